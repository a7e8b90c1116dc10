"""Step time of one global batch, term by term, and the throughput figures derived from it.

Model (per GPU, seconds):
- compute: every GEMM priced by its shape (`efficiency.gemm_time_s`), the fused attention core at
  the BF16 attention rate (before flash attention: its batched GEMMs and the softmax and dropout passes over the
  s x s scores), memory-bound glue at HBM bandwidth (`efficiency.elementwise_time_s`), the output layer's
  cross-entropy at its kernels' bytes per logit; a Gated
  DeltaNet layer's in_proj/out_proj as GEMMs and its conv + chunked delta rule (linear in the tokens) at the
  attention rate; a Mamba-2 mixer's in_proj/out_proj as GEMMs and its conv1d, chunked SSD scan and group norm
  kernels each on its roofline (the longer of its HBM bytes and its FLOPs; mamba_mixer.py);
- recompute: selective re-runs the attention core's forward, full re-runs the recomputed layers'
  forward (Korthikanti et al. 2022, Sec. 5);
- tp_comm: with SP 4 all-gathers + 4 reduce-scatters of the layer activation per layer per
  micro-batch (without SP: 4 all-reduces, the same volume), Korthikanti Sec. 4.2.2; with
  `tp_comm_overlap` (userbuffers/TE, NVIDIA only) 80 % of it is hidden behind the GEMMs; TP above a layer's
  KV heads adds an exposed all-gather of its QKV output and the gradient's reduce-scatter (Megatron-Core 0.16+);
- cp_comm: ring attention sends K, V forward and K, V, dK, dV backward, (cp-1) steps each, overlapped
  with the attention core (Liu et al. 2023 "Ring Attention"); only what exceeds the core is exposed. With
  `--cp-comm-type a2a` (Ulysses) an attention layer instead trades its sequence shard for cp-th of the heads by
  all-to-alls of q, k, v before the core and of its output after it (their gradients in the backward), not
  overlapped, and its core runs the whole sequence on those heads: the same FLOPs, no ring. A Mamba
  layer instead trades its sequence shard for a share of the heads by all-to-alls before the conv and after the
  scan, not overlapped; a hybrid's MLP and MoE layers communicate nothing over CP; a Gated DeltaNet layer trades
  sequence for heads by blocking all-to-alls around its recurrence (Megatron-Core 0.18+);
- experts: the routed experts' GEMMs at `grouped_gemm_fraction` of what a dense GEMM of their shape reaches
  (grouped / per-expert kernels, per-expert FP8 scaling); a latent MoE's experts, dispatch and token passes
  move latent-sized tokens, and its two projections (whole on every TP rank) are dense GEMMs; the HBM passes over
  each token's top-k copies and the experts' casts are moe_terms.py's (`moe_token_passes`);
- kernels: every kernel a layer runs costs a fixed time beyond its work (latency.py; fitted): a few dozen per
  dense layer, hundreds per MoE layer with one GEMM and one FP8 cast per local expert;
- moe_fixed: the alltoall dispatcher's host sync of a MoE layer and the launches after it the host paces
  (moe_terms.py, latency.py); the expert GEMMs also pay their partly filled last wave of tiles on the GPU's SMs;
- ep_comm: token dispatch + combine all-to-all forward and backward on MoE layers; with the flex dispatcher
  a token crosses to each remote NVLink domain once; with the all-to-all overlap each all-to-all hides only
  under the compute Megatron pairs it with, and slows that compute by the SMs its kernels hold (moe_terms.py);
- pp_comm: activation / gradient p2p between stages (scatter-gather: / TP), per model chunk; blocking
  under 1F1B, overlapped with compute under the interleaved schedule;
- pp_bubble: (pp-1)/vpp micro-batch times (Narayanan et al. 2021 Sec. 2.2). The slowest stage sets
  the rhythm (m of its micro-batches); filling and draining the pipeline adds one micro-batch of
  every other stage, so with unequal stages (an uneven split, the output layer on the last one)
  the bubble is the sum of the other stages' times, / vpp;
- dp_comm: gradient reduce-scatter (fp32) + parameter all-gather (bf16) with the distributed optimizer,
  an fp32 all-reduce without it; with overlap only what outlasts the last micro-batch's backward
  (forward for the all-gather) of stage 0 is exposed (stage 0 finishes last); under the interleaved schedule
  each model chunk syncs on its own, behind the later chunks' cooldown backwards; what hides still holds the SMs
  of NCCL's channels, so the compute beside it slows by that share of its length (`latency.NCCL_COLLECTIVE_SMS`);
- cpu_offload: `--cpu-offloading-num-layers` copies each offloaded layer's activations to host memory during the
  next layers' forward and back during the later layers' backward (`GPUSpec.host_link_gbps`, PCIe or a Grace
  superchip's NVLink-C2C, at `HOST_COPY_EFFICIENCY`); a copy longer than its layer's forward (backward) is exposed;
- optimizer: Adam reads/writes ~32 B per local shard parameter at HBM bandwidth; Muon adds its Newton-Schulz
  GEMMs on each rank's weight blocks (every DP rank with `muon`, a 1/DP share with `dist_muon`) and all-reduces
  its gradients (without overlap under plain `muon`, as Megatron requires).

Step = m x (slowest stage's micro-batch time, with cpu_offload) + bubble + exposed dp_comm + optimizer.
MFU = model FLOPs / (step time x world x dense peak of the precision used).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import lru_cache

from megapilot.estimate import comm, host_ops
from megapilot.estimate.attention_bounds import attention_core_bound
from megapilot.estimate.coverage import CalibrationCoverage, ErrorBand, band_of, coverage_for
from megapilot.estimate.efficiency import (
    CALIBRATED,
    EIGHT_BIT_PRECISIONS,
    EfficiencyParams,
    attention_time_s,
    elementwise_time_s,
    gemm_time_s,
)
from megapilot.estimate.flops import (
    FlopConvention,
    attention_core_flops,
    dsa_indexer_score_flops,
    flops_per_step,
    layer_attention_core_flops,
)
from megapilot.estimate.latency import (
    GRAPH_LAUNCH_GAP_S,
    GRAPH_SAVES_PER_KERNEL_S,
    NCCL_COLLECTIVE_SMS,
    CastKernels,
    layer_kernel_parts,
    sm_contended_exposed_s,
    sm_count,
    sm_share,
    unfused_rope,
)
from megapilot.estimate.mamba_mixer import context_parallel_all_to_all_bytes, mixer_kernels_s_per_token
from megapilot.estimate.memory import (
    layer_activation_bytes,
    layer_kinds,
    mamba_mixer_inner_bytes,
    moe_flags,
    offloaded_layer_bytes,
    shard_params,
)
from megapilot.estimate.moe_terms import (
    CLAMP_FORWARD_BYTES_PER_VALUE,
    a2a_overlap_runs,
    ep_leaves_domain,
    expert_all_to_all_s,
    expert_epilogue_passes_s,
    expert_mlp_wave_slowdown,
    expert_rht_unfused_shares,
    flex_dispatched,
    moe_a2a_overlapped,
    moe_fixed_s,
    moe_token_passes_s,
    overlapped_all_to_all_exposed_s,
)
from megapilot.estimate.params import pipeline_stages, stage_layer_indices
from megapilot.estimate.passes import ACTIVATION_BYTES, BACKWARD_SHARE, FORWARD_SHARE, PASSES_PER_FORWARD_BACKWARD
from megapilot.estimate.quantization import (
    BF16_BYTES,
    CALIBRATED_FP8_FLAVOUR,
    cast_kernels,
    layer_linears,
    layer_recipe_delta_s,
    mixer_linears,
)
from megapilot.spec.cuda_graphs import CudaGraphs, LayerPart
from megapilot.spec.hardware import ClusterSpec, GPUSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.pipeline import LOSS, MTP, PipelineSplit, StageWeights
from megapilot.spec.training import Optimizer, QuantFlavour, TrainingSpec
from megapilot.spec.validate import tp_comm_overlap_runs

TP_OVERLAP_HIDDEN_FRACTION = 0.8
PARAM_GATHER_BYTES = 2
ADAM_STEP_BYTES_PER_PARAM = 32  # read param, grad, m, v (16 B) and write param, m, v + bf16 copy (16 B)
# A GEMM of shape (m, k, n) does m*k*n multiply-adds (2 FLOPs each) in the forward and twice that in
# the backward (input and weight gradients): 6 m k n FLOPs per training step.
TRAIN_FLOPS_PER_MULTIPLY_ADD = 6
# Copies between HBM and pinned host memory reach about 80 % of the link's nominal rate (PCIe packet headers and
# flow control take the rest); taken for NVLink-C2C too. A stated constant, not fitted.
HOST_COPY_EFFICIENCY = 0.8
# Megatron-FSDP gathers each layer's weights for its forward and again for its backward.
FSDP_GATHERS_PER_MICROBATCH = 2
# Sequence-parallel TP: 4 all-gathers + 4 reduce-scatters of the layer activation per layer and
# micro-batch (Korthikanti Sec. 4.2.2); a recomputed forward repeats its 4, half as many again.
TP_COLLECTIVES_PER_LAYER = 8
TP_RECOMPUTE_COMM_FACTOR = 1.5
# RoPE in PyTorch ops (`latency.unfused_rope`), bytes per rotated value beyond the fused kernel's 8 (2 + 2 forward,
# 2 + 2 backward): forward t x cos (2 + 2), the half negated (1 + 1) and the halves concatenated (2 + 2), x sin
# (2 + 2), the sum (4 + 2), the final concatenation (2 + 2); backward the two products (2 + 2 each), the negation
# (1 + 1), the chunk's gradient concatenated (2 + 2), the branches' sum (4 + 2), the slice's gradient (zeros 2, copy
# 2 + 2): 50 bytes in all (models/common/embeddings/rope_utils.py, `_apply_rotary_pos_emb_bshd`).
UNFUSED_ROPE_BYTES_PER_VALUE = 50 - 8
GROUPED_GEMM_TILE_ROWS = 128  # rows of a CTA tile of the grouped GEMM kernels (cuBLAS/CUTLASS 128 x N tiles)
# Ring attention moves K and V in the forward and K, V, dK, dV in the backward: three K/V-sized passes.
CP_RING_KV_PASSES = 3
# Each micro-batch's activation goes forward and its gradient comes back, per model chunk.
PP_MESSAGES_PER_CHUNK = 2
# HBM bytes per logit of Megatron's vocab-parallel cross-entropy (`tensor_parallel/cross_entropy.py`), forward +
# backward, each step a kernel of its own over the [tokens x vocab / TP] logits: the fp32 copy of the bf16 logits
# (2 read + 4 written), their max (4), the in-place subtraction of it (4 + 4), exp (4 + 4), the sum (4), the
# division into the softmax it keeps (4 + 4); backward, the product with the loss gradient (4 + 4) and the cast
# back to bf16 for the output layer's backward GEMMs (4 + 2). A property of the kernels, not of the glue fit.
CROSS_ENTROPY_BYTES_PER_LOGIT = 52
# HBM bytes per s x s score element of the unfused attention core, forward + backward: the softmax reads the
# scores and writes the probabilities (2 + 2 bytes, 16-bit), dropout reads them and writes the dropped ones and its
# 1-byte mask (5); backward, dropout reads the gradient and the mask and writes (5), the softmax's backward reads the
# gradient and the probabilities and writes (6). The GEMMs' own reads and writes are in their roofline.
UNFUSED_SCORE_BYTES = 20
# A linear mixer's sequence-to-heads all-to-alls under CP (Gated DeltaNet's, the Mamba-2 mixer's) run in the forward
# and mirrored in the backward.
CP_HEAD_EXCHANGE_DIRECTIONS = 2
# HBM bytes per score of Transformer Engine's UnfusedDotProductAttention with a softmax offset (TE 2.8-2.10,
# dot_product_attention/backends.py): the sink column concatenated to the scores (2 + 2); with s + 1 columns the fused
# softmax kernel is refused (its column count must be a multiple of 8) and PyTorch runs it in fp32: the cast up
# (2 + 4), the in-place mask (4 + 1 + 4), softmax (4 + 4), the cast down (4 + 2), the sink column sliced off as a view
# (attention dropout 0: no kernel); backward the slice's gradient (zeros 2, copy 2 + 2), the casts (2 + 4, 4 + 2),
# the softmax's (4 + 4 + 4) and the mask's (4 + 1 + 4) gradients.
TE_UNFUSED_SINK_SCORE_BYTES = 4 + 6 + 9 + 8 + 6 + 6 + 6 + 12 + 9 + 6
# Bytes per score of Megatron-Core's local attention core on a CPU (the embedded trainer: fp32, attention dropout 0,
# which torch returns unchanged on CPU): `attention_mask_func`'s in-place masked_fill_ (4 + 1 + 4) and the torch
# softmax `FusedScaleMaskSoftmax` falls back to (4 + 4); backward the softmax's gradient (4 + 4 + 4) and the mask's
# (masked_fill of the gradient: 4 + 1 + 4).
HOST_UNFUSED_SCORE_BYTES = 9 + 8 + 12 + 9
# Side of the score blocks a fused attention kernel computes whole (masking inside a block): FlashAttention-2's
# forward and backward tile head dim 64 and 128 as 128 x 128 / 128 x 64 blocks (`Flash_fwd_kernel_traits<64, 128, 128,
# 4>`, csrc/flash_attn/src/flash_fwd_launch_template.h); cuDNN does not publish its tiles and is taken alike.
ATTENTION_TILE = 128

BREAKDOWN_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble", "dp_comm",
                   "optimizer")


@dataclass(frozen=True)
class EstimateOptions:
    """Run features the layout does not say (all on in current Megatron-LM recipes)."""

    tp_comm_overlap: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # MoE: the flex dispatcher (DeepEP / HybridEP, `--moe-token-dispatcher-type flex`) instead of alltoall: True =
    # on every layout, None = on the layouts whose expert group leaves the NVLink domain (the planner's choice where
    # a backend runs: Megatron's MoE guide pairs cross-node EP with DeepEP / HybridEP); the expert all-to-all
    # overlap (`--overlap-moe-expert-parallel-comm`): True = on wherever Megatron allows it, None = on where the
    # EP group also leaves the NVLink domain. Both off by default, as in Megatron.
    moe_flex_dispatcher: bool | None = False
    moe_a2a_overlap: bool | None = False
    # `--moe-use-legacy-grouped-gemm`: one CUTLASS grouped GEMM for all local experts instead of Transformer
    # Engine's one cuBLAS GEMM per expert (Megatron's default with `--moe-grouped-gemm`).
    moe_legacy_grouped_gemm: bool = False
    # The attention core as a fused flash kernel (Transformer Engine / FlashAttention: Megatron from 2023 on), or
    # False: Megatron-LM's attention before it (2021-22 releases), which writes every head's s x s scores to HBM
    # and runs softmax and dropout over them as kernels of their own (`_unfused_attention_core_s`).
    flash_attention: bool = True
    # Attention sinks (a learnable or off-by-one softmax offset, GPT-OSS) in Transformer Engine's FusedAttention,
    # which serves them from cuDNN 9.13.1 on (TE >= 2.8, `get_attention_backend` and `nvte_get_fused_attn_backend`;
    # FlashAttention never does), or False: an older cuDNN, where TE runs UnfusedDotProductAttention over the whole
    # s x s square (`_unfused_attention_core_s` at `TE_UNFUSED_SINK_SCORE_BYTES`).
    fused_sink_attention: bool = True
    # CUDA graphs (`--cuda-graph-impl`, `--cuda-graph-scope`): the kernels of the captured parts cost the eager
    # `kernel_overhead_s` less the launch gap a graph saves (`latency.GRAPH_SAVES_PER_KERNEL_S`). None: all eager.
    cuda_graphs: CudaGraphs | None = None
    efficiency: EfficiencyParams = CALIBRATED


@dataclass(frozen=True)
class StepTime:
    """Seconds per step by term, and the throughput that follows."""

    step_time_s: float
    breakdown_s: dict[str, float]
    model_flops_per_step: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    exposed_comm_fraction: float
    warnings: list[str] = field(default_factory=list)
    # The published runs behind this estimate (its calibrated cell, or the nearest); outside all: a warning.
    coverage: CalibrationCoverage | None = None
    # The 80 % band of predicted / true - 1 (coverage.error_band): the interval of tokens/s around this estimate.
    band: ErrorBand | None = None

    def tokens_interval(self) -> tuple[float, float] | None:
        """(p10, p90) of tokens/s/GPU, or None without a band."""
        return None if self.band is None else self.band.tokens_interval(self.tokens_per_s_per_gpu)


@dataclass(frozen=True)
class LayerCost:
    """Per-micro-batch seconds of one layer (or stage) on one GPU, by term."""

    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0

    # Term by term, written out: the planner adds and scales these hundreds of thousands of times.
    def __add__(self, other: LayerCost) -> LayerCost:
        return LayerCost(self.compute + other.compute, self.recompute + other.recompute,
                         self.tp_comm + other.tp_comm, self.cp_comm + other.cp_comm, self.ep_comm + other.ep_comm)

    def scaled(self, k: float) -> LayerCost:
        return LayerCost(self.compute * k, self.recompute * k, self.tp_comm * k, self.cp_comm * k, self.ep_comm * k)

    def _values(self) -> tuple[float, ...]:
        return (self.compute, self.recompute, self.tp_comm, self.cp_comm, self.ep_comm)

    @property
    def total(self) -> float:
        return sum(self._values())


# ---- one layer ---------------------------------------------------------------------------------


def _gemm_s(m: float, k: float, n: float, gpu: GPUSpec, precision: str, eff: EfficiencyParams) -> float:
    """Forward + backward seconds of a GEMM of shape (m, k, n): [m x k] @ [k x n]."""
    return gemm_time_s(TRAIN_FLOPS_PER_MULTIPLY_ADD * m * k * n, m, k, n, gpu, precision, eff)


def _mlp_gemms_s(
    model: ModelSpec, tokens: float, ffn: int, shard: int, cluster: ClusterSpec, precision: str,
    eff: EfficiencyParams, width: int | None = None,
) -> float:
    """Forward + backward GEMMs of an MLP of width `ffn` split `shard` ways, for `tokens` rows of `width` (h unless
    given: a latent MoE's routed experts)."""
    if ffn == 0:
        return 0.0
    h, gpu = model.hidden_size if width is None else width, cluster.gpu
    up_width = ffn * (2 if model.gated_mlp else 1) / shard
    down_width = ffn / shard
    up = _gemm_s(tokens, h, up_width, gpu, precision, eff)
    down = _gemm_s(tokens, down_width, h, gpu, precision, eff)
    return up + down


def _compressor_gemms_s(model: ModelSpec, layer_index: int, tokens: float, gpu: GPUSpec,
                        eff: EfficiencyParams) -> float:
    """DeepSeek-V4's KV compressor projections of layer `layer_index` (none on a window-only layer), forward +
    backward, whole on every rank and at the 16-bit rate in any recipe (Megatron-LM dev builds them duplicated,
    outside FP8)."""
    return sum(_gemm_s(tokens, n_in, n_out, gpu, "bf16", eff) for n_in, n_out in model.compressor_projections(
        layer_index))


def _hyper_connection_gemms_s(model: ModelSpec, tokens: float, tp: int, gpu: GPUSpec, eff: EfficiencyParams) -> float:
    """The hyper-connections' two mixing projections of a layer (n streams x h -> n^2 + 2n, kept in fp32, priced
    at the 16-bit rate as the router's logits are), forward + backward; 0 without hyper-connections. Their reads
    and writes of the n streams are the layer's glue (its stored activations hold the streams)."""
    return sum((_gemm_s(tokens / tp, n_in, n_out, gpu, "bf16", eff)
                for n_in, n_out in model.hyper_connection_projections()), 0.0)


def _mixer_gemms_s(model: ModelSpec, layer_index: int, tokens: float, tp: int, cluster: ClusterSpec, precision: str,
                   eff: EfficiencyParams) -> float:
    """The sequence mixer's projections (quantization.mixer_linears), forward + backward."""
    linears = mixer_linears(model, layer_index, tp, tokens)
    return sum(_gemm_s(m, k, n, cluster.gpu, precision, eff) for m, k, n in linears)


# The compute terms `layer_terms` names (their sum is a layer's compute), then its other per-micro-batch terms.
COMPUTE_TERMS = ("mixer_gemms", "mixer_core", "mlp_gemms", "router", "latent_projections", "experts",
                 "shared_experts", "moe_token_passes", "moe_fixed", "glue", "kernels")
LAYER_TERMS = COMPUTE_TERMS + ("recompute", "tp_comm", "cp_comm", "ep_comm")


def layer_terms(
    model: ModelSpec,
    layer_index: int,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    options: EstimateOptions,
    *,
    recomputed: bool,
) -> dict[str, float]:
    """Seconds one GPU spends on one layer for one micro-batch (forward + backward), term by term.

    mixer_gemms / mixer_core: the attention projections and fused core (a Mamba mixer's projections, and its
    conv, scan and norm kernels);
    mlp_gemms: a dense MLP; router, latent_projections, experts, shared_experts, moe_token_passes: a MoE block's
    router GEMM, a latent MoE's h -> latent -> h projections, routed experts, shared experts and the HBM passes
    over each token's top-k copies; glue: memory-bound elementwise work; recompute; tp/cp/ep_comm: exposed
    communication. A heterogeneous layer (`layer_blocks`) runs only the attention and MLP its block keeps."""
    p, eff, precision, gpu = parallel, options.efficiency, training.precision, cluster.gpu
    h = model.hidden_size
    tokens = p.mbs * training.seq_length / p.cp
    kind = model.layer_kind(layer_index)
    block = model.layer_block(layer_index)
    terms = dict.fromkeys(LAYER_TERMS, 0.0)
    per_expert_tokens = 1.0  # rows each local expert computes (a MoE layer's, below)
    core_flops = layer_attention_core_flops(model, layer_index, training.seq_length)
    # The causal core over a CP rank's chunk: its tokens attend on average to half the sequence, which
    # the per-token core FLOPs (at the full sequence length) already account for. TP splits the heads, but
    # DeepSeek Sparse Attention's indexer scores every token on every TP rank.
    whole_on_every_rank = dsa_indexer_score_flops(model, training.seq_length) \
        if model.has_attention(layer_index) and model.runs_dsa_indexer(layer_index) else 0.0
    if not _runs_unfused_attention(model, layer_index):  # MLA, DSA, Gated DeltaNet: their counted FLOPs
        softmax_flops = (core_flops - whole_on_every_rank) * attention_core_bound(model, layer_index, gpu)
        terms["mixer_core"] = attention_time_s((softmax_flops / p.tp + whole_on_every_rank) * tokens, gpu, eff)
    elif gpu.host_op_s:  # a CPU rank: Megatron-Core's local core, unfused, in fp32
        # its softmax and mask are element-wise work, priced per element with the layer's (glue, below)
        terms["mixer_core"] = _unfused_attention_core_s(model, training, p, gpu, eff,
                                                        0.0 if gpu.host_element_s else HOST_UNFUSED_SCORE_BYTES)
    elif not options.flash_attention:  # a plain softmax attention before flash kernels
        terms["mixer_core"] = _unfused_attention_core_s(model, training, p, gpu, eff)
    elif model.softmax_type != "vanilla" and not options.fused_sink_attention:  # sinks on a cuDNN before 9.13.1
        terms["mixer_core"] = _unfused_attention_core_s(model, training, p, gpu, eff, TE_UNFUSED_SINK_SCORE_BYTES)
    else:  # a plain softmax attention: its fused kernel's tiles and bytes
        terms["mixer_core"] = _fused_attention_core_s(model, layer_index, training, p, gpu, eff)
    if kind in ("transformer", "attention"):
        terms["mixer_gemms"] = _mixer_gemms_s(model, layer_index, tokens, p.tp, cluster, precision, eff) \
            + _compressor_gemms_s(model, layer_index, tokens, gpu, eff) \
            + _hyper_connection_gemms_s(model, tokens, p.tp, gpu, eff)
    if kind == "mamba":
        terms["mixer_gemms"], terms["mixer_core"] = _mamba_mixer_s(model, training, p, cluster, eff)
    elif kind == "attention":
        pass
    elif model.is_moe_layer(layer_index):
        moe = model.moe
        assert moe is not None
        # padded to capacity, an expert computes and receives capacity_factor x its even share (padding included)
        routed_tokens = tokens * moe.expert_load_factor
        per_expert_tokens = max(1.0, moe.tokens_per_expert(tokens, tp=p.tp, ep=p.ep, expert_tp=p.expert_tp))
        local_experts = moe.num_experts / p.ep
        # A grouped GEMM tiles each expert's rows on its own: a partly filled last tile costs a full one.
        padded = math.ceil(per_expert_tokens / GROUPED_GEMM_TILE_ROWS) * GROUPED_GEMM_TILE_ROWS
        width = moe.routed_width(h)
        terms["experts"] = local_experts * _mlp_gemms_s(
            model, padded, moe.moe_ffn_hidden_size, p.expert_tp, cluster, precision, eff, width
        ) / eff.grouped_gemm_fraction * expert_mlp_wave_slowdown(model, padded, p, gpu)
        if moe.latent_size is not None:  # h -> latent before the dispatch, latent -> h after the combine
            terms["latent_projections"] = (_gemm_s(tokens / p.tp, h, width, gpu, precision, eff)
                                           + _gemm_s(tokens / p.tp, width, h, gpu, precision, eff))
        terms["shared_experts"] = _mlp_gemms_s(
            model, tokens, moe.shared_expert_ffn_hidden_size, p.tp, cluster, precision, eff)
        terms["router"] = _gemm_s(tokens / p.tp, h, moe.num_experts, gpu, "bf16", eff)  # logits kept 16-bit
        terms["moe_token_passes"] = moe_token_passes_s(model, gpu, p, routed_tokens, training.quant_flavour,
                                                       per_expert_tokens) \
            + expert_epilogue_passes_s(model, gpu, p, routed_tokens, fp32_probs=flex_dispatched(cluster, p, options))
        terms["ep_comm"] = expert_all_to_all_s(model, cluster, p, options, routed_tokens)
        expert_casts = _cast_kernels(model, layer_index, p, training.quant_flavour, per_expert_tokens)[1]
        terms["moe_fixed"] = moe_fixed_s(model, cluster, p, options, precision, terms, expert_casts)
    elif block.mlp == "full":
        terms["mlp_gemms"] = _mlp_gemms_s(model, tokens, model.layer_ffn_hidden_size(layer_index), p.tp, cluster,
                                          precision, eff)
    elif block.mlp == "linear":  # a heterogeneous layer's MLP replaced by one h -> h linear
        terms["mlp_gemms"] = _gemm_s(tokens, h, h / p.tp, gpu, precision, eff)
    if gpu.host_element_s:  # a CPU rank's thread: per element written, not per byte (host_ops)
        terms["glue"] = host_ops.layer_elements(model, layer_index, p, training.seq_length) * gpu.host_element_s
    else:
        terms["glue"] = elementwise_time_s(_glue_bytes(model, layer_index, p, tokens), gpu, eff)
    if kind in ("transformer", "attention") and block.attention == "full" and unfused_rope(model):
        terms["glue"] += _unfused_rope_s(model, layer_index, gpu, p, tokens)
    # An FP8 recipe other than the calibrated current scaling: its own casts and GEMM rate (quantization.py).
    gemms_s = terms["mixer_gemms"] + terms["mlp_gemms"] + terms["experts"] + terms["shared_experts"]
    terms["glue"] += layer_recipe_delta_s(model, layer_index, training, p, gpu, tokens, gemms_s)
    dense_casts, expert_casts = _cast_kernels(model, layer_index, p, training.quant_flavour, per_expert_tokens)
    if gpu.host_op_s:  # ops in line with the host's thread (a CPU rank), not kernels queued ahead
        terms["kernels"] = host_ops.layer_ops(model, layer_index) * gpu.host_op_s
    else:
        terms["kernels"] = _kernels_s(layer_kernel_parts(
            model, layer_index, p.ep, eight_bit=precision in EIGHT_BIT_PRECISIONS,
            per_expert_gemms=not options.moe_legacy_grouped_gemm, cast_kernels=dense_casts,
            expert_cast_kernels=expert_casts), options.cuda_graphs, eff)
    compute_s = sum(terms[name] for name in COMPUTE_TERMS)

    tp_s = _tp_comm_s(model, cluster, p, options, tokens, training.precision)
    if kind != "transformer":
        tp_s /= 2  # one block per hybrid layer: half a transformer layer's collectives
    else:
        tp_s *= block.sublayers / 2  # a removed sublayer communicates nothing
    if model.has_attention(layer_index) and model.mla is None:
        tp_s += _qkv_gather_s(model, cluster, p, tokens, model.layer_kv_heads(layer_index))
    if p.recompute == "full" and recomputed:
        terms["recompute"] = compute_s / PASSES_PER_FORWARD_BACKWARD
        tp_s *= TP_RECOMPUTE_COMM_FACTOR
    elif p.recompute == "selective":
        terms["recompute"] = _selective_recompute_s(model, layer_index, terms, p, gpu, tokens, precision, eff)
    if terms["ep_comm"] and moe_a2a_overlapped(model, cluster, p, options):
        terms["ep_comm"] = overlapped_all_to_all_exposed_s(terms, gpu)
    terms["tp_comm"] = tp_s
    if kind == "mamba":
        terms["cp_comm"] = _mamba_cp_all_to_alls_s(model, cluster, p, tokens)
    elif model.is_linear_attention_layer(layer_index):
        terms["cp_comm"] = _gated_delta_net_cp_s(model, cluster, p, tokens)
    elif block.attention == "full" and kind in ("transformer", "attention"):  # a hybrid MLP or MoE layer: none
        if p.cp_comm_type == "a2a":
            terms["cp_comm"] = _attention_cp_all_to_alls_s(model, cluster, p, tokens,
                                                           model.layer_kv_heads(layer_index))
            if (recomputed and p.recompute == "full") or "core_attn" in p.recomputed_modules:
                # the rerun forward (Megatron checkpoints TE's DotProductAttention whole) repeats its all-to-alls
                terms["recompute"] += terms["cp_comm"] / CP_HEAD_EXCHANGE_DIRECTIONS
        else:
            terms["cp_comm"] = _cp_comm_exposed_s(model, cluster, p, tokens, terms["mixer_core"],
                                                  model.layer_kv_heads(layer_index))
    return terms


def _glue_bytes(model: ModelSpec, layer_index: int, p: ParallelConfig, tokens: float) -> float:
    """The stored bytes the memory-bound glue is priced on (`elementwise_passes` passes over them): the layer's
    activations, less a Mamba mixer's inner tensors, which the mixer's own kernels read and write
    (`_mamba_mixer_s`); its norm input and GEMM inputs stay, as on every layer."""
    stored = layer_activation_bytes(model, layer_index, p, tokens)
    if model.layer_kind(layer_index) == "mamba":
        stored -= mamba_mixer_inner_bytes(model) / p.tp * tokens
    return stored


def _gated_delta_net_cp_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, tokens: float) -> float:
    """A Gated DeltaNet layer under CP trades sequence for heads: an all-to-all of in_proj's output (q, k, v, z, beta,
    alpha) before the conv and delta rule and one of the normed output after them, each again for the gradient in
    the backward, blocking (Megatron-Core 0.18's GatedDeltaNet.forward, tensor_a2a_cp2hp / tensor_a2a_hp2cp)."""
    gdn = model.gated_delta_net
    if p.cp == 1 or gdn is None:
        return 0.0
    return _cp_head_exchange_s(cluster, p, tokens * (gdn.in_proj_width + gdn.value_width) / p.tp * ACTIVATION_BYTES)


