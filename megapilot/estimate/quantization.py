"""What each quantised-GEMM flavour costs physically: the HBM passes that cast GEMM inputs, the GEMM peak it
runs at, and the memory its quantised copies and scales hold.

A linear layer multiplies three tensors a low-precision recipe quantises from bf16: its input activation X
(m x k), its weight W (k x n) and, in the backward, the gradient of its output dY (m x n). Every GEMM wants its
operands scaled along its own reduction axis, so each tensor serves two GEMMs in two layouts:

    X   rowwise for fprop (reduces over k)     columnwise for wgrad (reduces over m)
    W   rowwise for fprop (reduces over k)     columnwise for dgrad (reduces over n)
    dY  rowwise for dgrad (reduces over n)     columnwise for wgrad (reduces over m)

Per-tensor scaling (delayed, current) has one scale, so one FP8 copy serves both where the tensor cores take
either operand layout (Blackwell; Transformer Engine's non-TN FP8 GEMMs from compute capability 10.0); Hopper
and Ada need both operands K-major, so the cast also writes a transposed copy (assumed for CDNA's hipBLASLt
too). Block scaling (blockwise, MXFP8, NVFP4, MXFP4) scales blocks that run along the reduction axis, so the
two layouts are two quantisations.

The passes over HBM, per element of the bf16 tensor (2 bytes per read):

- the cast reads the bf16 tensor once and writes its copies (element bytes + scale bytes per block);
- current (tensorwise) scaling reads it once more before, to reduce its amax; delayed scaling uses the amax
  history instead (the cast records this step's amax for the next); blockwise, MXFP8 and MXFP4 compute each
  block's scale inside the cast;
- NVFP4 has a second-level per-tensor FP32 scale, hence an amax pass; its wgrad operands (X and dY) take a
  16-point random Hadamard transform, cast in a pass of their own (the rowwise copy is cast without it);
  its weights use 16 x 16 blocks, so one quantisation gives both layouts (the second is its transpose).
  MXFP4 in Primus (ROCm Transformer Engine) applies no Hadamard transform unless NVTE_MXFP4_USE_HADAMARD=1.

Weights are cast once per optimizer step (Transformer Engine keeps the cast across the micro-batches of a
step); activations and gradients once per micro-batch. Not priced: the TP all-reduce of current scaling's amax
under sequence parallelism (latency, not bytes), stochastic rounding of NVFP4 gradients (compute in the cast).

The step time (step_time.layer_terms) adds `layer_recipe_delta_s`: the plain-FP8 recipes priced against the
calibrated current scaling. The memory model reads `weight_copy_bytes_per_param` (the quantised weight copies
kept beside the bf16 weights) and `saved_input_bytes_per_value` (each GEMM input kept for the backward).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from megapilot.estimate import efficiency
from megapilot.estimate.flops import (
    GEMM_PASSES_FLOPS,
    INDEXER_LINEAR_PASSES_FLOPS,
    attention_linear_flops,
)
from megapilot.spec.hardware import GPUSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import QuantFlavour, TrainingSpec

Role = Literal["activation", "weight", "grad"]
BF16_BYTES = 2
# Blockwise FP8 on Hopper promotes the FP8 tensor-core partial sums to FP32 on CUDA cores every 128-deep K
# slice to apply the block scales (DeepSeek-V3 technical report, section 3.3.2). The best public kernel,
# DeepGEMM, reaches up to 1550 TFLOP/s on H800 (78 % of its 1979 dense FP8 peak; deepseek-ai/DeepGEMM README).
# Blockwise GEMMs are priced 10 % below the per-tensor FP8 rate on Hopper and CDNA; with their casts (cheaper than
# current scaling's: no amax pass) that lands near what Transformer Engine's GEMM profiling guide measures on an
# H200 (a 5B layer's GEMMs with their quantisation, FP8 Block 22.882 ms against current scaling's 20.285: 0.89),
# and the H100 DeepSeek-V3 run the 25.09 table prints in both (0.98 predicted, 0.976 published). On Blackwell TE
# runs these GEMMs as MXFP8 (it converts the block scales to E8M0: TE PR #2157), at MXFP8's rate.
BLOCKWISE_RATE_WITHOUT_BLOCK_SCALED_MMA = 0.9


@dataclass(frozen=True)
class QuantScheme:
    """How one flavour stores a quantised tensor, and the passes its cast needs."""

    element_bytes: float
    block_values: int | None  # values sharing one scale along the reduction axis; None = one scale per tensor
    scale_bytes: float
    amax_pass: bool  # a read of the bf16 tensor before the cast (current scaling, NVFP4's per-tensor scale)
    hadamard_wgrad: bool = False  # X and dY pass a random Hadamard transform in their columnwise cast
    weight_block_side: int | None = None  # square weight blocks: one quantisation serves both layouts


SCHEMES: dict[QuantFlavour, QuantScheme] = {
    "fp8-delayed": QuantScheme(element_bytes=1, block_values=None, scale_bytes=4, amax_pass=False),
    "fp8-tensorwise": QuantScheme(element_bytes=1, block_values=None, scale_bytes=4, amax_pass=True),
    # 1 x 128 blocks for activations and gradients, 128 x 128 for weights, FP32 scales (Float8BlockScaling)
    "fp8-blockwise": QuantScheme(element_bytes=1, block_values=128, scale_bytes=4, amax_pass=False,
                                 weight_block_side=128),
    # OCP MX: 32 values per E8M0 scale (MXFP8BlockScaling; Primus's MXFP4)
    "mxfp8": QuantScheme(element_bytes=1, block_values=32, scale_bytes=1, amax_pass=False),
    "mxfp4": QuantScheme(element_bytes=0.5, block_values=32, scale_bytes=1, amax_pass=False),
    # 16 values per E4M3 scale, a per-tensor FP32 scale above them, 16 x 16 weight blocks (NVFP4BlockScaling)
    "nvfp4": QuantScheme(element_bytes=0.5, block_values=16, scale_bytes=1, amax_pass=True, hadamard_wgrad=True,
                         weight_block_side=16),
}


# Transformer Engine's NVFP4 quantizer (`NVFP4Quantizer::quantize_impl`, pytorch/csrc/quantizer.cpp, TE 2.8-2.10) runs,
# per tensor: the Hadamard-transformed amax (`nvte_hadamard_transform_amax`, one read), the rowwise cast, and the
# columnwise cast of the transformed transpose fused into one kernel (`nvte_hadamard_transform_cast_fusion_
# columnwise`) only for BF16 input with rows % 64 == 0 and cols % 128 == 0; otherwise it writes the transformed
# transpose in BF16 (`nvte_hadamard_transform`) and casts it in a kernel of its own: a BF16 copy more, written and
# read back. A stochastically rounded tensor (the gradients) first draws its RNG state (`philox_unpack`, a kernel).
RHT_FUSED_ROWS = 64
RHT_FUSED_COLS = 128
RHT_UNFUSED_EXTRA_BYTES = 2 * BF16_BYTES  # the BF16 transformed transpose, written and read back
NVFP4_CAST_KERNELS = {"activation": 3, "grad": 4, "weight": 2}  # fused Hadamard path; + 1 unfused (not weights)
# And those casts run well below HBM speed on expert-sized tensors. Public figure: Transformer Engine issue #2281
# (B200, TE 2.8-2.9, `benchmarks/linear/benchmark_grouped_linear.py` at DeepSeek-V3's expert shapes, M = 65,536 rows
# over 4 or 8 experts, K = 7168, N = 2048): NVFP4 GroupedLinear, forward + backward, is at most 1.15x as fast as
# MXFP8; the maintainers attribute the gap to the quantisation and Hadamard kernels, launched one expert after
# another (the grouped NVFP4 kernels came with TE 2.12, #2351 / #2411, whose notes call the fused Hadamard cast's
# memory throughput low). With the model's own pieces at that shape (both GEMMs at the 8-bit fraction of the rate
# each format's GEMMs are priced at, efficiency.gemm_peak_tflops; MXFP8's casts at HBM speed; the kernels) a 1.15x
# module leaves the NVFP4 casts 0.60 (4 experts) and 0.72 (8) of HBM speed: 0.66, an upper bound since 1.15x is.
# `tests/estimate/test_low_precision_moe.py` re-derives it.
NVFP4_CAST_HBM_FRACTION = 0.66


def rht_unfused_share(flavour: QuantFlavour | None, cols: float, rows_aligned: bool | None) -> float:
    """Share of a tensor's NVFP4 columnwise casts that take the unfused Hadamard path (0 for other formats):
    all when its width is off 128; with ragged per-expert counts (`rows_aligned` None: dropless routing, each count
    padded to 32 by TE's Fp8Padding) the odd multiples of 32, about half; else by the given alignment."""
    if flavour != "nvfp4":
        return 0.0
    if cols % RHT_FUSED_COLS:
        return 1.0
    if rows_aligned is None:
        return 0.5
    return 0.0 if rows_aligned else 1.0


def cast_kernels(flavour: QuantFlavour | None, role: Role, unfused_share: float = 0.0) -> float:
    """Kernels that quantise one tensor: none in BF16; current scaling's amax, scale and cast (the count the other
    per-tensor and blockwise FP8 recipes and MXFP4 are given too: not read); MXFP8 one (`MXFP8Quantizer::quantize`:
    one `nvte_quantize_v2` writes both layouts); NVFP4 per `NVFP4_CAST_KERNELS`, one more where the Hadamard
    cast is unfused."""
    if flavour is None:
        return 0.0
    if flavour == "mxfp8":
        return 1
    if flavour == "nvfp4":
        return NVFP4_CAST_KERNELS[role] + (unfused_share if role != "weight" else 0.0)
    return 3


def _scheme(flavour: QuantFlavour) -> QuantScheme:
    return SCHEMES[flavour]


def _per_tensor(flavour: QuantFlavour) -> bool:
    return _scheme(flavour).block_values is None


def copies_kept(flavour: QuantFlavour, architecture: str) -> int:
    """Quantised copies of one tensor: one where a per-tensor copy serves both layouts (Blackwell), else two."""
    return 1 if _per_tensor(flavour) and architecture == "blackwell" else 2


def _scale_bytes_per_value(flavour: QuantFlavour, role: Role) -> float:
    scheme = _scheme(flavour)
    if scheme.block_values is None:
        return 0.0  # one scale per tensor
    if role == "weight" and scheme.weight_block_side is not None:
        return scheme.scale_bytes / scheme.weight_block_side**2
    return scheme.scale_bytes / scheme.block_values


@lru_cache(maxsize=64)  # asked for by every memory check of the planner, for a handful of (flavour, role)
def copy_bytes_per_value(flavour: QuantFlavour, role: Role) -> float:
    """Bytes one quantised copy holds per value: the element and its share of a block scale."""
    return _scheme(flavour).element_bytes + _scale_bytes_per_value(flavour, role)


def source_reads(flavour: QuantFlavour, role: Role) -> int:
    """How often the bf16 tensor is read to quantise it: the cast, an amax pass, a Hadamard cast of its own."""
    scheme = _scheme(flavour)
    hadamard = scheme.hadamard_wgrad and role != "weight"
    return 1 + int(scheme.amax_pass) + int(hadamard)


def cast_bytes_per_value(flavour: QuantFlavour, role: Role, architecture: str) -> float:
    """HBM bytes moved to quantise one bf16 value of a tensor in `role` (reads of the source, writes of copies)."""
    reads = source_reads(flavour, role) * BF16_BYTES
    return reads + copies_kept(flavour, architecture) * copy_bytes_per_value(flavour, role)


def linear_cast_bytes(m: float, k: float, n: float, flavour: QuantFlavour, architecture: str,
                      microbatches: int | None = 1) -> float:
    """HBM bytes one micro-batch moves casting the operands of one linear layer (X: m x k, W: k x n, dY: m x n),
    forward and backward; the weight's once-per-step cast is shared by the step's micro-batches (None: the
    weight is left out, for a caller that prices it per step)."""
    if microbatches is not None and microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    activation = m * k * cast_bytes_per_value(flavour, "activation", architecture)
    grad = m * n * cast_bytes_per_value(flavour, "grad", architecture)
    if microbatches is None:
        return activation + grad
    return activation + grad + k * n * cast_bytes_per_value(flavour, "weight", architecture) / microbatches


def gemm_peak_tflops(gpu: GPUSpec, flavour: QuantFlavour | None) -> float:
    """Dense peak the flavour's GEMMs are priced at, TF/s (None = bf16): per-tensor FP8 at the datasheet's FP8
    peak, blockwise FP8 below it where the tensor cores cannot apply block scales (see the constant) and as MXFP8
    where TE converts them, the block-scaled formats as `efficiency.gemm_peak_tflops` prices them."""
    if flavour is None:
        return gpu.bf16_dense_tflops
    if flavour.startswith("fp8-"):
        peak = gpu.peak_tflops("fp8")
        if flavour == "fp8-blockwise":
            return efficiency.gemm_peak_tflops(gpu, "mxfp8") if gpu.architecture == "blackwell" \
                else peak * BLOCKWISE_RATE_WITHOUT_BLOCK_SCALED_MMA
        return peak
    return efficiency.gemm_peak_tflops(gpu, flavour)  # mxfp8 / nvfp4 / mxfp4 are precisions too


# Transformer Engine's FP8 primary weights (`--fp8-param-gather`: Megatron builds the model under fp8_model_init) on
# NVIDIA GPUs; Megatron asserts the distributed optimizer or an FSDP beside it, whose fp32 master copy the optimizer
# step casts from. Megatron-Bridge's fp8_cs and fp8_mx presets turn it on, and `megapilot script` writes it there.
FP8_PRIMARY_WEIGHT_PRECISIONS = ("fp8", "mxfp8")
NVIDIA_ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")


def keeps_fp8_primary_weights(precision: str, architecture: str | None, *, sharded_optimizer: bool) -> bool:
    """Whether the run keeps its weights only in FP8 (`--fp8-param-gather`): no bf16 copy beside the FP8 one."""
    return precision in FP8_PRIMARY_WEIGHT_PRECISIONS and architecture in NVIDIA_ARCHITECTURES and sharded_optimizer


def weight_copy_bytes_per_param(flavour: QuantFlavour, architecture: str) -> float:
    """Bytes the quantised weight copies hold per parameter, beside the bf16 weight (scales included)."""
    return copies_kept(flavour, architecture) * copy_bytes_per_value(flavour, "weight")


def saved_input_bytes_per_value(flavour: QuantFlavour) -> float:
    """Bytes kept per GEMM-input value for the backward: the columnwise copy wgrad reads, with its scales."""
    return copy_bytes_per_value(flavour, "activation")


# ---- against the calibrated recipe ----------------------------------------------------------------------------
# The efficiency fit (efficiency.py) saw FP8 runs in per-tensor current scaling (Megatron-Bridge's fp8_cs, the
# recipe of its performance tables), so its 8-bit GEMM fraction and glue passes already hold that recipe's
# casts. The other plain-FP8 recipes are priced by their physical difference from it.
CALIBRATED_FP8_FLAVOUR: QuantFlavour = "fp8-tensorwise"
Linear = tuple[float, float, float]  # (m, k, n): X m x k, W k x n, per GPU and micro-batch


def layer_linears(model: ModelSpec, layer_index: int, parallel: ParallelConfig, tokens: float) -> list[Linear]:
    """The quantised linears of one layer on one GPU for one micro-batch of `tokens` rows (attention
    projections, the dense MLP or the routed and shared experts, a latent MoE's projections); Mamba mixers are
    left out. A hybrid layer has only its own block."""
    kind = model.layer_kind(layer_index)
    linears: list[Linear] = []
    if kind in ("transformer", "attention"):
        linears += mixer_linears(model, layer_index, parallel.tp, tokens)
    if kind in ("mamba", "attention"):
        return linears
    moe = model.moe
    if model.is_moe_layer(layer_index) and moe is not None:
        width = moe.routed_width(model.hidden_size)
        per_expert = moe.tokens_per_expert(tokens, tp=parallel.tp, ep=parallel.ep, expert_tp=parallel.expert_tp)
        for _ in range(moe.num_experts // parallel.ep):
            linears += _mlp_linears(model, per_expert, moe.moe_ffn_hidden_size, parallel.expert_tp, width)
        if moe.latent_size is not None:
            h, rows = model.hidden_size, tokens / parallel.tp
            linears += [(rows, h, width), (rows, width, h)]
        return linears + _mlp_linears(model, tokens, moe.shared_expert_ffn_hidden_size, parallel.tp)
    block = model.layer_block(layer_index).mlp
    if block != "full":  # a heterogeneous layer's MLP: one h -> h linear, or none
        h = model.hidden_size
        return linears + ([(tokens, h, h / parallel.tp)] if block == "linear" else [])
    return linears + _mlp_linears(model, tokens, model.layer_ffn_hidden_size(layer_index), parallel.tp)


def mixer_linears(model: ModelSpec, layer_index: int, tp: int, tokens: float) -> list[Linear]:
    """The projections of layer `layer_index`'s sequence mixer on one GPU: QKV (with the output gate's share)
    and output; MLA as one equivalent projection of the same FLOPs; Gated DeltaNet's in_proj and out_proj."""
    h = model.hidden_size
    gdn = model.gated_delta_net
    block = model.layer_block(layer_index).attention
    if block != "full":  # a heterogeneous layer's attention: one h -> h linear, or none
        return [(tokens, h, h / tp)] if block == "linear" else []
    if gdn is not None and model.is_linear_attention_layer(layer_index):
        return [(tokens, h, gdn.in_proj_width / tp), (tokens, gdn.value_width / tp, h)]
    if model.mla is not None:
        indexer = _dsa_indexer_linears(model, tokens) if model.runs_dsa_indexer(layer_index) else []
        return [(tokens, h, attention_linear_flops(model) / (6 * h) / tp)] + indexer
    q = model.num_attention_heads * model.head_dim / tp
    gate = q if model.attention_output_gate else 0
    qkv = q + gate + 2 * model.layer_kv_heads(layer_index) * model.head_dim / tp
    return [(tokens, h, qkv), (tokens, q, h)]


def _dsa_indexer_linears(model: ModelSpec, tokens: float) -> list[Linear]:
    """DeepSeek Sparse Attention's indexer projections: whole on every TP rank (Megatron builds them duplicated
    and gathers the sequence-parallel input first), over every token; run forward and weight-gradient only (their
    inputs are detached), which the three-pass GEMM price takes as 2/3 of the output width."""
    two_passes = INDEXER_LINEAR_PASSES_FLOPS / GEMM_PASSES_FLOPS
    return [(tokens, n_in, n_out * two_passes) for n_in, n_out in model.dsa_indexer_projections]


def _mlp_linears(model: ModelSpec, tokens: float, ffn: int, shard: int, width: int | None = None) -> list[Linear]:
    if ffn == 0:
        return []
    h = model.hidden_size if width is None else width
    return [(tokens, h, ffn * (2 if model.gated_mlp else 1) / shard), (tokens, ffn / shard, h)]


def recipe_delta_s(training: TrainingSpec, gpu: GPUSpec, linears: list[Linear], gemm_s: float,
                   microbatches: int | None) -> float:
    """Seconds one micro-batch of a layer spends beyond the calibrated FP8 recipe (negative = saved): the
    difference in cast bytes at HBM bandwidth plus the GEMMs' time at the recipe's own rate. Zero for bf16 and
    the block-scaled formats, whose fitted rows already price them."""
    flavour = training.quant_flavour
    if flavour is None or not flavour.startswith("fp8-") or flavour == CALIBRATED_FP8_FLAVOUR:
        return 0.0
    extra_bytes = sum(linear_cast_bytes(m, k, n, flavour, gpu.architecture, microbatches)
                      - linear_cast_bytes(m, k, n, CALIBRATED_FP8_FLAVOUR, gpu.architecture, microbatches)
                      for m, k, n in linears)
    rate = gemm_peak_tflops(gpu, CALIBRATED_FP8_FLAVOUR) / gemm_peak_tflops(gpu, flavour)
    return gpu.hbm_time_s(extra_bytes) + gemm_s * (rate - 1)  # the casts are memory-bound


def layer_recipe_delta_s(model: ModelSpec, layer_index: int, training: TrainingSpec, parallel: ParallelConfig,
                         gpu: GPUSpec, tokens: float, gemm_s: float) -> float:
    """`recipe_delta_s` for one layer's linears (the step time's hook). The weights' casts are left out: they
    are shared by a step's micro-batches, whose count the step time's per-layer cost does not depend on (its
    cache is keyed without DP), and per step they are small beside the activations' and gradients'."""
    if training.quant_flavour in (None, CALIBRATED_FP8_FLAVOUR):
        return 0.0
    linears = layer_linears(model, layer_index, parallel, tokens)
    return recipe_delta_s(training, gpu, linears, gemm_s, microbatches=None)
