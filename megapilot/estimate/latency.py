"""Fixed costs of a layer that do not shrink with a faster GPU or a smaller micro-batch.

The bandwidth and FLOP terms of the step time scale with the work; three costs do not:

- kernel overhead: every kernel a layer runs costs a fixed time beyond its work: the gap between one kernel's end
  and the next one's start even when the host has queued it (NVIDIA measured a 2.9 us kernel at 3.8 us per kernel
  launched back to back on one stream: "Getting Started with CUDA Graphs", NVIDIA Technical Blog, A. Gray, 2019),
  its first wave's ramp-up and its last wave's drain. The seconds per kernel are fitted
  (`EfficiencyParams.kernel_overhead_s`, at most 5 us); the counts are Megatron-Core's layer (`layer_kernels`): a
  dense layer runs a few dozen kernels, a MoE layer hundreds (per local expert: its GEMMs and the FP8 casts of
  their inputs). A small model, or a MoE model with many narrow experts, spends a larger share of its step on
  them, the more so the faster the GPU. The host's own dispatch of each kernel (a Transformer Engine Linear
  forward takes 37-100 us of CPU on a Grace host: TransformerEngine issue #2053) is left out: the host queues
  ahead of the GPU except after the dispatcher's sync (below). A kernel a CUDA graph replays saves only the
  difference between the eager and the graph's launch gap (`GRAPH_SAVES_PER_KERNEL_S`): its ramp and drain stay,
  and with the host queued ahead there is no host time to take off (`layer_kernel_parts` splits a layer by the
  parts a graph scope names).
- the host sync: Megatron's alltoall dispatcher needs the tokens each rank sends and receives on the host (the
  all-to-all's split sizes are host arguments), so each MoE layer's forward copies them to the host and waits
  (`cuda_sync_point`, megatron/core/transformer/moe/token_dispatcher.py). The queue drains: the kernels after the
  sync run no faster than the host launches them, 3.8 us each at best (same blog), and the sync itself
  costs the 9.6 - 3.8 = 5.8 us that the blog measured for a stream synchronisation after a kernel. The flex
  dispatcher (`--moe-token-dispatcher-type flex`) is priced without it: HybridEP sizes its buffers statically and
  DeepEP can (`num_worst_tokens`); DeepEP's normal mode still waits on the host for its receive counts, which
  this leaves out (one sync, microseconds, unless the launches after it outlast the GPU's work).
- wave quantisation: a GEMM runs as tiles, one tile per SM at a time; a last, partly filled wave of tiles costs a
  full one. Transformer Engine's GroupedLinear (Megatron's default `--moe-grouped-gemm` path) runs one cuBLAS GEMM
  per local expert, spread over 4 compute streams (`num_streams = 4`, transformer_engine/common/include/
  transformer_engine/gemm.h; `nvte_multi_stream_cublas_gemm`), so up to four experts' tiles share the waves; one
  CUTLASS grouped GEMM (`--moe-use-legacy-grouped-gemm`, the `grouped_gemm` package) tiles every local expert in
  one launch.

Counts of kernels are those of Megatron-Core's Transformer Engine layer, forward and backward, with the fused
router (`--moe-router-fusion`) and fused permutation (`--moe-permute-fusion`) the NeMo/Bridge performance recipes
set; FP8 current scaling casts each GEMM input (an expert's on its own) with three kernels (amax, scale, cast:
Transformer Engine's `split_quantize`), MXFP8 with one and NVFP4 with three to five (quantization.cast_kernels); the
other FP8 recipes and MXFP4 are counted as current scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from megapilot.estimate.mamba_mixer import MIXER_KERNELS as MAMBA_MIXER_KERNELS
from megapilot.spec.cuda_graphs import LayerPart
from megapilot.spec.hardware import GPUSpec
from megapilot.spec.model import LayerBlock, ModelSpec, YarnRopeScaling

HOST_LAUNCH_FLOOR_S = 3.8e-6  # a kernel the host launches while the GPU waits takes at least this (same blog)
HOST_SYNC_S = 5.8e-6  # a stream synchronisation beyond a queued launch (same blog: 9.6 - 3.8 us)
# A kernel replayed from a CUDA graph: the same blog's 2.9 us kernel ran at 3.4 us per kernel inside a graph, a
# 0.5 us gap, against 3.8 us launched one by one (0.9 us) with the host queued ahead. What a graph takes off each
# kernel is that difference; the rest of the fitted `kernel_overhead_s` (its first wave's ramp, its last wave's
# drain) runs inside a graph too. Priced as the whole overhead but the graph's gap, the Megatron-Bridge 25.09
# recipes that captured every layer (Bridge v0.1.0rc4 `scripts/performance/configs/*.yaml`, `cuda_graphs: true`:
# Qwen3 30B-A3B and 235B-A22B on GB200, Qwen3 30B-A3B and Llama 3 8B on B200) would have run 13-42 points
# faster than they did (Qwen3 30B-A3B on 8 B200: +5.6 % eager, +48 % so; release_holdout.md).
EAGER_LAUNCH_GAP_S = 0.9e-6
GRAPH_LAUNCH_GAP_S = 0.5e-6
GRAPH_SAVES_PER_KERNEL_S = EAGER_LAUNCH_GAP_S - GRAPH_LAUNCH_GAP_S
TE_GROUPED_GEMM_STREAMS = 4  # Transformer Engine's multi-stream cuBLAS grouped GEMM
GEMM_TILE = 128  # output tile side of the cuBLAS/CUTLASS kernels (128 x 128 per SM), as step_time pads rows

# Kernels of one MoE layer besides the expert GEMMs and their casts (fused router and permutation):
# forward before the dispatcher's sync: the router's (router GEMM, fused top-k/softmax, 3 aux-loss kernels), then the
# preprocess (the per-expert token count, 3 for the split sizes (gather over EP, sums), 2 copies to the host, the
# fused permute);
ROUTER_KERNELS_FORWARD = 5
PREPROCESS_KERNELS_FORWARD = 7
ROUTER_AND_PREPROCESS_KERNELS = ROUTER_KERNELS_FORWARD + PREPROCESS_KERNELS_FORWARD
ROUTER_KERNELS_BACKWARD = 5  # of the backward's below: router GEMM dgrad and wgrad, top-k/softmax, 2 aux-loss
# forward after it: dispatch all-to-all, sort by local expert, the fused SwiGLU, unsort, combine all-to-all, unpermute;
DISPATCH_AND_COMBINE_KERNELS = 6
# backward: the two all-to-alls, four permutation kernels, SwiGLU, router GEMM dgrad + wgrad, top-k/softmax, 2 aux.
BACKWARD_OTHER_KERNELS = 13
FP8_CAST_KERNELS_PER_TENSOR = 3  # amax, scale, cast (current scaling)
# Kernels that quantise one tensor, per (GEMM input, output gradient): current scaling's by default; another recipe
# passes its own (quantization.cast_kernels).
CastKernels = tuple[float, float]
CURRENT_SCALING_CAST_KERNELS: CastKernels = (FP8_CAST_KERNELS_PER_TENSOR, FP8_CAST_KERNELS_PER_TENSOR)
EXPERT_GEMMS_FORWARD = 2  # fc1, fc2
EXPERT_GEMMS_BACKWARD = 4  # dgrad and wgrad of each
EXPERT_CASTS_FORWARD = 2  # fc1's and fc2's inputs
EXPERT_CASTS_BACKWARD = 2  # their output gradients
# Biased experts: fc2's bias added expert by expert in PyTorch (Megatron's `TEGroupedMLP._apply_bias`): forward a
# product and a sum per expert and one concatenation; backward per expert the bias's and the prob's products and
# sums, and the two splits' concatenations. (fc1's bias rides in its GEMM's epilogue.)
EXPERT_BIAS_KERNELS_FORWARD_PER_EXPERT = 2
EXPERT_BIAS_KERNELS_FORWARD = 1
EXPERT_BIAS_KERNELS_BACKWARD_PER_EXPERT = 4
EXPERT_BIAS_KERNELS_BACKWARD = 2
# A clamped gated unit: two clamps and a concatenation before the fused activation, forward and backward.
CLAMP_KERNELS_FORWARD = 3
CLAMP_KERNELS_BACKWARD = 3

# Kernels of a layer's other parts, forward + backward:
NORM_AND_RESIDUAL_KERNELS = 4  # a sublayer's norm and its bias-dropout-add, each forward and backward
LINEAR_KERNELS = 3  # fprop, dgrad, wgrad
LINEAR_CAST_KERNELS = 2 * FP8_CAST_KERNELS_PER_TENSOR  # an 8-bit linear's input (forward) and output gradient
ATTENTION_CORE_KERNELS = 4  # fused attention forward; its backward's preprocess, main kernel and dq conversion
ROPE_KERNELS = 4  # q and k rotated, forward and backward
# RoPE in PyTorch ops (Megatron's `_apply_rotary_pos_emb_bshd`), where Transformer Engine's fused RoPE cannot take
# YaRN's concentration factor (`unfused_rope`): per rotated tensor (q, k), forward the frequencies' cos and sin each
# scaled and cast (6 small kernels), t x cos, the rotated half's negation and concatenation, x sin, the sum and the
# final concatenation (6); backward the two products, the negation, the chunk's and the slice's gradients (zeros and
# a copy) and the two branches' sum (7).
UNFUSED_ROPE_KERNELS = 2 * (6 + 6 + 7)
QK_NORM_KERNELS = 4  # per-head q and k norms (Qwen3) or MLA's q and kv latent norms, forward and backward
ACTIVATION_KERNELS = 2  # an MLP's fused activation, forward and backward
DSA_INDEXER_KERNELS = 6  # DeepSeek Sparse Attention's index scores, top-k and its KL loss, forward and backward
GDN_MIXER_KERNELS = 24  # causal conv1d (2), q/k L2 norms (4), chunked gated delta rule (6 + 10), gated norm (2)

# Streaming multiprocessors (NVIDIA) / compute units (AMD) per GPU, with the vendor's number and source.
SM_COUNTS: dict[str, tuple[int, str]] = {
    "A100-SXM4-80GB": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs"),
    "H100-SXM5-80GB": (132, "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs (SXM5)"),
    "H200-SXM-141GB": (132, "NVIDIA H200: the GH100 of H100 SXM5 with HBM3e, 132 SMs"),
    "H800-SXM5-80GB": (132, "NVIDIA H800 SXM5: GH100 with 132 SMs (H100 SXM5 compute, reduced NVLink)"),
    "B200": (148, "B200: 148 SMs as the CUDA runtime reports them (multiProcessorCount), two dies of 74"),
    "GB200": (148, "GB200's Blackwell GPU: the B200 die pair, 148 SMs"),
    "B300": (160, "NVIDIA Technical Blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs"),
    "GB300": (160, "NVIDIA Technical Blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs"),
    "MI300X": (304, "AMD CDNA 3 architecture whitepaper (2023): 304 compute units"),
    "MI325X": (304, "AMD Instinct MI325X data sheet: 304 compute units"),
    "MI355X": (256, "AMD CDNA 4 architecture whitepaper (2025): 256 compute units"),
}
# A GPU outside the table (a user's own spec) takes its generation's flagship count.
SM_COUNTS_BY_ARCHITECTURE = {"ampere": 108, "hopper": 132, "blackwell": 148, "cdna3": 304, "cdna4": 256}
DEFAULT_SM_COUNT = 132


def sm_count(gpu: GPUSpec) -> int:
    """SMs (compute units) of `gpu`: by catalog name, else by its architecture's flagship."""
    known = SM_COUNTS.get(gpu.name)
    if known is not None:
        return known[0]
    return SM_COUNTS_BY_ARCHITECTURE.get(gpu.architecture, DEFAULT_SM_COUNT)