def _cp_head_exchange_s(cluster: ClusterSpec, p: ParallelConfig, sent_bytes: float) -> float:
    """A linear mixer's all-to-alls between sequence shards and head shards over the CP group (its ranks TP apart),
    `sent_bytes` per rank each way, forward and again backward, blocking."""
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, p.cp, stride=p.tp)
    return CP_HEAD_EXCHANGE_DIRECTIONS * comm.all_to_all_s(sent_bytes, p.cp, bandwidth)


def _attention_cp_all_to_alls_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, tokens: float,
                                kv_heads: int) -> float:
    """a2a context parallelism on a softmax-attention layer (Transformer Engine 2.8-2.11's
    AttnFuncWithCPAndQKVOA2A): before the core, each of q, k and v goes from this rank's sequence shard of its TP
    rank's heads to the whole sequence of cp-th of them, and the output goes back after it; the backward sends dO
    before its core and dq, dk, dv after. TE starts the three all-to-alls together and reorders each one's chunks
    on its CP stream while the next is in flight, but the core waits for all of them, and nothing else runs beside
    the output's: all exposed. (The sinks' per-head offsets go the same way: negligible.) A KV head TP replicates
    is one per rank. No extra memory: TE keeps the exchanged q, k, v and output for the backward, the size of the
    shards a p2p ring keeps."""
    q_heads = model.num_attention_heads / p.tp
    kv_per_rank = max(1.0, kv_heads / p.tp)
    sent_bytes = tokens * 2 * (q_heads + kv_per_rank) * model.head_dim * ACTIVATION_BYTES  # q and out, k and v
    return _cp_head_exchange_s(cluster, p, sent_bytes)


