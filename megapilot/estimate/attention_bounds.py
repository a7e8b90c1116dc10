"""When a fused attention core waits on something other than its tensor cores: in the forward and the backward on its
softmax's exponentials (`GPUSpec.mma_flops_per_exp`, the tensor-core time one exponential costs), in the backward also
on its shared memory (`GPUSpec.mma_flops_per_smem_byte`, the tensor-core time one byte of it costs). Both are
properties of the GPU and of the layer's head dimensions, the same for every model with them. The step time prices
them (`attention_core_bound`, in `step_time`); the estimate's coverage names the exponentials' wait, which no
calibration run had (`coverage`), while every Blackwell row's backward waits on its shared memory.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal, NamedTuple

from megapilot.estimate.passes import FORWARD_SHARE
from megapilot.spec.hardware import Architecture, GPUSpec
from megapilot.spec.model import ModelSpec

# The softmax's per-score work in the kernels an architecture ships, in exponentials: the SFU's exponential plus
# what else each score costs beside the MMAs (the row max, the rescale, the row sum, the score tile's trips through
# shared memory), where a published kernel benchmark pins it. Hopper: cuDNN's forward (the kernel Transformer Engine
# runs attention sinks with, and its default fused attention) reaches 413 TFLOP/s at head dim 64 against 595 at
# 128 (FlashAttention-3, Shah et al. 2024, Fig. 5, 16K tokens; FlashAttention-3's own: 497 / 648). At head dim 128 the
# MMAs bind (512 MMA FLOPs a score against the SFU's 256), so the head-dim-64 forward, where the two are level, runs
# 595 / 413 = 1.44 times its MMA time: the score's work is 1.44 exponentials. Elsewhere no published head-dim-64
# against -128 rate pins it (Blackwell's FlashAttention-4 moves part of its exponentials onto the FMA units): 1.
SOFTMAX_WORK_PER_EXPONENTIAL: dict[Architecture, float] = {"hopper": 595 / 413}


def softmax_exponential_bound(model: ModelSpec, layer_index: int, gpu: GPUSpec) -> float:
    """How much longer than its counted FLOPs say a fused attention core runs because the softmax's exponentials,
    not the tensor cores, bind: 1.0 where the tensor cores bind (and on a GPU that does not give
    `GPUSpec.mma_flops_per_exp`, or a Gated DeltaNet layer, which has no softmax).

    A flash kernel takes one exponential per score in the forward and recomputes it once in the backward. The core
    is counted at 2 (d_qk + d_v) FLOPs per score and head forward and twice that backward (QK^T and PV, Megatron's
    three passes), so per score the forward's exponential weighs `mma_flops_per_exp` / (2 (d_qk + d_v)) of its
    MMAs and the backward's half that. FlashAttention-3, FlashAttention-4 and cuDNN overlap the special-function
    unit with the tensor cores (ping-pong warp groups), so each pass runs at the slower of the two
    (FlashAttention-4, Zadouri et al. 2026: on B200 "the exponential is the forward's bottleneck"). At head dim
    128 on Blackwell the forward sits on the balance point (512 MMA FLOPs per exponential each way), so the
    head-dim-128 rows the attention fraction is fitted on are unchanged; a head-dim-64 layer's forward takes twice
    its MMA time there, and Blackwell Ultra's doubled SFU brings it back to its MMAs. On Hopper a score's softmax
    work is 1.44 exponentials (`SOFTMAX_WORK_PER_EXPONENTIAL`): head dim 128 stays on its MMAs, a head-dim-64
    forward takes 1.44 times its MMA time. Adding the exponentials
    beside the MMAs instead (no overlap) was refitted and left out (`bench/calibration/physics.md`)."""
    forward, backward = _exponential_pass_bounds(model, layer_index, gpu)
    return _counted(forward, backward)


def backward_smem_bound(model: ModelSpec, layer_index: int, gpu: GPUSpec) -> float:
    """How much longer than its MMAs a fused attention backward runs because its shared-memory traffic binds: 1.0
    where the tensor cores bind (Ampere, Hopper at head dim 128) or the GPU gives no `mma_flops_per_smem_byte`.

    FlashAttention-4 (Zadouri et al. 2026, arXiv 2603.05451) finds B200's backward bound by shared memory, not its
    MMAs: Blackwell doubled the tensor cores' FLOPs per clock per SM over Hopper and kept the shared memory's 128 bytes
    per clock. Counted per tile of `BACKWARD_TILE` queries x keys (`backward_smem_flops_per_byte`), the five MMAs of
    the backward run at 40 FLOPs a byte of shared memory at head dim 128: B200's 64 FLOPs a byte make the pass 1.6x
    its MMA time, the top of the 25-60 % the paper's roofline puts shared memory and the exponentials over the MMAs.
    cuDNN's fused attention, which Transformer Engine runs on Hopper and Blackwell (it turns FlashAttention off there
    "to give FusedAttention preference on Hopper+"), is the kernel priced; FlashAttention-4 shrinks that traffic with
    tensor memory and 2-CTA MMAs and runs up to 1.3x faster than cuDNN 9.13."""
    if gpu.mma_flops_per_smem_byte is None or not model.has_softmax_core(layer_index):
        return 1.0
    return max(1.0, gpu.mma_flops_per_smem_byte / backward_smem_flops_per_byte(*_head_dims(model)))


def attention_core_bound(model: ModelSpec, layer_index: int, gpu: GPUSpec) -> float:
    """How much longer than its counted FLOPs say a fused attention core runs, each pass at the slowest of its tensor
    cores, its exponentials and (backward) its shared memory: what the step time multiplies the core by."""
    bounds = attention_pass_bounds(model, layer_index, gpu)
    return _counted(bounds.forward, bounds.backward)


class PassBounds(NamedTuple):
    """A softmax attention core's passes over their MMA time (1.0: the tensor cores bind), and what binds the
    backward."""

    forward: float
    backward: float
    backward_by: Literal["tensor cores", "exponentials", "shared memory"]


def attention_pass_bounds(model: ModelSpec, layer_index: int, gpu: GPUSpec) -> PassBounds:
    """Each pass's time over its MMA time, at the slowest of its tensor cores, its exponentials and (backward) its
    shared memory, with the one the backward waits on."""
    forward, exponentials = _exponential_pass_bounds(model, layer_index, gpu)
    smem = backward_smem_bound(model, layer_index, gpu)
    backward = max(exponentials, smem)
    by: Literal["tensor cores", "exponentials", "shared memory"] = \
        "tensor cores" if backward <= 1.0 else "shared memory" if smem >= exponentials else "exponentials"
    return PassBounds(forward, backward, by)


# The tile of a fused attention backward: 128 queries against 128 keys (FlashAttention-2/-3 and cuDNN's Hopper and
# Blackwell kernels; FlashAttention-4's 1-CTA backward).
BACKWARD_TILE = 128


def backward_smem_flops_per_byte(d_qk: int, d_v: int, tile: int = BACKWARD_TILE) -> float:
    """MMA FLOPs per byte of shared-memory traffic of one tile of a fused attention backward (M = N = `tile` queries
    and keys, bf16 operands), a kernel that keeps its K and V tile resident and stages P and dS in shared memory:

    - the five MMAs, S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ = dS K: 2 M N (3 d_qk + 2 d_v) FLOPs;
    - their operands read from shared memory: Q and K twice each (S and dK; S and dQ), V once, dO twice (dP, dV);
    - P written once and read once (dV), dS written once and read twice (dK, dQ): 10 bytes per score;
    - dQ's fp32 partial written to shared memory and read back by the reduction to HBM: 8 bytes per value.

    Head dim 128: 20.97 MFLOPs over 512 KiB, 40 FLOPs a byte."""
    m = n = tile
    flops = 2 * m * n * (3 * d_qk + 2 * d_v)
    operands = 2 * (2 * m * d_qk + 2 * n * d_qk + n * d_v + 2 * m * d_v)
    scores = 10 * m * n
    dq_partial = 8 * m * d_qk
    return flops / (operands + scores + dq_partial)


def _head_dims(model: ModelSpec) -> tuple[int, int]:
    """(query-key, value) head dimensions of the attention core: MLA's carry the rope part on q and k."""
    if model.mla is not None:
        return model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim, model.mla.v_head_dim
    return model.head_dim, model.head_dim


def _exponential_pass_bounds(model: ModelSpec, layer_index: int, gpu: GPUSpec) -> tuple[float, float]:
    """(forward, backward) multipliers of the MMA time by the exponentials (`softmax_exponential_bound`)."""
    if gpu.mma_flops_per_exp is None or not model.has_softmax_core(layer_index):
        return 1.0, 1.0
    width = sum(_head_dims(model))
    per_score = gpu.mma_flops_per_exp * SOFTMAX_WORK_PER_EXPONENTIAL.get(gpu.architecture, 1.0)
    return max(1.0, per_score / (2 * width)), max(1.0, per_score / (4 * width))


def _counted(forward: float, backward: float) -> float:
    """One multiplier of the counted core from its passes' (the forward a third of the counted FLOPs)."""
    return FORWARD_SHARE * forward + (1 - FORWARD_SHARE) * backward


@lru_cache(maxsize=256)  # asked on every estimate's coverage: the planner's thousands share a handful of pairs
def waits_on_exponentials(model: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether any of the model's attention layers runs slower than its counted FLOPs on this GPU because of its
    exponentials."""
    return any(softmax_exponential_bound(model, i, gpu) > 1.0 for i in range(model.num_layers))
