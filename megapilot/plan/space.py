"""The layout space: which values of each parallel dimension are legal, and why the others are not.

The search never walks a grid of arbitrary numbers. Every size is drawn from the divisors of what it
must divide (TP, CP and PP from the GPU count; PP·VPP from the layer count; EP from the expert count;
MBS from the per-replica batch), and each rule that Megatron-LM enforces is a cheap pre-filter here
that asks `megapilot.spec.validate`'s own predicate where one exists (the heads TP and CP split, the
sequence CP and sequence parallel split, a hybrid stack's pipeline splits, the DSA top-k sharing), so the
planner walks exactly what the estimate accepts (`validate_layout` still runs on every layout it returns). A
rule that fails gives a `Rejection`: a stable category (the key of `rejected` in the plan's JSON), the concrete
message and the fix. When the user pinned a dimension (`--tp 16`) a failing rule is raised as a `MegapilotError`
instead of being counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from megapilot.errors import MegapilotError, from_validation_error
from megapilot.estimate.params import count_params
from megapilot.estimate.pipeline_balance import balanced_split, stage_weights
from megapilot.spec import ClusterSpec, LayoutPins, ModelSpec, TrainingSpec
from megapilot.spec.parallel import CpCommType
from megapilot.spec.pipeline import EVEN_SPLIT, PipelineSplit, StageWeights
from megapilot.spec.validate import (
    SplitRefusal,
    SplitRule,
    context_split_refusal,
    cp_comm_type_for,
    hash_layers_split_refusal,
    hybrid_split_refusal,
    sequence_parallel_refusal,
    tensor_split_refusal,
    topk_sharing_refusal,
)

__all__ = ["EVEN_SPLIT", "PipelineSplit"]  # the planner's splits are the spec's one typed pipeline split

# Search bounds that are not Megatron rules but practice: longer micro-batches than this never pay
# off on a GPU (the GEMMs are saturated long before), and CP beyond 32 is unheard of.
MAX_MBS = 8
MAX_CP = 32
# The sequence the planner's balanced layouts weigh layers at: only the attention core's share of a layer
# varies with it, and the split it gives is the same for any pretraining length of that order.
BALANCE_SEQ_LENGTH = 4096
# The most virtual stages per rank the planner cuts a balanced layout string into: the recipes' layouts use 2-4.
MAX_LAYOUT_VPP = 4
# The largest TP walked across the trays of one NVLink domain: the largest TP any calibration run checks (TP 8; a
# TP group's collectives sit on every layer's critical path, so the estimate is not trusted beyond what it has seen).
MAX_CROSS_TRAY_TP = 8


@lru_cache(maxsize=512)
def divisors(n: int) -> tuple[int, ...]:
    """All positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