def _selective_recompute_s(model: ModelSpec, layer_index: int, terms: dict[str, float], p: ParallelConfig,
                           gpu: GPUSpec, tokens: float, precision: str, eff: EfficiencyParams) -> float:
    """The forward passes `--recompute-modules` rerun in the backward (memory.recomputed_bytes_per_token says
    what each drops): the attention core; the norms that are modules of their own (a read and a write of the
    activation each); MLA's up-projection GEMMs; a dense MLP's GEMMs; a MoE layer whole (its GEMMs, the forward
    halves of its token passes and fixed costs, and its dispatch and combine all-to-alls once more), or its
    experts' activation function (a pass over each routed copy's gate and up outputs), or its shared experts."""
    modules, h = p.recomputed_modules, model.hidden_size
    third = 1 / PASSES_PER_FORWARD_BACKWARD
    kind = model.layer_kind(layer_index)
    moe_layer = model.is_moe_layer(layer_index) and kind in ("transformer", "moe")
    # a Mamba mixer has no core_attn to rerun (Megatron-Core's MambaMixer checkpoints nothing of its own)
    seconds = terms["mixer_core"] * third if "core_attn" in modules and kind != "mamba" else 0.0
    if "layernorm" in modules and kind in ("transformer", "moe") and model.layer_blocks is None:
        norms = int(model.mla is not None and kind == "transformer") + int(moe_layer)
        seconds += gpu.hbm_time_s(norms * 2 * BF16_BYTES * h * tokens / (p.tp if p.sequence_parallel else 1))
    if "mla_up_proj" in modules and model.mla is not None and kind == "transformer":
        mla, heads = model.mla, model.num_attention_heads
        q_up = _gemm_s(tokens, mla.q_lora_rank, heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim) / p.tp, gpu,
                       precision, eff) if mla.q_lora_rank is not None else 0.0
        kv_up = _gemm_s(tokens, mla.kv_lora_rank, heads * (mla.qk_head_dim + mla.v_head_dim) / p.tp, gpu,
                        precision, eff) if mla.csa is None else \
            _gemm_s(tokens, h, mla.v_head_dim, gpu, precision, eff)  # DeepSeek-V4: its one K=V head, from h
        seconds += (q_up + kv_up) * third
    if "mlp" in modules and not moe_layer:
        seconds += terms["mlp_gemms"] * third
    if moe_layer and "moe" in modules:
        moe_s = (terms["experts"] + terms["shared_experts"] + terms["router"] + terms["latent_projections"]) * third
        seconds += moe_s + (terms["moe_token_passes"] + terms["moe_fixed"] + terms["ep_comm"]) / 2
        seconds += terms["kernels"] * third  # its forward's kernels (most of a MoE layer's), priced as a third
    elif moe_layer and model.moe is not None:
        if "shared_experts" in modules:
            seconds += terms["shared_experts"] * third
        if "moe_act" in modules:
            moe = model.moe
            copies = tokens * moe.router_topk * moe.expert_load_factor * p.expert_tp / p.tp
            gated = 2 if model.gated_mlp else 1
            seconds += gpu.hbm_time_s(copies * (gated + 1) * BF16_BYTES * moe.moe_ffn_hidden_size / p.expert_tp)
            if model.activation_clamp is not None and model.gated_mlp:  # the clamp reruns inside the checkpoint
                seconds += gpu.hbm_time_s(copies * gated * moe.moe_ffn_hidden_size / p.expert_tp
                                          * CLAMP_FORWARD_BYTES_PER_VALUE)
    return seconds


