"""A MoE layer's own terms, per GPU and micro-batch (forward + backward); `step_time.layer_terms` prices the layer's
GEMMs (the routed and shared experts', the router's, a latent MoE's projections) and adds these to them.

- experts: the routed experts' GEMMs also pay their partly filled last wave of tiles on the GPU's SMs
  (`expert_mlp_wave_slowdown`);
- moe_token_passes: the HBM passes that move each token's top-k copies between the router and the experts, each
  expert's casts of its GEMM inputs under a quantised recipe (`moe_token_passes_s`; the NVFP4 casts' unfused Hadamard
  share, `expert_rht_unfused_shares`), and what Megatron runs around the expert GEMMs for biased experts and a
  clamped gated unit (`expert_epilogue_passes_s`);
- ep_comm: token dispatch + combine all-to-all forward and backward (`expert_all_to_all_s`); with the flex dispatcher
  a token crosses to each remote NVLink domain once; with the all-to-all overlap each all-to-all hides only under the
  compute Megatron pairs it with, and slows that compute by the SMs its kernels hold
  (`overlapped_all_to_all_exposed_s`);
- moe_fixed: the alltoall dispatcher's host sync of a MoE layer and the launches after it the host paces
  (`moe_fixed_s`, latency.py);
- which dispatcher and overlap a layout runs: `ep_leaves_domain`, `flex_dispatched`, `moe_a2a_overlapped`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megapilot.estimate import comm
from megapilot.estimate.efficiency import EIGHT_BIT_PRECISIONS
from megapilot.estimate.latency import (
    CURRENT_SCALING_CAST_KERNELS,
    CastKernels,
    expert_epilogue_flags,
    expert_wave_slowdown,
    moe_host_sync_s,
    moe_kernels,
    sm_contended_exposed_s,
    sm_count,
    sm_share,
)
from megapilot.estimate.passes import ACTIVATION_BYTES, FORWARD_SHARE
from megapilot.estimate.quantization import (
    CALIBRATED_FP8_FLAVOUR,
    NVFP4_CAST_HBM_FRACTION,
    RHT_FUSED_ROWS,
    RHT_UNFUSED_EXTRA_BYTES,
    cast_bytes_per_value,
    rht_unfused_share,
)
from megapilot.spec.cuda_graphs import cuda_graph_refusal, pads_routing_for_quantization
from megapilot.spec.hardware import ClusterSpec, GPUSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import QuantFlavour, TrainingSpec
from megapilot.spec.validate import moe_a2a_overlap_refusal

if TYPE_CHECKING:  # a type only: step_time, which defines the options, builds on this module
    from megapilot.estimate.step_time import EstimateOptions

# Token dispatch and combine, in the forward and again in the backward.
EP_ALL_TO_ALLS_PER_LAYER = 4
# SMs the expert dispatcher's kernels hold while they move tokens: DeepSeek-V3's overlapped all-to-all uses 20 of
# the H800's 132 ("only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink", DeepSeek-V3
# technical report, Sec. 3.2.2), DeepEP's default and Megatron's historical `moe_deepep_num_sms`; HybridEP takes
# DeepEP's default. Assumed the same for NCCL's all-to-all, whose channels each hold an SM's block.
ALL_TO_ALL_SMS = 20
# Permute, sort, unsort and unpermute of each token's top-k copies: 6 reads/writes forward, 6 backward.
MOE_TOKEN_PASSES = 12
# fc2's bias added expert by expert (`TEGroupedMLP._apply_bias`), bytes per value of fc2's output. With bf16 router
# probabilities (the alltoall dispatcher's): forward, bias x prob written (2), added to the output (2 + 2 read, 2
# written), the experts' pieces concatenated (2 + 2); backward, the gradient times the prob and its sum over tokens
# (2 + 2, 2) for the bias, times the bias and its sum over the width (2 + 2, 2) for the prob, and the split's
# gradient concatenated (2 + 2). The flex dispatcher hands the experts fp32 probabilities (DeepEP and HybridEP take
# only fp32: token_dispatcher.py), which promote the sum to fp32: forward 4; 2 + 4, 4; 4 + 4; the cast back 4 + 2;
# backward the cast up 2 + 4, the output's gradient cast down 4 + 2, the two products and sums at 4 bytes (12 each),
# the split 2 + 2. (Their extra casts, one per expert, are not counted as kernels.)
EXPERT_BIAS_BYTES_PER_VALUE = 28
EXPERT_BIAS_BYTES_PER_VALUE_FP32_PROBS = 28 + 40
# The gated unit's clamp (`activation_func_clamp_value`): forward each half clamped (2 read, 2 written) and the
# halves concatenated (2 + 2); backward each half's clamp gradient (gradient and input read, 2 + 2, 2 written) and the
# chunk's gradient concatenated (2 + 2). Bytes per value of fc1's output (both halves).
CLAMP_FORWARD_BYTES_PER_VALUE = 8
CLAMP_BYTES_PER_VALUE = CLAMP_FORWARD_BYTES_PER_VALUE + 10


def expert_mlp_wave_slowdown(model: ModelSpec, rows: float, p: ParallelConfig, gpu: GPUSpec) -> float:
    """Wave quantisation of the expert GEMMs (latency.py): fc1's and fc2's three GEMMs each, weighted by their
    FLOPs. The local experts' tiles share the waves: the legacy grouped GEMM tiles them in one launch, and
    Transformer Engine's streams start an expert's GEMM on the SMs its predecessors' last tiles leave free, so
    only the group's last wave is partly filled."""
    moe = model.moe
    assert moe is not None
    concurrent = moe.num_experts // p.ep
    width, ffn, sms = moe.routed_width(model.hidden_size), moe.moe_ffn_hidden_size / p.expert_tp, sm_count(gpu)
    gated = 2 if model.gated_mlp else 1
    fc1 = expert_wave_slowdown(rows, width, gated * ffn, sms, concurrent)
    fc2 = expert_wave_slowdown(rows, ffn, width, sms, concurrent)
    return (gated * fc1 + fc2) / (gated + 1)