# Thread blocks an NCCL all-gather or reduce-scatter of the DP / expert-DP / Megatron-FSDP buffers holds, one per
# channel, each on an SM for as long as it runs; a large buffer runs on all of a communicator's channels. The count
# is NCCL's topology search (src/graph/search.cc, connect.cc; NCCL 2.2x): on a DGX node of 8 rail NICs it finds one
# ring channel per NIC at the NIC's speed (48 GB/s of 400 Gb/s), does not duplicate them (Hopper and later skip that
# above 4 channels under 50 GB/s), and `ncclTopoPostset` doubles them: 16; NVLink SHARP runs 16 on Hopper
# (`NVLS_NCHANNELS_SM90`, src/transport/nvls.cc). Megatron and the Megatron-Bridge recipes leave NCCL_MIN/MAX_CTAS
# at their defaults; only `--use-nccl-ub` (NCCL user buffers with NCCL_CTA_POLICY=1: "an SM-efficient NCCL
# algorithm", Megatron-FSDP's README) lowers it, and the recipes the estimate is checked against do not set it.
NCCL_COLLECTIVE_SMS = 16


def sm_share(collective_sms: int, gpu: GPUSpec) -> float:
    """The share of `gpu`'s SMs a collective's kernels hold while they run."""
    return min(1.0, collective_sms / sm_count(gpu))