def _unfused_rope_s(model: ModelSpec, layer_index: int, gpu: GPUSpec, p: ParallelConfig, tokens: float) -> float:
    """What RoPE in PyTorch ops (`latency.unfused_rope`) moves beyond the fused kernel the glue fit stands for, over
    the rotated q and k values of a RoPE layer (`UNFUSED_ROPE_BYTES_PER_VALUE`; none on a NoPE or linear-attention
    layer; MLA rotates its q heads' and its one shared key's positional parts)."""
    if not model.has_softmax_core(layer_index) \
            or (model.no_rope_freq is not None and (layer_index + 1) % model.no_rope_freq == 0):
        return 0.0
    if model.mla is not None:
        rotated = (model.num_attention_heads / p.tp + 1) * model.mla.qk_pos_emb_head_dim
    else:
        heads = (model.num_attention_heads + model.layer_kv_heads(layer_index)) / p.tp
        rotated = heads * model.head_dim * model.rotary_percent
    return gpu.hbm_time_s(tokens * rotated * UNFUSED_ROPE_BYTES_PER_VALUE)


def _runs_unfused_attention(model: ModelSpec, layer_index: int) -> bool:
    """Whether the pre-flash attention path prices this layer's core: a plain softmax attention (MLA, DSA and Gated
    DeltaNet came with the fused kernels and have no unfused history to price)."""
    return model.has_softmax_core(layer_index) and model.mla is None and model.dsa is None