class RejectReason(str, Enum):
    """Why layouts were cut: the stable keys of `rejected` in the plan's JSON.

    Rule cuts come from the Megatron checks below; memory and dominance cuts from the search
    (`search.py`). Dominance cuts are not constraints: they drop layouts that cannot win.
    """

    TP_HEADS = "tp does not divide attention heads"
    TP_KV_HEADS = "tp neither divides nor is a multiple of the KV heads"
    TP_MAMBA = "tp does not divide the Mamba-2 heads and groups"
    TP_COMPRESSED_ATTENTION = "tp above 1 on DeepSeek-V4's compressed attention"
    TP_NODE = "tp exceeds GPUs per node"
    CP_SEQUENCE = "seq_length not divisible by 2*cp"
    CP_LINEAR_ATTENTION = "tp*cp does not divide the Gated DeltaNet heads"
    CP_MAMBA = "cp does not split the Mamba-2 heads and groups of a TP rank"
    CP_SINK = "cp on an attention-sink model"
    CP_WINDOW = "cp on a sliding-window model (p2p)"
    CP_A2A_HEADS = "cp does not divide a TP rank's heads (a2a)"
    CP_SPARSE_ATTENTION = "cp on a DeepSeek Sparse Attention model"
    CP_COMPRESSED_ATTENTION = "cp on DeepSeek-V4's compressed attention"
    SP_SEQUENCE = "seq_length/cp not divisible by tp (sequence parallel)"
    PP_LAYERS = "num_layers not divisible by pp*vpp"
    PP_SPLIT = "uneven pipeline split refused"
    PP_TOPK_SHARING = "a pipeline stage starts on a layer sharing an earlier DSA top-k"
    PP_HASH_LAYERS = "hash-routed layers outside the embedding's pipeline stage"
    BATCH = "global batch not divisible by mbs*dp"
    INTERLEAVE = "micro-batches not a multiple of pp (interleaved schedule)"
    EP_DENSE = "ep on a dense model"
    EP_EXPERTS = "ep does not divide experts"
    EP_GROUPS = "ep*etp does not divide tp*cp*dp"
    PRECISION = "precision not supported"
    MEMORY_FLOOR = "memory: weights+optimizer alone exceed HBM"
    MEMORY_FLOOR_ACTIVATIONS = "memory: activations exceed HBM even at the smallest MBS with full recompute"
    MEMORY_ACTIVATIONS = "memory: activations exceed HBM at this MBS and recompute"
    MEMORY_MBS_SKIPPED = "memory: larger MBS skipped after a smaller one did not fit"
    DOMINATED_RECOMPUTE = "dominated: more recompute than memory needs"
    DOMINATED_FSDP = "dominated: FSDP where memory does not bind"
    DOMINATED_CP = "dominated: more CP than memory needs"
    DOMINATED_MBS = "dominated: larger MBS after throughput fell"
    DOMINATED_VPP = "dominated: more VPP once throughput fell or the bubble is inside the tie band"
    DOMINATED_PP = "dominated: uneven-split PP after throughput fell without memory pressure"
    DOMINATED_SHAPE = "dominated: a shape whose bound (largest MBS, no bubble, DP traffic or relief) is out of reach"

    @property
    def dominated(self) -> bool:
        """A dominance cut: the layouts were legal and would fit, but cannot beat one already costed."""
        return self.value.startswith("dominated")

    @property
    def memory(self) -> bool:
        return self.value.startswith("memory")


@dataclass(frozen=True)
class Rejection:
    """Why one value of one dimension was cut: a stable category plus the specifics."""

    category: RejectReason
    field: str
    message: str
    fix: str

    def as_error(self) -> MegapilotError:
        return MegapilotError(self.message, field=self.field, fix=self.fix)


# The layout fields the search walks (or, pinned, holds): the others take ParallelConfig's defaults in its layouts.
SEARCHED_FIELDS = ("tp", "pp", "vpp", "cp", "cp_comm_type", "ep", "etp", "mbs", "recompute", "recompute_modules",
                   "fsdp")


class Pins(LayoutPins):
    """The layout fields the user fixed on the command line; None leaves the field to the search, which walks
    `SEARCHED_FIELDS` (a pin of another layout field is refused by name, not ignored)."""

    def __init__(self, **given: Any) -> None:
        try:
            super().__init__(**given)
        except ValidationError as exc:
            error = from_validation_error(exc)
            flag = f"--{(error.field or '').replace('_', '-')}"
            raise MegapilotError(f"{error.problem}, got {given.get(error.field or '')!r}", field=error.field,
                                 fix=f"pass {flag} as the message says, or leave it to the search") from None
        for name in set(self.given()) - set(SEARCHED_FIELDS):
            raise MegapilotError("the planner does not search this field", field=name,
                                 fix="pin it in `megapilot estimate` or `megapilot script` instead")
        if self.recompute_modules and self.recompute not in (None, "selective"):
            raise MegapilotError(f"--recompute-modules needs selective recompute, not {self.recompute}",
                                 field="recompute_modules", fix="drop --recompute, or --recompute-modules")
        # Megatron-Core asserts nothing against FSDP beside PP, and `megapilot estimate` costs it; the planner walks
        # FSDP at PP 1 only: Megatron-FSDP's guide pairs it with TP, CP and EP, no published recipe pipelines it (the
        # layouts it would be judged against), and each stage would gather its shards again every micro-batch.
        if self.fsdp and self.pp is not None and self.pp > 1:
            raise MegapilotError(f"the planner walks Megatron-FSDP at pp 1 only, not pp={self.pp}", field="fsdp",
                                 fix="drop --pp (FSDP layouts use pp 1) or drop --fsdp; `megapilot estimate` "
                                     "costs FSDP beside PP")


