"""Cross-field checks of a whole layout (model x cluster x training x parallel).

Each failed rule raises `MegapilotError` naming the field and the fix, as Megatron-LM's own argument
validation would refuse the run; softer issues come back as warnings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from megapilot.errors import MegapilotError
from megapilot.spec.hardware import ClusterSpec, GPUSpec
from megapilot.spec.model import HYBRID_MAMBA, MambaSpec, ModelSpec
from megapilot.spec.parallel import CpCommType, ParallelConfig
from megapilot.spec.pipeline import DECODER, EMBEDDING, LOSS, MTP, PipelineSplit, PipelineStages
from megapilot.spec.training import FP32_GRAD_BYTES, QuantFlavour, TrainingSpec


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def validate_layout(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    *,
    allow_tp_across_nodes: bool = False,
) -> list[str]:
    """Raise MegapilotError on the first rule the layout breaks; return warnings otherwise."""
    _check_world(cluster, parallel)
    _check_tensor_parallel(model, cluster, parallel, allow_tp_across_nodes)
    _check_pipeline(model, parallel)
    # No rule against Megatron-FSDP beside PP: Megatron-Core 0.16-0.19 assert none (neither arguments.py nor the
    # FSDP adapter in megatron/core/distributed/fsdp/), so the estimate costs it; `plan.space.Pins` says why the
    # planner does not walk it.
    _check_cpu_offloading(model, parallel)
    _check_sequence(model, training)
    _check_context_parallel(model, training, parallel)
    _check_mamba(model, training)
    _check_sparse_attention(model, parallel)
    _check_experts(model, parallel)
    _check_recompute_modules(model, training, parallel)
    _check_batch(training, parallel)
    _check_precision(cluster, training)
    check_optimizer(training, parallel)
    return _warnings(model, training, parallel)


def check_optimizer(training: TrainingSpec, p: ParallelConfig) -> None:
    """Megatron-LM's arguments.py: "Muon optimizer does not support distributed optimizer for now" (nor
    Megatron-FSDP); dist_muon is Muon's own sharding over DP."""
    if training.uses_muon and (p.distributed_optimizer or p.fsdp):
        switch = "Megatron-FSDP" if p.fsdp else "the distributed optimizer"
        raise MegapilotError(f"{training.optimizer} does not run with {switch} (Megatron refuses it)",
                             field="fsdp" if p.fsdp else "distributed_optimizer",
                             fix="drop it: --optimizer dist_muon shards Muon's state over DP")


def _check_world(cluster: ClusterSpec, p: ParallelConfig) -> None:
    if p.world_size != cluster.world_size:
        raise MegapilotError(
            f"TP*PP*CP*DP = {p.tp}*{p.pp}*{p.cp}*{p.dp} = {p.world_size} but the cluster has "
            f"{cluster.world_size} GPUs ({cluster.num_nodes} nodes x {cluster.gpus_per_node})",
            field="parallel",
            fix="make the product of the parallel sizes equal the GPU count",
        )


def _check_tensor_parallel(model: ModelSpec, cluster: ClusterSpec, p: ParallelConfig, allow_across: bool) -> None:
    if (refusal := tensor_split_refusal(model, p.tp)) is not None:
        raise refusal.error
    # Megatron itself places TP anywhere; a TP group beyond the NVLink domain would run its per-layer collectives
    # over the scale-out NICs, which no recipe does, so it is costed only when asked. Inside the domain the node
    # does not matter: an NVL72 rack's 4-GPU trays share NVLink, and the estimate prices TP there.
    domain = max(cluster.gpus_per_node, cluster.scaleup_domain_gpus)
    if p.tp > domain and not allow_across:
        where = (f"{cluster.gpus_per_node} GPUs per node" if domain == cluster.gpus_per_node
                 else f"the {domain} GPUs of one NVLink domain")
        raise MegapilotError(
            f"tp={p.tp} exceeds {where}; TP all-reduces would leave NVLink",
            field="tp",
            fix=f"use tp <= {domain} (or pass --force-tp-across-nodes to cost it anyway)",
        )


def unsplittable_kv_heads(model: ModelSpec, tp: int) -> int | None:
    """A KV-head count of the model's attention layers that TP can neither split nor replicate, or None.

    Megatron-Core's TransformerConfig (core_v0.16.0 on, "Support TP greater than num_kv_heads", #2565) raises
    unless num_query_groups is a multiple or a divisor of the TP size: below TP, each KV head goes to tp/groups
    ranks, which all-gather the layer's QKV projection to pick their own query heads (Attention.
    get_query_key_value_tensors)."""
    return next((kv for kv in _kv_head_counts(model) if kv % tp and tp % kv), None)


@lru_cache(maxsize=64)  # asked for every TP the planner walks
def _kv_head_counts(model: ModelSpec) -> tuple[int, ...]:
    """The distinct KV-head counts of the model's attention layers, ascending."""
    counts = {model.kv_heads} if model.layer_blocks is None else {model.kv_heads} | {
        model.layer_kv_heads(i) for i in range(model.num_layers) if model.layer_block(i).attention == "full"}
    return tuple(sorted(counts))


def kv_splitting_tps(model: ModelSpec) -> list[int]:
    """The TP sizes that split the attention heads and split or replicate every layer's KV heads."""
    return [tp for tp in range(1, model.num_attention_heads + 1)
            if model.num_attention_heads % tp == 0 and unsplittable_kv_heads(model, tp) is None]


class SplitRule(Enum):
    """The Megatron rules by which TP and CP must split a model's heads and its sequence, each named once:
    `validate_layout` raises the refusal a broken rule gives, the planner counts the sizes it cuts under the rule's
    category (`plan.space.RejectReason`)."""

    ATTENTION_HEADS = "attention heads"
    KV_HEADS = "KV heads"
    ATTENTION_SINK = "attention sinks"
    SLIDING_WINDOW = "sliding-window attention"
    ATTENTION_HEADS_OVER_CP = "a2a context parallelism's split of a TP rank's attention heads"
    SEQUENCE_CHUNKS = "the sequence's 2 x CP chunks"
    GATED_DELTA_NET_HEADS = "Gated DeltaNet heads"
    MAMBA_HEADS = "Mamba-2 heads and groups"
    SPARSE_ATTENTION = "DeepSeek Sparse Attention"
    COMPRESSED_ATTENTION = "DeepSeek-V4's compressed attention"
    SEQUENCE_PARALLEL = "sequence parallel's split of a CP rank's sequence over TP"