def _fused_attention_core_s(model: ModelSpec, layer_index: int, training: TrainingSpec, p: ParallelConfig,
                            gpu: GPUSpec, eff: EfficiencyParams) -> float:
    """Forward + backward of the fused (flash) attention kernel of a plain softmax-attention layer: the slower of its
    tiles at the attention rate and its HBM bytes (`fused_attention_bytes_per_token`) at the HBM roofline.

    The kernel computes whole `ATTENTION_TILE` x `ATTENTION_TILE` blocks of scores, masking inside a block. A causal
    layer is priced at its causal FLOPs: the attention fraction was fitted on such layers, so it absorbs their
    half-masked diagonal blocks. A sliding-window layer computes every block its window touches: it is priced as the
    causal layer times its share of the causal layer's blocks (`window_block_share`), so a 128-token window costs
    two blocks per row of blocks (256 keys per query), not its 127 mean keys. A learnable or off-by-one softmax
    offset (attention sinks) adds one logit per row inside the same kernel (Transformer Engine's FusedAttention with
    cuDNN >= 9.13.1): nothing measurable. Llama 4's chunks keep their FLOPs count (a block-diagonal mask)."""
    s = training.seq_length
    tokens = p.mbs * s / p.cp
    window = model.attention_window(layer_index)
    if window is None or window >= s or model.attention_chunk_size == window:
        flops = layer_attention_core_flops(model, layer_index, s)
    else:
        flops = attention_core_flops(model, s) * window_block_share(window, s)
    compute_s = attention_time_s(flops * attention_core_bound(model, layer_index, gpu) / p.tp * tokens, gpu,
                                 eff)
    return max(compute_s, gpu.hbm_time_s(fused_attention_bytes_per_token(model, layer_index, p) * tokens))


def window_block_share(window: int, seq_length: int, tile: int = ATTENTION_TILE) -> float:
    """The share of a causal layer's score blocks (tile x tile, aligned on the diagonal) a sliding window of `window`
    tokens computes: row of blocks k touches min(k + 1, m) blocks, m = ceil((window - 1) / tile) + 1."""
    rows = math.ceil(seq_length / tile)
    reach = min(rows, math.ceil((window - 1) / tile) + 1)
    windowed = reach * (reach + 1) / 2 + (rows - reach) * reach
    return windowed / (rows * (rows + 1) / 2)


def fused_attention_bytes_per_token(model: ModelSpec, layer_index: int, p: ParallelConfig) -> float:
    """HBM bytes per query token of a fused attention layer's kernels, forward + backward, per GPU (heads / TP):
    forward reads Q, K, V and writes O and the fp32 row statistics; the backward's preprocess reads O and dO and
    writes their fp32 row dot; its main kernel reads Q, K, V, dO and both statistics and writes dK, dV and dQ as fp32
    partial sums, which the last kernel reads and writes as bf16 (FlashAttention-2's backward, the four kernels
    `latency.ATTENTION_CORE_KERNELS` counts). With CP a rank reads every rank's K and V."""
    d = model.head_dim
    q_heads = model.num_attention_heads / p.tp
    kv_heads = model.layer_kv_heads(layer_index) / p.tp
    per_q_value = 2 * (2 + 2 + 2) + (4 + 4 + 2)  # Q read twice, O written and read, dO read twice; dQ's fp32 out, in
    # K (or V) read forward and backward, every CP rank's on the p2p ring (a2a: the whole sequence of cp-th of the
    # heads, read once); dK (or dV) written
    per_kv_value = 2 * 2 * (p.cp if p.cp_comm_type == "p2p" else 1) + 2
    stats_per_head = 4 * 4  # the log-sum-exp and the dO.O row dot: fp32, each written once and read once
    return q_heads * (d * per_q_value + stats_per_head) + 2 * kv_heads * d * per_kv_value


def _unfused_attention_core_s(model: ModelSpec, training: TrainingSpec, p: ParallelConfig, gpu: GPUSpec,
                              eff: EfficiencyParams, score_bytes: float = UNFUSED_SCORE_BYTES) -> float:
    """Forward + backward of an attention core that writes the s x s scores to HBM: Megatron-LM's before flash
    attention (`CoreAttention`, 2021-22), or Transformer Engine's `UnfusedDotProductAttention` (attention sinks on a
    cuDNN older than 9.13.1, `TE_UNFUSED_SINK_SCORE_BYTES`; a sliding window is a mask over the same square).

    Per head: Q K^T as a batched GEMM (baddbmm) that writes the s x s scores to HBM, `FusedScaleMaskSoftmax` over
    them (the causal mask applied inside, every element computed), dropout on the probabilities, and a second
    batched GEMM over the values; the backward mirrors each. The GEMMs run over the whole square (no causal skip) at
    the GEMM rate of their (s, d, s) and (s, s, d) shapes; the softmax and dropout kernels are memory-bound passes
    over the scores (`score_bytes` per score)."""
    s, d = training.seq_length, model.head_dim
    ring = p.cp_comm_type == "p2p"
    rows = s / p.cp if ring else s  # a CP rank's queries against every key (a2a: every query of cp-th of the heads)
    heads = p.mbs * model.num_attention_heads / p.tp / (1 if ring else p.cp)
    precision = "bf16"  # the 16-bit recipes of that era; quantised recipes never ran this path
    gemms = heads * (_gemm_s(rows, d, s, gpu, precision, eff) + _gemm_s(rows, s, d, gpu, precision, eff))
    passes = gpu.hbm_time_s(heads * rows * s * score_bytes)
    return gemms + passes


def _kernels_s(parts: dict[LayerPart, float], graphs: CudaGraphs | None, eff: EfficiencyParams) -> float:
    """The fixed cost of a layer's kernels: eager ones at the fitted overhead, those a CUDA graph replays at it
    less the launch gap the graph saves (`latency.GRAPH_SAVES_PER_KERNEL_S`), never below the graph's own gap."""
    graphed = sum(count for part, count in parts.items() if graphs is not None and graphs.captures(part))
    eager = sum(parts.values()) - graphed
    replayed_s = min(eff.kernel_overhead_s, max(GRAPH_LAUNCH_GAP_S, eff.kernel_overhead_s - GRAPH_SAVES_PER_KERNEL_S))
    return eff.kernel_overhead_s * eager + replayed_s * graphed


def layer_cost(
    model: ModelSpec,
    layer_index: int,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    options: EstimateOptions,
    *,
    recomputed: bool,
) -> LayerCost:
    """Seconds one GPU spends on one layer for one micro-batch (forward + backward): `layer_terms` summed."""
    terms = layer_terms(model, layer_index, cluster, training, parallel, options, recomputed=recomputed)
    return LayerCost(sum(terms[name] for name in COMPUTE_TERMS), terms["recompute"], terms["tp_comm"],
                     terms["cp_comm"], terms["ep_comm"])


def _cast_kernels(model: ModelSpec, layer_index: int, p: ParallelConfig, flavour: QuantFlavour | None,
                  per_expert_tokens: float) -> tuple[CastKernels, CastKernels]:
    """Kernels that quantise one tensor (a GEMM input, an output gradient) for the layer's dense linears and for its
    routed experts (quantization.cast_kernels), FP8 recipes all counted as current scaling."""
    counted = CALIBRATED_FP8_FLAVOUR if flavour is not None and flavour.startswith("fp8-") else flavour
    dense: CastKernels = (cast_kernels(counted, "activation"), cast_kernels(counted, "grad"))
    if not model.is_moe_layer(layer_index) or counted != "nvfp4":
        return dense, dense
    input_share, grad_share = expert_rht_unfused_shares(model, p, counted, per_expert_tokens)
    return dense, (cast_kernels(counted, "activation", input_share), cast_kernels(counted, "grad", grad_share))


def _mamba_mixer_s(model: ModelSpec, training: TrainingSpec, p: ParallelConfig, cluster: ClusterSpec,
                   eff: EfficiencyParams) -> tuple[float, float]:
    """(in_proj + out_proj GEMMs, the mixer's other kernels) of one Mamba-2 mixer, forward + backward.

    Between the projections Megatron runs the causal conv1d, the chunked SSD scan's Triton kernels and the group
    RMSNorm, forward and backward (mamba_mixer.py lists them with their sources): each is priced on its own
    roofline, from the bytes it reads and writes and its FLOPs."""
    assert model.mamba is not None
    mamba, h, gpu, precision = model.mamba, model.hidden_size, cluster.gpu, training.precision
    tokens = p.mbs * training.seq_length / p.cp
    heads, inner = mamba.heads(h), mamba.inner_size(h)
    in_width = (2 * inner + 2 * mamba.num_groups * mamba.state_dim + heads) / p.tp
    out_width = inner / p.tp
    gemms = _gemm_s(tokens, h, in_width, gpu, precision, eff) + _gemm_s(tokens, out_width, h, gpu, precision, eff)
    per_token_s = mixer_kernels_s_per_token(model, p.tp, p.cp, p.mbs, training.seq_length, sm_count(gpu), gpu, eff)
    return gemms, per_token_s * tokens


def _mamba_cp_all_to_alls_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, tokens: float) -> float:
    """Context parallelism on a Mamba layer: the sequence-to-heads all-to-alls around the conv and the scan
    (`mamba_mixer.context_parallel_all_to_all_bytes`), forward and again backward. Nothing overlaps them: the conv
    waits for the first, out_proj for the last."""
    if p.cp == 1:
        return 0.0
    return _cp_head_exchange_s(cluster, p, context_parallel_all_to_all_bytes(model, p.tp, p.cp) * tokens)


def _tp_comm_s(
    model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions, tokens: float,
    precision: str,
) -> float:
    """8 ring AG/RS (or 4 AR) of the [tokens x h] bf16 activation per layer; part hidden with overlap, where it runs
    (CUDA only, not under NVFP4: `tp_comm_overlap_runs`; those runs and their scripts go without it)."""
    if p.tp == 1:
        return 0.0
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, p.tp)
    total = TP_COLLECTIVES_PER_LAYER * comm.all_gather_s(tokens * model.hidden_size * ACTIVATION_BYTES, p.tp, bandwidth)
    overlaps = options.tp_comm_overlap and tp_comm_overlap_runs(cluster.gpu, p, precision)
    return total * (1 - (TP_OVERLAP_HIDDEN_FRACTION if overlaps else 0.0))