def sm_contended_exposed_s(exposed_s: float, traffic_s: float, share: float) -> float:
    """What a collective that runs `traffic_s` beside compute adds to the step, `exposed_s` of it outlasting that
    compute: its kernels hold `share` of the SMs for all of its length, so even a collective that hides entirely
    slows the compute beside it by that share of its length. A collective that hides nothing (`exposed_s` =
    `traffic_s`) adds just itself."""
    return max(exposed_s, share * traffic_s)


def wave_efficiency(rows: float, cols: float, sms: int, concurrent: int = 1) -> float:
    """Fraction of the SM-waves a GEMM's output tiles fill: `concurrent` equal GEMMs share the waves."""
    tiles = math.ceil(rows / GEMM_TILE) * math.ceil(cols / GEMM_TILE) * max(1, concurrent)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


@lru_cache(maxsize=4096)  # the planner prices thousands of layouts that share a few expert shapes
def expert_wave_slowdown(tokens: float, hidden: float, width: float, sms: int, concurrent: int) -> float:
    """Mean factor (>= 1) by which wave quantisation slows an expert linear's three GEMMs: fprop writes
    tokens x width, dgrad tokens x hidden, wgrad hidden x width (equal FLOPs, so equal weights)."""
    outputs = ((tokens, width), (tokens, hidden), (hidden, width))
    return sum(1 / wave_efficiency(r, c, sms, concurrent) for r, c in outputs) / len(outputs)


