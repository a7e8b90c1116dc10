"""When a fused attention core waits on its softmax's exponentials rather than its tensor cores: a property of the GPU
(`GPUSpec.mma_flops_per_exp`, the tensor-core time one exponential costs) and of the layer's head dimensions. The
step time prices it (`step_time`) and the estimate's coverage names it, since no calibration run had it (`coverage`).
"""

from __future__ import annotations

from functools import lru_cache

from megapilot.estimate.flops import has_attention
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
    if gpu.mma_flops_per_exp is None or not has_attention(model, layer_index) \
            or model.is_linear_attention_layer(layer_index):
        return 1.0
    if model.mla is not None:
        width = model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim + model.mla.v_head_dim
    else:
        width = 2 * model.head_dim
    per_score = gpu.mma_flops_per_exp * SOFTMAX_WORK_PER_EXPONENTIAL.get(gpu.architecture, 1.0)
    forward = max(1.0, per_score / (2 * width))
    backward = max(1.0, per_score / (4 * width))
    return FORWARD_SHARE * forward + (1 - FORWARD_SHARE) * backward


@lru_cache(maxsize=256)  # asked on every estimate's coverage: the planner's thousands share a handful of pairs
def waits_on_exponentials(model: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether any of the model's attention layers runs slower than its counted FLOPs on this GPU because of its
    exponentials."""
    return any(softmax_exponential_bound(model, i, gpu) > 1.0 for i in range(model.num_layers))