def _list(values: tuple[int, ...] | list[int]) -> str:
    return ", ".join(str(v) for v in values)


# ---- rules, one per Megatron check ------------------------------------------------------------

def tp_rule(model: ModelSpec, cluster: ClusterSpec, tp: int) -> Rejection | None:
    """TP must split the model's heads (`tensor_split_rule`) and stay inside one node."""
    if (split := tensor_split_rule(model, tp)) is not None:
        return split
    limit = tp_limit(cluster)
    if tp > limit:
        where = "GPUs per node" if limit == cluster.gpus_per_node else "GPUs the planner gives TP in the NVLink domain"
        return Rejection(RejectReason.TP_NODE, "tp", f"tp={tp} exceeds {limit} {where}", f"use tp <= {limit}")
    return None


def tensor_split_rule(model: ModelSpec, tp: int) -> Rejection | None:
    """TP splits whole attention heads, splits or replicates whole KV groups, and splits the linear mixers' heads
    (Gated DeltaNet's, the Mamba-2 mixer's heads and groups): `validate_layout`'s own rules, in its order
    (`tensor_split_refusal`), each under its category."""
    refusal = tensor_split_refusal(model, tp)
    return None if refusal is None else _rejection(_TP_CATEGORIES, refusal)


# The category a TP or a CP size is counted under, by the split rule it breaks (`spec.validate.SplitRule`; a Gated
# DeltaNet split that TP alone breaks counts with the attention heads').
_TP_CATEGORIES = {SplitRule.ATTENTION_HEADS: RejectReason.TP_HEADS, SplitRule.KV_HEADS: RejectReason.TP_KV_HEADS,
                  SplitRule.GATED_DELTA_NET_HEADS: RejectReason.TP_HEADS, SplitRule.MAMBA_HEADS: RejectReason.TP_MAMBA,
                  SplitRule.COMPRESSED_ATTENTION: RejectReason.TP_COMPRESSED_ATTENTION}
_CP_CATEGORIES = {SplitRule.ATTENTION_SINK: RejectReason.CP_SINK, SplitRule.SLIDING_WINDOW: RejectReason.CP_WINDOW,
                  SplitRule.SEQUENCE_CHUNKS: RejectReason.CP_SEQUENCE,
                  SplitRule.ATTENTION_HEADS_OVER_CP: RejectReason.CP_A2A_HEADS,
                  SplitRule.GATED_DELTA_NET_HEADS: RejectReason.CP_LINEAR_ATTENTION,
                  SplitRule.MAMBA_HEADS: RejectReason.CP_MAMBA,
                  SplitRule.SPARSE_ATTENTION: RejectReason.CP_SPARSE_ATTENTION,
                  SplitRule.COMPRESSED_ATTENTION: RejectReason.CP_COMPRESSED_ATTENTION,
                  SplitRule.SEQUENCE_PARALLEL: RejectReason.SP_SEQUENCE}


def _rejection(categories: dict[SplitRule, RejectReason], refusal: SplitRefusal) -> Rejection:
    error = refusal.error
    return Rejection(categories[refusal.rule], error.field or "", error.problem, error.fix or "")


def tp_limit(cluster: ClusterSpec) -> int:
    """The largest TP the planner walks: one node, or where one NVLink domain spans several nodes (the 4-GPU trays of
    an NVL72 rack) TP across trays up to `MAX_CROSS_TRAY_TP`: its collectives still ride NVLink (the estimate prices
    them there), and Megatron does not care where a node ends. The domain is the cluster's: an HGX baseboard's NVLink
    stops at the node when nodes hold fewer of its GPUs, where the estimate refuses TP beyond the node."""
    domain = min(cluster.scaleup_domain_gpus, cluster.world_size)
    return max(cluster.gpus_per_node, min(domain, MAX_CROSS_TRAY_TP))