@dataclass(frozen=True)
class MoeKernels:
    """Kernels of one MoE layer per micro-batch, split where the dispatcher's host sync falls. `*_serial` count
    what runs one after another on the GPU (the expert GEMMs once per round of streams); the host launches every
    GEMM on its own (`forward_after_sync_launches`)."""

    forward_before_sync: float
    forward_after_sync_serial: float
    forward_after_sync_launches: float
    backward_serial: float

    @property
    def serial(self) -> float:
        return self.forward_before_sync + self.forward_after_sync_serial + self.backward_serial


@lru_cache(maxsize=256)
def moe_kernels(local_experts: int, *, per_expert_gemms: bool, fp8_casts: bool,
                cast_kernels: CastKernels = CURRENT_SCALING_CAST_KERNELS, biased_experts: bool = False,
                clamped: bool = False) -> MoeKernels:
    """Kernels of one MoE layer: one GEMM per local expert when Transformer Engine runs them (spread over its
    streams, so they follow one another once per round of streams), else one grouped GEMM per kind. A quantised
    recipe casts each expert's inputs and output gradients on their own (Transformer Engine 2.7-2.10 fuses the
    per-expert casts into one kernel only for delayed scaling: `multi_tensor_quantize_impl`), `cast_kernels` each;
    with biased experts fc2's per-expert bias kernels, with a clamped gated unit its clamps."""
    gemm_rounds = math.ceil(local_experts / TE_GROUPED_GEMM_STREAMS) if per_expert_gemms else 1
    gemm_launches = local_experts if per_expert_gemms else 1
    input_casts, grad_casts = (kernels * local_experts if fp8_casts else 0 for kernels in cast_kernels)
    forward_other = DISPATCH_AND_COMBINE_KERNELS + EXPERT_CASTS_FORWARD * input_casts
    backward_other = BACKWARD_OTHER_KERNELS + EXPERT_CASTS_BACKWARD * grad_casts
    if biased_experts:
        forward_other += EXPERT_BIAS_KERNELS_FORWARD + EXPERT_BIAS_KERNELS_FORWARD_PER_EXPERT * local_experts
        backward_other += EXPERT_BIAS_KERNELS_BACKWARD + EXPERT_BIAS_KERNELS_BACKWARD_PER_EXPERT * local_experts
    if clamped:
        forward_other += CLAMP_KERNELS_FORWARD
        backward_other += CLAMP_KERNELS_BACKWARD
    return MoeKernels(
        forward_before_sync=ROUTER_AND_PREPROCESS_KERNELS,
        forward_after_sync_serial=forward_other + EXPERT_GEMMS_FORWARD * gemm_rounds,
        forward_after_sync_launches=forward_other + EXPERT_GEMMS_FORWARD * gemm_launches,
        backward_serial=backward_other + EXPERT_GEMMS_BACKWARD * gemm_rounds,
    )