@dataclass(frozen=True)
class SplitRefusal:
    """The first rule a TP or CP size breaks, and Megatron's refusal of it (field `tp` or `cp`; sequence parallel's
    `seq_length`)."""

    rule: SplitRule
    error: MegapilotError


def tensor_split_refusal(model: ModelSpec, tp: int) -> SplitRefusal | None:
    """Why TP cannot split this model's heads, or None: the attention heads, the KV heads (split or replicated),
    then the linear mixers' heads (`_mixer_head_rules`), asked in that order by `validate_layout` and by the
    planner's TP rule alike."""
    return _first_broken(_tensor_split_rules(model, tp))


def context_split_refusal(model: ModelSpec, tp: int, cp: int, *, seq_length: int,
                          cp_comm_type: CpCommType = "p2p") -> SplitRefusal | None:
    """Why CP (beside this TP, exchanging attention by `cp_comm_type`) cannot split this model's heads and its
    `seq_length`-token sequences, or None (always at cp 1): DeepSeek-V4's compressed attention takes none megapilot
    prices, attention sinks take no p2p ring, a2a splits each TP
    rank's attention heads, the sequence must cut into 2*CP chunks, then the linear mixers' heads
    (`_mixer_head_rules`), and DeepSeek Sparse Attention takes none, asked in that order by `validate_layout` and by
    the planner's CP rule alike."""
    if cp == 1:
        return None
    return _first_broken(_context_split_rules(model, tp, cp, seq_length, cp_comm_type))