def moe_token_passes_s(
    model: ModelSpec, gpu: GPUSpec, p: ParallelConfig, tokens: float, flavour: QuantFlavour | None,
    per_expert_tokens: float = 1.0,
) -> float:
    """HBM time of the passes that move each token's top-k copies between the router and the experts.

    Forward: permute (write k copies), sort them by local expert after the all-to-all (read + write), unsort
    (read + write), unpermute with the routing weights (read); the backward runs the same six in reverse:
    twelve passes over k copies of the token, none of them in the stored-activation glue. An ETP group
    dispatches its tokens once for the group. A quantised recipe makes each expert cast its own GEMM inputs
    (fc1's and fc2's, forward; their output gradients, backward) at quantization.py's bytes per value: plain FP8
    at the calibrated current scaling's (the step time's recipe hook adds another FP8 recipe's difference), the
    block-scaled formats at their own."""
    moe = model.moe
    assert moe is not None
    copies = tokens * moe.router_topk * p.expert_tp / p.tp
    width = moe.routed_width(model.hidden_size)
    moved = MOE_TOKEN_PASSES * copies * width * ACTIVATION_BYTES
    if flavour is not None:
        priced = CALIBRATED_FP8_FLAVOUR if flavour.startswith("fp8-") else flavour
        ffn = moe.moe_ffn_hidden_size / p.expert_tp
        gated = 2 if model.gated_mlp else 1
        inputs = width + ffn  # fc1 in, fc2 in
        grads = width + gated * ffn  # fc2 grad-out, fc1 grad-out
        casts = copies * (inputs * cast_bytes_per_value(priced, "activation", gpu.architecture)
                          + grads * cast_bytes_per_value(priced, "grad", gpu.architecture))
        if flavour == "nvfp4":  # the Hadamard casts Transformer Engine cannot fuse write and read a BF16 copy more
            input_share, grad_share = expert_rht_unfused_shares(model, p, flavour, per_expert_tokens)
            casts += copies * RHT_UNFUSED_EXTRA_BYTES * (inputs * input_share + grads * grad_share)
            casts /= NVFP4_CAST_HBM_FRACTION  # its cast kernels run below HBM speed (quantization.py)
        moved += casts
    return gpu.hbm_time_s(moved)