def expert_epilogue_flags(model: ModelSpec) -> dict[str, bool]:
    """`moe_kernels`' flags for the model's experts: biased (`add_bias_linear`), a clamped gated unit."""
    return {"biased_experts": model.add_bias_linear,
            "clamped": model.activation_clamp is not None and model.gated_mlp}


def moe_host_sync_s(kernels: MoeKernels, *, forward_after_sync_gpu_s: float, kernel_overhead_s: float) -> float:
    """Seconds per micro-batch one MoE layer's dispatcher host sync costs: the sync itself and whatever the
    host's launches after it (the queue is empty) take beyond the GPU's work and kernel overheads over the same
    kernels."""
    host_paced = kernels.forward_after_sync_launches * HOST_LAUNCH_FLOOR_S
    gpu_paced = forward_after_sync_gpu_s + kernels.forward_after_sync_serial * kernel_overhead_s
    return HOST_SYNC_S + max(0.0, host_paced - gpu_paced)


def layer_kernels(model: ModelSpec, layer_index: int, ep: int, *, eight_bit: bool, per_expert_gemms: bool,
                  cast_kernels: CastKernels = CURRENT_SCALING_CAST_KERNELS,
                  expert_cast_kernels: CastKernels | None = None) -> float:
    """Kernels layer `layer_index` runs one after another per micro-batch, forward + backward, each paying the
    fixed kernel overhead: its sequence mixer, then its dense MLP or MoE block (a hybrid layer has one block)."""
    return sum(layer_kernel_parts(model, layer_index, ep, eight_bit=eight_bit, per_expert_gemms=per_expert_gemms,
                                  cast_kernels=cast_kernels, expert_cast_kernels=expert_cast_kernels).values())