def _qkv_gather_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, tokens: float, kv_heads: int) -> float:
    """TP above the layer's KV heads: each KV head serves tp/kv_heads ranks, which all-gather the whole QKV output
    ([tokens x (heads, the output gate's too, + 2 kv_heads) x head_dim]) over the TP group in the forward to pick
    their query heads and reduce-scatter its gradient in the backward (Megatron-Core's
    Attention.get_query_key_value_tensors, core_v0.16.0 on), outside Transformer Engine's userbuffers overlap."""
    if kv_heads >= p.tp:
        return 0.0
    query_and_gate = model.num_attention_heads * (2 if model.attention_output_gate else 1)
    width = (query_and_gate + 2 * kv_heads) * model.head_dim
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, p.tp)
    return 2 * comm.all_gather_s(tokens * width * ACTIVATION_BYTES, p.tp, bandwidth)


def _cp_comm_exposed_s(
    model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, tokens: float, core_s: float, kv_heads: int
) -> float:
    """Ring-attention K/V traffic beyond what the attention core hides (`kv_heads`: the layer's)."""
    if p.cp == 1:
        return 0.0
    if model.mla is not None:
        kv_width = model.num_attention_heads * (model.mla.qk_head_dim + model.mla.qk_pos_emb_head_dim
                                                + model.mla.v_head_dim) / 2
    else:
        kv_width = kv_heads * model.head_dim
    kv_bytes = tokens * 2 * kv_width * ACTIVATION_BYTES / p.tp  # K and V
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, p.cp, stride=p.tp)
    traffic_s = CP_RING_KV_PASSES * (p.cp - 1) * comm.p2p_s(kv_bytes, bandwidth)
    return max(0.0, traffic_s - core_s)


# ---- stages, pipeline, data parallel -------------------------------------------------------------


def _recomputed_layers(
    recompute: str, method: str, num_layers: int | None, vpp: int, layers_in_stage: int
) -> set[int]:
    """Positions (within the stage) whose forward is re-run under full recompute."""
    if recompute != "full":
        return set()
    if method == "block" and num_layers:
        chunk = layers_in_stage // vpp
        return {c * chunk + i for c in range(vpp) for i in range(min(num_layers, chunk))}
    return set(range(layers_in_stage))


def _output_cost(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, p: ParallelConfig, eff: EfficiencyParams
) -> float:
    """Logits GEMM + cross-entropy of one output head (the loss rank's, or one MTP module's), per micro-batch."""
    tokens = p.mbs * training.seq_length / p.cp
    vocab = model.padded_vocab_size(p.tp) / p.tp
    h, gpu = model.hidden_size, cluster.gpu
    gemm = _gemm_s(tokens, h, vocab, gpu, training.precision, eff)
    if gpu.host_element_s:  # a CPU rank: the loss and the embedding's element-wise work, per element
        return gemm + host_ops.micro_batch_elements(model, p, training.seq_length) * gpu.host_element_s \
            + host_ops.micro_batch_ops(model) * gpu.host_op_s
    cross_entropy = gpu.hbm_time_s(tokens * vocab * CROSS_ENTROPY_BYTES_PER_LOGIT)
    return gemm + cross_entropy + host_ops.micro_batch_ops(model) * gpu.host_op_s


@lru_cache(maxsize=64)
def attention_windows(model: ModelSpec) -> tuple[Hashable, ...]:
    """Each layer's attention window (None: global) with its kind as the memory model tells kinds apart (hybrid
    blocks, a heterogeneous layer's block, Gated DeltaNet or attention, a DSA indexer of its own or a shared
    top-k): layers differing in any of them cost apart."""
    kinds = layer_kinds(model)

    def key(i: int) -> Hashable:
        window = model.attention_window(i) if model.layer_kind(i) in ("transformer", "attention") else None
        return window, kinds[i][1]
    return tuple(key(i) for i in range(model.num_layers))


# A layer's cost kind: (holds MoE, its attention window, recomputed). Layers of a kind cost the same, so every cost
# cache is keyed by it.
LayerKind = tuple[bool, Hashable, bool]


def layer_cost_kind(model: ModelSpec, layer_index: int, recomputed: bool = False) -> LayerKind:
    return moe_flags(model)[layer_index], attention_windows(model)[layer_index], recomputed


# Layer costs shared across layouts: a layer's cost depends on TP, CP (and its comm type), EP, ETP, MBS, SP and
# recompute (granularity and modules) only (and, when the expert all-to-all overlap is left to the layout, on whether
# PP > 1 runs without VPP), which thousands of the planner's layouts (differing in PP, VPP, DP, splits) share. Keyed
# by the inputs' identities; each entry keeps the inputs alive, so an id is never reused while its entry stands.
_LAYER_COST_CACHE: dict[tuple[object, ...], tuple[object, object, object, object, LayerCost]] = {}
_LAYER_COST_CACHE_SIZE = 16384


def _shared_layer_cost(
    model: ModelSpec, layer_index: int, kind: LayerKind, cluster: ClusterSpec,
    training: TrainingSpec, p: ParallelConfig, options: EstimateOptions,
) -> LayerCost:
    """The cost of a layer of `kind` (moe, attention window, recomputed): layers of a kind cost the same."""
    key = (id(model), id(cluster), id(training), id(options), kind, p.tp, p.cp, p.cp_comm_type, p.ep,
           p.expert_tp, p.mbs, p.recompute, p.recompute_modules, p.sequence_parallel,
           (p.pp == 1 or p.vpp > 1) if options.moe_a2a_overlap is not False else None)  # Megatron's VPP rule
    entry = _LAYER_COST_CACHE.get(key)
    if entry is not None and entry[0] is model and entry[1] is cluster and entry[2] is training \
            and entry[3] is options:
        return entry[4]
    cost = layer_cost(model, layer_index, cluster, training, p, options, recomputed=kind[2])
    if len(_LAYER_COST_CACHE) >= _LAYER_COST_CACHE_SIZE:
        _LAYER_COST_CACHE.clear()
    _LAYER_COST_CACHE[key] = (model, cluster, training, options, cost)
    return cost


def stage_costs(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
    options: EstimateOptions,
) -> list[LayerCost]:
    """Per-micro-batch cost of every pipeline rank (layers of the same kind are costed once, ranks holding the same
    layers once)."""
    p = parallel
    cache: dict[LayerKind, LayerCost] = {}

    def cost_of(kind: LayerKind, layer_index: int) -> LayerCost:
        cost = cache.get(kind)
        if cost is None:
            cost = cache[kind] = _shared_layer_cost(model, layer_index, kind, cluster, training, p, options)
        return cost

    plan = _stage_compositions(model, p.pp, p.vpp, p.pipeline_split, p.recompute, p.recompute_method,
                               p.recompute_num_layers)
    distinct = [_composition_cost(composition, cost_of, model, cluster, training, p, options)
                for composition in plan.compositions]
    return [distinct[i] for i in plan.rank_composition]


def stage_time_weights(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
    options: EstimateOptions,
) -> StageWeights:
    """Each pipeline-layout item's time per micro-batch on this layout (its TP, CP, EP, MBS; no recompute), in units
    of the mean decoder layer: the weights a layout string is balanced by where the layout is known.

    FLOPs alone misjudge the items: an MoE layer spends far more time per FLOP (its all-to-all, token passes,
    grouped GEMMs and kernels) than the loss's one wide logits GEMM, so a FLOP-balanced cut of DeepSeek-V3 gives
    the MTP module and the loss a stage of their own and one stage an extra layer, where the time-balanced cut
    puts a layer beside them and every other stage even. The embedding is a lookup: weight 0, as in the FLOPs."""
    p = parallel

    def layer_s(layer_index: int) -> float:
        kind = layer_cost_kind(model, layer_index)
        return _shared_layer_cost(model, layer_index, kind, cluster, training, p, options).total

    layers = [layer_s(i) for i in range(model.num_layers)]
    unit = sum(layers) / len(layers)
    head = _output_cost(model, cluster, training, p, options.efficiency)
    mtp = head + sum(layer_s(i) for i in model.mtp_layer_indices) if model.mtp_num_layers else 0.0
    return StageWeights(decoder=tuple(x / unit for x in layers), embedding=0.0, loss=head / unit, mtp=mtp / unit)


def _composition_cost(
    composition: StageComposition, cost_of: Callable[[LayerKind, int], LayerCost],
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, p: ParallelConfig, options: EstimateOptions,
) -> LayerCost:
    """One rank's layers (summed term by term: the planner's hottest sum), its loss and its MTP modules."""
    compute = recompute = tp_comm = cp_comm = ep_comm = 0.0
    for kind, layer_index, count in composition.kinds:
        c = cost_of(kind, layer_index)
        compute += c.compute * count
        recompute += c.recompute * count
        tp_comm += c.tp_comm * count
        cp_comm += c.cp_comm * count
        ep_comm += c.ep_comm * count
    total = LayerCost(compute, recompute, tp_comm, cp_comm, ep_comm)
    if composition.loss:
        total = total + LayerCost(compute=_output_cost(model, cluster, training, p, options.efficiency))
    if composition.mtp_kinds is not None:  # each MTP module: its layers (like the last, or a hybrid's pattern), logits
        module = LayerCost(compute=_output_cost(model, cluster, training, p, options.efficiency))
        for kind, index in composition.mtp_kinds:
            module = module + cost_of(kind, index)
        total = total + module.scaled(model.mtp_num_layers)
    return total


@dataclass(frozen=True)
class StageComposition:
    """What one pipeline rank runs per micro-batch: (layer kind, a layer of it, how many), whether it holds the loss,
    and the kinds of the MTP modules' layers when it holds them."""

    kinds: tuple[tuple[LayerKind, int, int], ...]
    loss: bool
    mtp_kinds: tuple[tuple[LayerKind, int], ...] | None


@dataclass(frozen=True)
class StagePlan:
    """The distinct rank compositions of a layout, and which of them each pipeline rank runs."""

    compositions: tuple[StageComposition, ...]
    rank_composition: tuple[int, ...]