def expert_epilogue_passes_s(model: ModelSpec, gpu: GPUSpec, p: ParallelConfig, tokens: float, *,
                             fp32_probs: bool = False) -> float:
    """HBM time of what Megatron's TEGroupedMLP runs around the expert GEMMs when the experts have biases or a clamped
    gated unit (GPT-OSS), over each routed copy (megatron/core/transformer/moe/experts.py, core 0.15-0.16): fc1's
    bias rides in the grouped GEMM's epilogue (Transformer Engine's GroupedLinear: cuBLAS bias epilogue forward,
    its gradient in the wgrad GEMM), but fc2 returns its bias and `TEGroupedMLP._apply_bias` adds it expert by
    expert in PyTorch (`EXPERT_BIAS_BYTES_PER_VALUE` per value of fc2's output, more when the flex dispatcher's fp32
    router probabilities promote the sum); the clamp runs before the fused quick-GEGLU kernel as clamps and a
    concatenation of their own (`CLAMP_BYTES_PER_VALUE` per value of fc1's output; fusions/fused_bias_geglu.py,
    `weighted_bias_quick_geglu_impl`)."""
    moe = model.moe
    assert moe is not None
    copies = tokens * moe.router_topk * p.expert_tp / p.tp
    moved = 0.0
    if model.add_bias_linear:
        per_value = EXPERT_BIAS_BYTES_PER_VALUE_FP32_PROBS if fp32_probs else EXPERT_BIAS_BYTES_PER_VALUE
        moved += copies * moe.routed_width(model.hidden_size) * per_value
    if model.activation_clamp is not None and model.gated_mlp:
        moved += copies * 2 * moe.moe_ffn_hidden_size / p.expert_tp * CLAMP_BYTES_PER_VALUE
    return gpu.hbm_time_s(moved)


def expert_rht_unfused_shares(model: ModelSpec, p: ParallelConfig, flavour: QuantFlavour | None,
                              per_expert_tokens: float) -> tuple[float, float]:
    """The share of the experts' NVFP4 columnwise casts on Transformer Engine's unfused Hadamard path, for their GEMM
    inputs (fc1's, fc2's) and their output gradients (fc2's, fc1's), each pair weighted by width
    (quantization.rht_unfused_share): counts padded to a capacity are aligned when it is a multiple of 64."""
    moe = model.moe
    assert moe is not None
    width, ffn = moe.routed_width(model.hidden_size), moe.moe_ffn_hidden_size / p.expert_tp
    up = ffn * (2 if model.gated_mlp else 1)
    rows_aligned = per_expert_tokens % RHT_FUSED_ROWS == 0 if moe.pad_to_capacity else None

    def share(widths: tuple[float, float]) -> float:
        return sum(w * rht_unfused_share(flavour, w, rows_aligned) for w in widths) / sum(widths)

    return share((width, ffn)), share((width, up))


