"""When a fused attention core waits on its softmax's exponentials rather than its tensor cores: a property of the GPU
(`GPUSpec.mma_flops_per_exp`, the tensor-core time one exponential costs) and of the layer's head dimensions. The
step time prices it (`step_time`) and the estimate's coverage names it, since no calibration run had it (`coverage`).
"""

from __future__ import annotations

from functools import lru_cache

from megapilot.estimate.flops import has_attention
from megapilot.estimate.passes import FORWARD_SHARE
from megapilot.spec.hardware import GPUSpec
from megapilot.spec.model import ModelSpec


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
    its MMA time there, and Blackwell Ultra's doubled SFU brings it back to its MMAs. Adding the exponentials
    beside the MMAs instead (no overlap) was refitted and left out (`bench/calibration/physics.md`)."""
    if gpu.mma_flops_per_exp is None or not has_attention(model, layer_index) \
            or model.is_linear_attention_layer(layer_index):
        return 1.0
    if model.mla is not None:
        width = model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim + model.mla.v_head_dim
    else:
        width = 2 * model.head_dim
    forward = max(1.0, gpu.mma_flops_per_exp / (2 * width))
    backward = max(1.0, gpu.mma_flops_per_exp / (4 * width))
    return FORWARD_SHARE * forward + (1 - FORWARD_SHARE) * backward


@lru_cache(maxsize=256)  # asked on every estimate's coverage: the planner's thousands share a handful of pairs
def waits_on_exponentials(model: ModelSpec, gpu: GPUSpec) -> bool:
    """Whether any of the model's attention layers runs slower than its counted FLOPs on this GPU because of its
    exponentials."""
    return any(softmax_exponential_bound(model, i, gpu) > 1.0 for i in range(model.num_layers))