def cp_rule(model: ModelSpec, training: TrainingSpec, tp: int, cp: int,
            cp_comm_type: CpCommType = "p2p") -> Rejection | None:
    """CP cuts each sequence into 2·CP load-balanced chunks, Gated DeltaNet and the Mamba-2 mixer take it over whole
    heads of a TP rank, attention sinks only by a2a, a2a over whole heads of a TP rank, DeepSeek Sparse Attention
    none (`context_split_refusal`); sequence parallel, on beside every TP > 1, then splits a CP rank's tokens over TP
    (`sequence_parallel_refusal`): `validate_layout`'s own rules, in its order, each under its category."""
    seq_length = training.seq_length
    refusal = context_split_refusal(model, tp, cp, seq_length=seq_length, cp_comm_type=cp_comm_type) \
        or sequence_parallel_refusal(tp, cp, seq_length=seq_length)
    return None if refusal is None else _rejection(_CP_CATEGORIES, refusal)


def pp_rule(
    model: ModelSpec, pp: int, vpp: int = 1, split: PipelineSplit = EVEN_SPLIT
) -> Rejection | None:
    """Each (virtual) pipeline stage holds a whole number of layers; an uneven split obeys Megatron's rules."""
    if split.is_even:
        if model.num_layers % (pp * vpp):
            field = "pp" if vpp == 1 else "vpp"
            return Rejection(RejectReason.PP_LAYERS, field,
                             f"num_layers={model.num_layers} is not divisible by pp*vpp={pp}*{vpp}",
                             f"use pp*vpp from: {_list(divisors(model.num_layers))}")
        return _topk_sharing_rule(model, pp, vpp, split)
    if (error := split_refusal(model, pp, vpp, split)) is not None:
        return Rejection(RejectReason.PP_SPLIT, error.field or "pp", error.problem, error.fix or "")
    return _topk_sharing_rule(model, pp, vpp, split)


def split_refusal(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> MegapilotError | None:
    """Why Megatron refuses this uneven split at PP x VPP, or None: its layer counts (`PipelineSplit.resolve`),
    then, for a hybrid (Mamba) stack, where its layer pattern's segments can place it (`hybrid_split_refusal`):
    the refusals `validate_layout` raises."""
    try:
        split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp)
    except MegapilotError as error:
        return error
    return hybrid_split_refusal(model, pp, vpp, split)