def expert_all_to_all_s(
    model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions, tokens: float
) -> float:
    """Dispatch + combine, forward and backward, of one MoE layer: top-k copies of each token leave the rank.

    With the flex dispatcher a token crosses to each remote NVLink domain once, however many of its experts
    sit there, and is copied to them over NVLink: the cross-domain bytes shrink to the expected number of
    domains its top-k touch (balanced routing, within the routing groups a group-limited router opens: DeepSeek-V3
    reaches at most 4 of 8 nodes) over k."""
    moe = model.moe
    assert moe is not None
    sent_bytes = tokens * moe.router_topk * moe.routed_width(model.hidden_size) * ACTIVATION_BYTES * p.expert_tp / p.tp
    share = 1.0
    ranks_per_domain = max(1, min(p.ep, comm.scaleup_domain(cluster) // p.expert_tp))
    if flex_dispatched(cluster, p, options) and p.ep > ranks_per_domain:
        domains = p.ep / ranks_per_domain
        touched = comm.expected_groups_touched(moe.num_experts, moe.router_topk, round(domains),
                                               moe.router_num_groups, moe.router_group_topk)
        share = touched / moe.router_topk
    return EP_ALL_TO_ALLS_PER_LAYER * comm.expert_all_to_all_s(
        sent_bytes, cluster, p.ep, stride=p.expert_tp, cross_domain_share=share)


def moe_fixed_s(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions,
                precision: str, terms: dict[str, float],
                cast_kernels: CastKernels = CURRENT_SCALING_CAST_KERNELS) -> float:
    """The dispatcher's host sync of one MoE layer (latency.py), where it syncs: the alltoall dispatcher syncs
    whenever tokens leave the rank or several local experts split them (Megatron's dropless path, and token
    dropping without padding); the flex dispatcher and inputs padded to capacity keep the split sizes static.
    After the sync the GPU runs the forward's dispatch, experts and combine: their forward third and the two
    forward all-to-alls."""
    moe = model.moe
    assert moe is not None
    local_experts = moe.num_experts // p.ep
    # padded to capacity the split sizes are static: Megatron's alltoall dispatcher skips the sync (drop_and_pad)
    if flex_dispatched(cluster, p, options) or moe.pad_to_capacity or (p.ep == 1 and local_experts == 1):
        return 0.0
    kernels = moe_kernels(local_experts, per_expert_gemms=not options.moe_legacy_grouped_gemm,
                          fp8_casts=precision in EIGHT_BIT_PRECISIONS, cast_kernels=cast_kernels,
                          **expert_epilogue_flags(model))
    after_sync_s = FORWARD_SHARE * (terms["experts"] + terms["moe_token_passes"]) + terms["ep_comm"] / 2
    return moe_host_sync_s(kernels, forward_after_sync_gpu_s=after_sync_s,
                           kernel_overhead_s=options.efficiency.kernel_overhead_s)


def overlapped_all_to_all_exposed_s(terms: dict[str, float], gpu: GPUSpec) -> float:
    """What the expert all-to-all still costs under `--overlap-moe-expert-parallel-comm`.

    Megatron merges one micro-batch's forward of a layer with another's backward of it and runs the
    communication on a stream of its own, in three windows (TransformerLayerSchedulePlan.run,
    megatron/core/models/common/model_chunk_schedule_plan.py):

        comm:    combine bwd       | dispatch fwd  | dispatch bwd           | combine fwd
        compute: pre-dispatch fwd  | MLP dgrad     | MLP wgrad, MLP fwd     | pre-dispatch bwd

    (the dispatch backward sends what the MLP's dgrad returns, so it waits for it; the backward's thirds are
    the dgrad and the wgrad). Each window lasts as long as the longer of its two sides: an all-to-all hides
    only under its own window's compute. And while the dispatcher's kernels run they hold SMs the compute then
    lacks (`ALL_TO_ALL_SMS`), so even a fully hidden all-to-all slows its window by that share of its length."""
    pre_dispatch = (terms["mixer_gemms"] + terms["mixer_core"] + terms["router"] + terms["latent_projections"]
                    + (terms["glue"] + terms["moe_token_passes"] + terms["kernels"]) / 2)  # permute before it
    mlp = (terms["experts"] + terms["shared_experts"] + terms["moe_fixed"]
           + (terms["glue"] + terms["moe_token_passes"] + terms["kernels"]) / 2)  # sort, unsort, unpermute
    comm = terms["ep_comm"] / EP_ALL_TO_ALLS_PER_LAYER  # one all-to-all
    third = FORWARD_SHARE  # the forward, the dgrad and the wgrad each take a third of a block's compute
    windows = ((comm, third * pre_dispatch), (comm, third * mlp), (comm, 2 * third * mlp),
               (comm, 2 * third * pre_dispatch))
    share = sm_share(ALL_TO_ALL_SMS, gpu)
    return sum(sm_contended_exposed_s(max(0.0, comm_s - compute_s), comm_s, share) for comm_s, compute_s in windows)


def ep_leaves_domain(cluster: ClusterSpec, p: ParallelConfig) -> bool:
    """Whether the expert group (EP x ETP ranks) spans more GPUs than one NVLink/xGMI domain holds."""
    return p.ep * p.expert_tp > comm.scaleup_domain(cluster)


def flex_dispatched(cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions) -> bool:
    """Whether this layout's tokens go through the flex dispatcher: always (True), never (False), or (None) where
    its expert group leaves the NVLink domain."""
    if options.moe_flex_dispatcher is None:
        return ep_leaves_domain(cluster, p)
    return options.moe_flex_dispatcher


def a2a_overlap_runs(model: ModelSpec, training: TrainingSpec, p: ParallelConfig, options: EstimateOptions) -> bool:
    """Whether Megatron runs `--overlap-moe-expert-parallel-comm` if asked on this case: the layout
    (`spec.moe_a2a_overlap_refusal`) and its CUDA graphs (Transformer Engine's moe and mlp scopes are refused beside
    it): what an advice to turn it on must check first."""
    if model.moe is None or moe_a2a_overlap_refusal(model, p) is not None:
        return False
    graphs = options.cuda_graphs
    return graphs is None or cuda_graph_refusal(
        model, p, graphs, flex_dispatcher=bool(options.moe_flex_dispatcher),
        router_padding=pads_routing_for_quantization(model, training), a2a_overlap=True) is None


def moe_a2a_overlapped(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, options: EstimateOptions) -> bool:
    """`--overlap-moe-expert-parallel-comm`: off (False); on wherever Megatron allows it (True: no full recompute,
    VPP whenever PP > 1, one MTP layer at most, `spec.moe_a2a_overlap_refusal`); or (None) on only where the
    expert group also leaves the NVLink domain."""
    if options.moe_a2a_overlap is False or moe_a2a_overlap_refusal(model, p) is not None:
        return False
    return options.moe_a2a_overlap is True or ep_leaves_domain(cluster, p)