@lru_cache(maxsize=4096)
def _stage_compositions(
    model: ModelSpec, pp: int, vpp: int, split: PipelineSplit, recompute: str, recompute_method: str,
    recompute_num_layers: int | None,
) -> StagePlan:
    """Every rank's composition, found once per (model, split, recompute): the planner costs thousands of
    layouts that differ only in sizes the composition does not depend on."""
    stages = pipeline_stages(model, pp, vpp, split)
    mtp_kinds = tuple((layer_cost_kind(model, i), i) for i in model.mtp_layer_indices)
    distinct: dict[StageComposition, int] = {}
    rank_composition = []
    for stage in range(pp):
        layers = stages.decoder_layers(stage)
        recomputed = _recomputed_layers(recompute, recompute_method, recompute_num_layers, vpp, len(layers))
        kinds: dict[LayerKind, tuple[int, int]] = {}  # -> (a layer of that kind, how many)
        for position, layer_index in enumerate(layers):
            key = layer_cost_kind(model, layer_index, position in recomputed)
            first, count = kinds.get(key, (layer_index, 0))
            kinds[key] = (first, count + 1)
        composition = StageComposition(
            kinds=tuple((key, first, count) for key, (first, count) in kinds.items()),
            loss=stage == stages.rank_of(LOSS), mtp_kinds=mtp_kinds if stage == stages.rank_of(MTP) else None)
        rank_composition.append(distinct.setdefault(composition, len(distinct)))
    return StagePlan(compositions=tuple(distinct), rank_composition=tuple(rank_composition))


def _cpu_offload_s(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, p: ParallelConfig, options: EstimateOptions
) -> float:
    """Exposed seconds per micro-batch of `--cpu-offloading-num-layers`: each offloaded layer's activations go to
    host memory while the following layers run their forward and come back while the later layers run their
    backward; what a layer's copy takes beyond its own forward (backward) the next one waits for."""
    offloaded = offloaded_layer_bytes(model, training, p)
    if not offloaded:
        return 0.0
    bandwidth = cluster.gpu.host_link_gbps * 1e9 * HOST_COPY_EFFICIENCY
    exposed = 0.0
    for index, stored in offloaded:
        compute = _shared_layer_cost(model, index, layer_cost_kind(model, index), cluster, training, p, options).compute
        copy_s = stored / bandwidth
        exposed += max(0.0, copy_s - FORWARD_SHARE * compute) + max(0.0, copy_s - BACKWARD_SHARE * compute)
    return exposed


def _pp_comm_s(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, p: ParallelConfig, microbatch_compute_s: float
) -> float:
    """Exposed activation/gradient p2p per micro-batch (scatter-gather: / TP).

    1F1B sends and receives block the stage. The interleaved schedule posts them asynchronously
    (Megatron's default `overlap_p2p_comm`), so they hide under the next chunk's compute and only
    traffic beyond that compute is exposed.
    """
    if p.pp == 1:
        return 0.0
    # (hyper-connections send every residual stream: Megatron contracts them only after the last layer)
    message = p.mbs * training.seq_length / p.cp * model.hidden_size * model.residual_streams * ACTIVATION_BYTES / p.tp
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, 2, stride=p.tp * p.cp * p.dp)
    traffic_s = PP_MESSAGES_PER_CHUNK * p.vpp * comm.p2p_s(message, bandwidth)
    return traffic_s if p.vpp == 1 else max(0.0, traffic_s - microbatch_compute_s)


def _dp_comm_s(
    model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions, stage0_microbatch_s: float,
    num_microbatches: int, training: TrainingSpec,
) -> tuple[float, float]:
    """(exposed seconds, total seconds) of the gradient reduction and parameter gather of stage 0. Muon
    all-reduces the gradients; Megatron refuses to overlap that with plain `muon`, and `dist_muon` all-gathers
    the weights each rank updated (its layer-wise shard) after the step, exposed (the launch script does not
    ask Megatron to overlap it: 0.16 refuses that). What hides still holds NCCL's SMs while the compute beside it
    runs (`latency.sm_contended_exposed_s`)."""
    shard = shard_params(model, p, 0)
    dense, expert = shard.dense + shard.replicated, shard.expert
    grad_bytes, optimizer = training.main_grad_bytes, training.optimizer
    dense_group, expert_group = p.dp * p.cp, p.expert_dp
    bandwidth = comm.group_bandwidth_bytes_per_s(cluster, p.cp * p.dp, stride=p.tp)
    share = sm_share(NCCL_COLLECTIVE_SMS, cluster.gpu)
    # The expert-DP ring is priced on the dense ring's links. Its ranks lie EP x ETP apart (Megatron's expert grid
    # orders ETP, EP, then expert-DP), so with the expert group filling a node it really crosses on one NIC per
    # node; priced so and refitted, the leave-one-family-out median worsens (bench/calibration/physics.md), so it
    # is left out.
    if p.distributed_optimizer or p.fsdp:
        reduce_s = comm.reduce_scatter_s(dense * grad_bytes, dense_group, bandwidth) + comm.reduce_scatter_s(
            expert * grad_bytes, expert_group, bandwidth)
        gather_s = comm.all_gather_s(dense * PARAM_GATHER_BYTES, dense_group, bandwidth) + comm.all_gather_s(
            expert * PARAM_GATHER_BYTES, expert_group, bandwidth)
        if p.fsdp:
            return _fsdp_exposed_s(reduce_s, gather_s, options, stage0_microbatch_s, num_microbatches,
                                   model.num_layers, share)
    else:
        reduce_s = comm.all_reduce_s(dense * grad_bytes, dense_group, bandwidth) + comm.all_reduce_s(
            expert * grad_bytes, expert_group, bandwidth)
        gather_s = 0.0
        if optimizer == "dist_muon":
            gather_s = comm.all_gather_s(dense * PARAM_GATHER_BYTES, dense_group, bandwidth) + comm.all_gather_s(
                expert * PARAM_GATHER_BYTES, expert_group, bandwidth)
    reduce_hides = options.overlap_grad_reduce and optimizer != "muon"  # Megatron refuses it with plain muon
    gather_hides = options.overlap_param_gather and optimizer == "adam"  # dist_muon's: from Megatron-LM 0.17 on
    backward_s = BACKWARD_SHARE * stage0_microbatch_s if reduce_hides else 0.0
    forward_s = FORWARD_SHARE * stage0_microbatch_s if gather_hides else 0.0
    reduce_late_s = _chunked_sync_exposed_s(reduce_s, backward_s, p.pp, p.vpp, num_microbatches)
    gather_late_s = _chunked_sync_exposed_s(gather_s, forward_s, p.pp, p.vpp, num_microbatches)
    exposed = sm_contended_exposed_s(reduce_late_s, reduce_s, share) \
        + sm_contended_exposed_s(gather_late_s, gather_s, share)
    return exposed, reduce_s + gather_s


def _chunked_sync_exposed_s(traffic_s: float, pass_s: float, pp: int, vpp: int, num_microbatches: int) -> float:
    """What of a stage's gradient reduce-scatter (or parameter all-gather) outlasts the compute it can hide under.

    Without interleaving the reduction starts with the last micro-batch's backward (`pass_s`) and what outlasts it
    is exposed. The interleaved schedule syncs each of the `vpp` model chunks on its own (megatron-core's
    `forward_backward_pipelining_with_interleaving`: a chunk's `grad_sync_func` fires after its last backward, the
    next chunk's `param_sync_func` when a chunk's first forward starts). The cooldown runs the chunks' last
    backwards chunk by chunk, `pp` micro-steps each (b / vpp apiece), so the k-th chunk from the end finishes
    k x pp + 1 micro-steps before the step does, and the collectives, queued on one stream, show as their largest
    lateness: max over k of (k + 1) x T / vpp - (k x pp + 1) x b / vpp. The gathers mirror this in the warm-up.
    With vpp = 1 it is T - b."""
    if vpp == 1:
        return max(0.0, traffic_s - pass_s)
    chunk_traffic_s, chunk_pass_s = traffic_s / vpp, pass_s / vpp
    steps_per_chunk = min(pp, max(1, num_microbatches))
    return max(0.0, max((k + 1) * chunk_traffic_s - (k * steps_per_chunk + 1) * chunk_pass_s for k in range(vpp)))


def _fsdp_exposed_s(
    reduce_s: float, gather_s: float, options: EstimateOptions, microbatch_s: float, m: int, layers: int,
    share: float,
) -> tuple[float, float]:
    """Megatron-FSDP gathers each layer's weights for the forward and again for the backward of every
    micro-batch, layer by layer, and reduce-scatters the gradients once per step, each layer's traffic
    prefetched under its neighbour's compute. What cannot hide: the first layer's gather before each
    micro-batch's forward (nothing runs before it) and the last reduce-scatter after the step's final
    backward layer - one layer's share each - plus whatever traffic outlasts the step's compute. The rest runs
    beside the compute and holds `share` of the SMs all the while (`latency.sm_contended_exposed_s`)."""
    total = FSDP_GATHERS_PER_MICROBATCH * gather_s * m + reduce_s
    if not (options.overlap_grad_reduce and options.overlap_param_gather):
        return total, total
    unhidden_edges = (m * gather_s + reduce_s) / max(1, layers)
    overlapped = total - unhidden_edges
    late = max(0.0, total - m * microbatch_s)
    return sm_contended_exposed_s(late, overlapped, share) + unhidden_edges, total


def _newton_schulz_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, optimizer: Optimizer) -> float:
    """Muon's orthogonalisation of stage 0's 2-D weights: `MUON_NS_STEPS` quintic Newton-Schulz steps per matrix
    (on each rank's TP block, Megatron's default `--muon-tp-mode blockwise`), GEMMs that run in fp32 at
    `medium` matmul precision, priced at the BF16 rate of a large GEMM. `muon` repeats it on every DP rank;
    `dist_muon` deals the matrices out over DP (the experts' over expert-DP)."""
    if optimizer == "adam":
        return 0.0
    dense, expert = newton_schulz_flops(model, p.tp, p.pp, p.vpp, p.ep, p.expert_tp, p.pipeline_split)
    if optimizer == "dist_muon":
        dense, expert = dense / (p.dp * p.cp), expert / p.expert_dp
    gpu = cluster.gpu
    rate = gpu.bf16_dense_tflops * 1e12 * CALIBRATED.gemm_peak_fraction_16bit
    return (dense + expert) / rate