def _topk_sharing_rule(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> Rejection | None:
    """The layer placements Megatron keeps inside one stage: a DSA top-k's sharers, DeepSeek-V4's hash layers."""
    if (refusal := topk_sharing_refusal(model, pp, vpp, split)) is not None:
        return Rejection(RejectReason.PP_TOPK_SHARING, "pp", refusal.problem, refusal.fix or "")
    if (refusal := hash_layers_split_refusal(model, pp, vpp, split)) is not None:
        return Rejection(RejectReason.PP_HASH_LAYERS, "pp", refusal.problem, refusal.fix or "")
    return None


def batch_rule(training: TrainingSpec, dp: int, mbs: int = 1) -> Rejection | None:
    """Every data-parallel replica runs a whole number of micro-batches."""
    if training.global_batch_size % (dp * mbs):
        return Rejection(RejectReason.BATCH, "global_batch_size",
                         f"global_batch_size={training.global_batch_size} is not divisible by "
                         f"mbs*dp={mbs}*{dp}",
                         f"use a global batch that is a multiple of {dp * mbs}")
    return None


def interleave_rule(training: TrainingSpec, pp: int, vpp: int, dp: int, mbs: int) -> Rejection | None:
    """The interleaved schedule runs micro-batches in groups of PP: with VPP > 1, Megatron-Core (v0.16
    `forward_backward_pipelining_with_interleaving`) refuses a micro-batch count that is not a
    multiple of PP (fewer than PP, or a remainder group smaller than PP)."""
    microbatches = training.global_batch_size // (dp * mbs)
    if vpp > 1 and microbatches % pp:
        return Rejection(RejectReason.INTERLEAVE, "vpp",
                         f"{microbatches} micro-batches per replica is not a multiple of pp={pp}, which the "
                         "interleaved schedule needs",
                         f"use vpp=1, or a global batch that gives a multiple of {pp} micro-batches")
    return None


def expert_rule(model: ModelSpec, tp: int, cp: int, dp: int, ep: int, etp: int) -> Rejection | None:
    """EP divides the experts; EP·ETP divides TP·CP·DP, the ranks Megatron carves expert groups from."""
    if model.moe is None and ep > 1:
        return Rejection(RejectReason.EP_DENSE, "ep", f"ep={ep} on a dense model",
                         "use ep=1 for models without experts")
    if model.moe is not None and model.moe.num_experts % ep:
        return Rejection(RejectReason.EP_EXPERTS, "ep",
                         f"ep={ep} does not divide num_experts={model.moe.num_experts}",
                         f"use an EP from: {_list(divisors(model.moe.num_experts))}")
    # a dense model's expert groups are built too (as `validate_layout` says), so a pinned ETP must fit them there
    # as well: ETP 2 over TP1 PP8 on 8 GPUs left an expert-DP of 0 for the memory model to divide by
    if (tp * cp * dp) % (ep * etp):
        return Rejection(RejectReason.EP_GROUPS, "ep" if ep > 1 else "etp",
                         f"ep*etp={ep}*{etp} does not divide tp*cp*dp={tp}*{cp}*{dp}={tp * cp * dp}",
                         "choose ep and etp whose product divides tp*cp*dp")
    return None


def precision_rule(cluster: ClusterSpec, training: TrainingSpec) -> Rejection | None:
    if not cluster.gpu.supports(training.precision):
        return Rejection(RejectReason.PRECISION, "precision",
                         f"{training.precision} is not supported on {cluster.gpu.name} "
                         f"({cluster.gpu.architecture})",
                         f"use one of: {', '.join(sorted(cluster.gpu.precisions))}")
    return None


# ---- candidate values per dimension -----------------------------------------------------------

def tp_values(world: int, pins: Pins) -> tuple[int, ...]:
    return (pins.tp,) if pins.tp else divisors(world)


def cp_values(rest: int, pins: Pins) -> tuple[int, ...]:
    """The CPs of the `rest` GPUs TP x PP leave; a pinned CP only where it divides them (else no data parallelism)."""
    if pins.cp:
        return (pins.cp,) if rest % pins.cp == 0 else ()
    return tuple(c for c in divisors(rest) if c <= MAX_CP)


def pp_values(rest: int, model: ModelSpec, pins: Pins) -> tuple[int, ...]:
    if pins.pp:
        return (pins.pp,) if rest % pins.pp == 0 else ()
    return tuple(p for p in divisors(rest) if p <= model.num_layers)


def vpp_values(model: ModelSpec, pp: int, pins: Pins, split: PipelineSplit = EVEN_SPLIT) -> tuple[int, ...]:
    """Interleaving needs PP > 1; any number of chunks that splits every rank's layers evenly is legal. The
    balanced layout string is re-cut for each VPP (`split_at_vpp`): up to a layer per virtual stage."""
    if pins.vpp:
        return (pins.vpp,)
    if pp > 1 and is_balanced_layout(model, pp, split):
        # beside a first/last split (as balanced at VPP 1) the layout string is costed where only it goes: VPP > 1
        lowest = 1 if len(pipeline_splits(model, pp)) == 1 else 2
        return tuple(range(lowest, min(MAX_LAYOUT_VPP, model.num_layers // pp) + 1))
    if pp == 1 or split.layout is not None or (split.is_even and model.num_layers % pp):
        return (1,)  # a layout string fixes its own VPP (its stage count / PP)
    # a hybrid stack interleaves an even split (as | segments) but not its first/last counts
    return tuple(vpp for vpp in divisors(math.gcd(*_rank_slots(model, pp, split)))
                 if hybrid_split_refusal(model, pp, vpp, split) is None)


def is_balanced_layout(model: ModelSpec, pp: int, split: PipelineSplit) -> bool:
    """Whether `split` is the planner's balanced layout string at this PP (which it re-cuts for each VPP)."""
    return split.layout is not None and split == _balanced_layout(model, pp)


@lru_cache(maxsize=1024)  # a bisection per cut, asked for by every (TP, CP, EP) shape that walks this PP
def split_at_vpp(model: ModelSpec, pp: int, split: PipelineSplit, vpp: int,
                 weights: StageWeights | None = None) -> PipelineSplit:
    """The split a layout at `vpp` runs: the balanced layout string cut into PP x VPP stages; any other as is.
    With `weights` (each item's time on the shape being walked: `CostModel.stage_weights`) the string is cut by
    them at every VPP; without, by FLOPs, as listed at VPP 1."""
    if not is_balanced_layout(model, pp, split):
        return split
    if weights is not None:
        return balanced_split(model, pp, vpp, weights)
    return split if vpp == 1 else balanced_split(model, pp, vpp, stage_weights(model, BALANCE_SEQ_LENGTH))


@lru_cache(maxsize=1024)
def _rank_slots(model: ModelSpec, pp: int, split: PipelineSplit) -> tuple[int, ...]:
    """Layer slots per rank that VPP must cut evenly: its decoder layers, plus the embedding's and the
    loss's slot on the end ranks when the split accounts for them."""
    stages = split.resolve(model.num_layers, model.mtp_num_layers, pp, 1)
    counts = list(stages.rank_layer_counts())
    counts[0] += int(split.account_for_embedding)
    counts[-1] += int(split.account_for_loss)
    return tuple(counts)


@lru_cache(maxsize=1024)
def pipeline_splits(model: ModelSpec, pp: int) -> tuple[PipelineSplit, ...]:
    """The layer splits worth costing at this PP: the even one when PP divides the layers, else the
    account-for splits that make it divide (what NVIDIA's recipes use: 126 + E + L = 128 slots for Llama
    3.1 405B, which also admits interleaving), a few uneven ones (--decoder-first/last-pipeline-num-layers),
    and, where no account-for split interleaves, the most balanced layout string (at VPP 1 here;
    `split_at_vpp` re-cuts it for each VPP, the way DeepSeek-V3's recipes interleave 61 layers and an MTP
    module). A hybrid (Mamba) stack takes the first/last and layout-string splits only (its layer pattern's `|`
    segments, from Megatron-Core 0.17: `hybrid_split_refusal`), which `megapilot script` writes as those segments.

    The end ranks carry more than layers: rank 0 the input embedding (memory), the last rank the
    output layer and the loss (time and memory). Each is worth `_end_rank_extra_layers` layers; for
    a middle count m (the smallest that fits the layers, and one more) the end ranks share what is
    left, the heavier extra taking the lighter share, the last rank the smaller on a tie.
    """
    layers = model.num_layers
    if pp == 1 or layers % pp == 0:
        return (EVEN_SPLIT,)
    account_for = (PipelineSplit(account_for_embedding=embedding, account_for_loss=loss)
                   for embedding, loss in ((True, True), (False, True), (True, False))
                   if (layers + embedding + loss) % pp == 0)
    splits = [split for split in account_for if _split_is_legal(model, pp, split)]  # a hybrid takes none
    embedding_extra, output_extra = _end_rank_extra_layers(model)
    middle_ranks = pp - 2
    smallest_middle = -(-layers // pp)
    for middle in (smallest_middle, smallest_middle + 1) if middle_ranks else (0,):
        left = layers - middle_ranks * middle
        # rounded half up, so that on a tie the last rank (output layer and loss) is the lighter one
        first = math.floor((left + output_extra - embedding_extra) / 2 + 0.5 + 1e-9)
        first = min(max(first, 1), left - 1)
        uneven = PipelineSplit(first_stage_layers=first, last_stage_layers=left - first) if left >= 2 else None
        if uneven is not None and (not middle_ranks or max(first, left - first) <= middle) \
                and uneven not in splits and _split_is_legal(model, pp, uneven):
            splits.append(uneven)
    accounted = any(split.account_for_embedding or split.account_for_loss for split in splits)
    if pp <= layers and not accounted:  # the most balanced layout string: it interleaves any layer count
        splits.append(_balanced_layout(model, pp))
    return tuple(splits)


@lru_cache(maxsize=1024)
def _balanced_layout(model: ModelSpec, pp: int) -> PipelineSplit:
    """`--pipeline-model-parallel-layout` with each rank's items weighted by their FLOPs (the split
    `--pp-layout balanced` gives), for a PP no even, account-for or first/last split reaches."""
    return balanced_split(model, pp, 1, stage_weights(model, BALANCE_SEQ_LENGTH))


def _split_is_legal(model: ModelSpec, pp: int, split: PipelineSplit) -> bool:
    return split_refusal(model, pp, 1, split) is None


@lru_cache(maxsize=64)
def _end_rank_extra_layers(model: ModelSpec) -> tuple[float, float]:
    """(embedding, output layer + loss) in layers: embedding parameters over a layer's, and the output
    GEMM (one per MTP depth + 1) over a layer's active parameters (both are GEMM-bound per token)."""
    counts = count_params(model)
    per_layer_total = counts.layers / model.num_layers
    per_layer_active = sum(layer.active for layer in counts.per_layer) / model.num_layers
    vocab_matrix = model.vocab_size * model.hidden_size
    return vocab_matrix / per_layer_total, vocab_matrix * (model.mtp_num_layers + 1) / per_layer_active


def mbs_values(training: TrainingSpec, dp: int, pins: Pins) -> tuple[int, ...]:
    if pins.mbs:
        return (pins.mbs,)
    per_replica = training.global_batch_size // dp
    return tuple(m for m in divisors(per_replica) if m <= MAX_MBS) if per_replica else ()


def expert_values(model: ModelSpec, tp: int, pins: Pins) -> tuple[tuple[int, int], ...]:
    """(EP, ETP) pairs, largest EP first. ETP is 1 (fine-grained experts, the DeepSeek/Qwen3 recipes)
    or TP (experts sharded like the dense MLP, the Mixtral recipes)."""
    if model.moe is None:
        return ((pins.ep or 1, pins.etp or tp),)
    eps = (pins.ep,) if pins.ep else tuple(reversed(divisors(model.moe.num_experts)))
    etps = (pins.etp,) if pins.etp else tuple(sorted({1, tp}))
    return tuple((ep, etp) for ep in eps for etp in etps)


def _check_pinned_products(pins: Pins, world: int) -> None:
    """Pins that each divide the GPUs but together do not: TP8 PP8 on 8 GPUs read 'no layout passes the rules', and
    an ETP its pinned pipeline stage cannot hold 'no layout fits' with a GPU count to buy."""
    pinned = {name: value for name in ("tp", "pp", "cp") if (value := getattr(pins, name))}
    product = math.prod(pinned.values())
    if world % product:
        names = "*".join(pinned)
        raise MegapilotError(f"{names} = {'*'.join(map(str, pinned.values()))} = {product} does not divide the {world} "
                             "GPUs", field=names, fix=f"pin sizes whose product divides {world}, or pin fewer of them")
    experts = (pins.ep or 1) * (pins.etp or 1)
    stage = world // (pins.pp or 1)
    if stage % experts:
        names = "*".join(name for name in ("ep", "etp") if getattr(pins, name))
        where = f"the {stage} GPUs of one pipeline stage ({world} / pp {pins.pp})" if pins.pp else f"the {world} GPUs"
        raise MegapilotError(f"{names} = {experts} does not divide {where}, the TP*CP*DP ranks Megatron carves the "
                             "expert groups from", field=names,
                             fix=f"use an {names} dividing {stage}" + (", or a smaller --pp" if pins.pp else ""))


def check_pins(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, pins: Pins) -> None:
    """Refuse pinned values that no layout can use, with the rule that fails and its fix."""
    if pins.fsdp and training.uses_muon:
        raise MegapilotError(f"{training.optimizer} does not run with Megatron-FSDP (Megatron refuses it)",
                             field="fsdp", fix="drop --fsdp, or plan with --optimizer adam")
    failure = precision_rule(cluster, training)
    world = cluster.world_size
    _check_divides_world(pins, ("tp", "pp", "cp"), world)
    if failure is None and pins.tp:
        failure = tp_rule(model, cluster, pins.tp)
    if failure is None and pins.cp:
        failure = cp_rule(model, training, pins.tp or 1, pins.cp, cp_comm_type_for(model, pins.cp, pins.cp_comm_type))
    if failure is None and (pins.pp or pins.vpp):
        if pins.vpp and pins.vpp > 1 and pins.pp == 1:
            raise MegapilotError("vpp > 1 needs pp > 1", field="vpp", fix="drop --vpp or set --pp above 1")
        pp, vpp = pins.pp or 1, pins.vpp or 1
        tried = [pp_rule(model, pp, vpp, split_at_vpp(model, pp, split, vpp))
                 for split in pipeline_splits(model, pp) or (EVEN_SPLIT,)]
        failure = None if None in tried else tried[0]
    if failure is None and pins.ep:
        if model.moe is None and pins.ep > 1:
            failure = expert_rule(model, 1, 1, 1, pins.ep, 1)
        elif model.moe is not None and model.moe.num_experts % pins.ep:
            failure = expert_rule(model, 1, 1, pins.ep, pins.ep, 1)
    if failure is not None:
        raise failure.as_error()
    _check_divides_world(pins, ("ep", "etp"), world)  # they split TP x CP x DP, a divisor of the GPU count
    _check_pinned_products(pins, world)
    _check_pinned_batch(pins, world, training.global_batch_size)
    gbs = training.global_batch_size
    if pins.vpp and pins.vpp > 1 and pins.pp and gbs % pins.pp:
        # micro-batches per replica (GBS / (DP x MBS)) are a multiple of PP only where PP divides the GBS
        raise MegapilotError(f"vpp={pins.vpp} interleaves, which needs micro-batches per replica in multiples of "
                             f"pp={pins.pp}, and no DP or MBS gives that from a global batch of {gbs:,}", field="vpp",
                             fix=f"pass a --gbs that is a multiple of {pins.pp}, or drop --vpp")


def _check_pinned_batch(pins: Pins, world: int, gbs: int) -> None:
    """With TP, PP and CP all pinned DP is fixed, and the batch must split into it: GBS 4 at MBS 2 on 8 GPUs of
    TP1 PP1 CP1 was told to use a --gbs the GPUs divide (8, which MBS 2 x DP 8 does not divide either)."""
    if not (pins.tp and pins.pp and pins.cp):
        return
    dp = world // (pins.tp * pins.pp * pins.cp)
    step = dp * (pins.mbs or 1)
    if gbs % step:
        mbs = f"MBS {pins.mbs} x " if pins.mbs else ""
        raise MegapilotError(f"global batch {gbs:,} does not split into {mbs}DP {dp} (the {world} GPUs over the pinned "
                             f"TP {pins.tp} x PP {pins.pp} x CP {pins.cp})", field="gbs",
                             fix=f"pass a --gbs that is a multiple of {step}, or pin a larger --tp/--pp/--cp"
                                 + (" or a smaller --mbs" if pins.mbs and pins.mbs > 1 else ""))


def _check_divides_world(pins: Pins, names: tuple[str, ...], world: int) -> None:
    for name in names:
        value = getattr(pins, name)
        if value is not None and world % value:
            raise MegapilotError(f"{name}={value} does not divide the {world} GPUs", field=name,
                                 fix=f"use {'an' if name[0] == 'e' else 'a'} {name.upper()} from: "
                                     f"{_list(divisors(world))}")