def layer_kernel_parts(model: ModelSpec, layer_index: int, ep: int, *, eight_bit: bool, per_expert_gemms: bool,
                       cast_kernels: CastKernels = CURRENT_SCALING_CAST_KERNELS,
                       expert_cast_kernels: CastKernels | None = None) -> dict[LayerPart, float]:
    """`layer_kernels` by the part of the layer a CUDA graph scope names (`CudaGraphs.captures`): the attention
    sublayer (its norm and residual with it), a Mamba mixer, a dense MLP, and a MoE block split where Megatron's
    scopes split it: the router (with the MLP's norm and the shared experts, which `moe_router` captures), the
    preprocess (token counts, split sizes, the permute) and the rest (dispatch, experts, combine, residual)."""
    linear = LINEAR_KERNELS + (sum(cast_kernels) if eight_bit else 0)
    kind, block = model.layer_kind(layer_index), model.layer_block(layer_index)
    parts: dict[LayerPart, float] = {}
    if kind in ("transformer", "attention") and block.attention != "none":
        parts["attn"] = NORM_AND_RESIDUAL_KERNELS + _mixer_kernels(model, layer_index, block, linear)
    if kind == "mamba":
        parts["mamba"] = NORM_AND_RESIDUAL_KERNELS + MAMBA_MIXER_KERNELS + 2 * linear  # the conv, scan and norm
    if kind in ("mamba", "attention"):
        return parts
    moe = model.moe
    if model.is_moe_layer(layer_index) and moe is not None:
        block_kernels = moe_kernels(moe.num_experts // ep, per_expert_gemms=per_expert_gemms, fp8_casts=eight_bit,
                                    cast_kernels=expert_cast_kernels or cast_kernels, **expert_epilogue_flags(model))
        shared = 2 * linear + ACTIVATION_KERNELS if moe.shared_expert_ffn_hidden_size else 0
        latent = 2 * linear if moe.latent_size is not None else 0
        norm = NORM_AND_RESIDUAL_KERNELS / 2  # the norm before the block, forward and backward
        parts["moe_router"] = norm + ROUTER_KERNELS_FORWARD + ROUTER_KERNELS_BACKWARD + shared
        parts["moe_preprocess"] = PREPROCESS_KERNELS_FORWARD
        parts["moe"] = (NORM_AND_RESIDUAL_KERNELS - norm + block_kernels.serial - ROUTER_AND_PREPROCESS_KERNELS
                        - ROUTER_KERNELS_BACKWARD + latent)
    elif block.mlp == "full":
        parts["mlp"] = NORM_AND_RESIDUAL_KERNELS + 2 * linear + ACTIVATION_KERNELS
    elif block.mlp == "linear":
        parts["mlp"] = NORM_AND_RESIDUAL_KERNELS + linear
    return parts


def unfused_rope(model: ModelSpec) -> bool:
    """Whether Megatron rotates q and k in PyTorch ops instead of Transformer Engine's fused RoPE: the fused kernel
    takes no scale, so `apply_rotary_pos_emb` (models/common/embeddings/rope_utils.py, core 0.15-0.16) falls back
    whenever YaRN's concentration factor is not 1 (GPT-OSS: factor 32, 1.35), with or without --apply-rope-fusion."""
    scaling = model.rope_scaling
    return model.position_embedding == "rope" and isinstance(scaling, YarnRopeScaling) and scaling.concentration != 1


def _mixer_kernels(model: ModelSpec, layer_index: int, block: LayerBlock, linear: float) -> float:
    """Kernels of a layer's sequence mixer without its norm: attention (standard or MLA), Gated DeltaNet, or a
    heterogeneous layer's one linear."""
    if block.attention == "linear":
        return linear
    if model.gated_delta_net is not None and model.is_linear_attention_layer(layer_index):
        return GDN_MIXER_KERNELS + 2 * linear
    rope = (UNFUSED_ROPE_KERNELS if unfused_rope(model) else ROPE_KERNELS) if model.position_embedding == "rope" else 0
    mla = model.mla
    if mla is None:
        # (Llama 4's weightless L2 norm launches the same q and k kernels as a weighted one, on its RoPE layers)
        qk_norms = model.qk_layernorm or model.qk_l2_norm_at(layer_index)
        return ATTENTION_CORE_KERNELS + rope + 2 * linear + (QK_NORM_KERNELS if qk_norms else 0)
    linears = (2 if mla.q_lora_rank else 1) + 2 + 1  # q (down, up), kv down and up, output
    indexer = DSA_INDEXER_KERNELS + 2 * linear if model.runs_dsa_indexer(layer_index) else 0
    norms = QK_NORM_KERNELS if mla.latent_layernorms else 0
    return ATTENTION_CORE_KERNELS + rope + linears * linear + norms + indexer