MUON_NS_STEPS = 5  # --muon-num-ns-steps default
MUON_CAVEAT = ("Muon is priced from Megatron-LM's implementation (its state, its Newton-Schulz GEMMs at the BF16 rate "
               "of a large GEMM, its all-reduce); no published Muon run checks those terms")

DSA_CAVEAT = ("DeepSeek Sparse Attention is priced as Megatron-Core's fused kernels run it (--dsa-kernel-backend, "
              "core_v0.19.0 on): MLA over each query's top-k keys plus the indexer's scores over every earlier key; "
              "earlier releases run it unfused, with fp32 score matrices of every head over the whole sequence, "
              "far slower and larger than this; no published DSA run checks these terms")
CSA_CAVEAT = ("DeepSeek-V4's attention is priced as fused attention over each query's window and compressed keys, "
              "its indexer as DeepSeek Sparse Attention's over the compressed keys and its hyper-connections as "
              "their projections plus the glue over their residual streams; Megatron-LM dev (dsv4_hybrid, TP 1) "
              "runs it, no Megatron-Core release does, and no published run checks these terms")


@lru_cache(maxsize=1024)
def newton_schulz_flops(model: ModelSpec, tp: int, pp: int, vpp: int, ep: int, etp: int,
                        split: PipelineSplit) -> tuple[float, float]:
    """(dense, routed-expert) FLOPs of one Muon step's Newton-Schulz iterations on pipeline rank 0's 2-D weights,
    each as its TP / EP block: a quintic step on an m x N matrix (m <= N) is X X^T (2 m^2 N), the polynomial
    in it (2 m^3) and its product with X (2 m^2 N)."""
    layout = ParallelConfig(tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, dp=ep * etp, sequence_parallel=tp > 1,
                            first_stage_layers=split.first_stage_layers, last_stage_layers=split.last_stage_layers,
                            account_for_embedding=split.account_for_embedding,
                            account_for_loss=split.account_for_loss, pipeline_layout=split.layout)
    total = expert = 0.0
    for index in stage_layer_indices(model, pp, vpp, 0, split=split):
        total += sum(_newton_schulz_flops(k, n) for _, k, n in layer_linears(model, index, layout, 1.0))
        if model.is_moe_layer(index) and model.moe is not None:
            moe = model.moe
            width, ffn = moe.routed_width(model.hidden_size), moe.moe_ffn_hidden_size / etp
            fc1 = _newton_schulz_flops(width, ffn * (2 if model.gated_mlp else 1))
            expert += moe.num_experts // ep * (fc1 + _newton_schulz_flops(ffn, width))
    return total - expert, expert


def _newton_schulz_flops(k: float, n: float) -> float:
    m, wide = min(k, n), max(k, n)
    return MUON_NS_STEPS * (4 * m * m * wide + 2 * m ** 3)


def _optimizer_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, optimizer: Optimizer = "adam") -> float:
    """The memory-bound update of this GPU's shard of the master weights (Adam's bytes; Muon's momentum update
    moves fewer, its Newton-Schulz GEMMs are `_newton_schulz_s`)."""
    shard = shard_params(model, p, 0)
    sharded = p.distributed_optimizer or p.fsdp or optimizer == "dist_muon"
    dense = (shard.dense + shard.replicated) / (p.dp * p.cp if sharded else 1)
    expert = shard.expert / (p.expert_dp if sharded else 1)
    gpu = cluster.gpu
    update_s = host_ops.step_elements(dense + expert) * gpu.host_element_s if gpu.host_element_s \
        else gpu.hbm_time_s((dense + expert) * ADAM_STEP_BYTES_PER_PARAM)  # a CPU rank's thread: per element
    return update_s + host_ops.step_ops(model, p) * gpu.host_op_s


def step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    options: EstimateOptions = EstimateOptions(),
    *,
    convention: FlopConvention = "megatron",
) -> StepTime:
    """Seconds per global batch and the throughput figures; see the module doc for the model."""
    p = parallel
    m = p.num_microbatches(training.global_batch_size)
    stages = stage_costs(model, cluster, training, p, options)
    totals = [c.total for c in stages]
    slowest_total = max(totals)
    slowest = stages[totals.index(slowest_total)]
    pp_comm_s = _pp_comm_s(model, cluster, training, p, slowest.compute)
    offload_s = _cpu_offload_s(model, cluster, training, p, options)  # PP 1 only: the one stage is the slowest
    per_microbatch_s = slowest_total + pp_comm_s + offload_s
    other_stages_s = sum(totals) - slowest_total + (p.pp - 1) * pp_comm_s
    bubble_s = other_stages_s / p.vpp
    dp_exposed_s, _ = _dp_comm_s(model, cluster, p, options, totals[0], m, training)
    optimizer_s = _optimizer_s(model, cluster, p, training.optimizer) \
        + _newton_schulz_s(model, cluster, p, training.optimizer)
    breakdown = {
        "compute": m * slowest.compute,
        "recompute": m * slowest.recompute,
        "tp_comm": m * slowest.tp_comm,
        "cp_comm": m * slowest.cp_comm,
        "ep_comm": m * slowest.ep_comm,
        "pp_comm": m * pp_comm_s,
        "pp_bubble": bubble_s,
        "cpu_offload": m * offload_s,
        "dp_comm": dp_exposed_s,
        "optimizer": optimizer_s,
    }
    total_s = m * per_microbatch_s + bubble_s + dp_exposed_s + optimizer_s
    world = cluster.world_size
    model_flops = flops_per_step(model, training.seq_length, training.global_batch_size, convention=convention, tp=p.tp)
    tflops = model_flops / (total_s * world) / 1e12
    comm_s = sum(breakdown[k] for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"))
    coverage = coverage_for(model, cluster.gpu, training.gemm_format)
    return StepTime(
        step_time_s=total_s,
        breakdown_s=breakdown,
        model_flops_per_step=model_flops,
        tokens_per_s_per_gpu=training.tokens_per_step / (total_s * world),
        tflops_per_gpu=tflops,
        mfu=tflops / cluster.gpu.peak_tflops(training.precision),
        bubble_fraction=bubble_s / total_s,
        exposed_comm_fraction=comm_s / total_s,
        warnings=_warnings(breakdown, total_s, ep_advice=lambda: _ep_advice(model, cluster, training, p, options),
                           fabric=cluster.gpu.scaleup_fabric)
        + ([coverage.statement()] if coverage.needs_caveat else []) + ([MUON_CAVEAT] if training.uses_muon else [])
        + ([CSA_CAVEAT] if model.csa is not None else [DSA_CAVEAT] if model.dsa is not None else []),
        coverage=coverage,
        band=band_of(coverage),
    )


# (breakdown term, share of the step above which it is worth a warning, its name in words, advice after it)
_STEP_SHARE_WARNINGS = (
    ("pp_bubble", 0.15, "pipeline bubble", ": raise the global batch, use interleaving (--vpp) or lower pp"),
    ("dp_comm", 0.10, "exposed data-parallel communication", ""),
    ("ep_comm", 0.20, "expert all-to-all", ""),  # its advice is the layout's (`_ep_advice`)
    ("tp_comm", 0.15, "tensor-parallel communication", ""),
    ("cpu_offload", 0.10, "waiting on activation copies to host memory",
     ": offload fewer layers (--cpu-offloading-num-layers) or recompute some instead"),
)
# An expert group already inside the NVLink domain cannot move closer: what is left is hiding its all-to-all.
_EP_INSIDE_DOMAIN_ADVICE = (": it runs inside the {fabric} domain already; --overlap-moe-expert-parallel-comm (with "
                            "VPP when pp > 1) hides it behind another micro-batch's compute")
_EP_OVERLAPPED_INSIDE_ADVICE = ": it runs inside the {fabric} domain and overlapped already"
# One leaving the domain can come back inside it, or be hidden where Megatron allows the overlap on the layout (the
# published recipes that spread experts over nodes run the overlap).
_EP_ACROSS_ADVICE = ": keep ep*etp inside the {fabric} domain"
_EP_ACROSS_OVERLAP_ADVICE = (", or hide it behind another micro-batch's compute (--overlap-moe-expert-parallel-comm, "
                             "off here)")


def _ep_advice(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, p: ParallelConfig,
               options: EstimateOptions) -> str:
    """What the expert all-to-all warning advises: the lever the layout still has (its domain, the overlap)."""
    overlapped = model.moe is not None and moe_a2a_overlapped(model, cluster, p, options)
    if not ep_leaves_domain(cluster, p):
        return _EP_OVERLAPPED_INSIDE_ADVICE if overlapped else _EP_INSIDE_DOMAIN_ADVICE
    can_overlap = not overlapped and a2a_overlap_runs(model, training, p, options)
    return _EP_ACROSS_ADVICE + (_EP_ACROSS_OVERLAP_ADVICE if can_overlap else "")


def _warnings(breakdown: dict[str, float], total_s: float, *, ep_advice: Callable[[], str], fabric: str) -> list[str]:
    """One line per term that takes a larger share of the step than its threshold (a term left out is none);
    `ep_advice`: the expert all-to-all's (`_ep_advice`), asked only when its warning is given (every estimate of
    the planner's thousands passes here); `fabric`: the scale-up links' name
    (`GPUSpec.scaleup_fabric`)."""
    return [
        f"{words} is {breakdown[term] / total_s:.0%} of the step"
        + (ep_advice() if term == "ep_comm" else advice).format(fabric=fabric)
        for term, threshold, words, advice in _STEP_SHARE_WARNINGS
        if breakdown.get(term, 0.0) > threshold * total_s
    ]