def sequence_parallel_refusal(tp: int, cp: int, *, seq_length: int) -> SplitRefusal | None:
    """Why sequence parallelism cannot split a CP rank's seq_length/cp tokens over TP, or None: Megatron scatters
    them over the TP ranks, each a whole share. `validate_layout` asks it where sequence parallelism is on, the
    planner (which turns it on beside TP > 1) for every TP."""
    if (seq_length // cp) % tp == 0:
        return None
    return SplitRefusal(SplitRule.SEQUENCE_PARALLEL, MegapilotError(
        f"sequence parallel splits seq_length/cp={seq_length // cp} over tp={tp}, which does not divide it",
        field="seq_length", fix=f"use a sequence length divisible by tp*cp={tp * cp}, or a tp that divides "
                                f"{seq_length // cp}"))


_RuleCheck = tuple[SplitRule, MegapilotError | None]


def _tensor_split_rules(model: ModelSpec, tp: int) -> Iterator[_RuleCheck]:
    yield SplitRule.ATTENTION_HEADS, attention_heads_refusal(model, tp)
    yield SplitRule.KV_HEADS, kv_heads_refusal(model, tp)
    yield SplitRule.COMPRESSED_ATTENTION, compressed_attention_tp_refusal(model, tp)
    yield from _mixer_head_rules(model, tp, 1)


def _context_split_rules(model: ModelSpec, tp: int, cp: int, seq_length: int,
                         cp_comm_type: CpCommType) -> Iterator[_RuleCheck]:
    yield SplitRule.COMPRESSED_ATTENTION, compressed_attention_cp_refusal(model, cp)
    yield SplitRule.ATTENTION_SINK, sink_context_parallel_refusal(model, tp, cp, cp_comm_type)
    yield SplitRule.SLIDING_WINDOW, window_context_parallel_refusal(model, tp, cp, cp_comm_type)
    yield SplitRule.ATTENTION_HEADS_OVER_CP, a2a_context_parallel_refusal(model, tp, cp, cp_comm_type)
    yield SplitRule.SEQUENCE_CHUNKS, sequence_chunks_refusal(seq_length, cp)
    yield from _mixer_head_rules(model, tp, cp)
    yield SplitRule.SPARSE_ATTENTION, sparse_attention_context_refusal(model, cp)


def _mixer_head_rules(model: ModelSpec, tp: int, cp: int) -> Iterator[_RuleCheck]:
    """Gated DeltaNet's key and value heads, then the Mamba-2 mixer's heads and groups, over TP x CP ranks."""
    yield SplitRule.GATED_DELTA_NET_HEADS, gated_delta_net_split_refusal(model, tp, cp)
    yield SplitRule.MAMBA_HEADS, mamba_split_refusal(model, tp, cp)


def _first_broken(checks: Iterator[_RuleCheck]) -> SplitRefusal | None:
    """The first rule refused, asking each only once the ones before it passed."""
    return next((SplitRefusal(rule, error) for rule, error in checks if error is not None), None)


def attention_heads_refusal(model: ModelSpec, tp: int) -> MegapilotError | None:
    """TP splits whole attention heads (Megatron-Core's TransformerConfig asserts it)."""
    if model.num_attention_heads % tp == 0:
        return None
    return MegapilotError(f"tp={tp} does not divide num_attention_heads={model.num_attention_heads}", field="tp",
                          fix=f"use a TP from: {_divisors(model.num_attention_heads)}")


def kv_heads_refusal(model: ModelSpec, tp: int) -> MegapilotError | None:
    """TP splits whole KV groups or replicates each KV head over tp/groups ranks (`unsplittable_kv_heads`)."""
    if model.mla is not None or (kv_heads := unsplittable_kv_heads(model, tp)) is None:
        return None
    return MegapilotError(
        f"tp={tp} is neither a divisor nor a multiple of the {kv_heads} KV heads (num_query_groups); "
        "Megatron-Core splits whole KV groups over TP, or gives each KV head to tp/groups ranks "
        "(TransformerConfig raises)",
        field="tp",
        fix=f"use a TP from: {', '.join(map(str, kv_splitting_tps(model)))}",
    )


def compressed_attention_cp_refusal(model: ModelSpec, cp: int) -> MegapilotError | None:
    """DeepSeek-V4's attention under CP: Megatron-LM dev's DSv4HybridAttention takes it only over packed (THD)
    sequences split contiguously, which megapilot neither prices nor writes. Asked before the Transformer Engine
    rules (sinks, windows, a2a), which its own kernels do not follow. The refusal (field `cp`), or None."""
    if model.csa is None or cp == 1:
        return None
    return MegapilotError(
        f"cp={cp}: DeepSeek-V4's compressed attention takes context parallelism in Megatron-LM dev only over packed "
        "(THD) sequences split contiguously, which megapilot neither prices nor writes", field="cp",
        fix="use cp 1 (each query attends to a 128-token window and compressed keys; split the model with EP, PP "
            "and DP)")


def compressed_attention_tp_refusal(model: ModelSpec, tp: int) -> MegapilotError | None:
    """DeepSeek-V4's attention runs unsplit: Megatron-LM dev's DSv4HybridAttention asserts a TP group of one
    (TransformerConfig: "DSv4 Hybrid Attention only supports TP size 1"). The refusal (field `tp`), or None."""
    if model.csa is None or tp == 1:
        return None
    return MegapilotError(
        f"tp={tp}: DeepSeek-V4's compressed attention (dsv4_hybrid) runs with TP 1 only in Megatron-LM dev "
        "(DSv4HybridAttention asserts it)", field="tp",
        fix="use tp 1 and split the model with EP, PP and DP")


def _check_pipeline(model: ModelSpec, p: ParallelConfig) -> None:
    if (hybrid := hybrid_split_refusal(model, p.pp, p.vpp, p.pipeline_split)) is not None:
        raise hybrid
    try:
        stages = p.pipeline_stages(model.num_layers, model.mtp_num_layers)
    except MegapilotError as refusal:
        if model.is_hybrid and refusal.fix:  # offer only the fixes a hybrid takes (`hybrid_split_refusal`)
            refused = ("account_for", "first_stage_layers") if p.vpp > 1 else ("account_for",)
            fixes = [fix for fix in refusal.fix.split("; or ") if not fix.startswith(refused)]
            # its own type kept: `estimate` answers a NoPipelineSplit with the balanced split
            raise type(refusal)(refusal.problem, field=refusal.field, fix="; or ".join(fixes)) from None
        raise
    if p.recompute == "full" and p.recompute_num_layers:
        layers_per_chunk = max(stage.count("t") for stage in stages.stages)
        if p.recompute_method == "block" and p.recompute_num_layers > layers_per_chunk:
            raise MegapilotError(
                f"recompute_num_layers={p.recompute_num_layers} exceeds the {layers_per_chunk} layers of a stage",
                field="recompute_num_layers",
                fix=f"use at most {layers_per_chunk}",
            )


def most_offloaded_layers(num_layers: int, pp: int, recompute: str) -> int:
    """The most layers `--cpu-offloading-num-layers` may name, by Megatron-Core's TransformerConfig: fewer than
    num_layers ("CPU offloading can be done only for layers less than num_layers"), and none beside pipeline
    parallelism or recompute (ParallelConfig refuses those with Megatron's words)."""
    return num_layers - 1 if pp == 1 and recompute == "none" else 0


def _check_cpu_offloading(model: ModelSpec, p: ParallelConfig) -> None:
    most = most_offloaded_layers(model.num_layers, p.pp, p.recompute)
    if p.cpu_offloading_num_layers > most:
        raise MegapilotError(
            f"cpu_offloading_num_layers={p.cpu_offloading_num_layers} offloads every layer of {model.name} "
            f"({model.num_layers}); Megatron offloads only fewer than num_layers",
            field="cpu_offloading_num_layers", fix=f"use at most {most}")


def hybrid_split_refusal(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> MegapilotError | None:
    """Why Megatron-Core's hybrid (Mamba) stack cannot place this split, or None (always None for other models):
    from core 0.17, `|` segments of the layer pattern place its layers on the PP x VPP stages in any counts; a pattern
    without them takes --decoder-first/last-pipeline-num-layers at VPP 1 only; the account-for flags are refused
    (MambaModel's select_pipeline_segment and arguments.py raise each). A layout string stands for those segments
    here, so the embedding opens the first stage and the loss (and an MTP module) close the last, where MambaModel
    puts them. `validate_layout` and the planner's pipeline rule ask the same; a layout string must resolve."""
    if not model.is_hybrid:
        return None
    if split.account_for_embedding or split.account_for_loss:
        return MegapilotError(
            f"the hybrid Mamba model {model.name} takes no account-for-embedding/loss split: Megatron places its "
            "layers by the layer pattern's | segments (arguments.py asserts it)",
            field="account_for_embedding" if split.account_for_embedding else "account_for_loss",
            fix="drop the account-for flags; give the split as first/last stage layers or a pipeline layout")
    if vpp > 1 and (split.first_stage_layers is not None or split.last_stage_layers is not None):
        return MegapilotError(
            f"vpp={vpp} beside first/last stage layers on the hybrid Mamba model {model.name}: Megatron "
            "interleaves a hybrid only by the layer pattern's | segments, which exclude those flags",
            field="vpp", fix="give the split as a pipeline layout (--pp-layout; | segments of the pattern), or vpp=1")
    if split.layout is None:
        return None
    return hybrid_end_stages_refusal(model, split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp),
                                     f"the layout {split.layout!r}")


def hybrid_end_stages_refusal(model: ModelSpec, stages: PipelineStages, what: str) -> MegapilotError | None:
    """Why a hybrid (Mamba) stack cannot run these stages, or None: its pattern's | segments hold decoder layers only,
    and MambaModel builds the embedding on the first stage and the output, the loss and MTP on the last. `what`
    names the split in the refusal (a layout string, or the split a script writes)."""
    first, last = stages.stages[0], stages.stages[-1]
    if first.startswith(EMBEDDING) and last.endswith(LOSS) and not any(MTP in stage for stage in stages.stages[:-1]):
        return None
    return MegapilotError(
        f"{what} moves the embedding, the loss or MTP off the end stages of the hybrid Mamba model {model.name}: "
        "its pattern's | segments hold layers only, the embedding on the first stage and the output (and MTP) on "
        "the last", field="pipeline_layout", fix="start the first stage with E and put m and L in the last stage")


def check_pipeline_split(
    num_layers: int, pp: int, vpp: int = 1, first_stage_layers: int | None = None,
    last_stage_layers: int | None = None, *, mtp_num_layers: int = 0, split: PipelineSplit | None = None,
) -> None:
    """Refuse a layer split Megatron-Core would refuse (TransformerConfig.__post_init__, core 0.16).

    Even split: pp*vpp divides num_layers (plus one slot per account-for flag); otherwise the message
    lists every split that would make it legal, with a concrete example. Uneven split: the first/last
    counts are >= 1 and fit, the layers left divide over the middle ranks (there are middle layers
    exactly when there are middle ranks), and with interleaving every rank's count divides by vpp.
    Layout strings: Megatron's layout rules (see `spec.pipeline`).
    """
    if split is None:
        split = PipelineSplit(first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    split.resolve(num_layers, mtp_num_layers, pp, vpp)


def _check_sequence(model: ModelSpec, training: TrainingSpec) -> None:
    # Learned absolute positions have one embedding row per position: there is none beyond the table.
    if model.position_embedding == "learned_absolute" and training.seq_length > model.max_position_embeddings:
        raise MegapilotError(
            f"seq_length={training.seq_length} exceeds the {model.max_position_embeddings} learned position "
            f"embeddings of {model.name}",
            field="seq_length",
            fix=f"use a sequence length of at most {model.max_position_embeddings}",
        )


def _check_context_parallel(model: ModelSpec, training: TrainingSpec, p: ParallelConfig) -> None:
    """CP's rules, then sequence parallel's split of what CP leaves a rank (the order the planner's CP rule asks)."""
    refusal = context_split_refusal(model, p.tp, p.cp, seq_length=training.seq_length, cp_comm_type=p.cp_comm_type)
    if refusal is None and p.sequence_parallel:
        refusal = sequence_parallel_refusal(p.tp, p.cp, seq_length=training.seq_length)
    if refusal is not None:
        raise refusal.error


def sequence_chunks_refusal(seq_length: int, cp: int) -> MegapilotError | None:
    """Megatron's CP cuts each sequence into 2*CP chunks, two per CP rank (one early, one late: causal load
    balance), so 2*CP must divide seq_length. The refusal (field `cp`), or None."""
    if seq_length % (2 * cp) == 0:
        return None
    return MegapilotError(
        f"seq_length={seq_length} is not divisible by 2*cp={2 * cp} (CP splits each sequence into 2*CP chunks for "
        "load balance)", field="cp",
        fix=f"use a cp whose double divides {seq_length}, or a sequence length that is a multiple of {2 * cp}")


def sink_context_parallel_refusal(model: ModelSpec, tp: int, cp: int,
                                  cp_comm_type: CpCommType = "p2p") -> MegapilotError | None:
    """Attention sinks (a learnable or off-by-one softmax, GPT-OSS) under CP: Transformer Engine 2.8-2.11's
    `get_attention_backend` serves them with FusedAttention only, and under context parallelism only with
    cp_comm_type a2a (FlashAttention never takes a sink; UnfusedDotProductAttention takes none under CP;
    `attn_forward_func_with_cp` asserts "Context parallelism only supports {softmax_type=} with cp_comm_type =
    'a2a'"). Megatron's --cp-comm-type defaults to p2p, where TE finds no backend. The refusal (field
    `cp_comm_type`; the fix offers a2a where this TP x CP splits the heads for it, else cp 1), or None."""
    if cp == 1 or model.softmax_type == "vanilla" or cp_comm_type == "a2a":
        return None
    return MegapilotError(
        f"cp={cp} on {model.name}'s attention sinks (softmax_type {model.softmax_type}): Transformer Engine runs a "
        "sink under context parallelism only with --cp-comm-type a2a; the p2p ring has no attention backend",
        field="cp_comm_type", fix=_a2a_instead_fix(model, tp, cp))


def window_context_parallel_refusal(model: ModelSpec, tp: int, cp: int,
                                    cp_comm_type: CpCommType = "p2p") -> MegapilotError | None:
    """Sliding-window attention under CP: Transformer Engine 2.8-2.11's `attn_forward_func_with_cp` asserts "Context
    parallelism does not support sliding window attention with cp_comm_type='p2p'" for any window but the causal
    (-1, 0), which Megatron passes as --window-size on every layer of such a model; a2a (and all_gather, which
    megapilot does not price) take it. The refusal (field `cp_comm_type`, the fix as for sinks), or None."""
    if cp == 1 or model.sliding_window is None or cp_comm_type == "a2a":
        return None
    return MegapilotError(
        f"cp={cp} on {model.name}'s sliding-window attention (window {model.sliding_window}): Transformer Engine "
        "runs a sliding window under context parallelism only with --cp-comm-type a2a or all_gather, not the p2p "
        "ring", field="cp_comm_type", fix=_a2a_instead_fix(model, tp, cp))


def a2a_only_attention(model: ModelSpec) -> str | None:
    """What of this model's attention Transformer Engine refuses on the p2p CP ring, so that CP takes the a2a
    exchange (`sink_context_parallel_refusal`, `window_context_parallel_refusal`): "attention sinks", "a sliding
    window", or None."""
    if model.softmax_type != "vanilla":
        return "attention sinks"
    return "a sliding window" if model.sliding_window is not None else None


def needs_a2a_context_parallel(model: ModelSpec) -> bool:
    """Whether Transformer Engine refuses this model's attention on the p2p CP ring (`a2a_only_attention`)."""
    return a2a_only_attention(model) is not None


def cp_comm_type_for(model: ModelSpec, cp: int, pinned: CpCommType | None = None) -> CpCommType:
    """How a layout exchanges attention over CP where it is not told (`estimate`, `script` and the planner alike):
    the pinned way; else a2a on a model with attention sinks or a sliding window, which Transformer Engine runs
    under CP only so (`needs_a2a_context_parallel`), and Megatron's default p2p ring on every other model (the
    layouts published runs use); p2p at cp 1, where nothing is exchanged."""
    if cp == 1:
        return "p2p"
    if pinned is not None:
        return pinned
    return "a2a" if needs_a2a_context_parallel(model) else "p2p"


def _a2a_instead_fix(model: ModelSpec, tp: int, cp: int) -> str:
    """The fix for attention the p2p ring cannot run: a2a where this TP x CP splits the heads for it, else the CP
    sizes that do, else cp 1."""
    if a2a_context_parallel_refusal(model, tp, cp, "a2a") is None:
        return "use --cp-comm-type a2a (or cp 1)"
    if len(sizes := a2a_cp_sizes(model.num_attention_heads, _kv_head_counts(model), tp)) > 1:
        return f"use cp 1, or a cp from {', '.join(map(str, sizes[1:]))} with --cp-comm-type a2a"
    return f"use cp 1 (a2a splits a TP rank's heads over CP; tp={tp} leaves one KV head per rank), or a smaller tp"


def a2a_context_parallel_refusal(model: ModelSpec, tp: int, cp: int,
                                 cp_comm_type: CpCommType = "a2a") -> MegapilotError | None:
    """a2a CP (Ulysses) trades each CP rank's sequence shard for cp-th of its TP rank's heads: Transformer Engine
    2.8-2.11's AttnFuncWithCPAndQKVOA2A asserts "The number of attention heads needs to be divisible by CP size!"
    on the query heads and the KV heads a TP rank holds (num_attention_heads / tp, and num_query_groups / tp, or
    one where TP replicates each KV head, Megatron-Core's Attention), and `attn_forward_func_with_cp` asserts
    "Context parallelism does not support MLA" with it (K and V of unequal head dims). The refusal (field `cp`, or
    `cp_comm_type` for MLA), or None (always for p2p)."""
    if cp == 1 or cp_comm_type != "a2a" or not model.has_softmax_attention:
        return None
    if model.mla is not None:
        return MegapilotError(
            f"--cp-comm-type a2a on {model.name}'s multi-latent attention: Transformer Engine runs MLA under context "
            "parallelism only with p2p or a2a+p2p", field="cp_comm_type", fix="use --cp-comm-type p2p")
    return a2a_heads_split_refusal(model.num_attention_heads, _kv_head_counts(model), tp, cp,
                                   sinks=model.softmax_type != "vanilla")


def a2a_heads_split_refusal(heads: int, kv_heads: tuple[int, ...], tp: int, cp: int, *,
                            sinks: bool) -> MegapilotError | None:
    """`a2a_context_parallel_refusal` for the head counts alone (`kv_heads`: each attention layer's; what a
    hand-written script's flags say too). The fix offers p2p unless attention sinks rule it out."""
    sizes = a2a_cp_sizes(heads, kv_heads, tp)
    if cp in sizes:
        return None
    fix = f"use a cp from {', '.join(map(str, sizes))} with --cp-comm-type a2a" if len(sizes) > 1 \
        else "use cp 1, or a smaller tp with --cp-comm-type a2a"
    return MegapilotError(
        f"cp={cp} does not divide the {heads // tp} attention heads and {min(max(1, kv // tp) for kv in kv_heads)} "
        f"KV heads of a TP rank (tp={tp}); a2a context parallelism gives each CP rank whole heads (Transformer Engine "
        "asserts it)", field="cp", fix=fix + ("" if sinks else ", or --cp-comm-type p2p"))


def a2a_cp_sizes(heads: int, kv_heads: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The CP sizes a2a splits a TP rank's heads by (1 included): its query heads and the KV heads of every attention
    layer (a KV head TP replicates counts one, as Megatron-Core's Attention holds it)."""
    per_rank, kv_per_rank = heads // tp, {max(1, kv // tp) for kv in kv_heads}
    return tuple(c for c in range(1, per_rank + 1) if per_rank % c == 0 and all(kv % c == 0 for kv in kv_per_rank))


def gated_delta_net_split_refusal(model: ModelSpec, tp: int, cp: int) -> MegapilotError | None:
    """Megatron-Core's GatedDeltaNet: whole key and value heads per TP x CP rank. Its CP trades the sequence for
    heads by all-to-all (core_v0.18.0 on; 0.16 and 0.17 asserted context_parallel_size == 1), so TransformerConfig
    asserts linear_num_key_heads and linear_num_value_heads are multiples of tp * cp. The refusal (field `tp`, or
    `cp` beside CP > 1), or None."""
    gdn = model.gated_delta_net
    if gdn is None:
        return None
    ranks = tp * cp
    if gdn.key_heads % ranks or gdn.value_heads % ranks:
        sizes = f"tp={tp}" if cp == 1 else f"tp*cp={tp}*{cp}={ranks}"
        return MegapilotError(
            f"{sizes} does not divide Gated DeltaNet's {gdn.key_heads} key heads and {gdn.value_heads} value "
            "heads; Megatron shards whole heads over TP x CP", field="tp" if cp == 1 else "cp",
            fix=f"use a TP x CP from: {_divisors(gdn.key_heads)}")
    return None


def _check_mamba(model: ModelSpec, training: TrainingSpec) -> None:
    """FP8 GEMMs on the Mamba-2 mixer's input projection (its heads' split over TP and CP is a `SplitRule`)."""
    mamba = _mamba_mixer(model)
    if mamba is not None and training.precision in ("fp8", "mxfp8"):  # Megatron's config.fp8 (MXFP8 is a recipe)
        heads, inner = mamba.heads(model.hidden_size), mamba.inner_size(model.hidden_size)
        width = 2 * inner + 2 * mamba.num_groups * mamba.state_dim + heads
        if width % 16:
            raise MegapilotError(
                f"the Mamba-2 mixer's input projection is {width} wide (2 x d_inner + 2 x groups x state + heads), "
                "not a multiple of 16, which FP8 GEMMs need (MambaMixer asserts it with fp8)", field="precision",
                fix="train this model in bf16, or choose Mamba head and group sizes whose projection width is a "
                    "multiple of 16")


def _mamba_mixer(model: ModelSpec) -> MambaSpec | None:
    """The Mamba-2 mixer of a hybrid with Mamba layers in its pattern, or None."""
    return model.mamba if HYBRID_MAMBA in (model.hybrid_override_pattern or "") else None


def mamba_split_refusal(model: ModelSpec, tp: int, cp: int) -> MegapilotError | None:
    """How TP and CP may split a hybrid's Mamba-2 mixers (`mamba_heads_split_refusal`), or None without them."""
    mamba = _mamba_mixer(model)
    if mamba is None:
        return None
    return mamba_heads_split_refusal(mamba.heads(model.hidden_size), mamba.num_groups, tp, cp)


def mamba_heads_split_refusal(heads: int, groups: int, tp: int, cp: int) -> MegapilotError | None:
    """Megatron-Core's asserts (core_v0.16.0-v0.19.0) on a Mamba-2 mixer of `heads` heads (d_inner / head_dim) in
    `groups` B/C groups: the MambaMixer gives each TP rank whole heads and whole groups; MambaContextParallel then
    gives each CP rank whole heads of its TP rank's, and either whole groups (CP divides the groups per TP rank) or
    a share of one group's heads (the groups per TP rank divide CP). The refusal (field `tp` or `cp`), or None."""
    if heads % tp or groups % tp:
        return MegapilotError(
            f"tp={tp} does not divide the Mamba-2 mixer's {heads} heads and {groups} groups; MambaMixer gives "
            "each TP rank whole heads and whole groups (it asserts both)", field="tp",
            fix=f"use a TP from: {_divisors(math.gcd(heads, groups))}")
    heads_per_rank, groups_per_rank = heads // tp, groups // tp
    if cp == 1 or (heads_per_rank % cp == 0 and (groups_per_rank % cp == 0 or cp % groups_per_rank == 0)):
        return None
    fits = [c for c in range(1, heads_per_rank + 1)
            if heads_per_rank % c == 0 and (groups_per_rank % c == 0 or c % groups_per_rank == 0)]
    why = (f"does not divide the {heads_per_rank} Mamba-2 heads of a TP rank" if heads_per_rank % cp else
           f"and the {groups_per_rank} Mamba-2 groups of a TP rank do not divide one another")
    return MegapilotError(
        f"cp={cp} {why} (tp={tp}); MambaContextParallel gives each CP rank whole heads and whole groups or a "
        "share of one group (it asserts it)", field="cp", fix=f"use a CP from: {', '.join(map(str, fits))}")


def topk_sharing_refusal(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> MegapilotError | None:
    """Megatron-Core's cross-layer DSA top-k sharing stays inside a model chunk: every (virtual) pipeline stage
    must start on a layer that runs its own indexer (core_v0.19.0's _validate_dsa_index_share_pipeline_split).
    The refusal, or None where the split keeps every shared layer's source local."""
    dsa = model.dsa
    if dsa is None or dsa.topk_freq == 1:
        return None
    first = 0
    for stage in split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp).stages:
        layers = stage.count(DECODER)
        if layers and not dsa.runs_indexer(first):
            starts = [i + 1 for i in range(model.num_layers) if dsa.runs_indexer(i)]
            return MegapilotError(
                f"a pipeline stage starts at layer {first + 1}, which reuses an earlier layer's DSA top-k: "
                "Megatron-Core does not share top-k indices across pipeline stages", field="pp",
                fix=f"split so that every stage starts on a layer that runs its indexer ({_list(starts)}), e.g. with "
                    "--pipeline-model-parallel-layout, or use fewer stages")
        first += layers
    return None


def hash_layers_split_refusal(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> MegapilotError | None:
    """Megatron-LM dev's hash-routed MoE layers read the token ids, so all of them must sit in the (virtual)
    pipeline stage that holds the embedding (TransformerConfig: "All hash MoE layers must be in the same virtual
    pipeline stage as the embedding"). The refusal (field `pp`), or None."""
    hashed = model.moe.num_hash_layers if model.moe is not None else 0
    if not hashed or pp * vpp == 1:
        return None
    stages = split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp).stages
    held = next(stage.count(DECODER) for stage in stages if EMBEDDING in stage)
    if held >= hashed:
        return None
    return MegapilotError(
        f"the embedding's pipeline stage holds {held} decoder layers, but the first {hashed} are routed by token-id "
        "hash and must all sit with the embedding (Megatron-LM dev asserts it)", field="pp",
        fix=f"give the first (virtual) stage at least {hashed} layers: fewer stages, a smaller vpp, or "
            "--pipeline-model-parallel-layout")


def _list(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:12]))
    return shown + (", ..." if len(numbers) > 12 else "")


def _check_sparse_attention(model: ModelSpec, p: ParallelConfig) -> None:
    """Megatron-Core's DSAttention shares a layer's top-k only within a pipeline stage (its CP: a `SplitRule`), and
    DeepSeek-V4's hash-routed layers stay with the embedding."""
    refusal = topk_sharing_refusal(model, p.pp, p.vpp, p.pipeline_split) or hash_layers_split_refusal(
        model, p.pp, p.vpp, p.pipeline_split)
    if refusal is not None:
        raise refusal


def sparse_attention_context_refusal(model: ModelSpec, cp: int) -> MegapilotError | None:
    """Megatron-Core's DeepSeek Sparse Attention under CP: TransformerConfig asserts context_parallel_size == 1 with
    experimental_attention_variant dsa before core 0.19; 0.19 runs it only with --cp-comm-type allgather, which
    megapilot neither prices nor writes. The refusal (field `cp`), or None."""
    if model.dsa is None or cp == 1:
        return None
    return MegapilotError(
        f"cp={cp}: Megatron-Core's DeepSeek Sparse Attention has no context parallelism before core 0.19 "
        "(TransformerConfig asserts context_parallel_size == 1 with experimental_attention_variant dsa); 0.19 "
        "runs it only with --cp-comm-type allgather, which megapilot neither prices nor writes yet", field="cp",
        fix="use cp 1 (DSA's top-k already bounds each query's keys; split the sequence with TP and SP)")


def _check_experts(model: ModelSpec, p: ParallelConfig) -> None:
    if model.moe is None:
        if p.ep > 1:
            raise MegapilotError(
                f"ep={p.ep} on a dense model", field="ep", fix="use ep=1 for models without experts"
            )
    elif model.moe.num_experts % p.ep:
        raise MegapilotError(
            f"ep={p.ep} does not divide num_experts={model.moe.num_experts}",
            field="ep",
            fix=f"use an EP from: {_divisors(model.moe.num_experts)}",
        )
    # Megatron builds the expert groups for a dense model too, so an ETP that does not fit is refused there as well
    ranks_per_stage = p.tp * p.cp * p.dp
    if ranks_per_stage % (p.ep * p.expert_tp):
        raise MegapilotError(
            f"ep*etp = {p.ep}*{p.expert_tp} does not divide tp*cp*dp = {ranks_per_stage}, the ranks of "
            "one pipeline stage that Megatron carves the expert groups from (initialize_model_parallel)",
            field="ep" if p.ep > 1 else "etp",
            fix=_expert_fix(p, ranks_per_stage),
        )


def _expert_fix(p: ParallelConfig, ranks_per_stage: int) -> str:
    """Name the ETPs that keep this EP legal (Megatron-LM's default is TP; the MoE recipes set 1)."""
    etps = [etp for etp in range(1, ranks_per_stage + 1) if ranks_per_stage % (p.ep * etp) == 0]
    if not etps:
        return "choose ep and etp whose product divides tp*cp*dp"
    return (f"set etp to one of {', '.join(map(str, etps))} (--expert-tensor-parallel-size), "
            "or choose ep and etp whose product divides tp*cp*dp")


def _check_recompute_modules(model: ModelSpec, training: TrainingSpec, p: ParallelConfig) -> None:
    """`--recompute-modules` Megatron-Core refuses for this model and recipe (TransformerConfig raises), or that
    name a part the model has not."""
    if (refusal := recompute_modules_refusal(model, training, p)) is not None:
        raise MegapilotError(refusal, field="recompute_modules",
                             fix="drop that module from --recompute-modules")


def recompute_modules_refusal(model: ModelSpec, training: TrainingSpec, p: ParallelConfig) -> str | None:
    """Why these recompute modules cannot run on this model and recipe, or None."""
    modules = p.recomputed_modules
    if "mla_up_proj" in modules and model.mla is None:
        return f"mla_up_proj needs multi-latent attention, which {model.name} does not use (Megatron raises)"
    experts = ("moe_act", "moe", "shared_experts")
    if model.moe is None and (named := sorted(modules.intersection(experts))):
        return f"{', '.join(named)} recompute{'s' if len(named) == 1 else ''} MoE layers; {model.name} has none"
    if "shared_experts" in modules and model.moe is not None and not model.moe.shared_expert_ffn_hidden_size:
        return f"shared_experts recomputes shared experts; {model.name} has none"
    if training.fp8_recipe == "delayed" and training.precision == "fp8" and (
            named := sorted(modules.intersection(("moe_act", "layernorm")))):
        return f"FP8 delayed scaling does not support {' and '.join(named)} recompute (Megatron raises)"
    return None


def light_recompute_modules(model: ModelSpec, flavour: QuantFlavour | None) -> tuple[str, ...]:
    """The modules Megatron's MoE and MLA recipes recompute before any whole layer: MLA's up-projections, the
    experts' activation and the norms that are modules of their own (MLA's input norm, a MoE layer's pre-MLP
    norm), each a forward pass over memory-bound or small tensors. Megatron refuses the last two under FP8
    delayed scaling. Dense models without MLA have none: their norms are fused into the next linear."""
    modules: list[str] = []
    if model.mla is not None:
        modules.append("mla_up_proj")
    if model.moe is not None:
        modules.append("moe_act")
    if modules and flavour == "fp8-delayed":
        modules = [name for name in modules if name != "moe_act"]
    elif modules:
        modules.append("layernorm")
    return tuple(modules)


def _check_batch(training: TrainingSpec, p: ParallelConfig) -> None:
    if training.global_batch_size % (p.mbs * p.dp):
        raise MegapilotError(
            f"global_batch_size={training.global_batch_size} is not divisible by mbs*dp={p.mbs}*{p.dp}",
            field="global_batch_size",
            fix=f"use a global batch that is a multiple of {p.mbs * p.dp}",
        )


def _check_precision(cluster: ClusterSpec, training: TrainingSpec) -> None:
    if not cluster.gpu.supports(training.precision):
        supported = ", ".join(sorted(cluster.gpu.precisions))
        raise MegapilotError(
            f"{training.precision} is not supported on {cluster.gpu.name} ({cluster.gpu.architecture})",
            field="precision",
            fix=f"use one of: {supported}",
        )
    if training.grad_reduce_in_bf16 and cluster.gpu.vendor == "CPU":
        raise MegapilotError("a CPU run trains in fp32 (no --bf16 is written for it), so its gradients are fp32",
                             field="grad_reduce_in_bf16", fix="leave --grad-reduce-in-bf16 out on a CPU")


# What estimate and plan say they took where bf16_gradients_would_change: Megatron's fp32 gradients, against the
# 16-bit ones the NeMo / Megatron-Bridge recipes run (their published figures assume them).
FP32_GRADIENTS_ASSUMED = ("fp32 gradients (--grad-reduce-in-bf16 for the 16-bit ones NeMo's and Megatron-Bridge's "
                          "recipes run)")


def overlaps_assumed(gpu: GPUSpec, precision: str, p: ParallelConfig | None = None) -> str | None:
    """The communication overlaps an estimate prices as on (what `script` writes, and the estimator's defaults), said
    where they change it: TP's under the GEMMs where it runs (`tp_comm_overlap_runs`), the DP reduction's and the
    parameter gather's under the backward and forward where data parallelism reduces. `p` None: a plan's layouts,
    each where it runs. A script without them is priced as written by `optimize --script`."""
    tp = tp_comm_overlap_runs(gpu, p, precision)
    dp = p is None or p.dp * p.cp > 1
    if gpu.vendor == "CPU" or not (tp or dp):
        return None
    flags = (["--tp-comm-overlap"] if tp else []) + (["--overlap-grad-reduce", "--overlap-param-gather"] if dp else [])
    kinds = " and ".join(kind for kind, on in (("TP", tp), ("DP", dp)) if on)
    return f"{kinds} communication overlapped ({' '.join(flags)}, as `script` writes)"


def bf16_gradients_would_change(training: TrainingSpec, gpu: GPUSpec) -> bool:
    """Whether --grad-reduce-in-bf16 would change this run, so that advice may name it: its gradients are fp32
    (bf16-class training without the flag) on a GPU (a CPU run trains in fp32 and refuses the flag)."""
    return training.main_grad_bytes == FP32_GRAD_BYTES and gpu.vendor != "CPU"


def tp_comm_overlap_runs(gpu: GPUSpec | None, p: ParallelConfig | None, precision: str) -> bool:
    """Whether Transformer Engine's userbuffers overlap of the TP all-gathers and reduce-scatters with the GEMMs
    (--tp-comm-overlap) can run: CUDA only (NVLink), with sequence parallelism (Megatron asserts it; it needs TP >
    1), and not under NVFP4: Megatron-Bridge's performance recipes turn it off for every NVFP4 run (v0.2-v0.4,
    `tp_comm_overlap = False if precision == "nvfp4"`; later ones name the FP4 parameter gather as what it does not
    run with). What `script` writes, what `estimate` and `plan` price by default, what `optimize` may offer. `p`
    None: on some layout of this GPU and precision (a plan's, before its layout is chosen); `gpu` None: on an NVIDIA
    GPU (a script read without one named)."""
    layout_runs = p is None or (p.tp > 1 and p.sequence_parallel)
    return (gpu is None or gpu.vendor == "NVIDIA") and layout_runs and precision != "nvfp4"


def _warnings(model: ModelSpec, training: TrainingSpec, p: ParallelConfig) -> list[str]:
    warnings: list[str] = []
    microbatches = p.num_microbatches(training.global_batch_size)
    if p.pp > 1 and microbatches < p.pp:
        warnings.append(
            f"only {microbatches} micro-batches for pp={p.pp}: the pipeline never fills "
            "(raise the global batch or lower pp)"
        )
    if p.vpp > 1 and microbatches % p.pp:
        warnings.append(
            f"{microbatches} micro-batches is not a multiple of pp={p.pp}; older Megatron-LM releases "
            "refuse this with the interleaved schedule"
        )
    if p.tp > 1 and not p.sequence_parallel:
        warnings.append("tp > 1 without sequence parallel replicates LayerNorm/dropout activations")
    return warnings


# Architectures each flex backend runs on (Megatron-Bridge's flex_dispatcher_backend.py gate: DeepEP on
# SM 8.x/9.x and B200-class Blackwell, HybridEP on SM 8/9/10); both are CUDA libraries.
FLEX_BACKEND_ARCHITECTURES = {
    "deepep": ("ampere", "hopper", "blackwell"), "hybridep": ("ampere", "hopper", "blackwell"),
}
KEEP_ALLTOALL = "drop --moe-flex-dispatcher (the alltoall dispatcher stays)"
DEEPEP_REFUSES_PADDING = ("the flex dispatcher's DeepEP backend does not pad expert inputs to capacity "
                          "(Megatron-Core refuses moe_pad_expert_input_to_capacity with it)")


def flex_backend_refusal(backend: str, cluster: ClusterSpec, model: ModelSpec) -> MegapilotError | None:
    """Why a flex dispatcher backend does not run on these GPUs or for this model (field moe_flex_dispatcher), or
    None. DeepEP and HybridEP are CUDA libraries; Bridge gates DeepEP to B200-class Blackwell, not the NVL72
    GB200/GB300, where only HybridEP spans the rack's NVLink domain; DeepEP does not pad expert inputs to capacity."""
    if backend == "deepep" and model.moe is not None and model.moe.pad_to_capacity:
        return MegapilotError(DEEPEP_REFUSES_PADDING, field="moe_flex_dispatcher",
                              fix="use --moe-flex-dispatcher hybridep, or drop the padding to capacity")
    gpu = cluster.gpu
    if gpu.vendor != "NVIDIA":
        return MegapilotError(f"the {backend} flex dispatcher runs only in Megatron-LM on NVIDIA GPUs",
                              field="moe_flex_dispatcher", fix=KEEP_ALLTOALL)
    # an NVLink domain past the node (an NVL72 rack) is the cluster's: a B200 baseboard's ends at a smaller node
    if gpu.architecture not in FLEX_BACKEND_ARCHITECTURES.get(backend, ()) or (
            backend == "deepep" and cluster.scaleup_domain_gpus > cluster.gpus_per_node):
        return MegapilotError(f"{backend} does not run on {gpu.name}", field="moe_flex_dispatcher",
                              fix="use --moe-flex-dispatcher hybridep" if backend == "deepep" else KEEP_ALLTOALL)
    return None



def flex_dispatcher_refusal(p: ParallelConfig) -> str | None:
    """Why Megatron-Core refuses the flex token dispatcher on this layout, or None where it runs."""
    return flex_layout_refusal(p.tp, p.ep)


def flex_layout_refusal(tp: int, ep: int) -> str | None:
    """`flex_dispatcher_refusal` for the sizes alone (what a hand-written script's flags say)."""
    return "the flex dispatcher needs TP x EP > 1 (Megatron asserts it)" if tp * ep == 1 else None


def moe_a2a_overlap_refusal(model: ModelSpec, p: ParallelConfig) -> str | None:
    """Why Megatron-Core refuses `--overlap-moe-expert-parallel-comm` for this model and layout (its
    TransformerConfig asserts), or None where it runs."""
    if model.moe is None:
        return f"{model.name} has no experts"
    if p.ep == 1:
        return "it needs expert parallelism (EP > 1)"
    if p.recompute == "full":
        return "it does not run with full recompute"
    if "moe" in p.recomputed_modules:  # core_v0.17.0 on
        return "it does not run with the moe recompute module"
    if p.pp > 1 and p.vpp == 1:
        return "with PP > 1 it needs virtual pipeline stages (VPP > 1)"
    if model.mtp_num_layers > 1:
        return f"it takes at most one MTP layer, not {model.mtp_num_layers}"
    if model.mtp_num_layers == 1 and p.pp == 1:
        return "with an MTP layer it needs PP > 1"
    return None
