"""Why a layout looks as it does, in plain words computed from the estimator's numbers.

Every reason is a what-if: the planner re-costs the winner with one dimension moved (TP halved or
doubled, PP lowered, CP=1, VPP=1, EP=1, a larger micro-batch, less recompute) and states what the cost
model says would happen — it would not fit, by how many GiB, or it would be slower, by how much. The
rules of thumb (TP within a node, PP for large models, CP for long sequences, EP dividing the expert
count, DP filling the rest) are therefore stated only where the cost model reproduces them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from megapilot import vocabulary
from megapilot.errors import MegapilotError
from megapilot.estimate.comm import scaleup_domain
from megapilot.estimate.units import format_duration
from megapilot.plan import space
from megapilot.plan.cost import CostModel
from megapilot.spec import EstimateResult, ParallelConfig
from megapilot.spec.validate import a2a_only_attention, cp_comm_type_for

if TYPE_CHECKING:  # the search imports this module at run time
    from megapilot.plan.search import Fit

# time_breakdown_s keys → words. Matching is by the first key fragment found, so the estimator may
# name its entries e.g. `tp_comm_exposed` or `pipeline_bubble` and still be read.
COMPONENT_WORDS: tuple[tuple[str, str], ...] = (
    ("bubble", "pipeline bubble"),
    ("offload", "activation offload copies"),
    ("recompute", "activation recompute"),
    ("tp", "TP communication"),
    ("cp", "CP communication"),
    ("ep", "EP all-to-all"),
    ("a2a", "EP all-to-all"),
    ("all_to_all", "EP all-to-all"),
    ("dp", "DP gradient sync"),
    ("fsdp", "FSDP gathers"),
    ("p2p", "pipeline send/recv"),
    ("pp", "pipeline send/recv"),
    ("optimizer", "optimizer step"),
    ("compute", "compute"),
)


TIE_FRACTION = 0.002  # the search's tie band: speeds within 0.2 % count as equal


def component_words(key: str) -> str:
    lowered = key.lower()
    for fragment, words in COMPONENT_WORDS:
        if fragment in lowered.split("_") or lowered.startswith(fragment):
            return words
    return key.replace("_", " ")


def component_share(est: EstimateResult, fragment: str) -> float:
    """Fraction of the step spent in the breakdown entries whose name carries `fragment`."""
    if est.step_time_s <= 0:
        return 0.0
    total = sum(v for k, v in est.time_breakdown_s.items() if _matches(k, fragment))
    return total / est.step_time_s


def _matches(key: str, fragment: str) -> bool:
    parts = key.lower().split("_")
    return fragment in parts or key.lower().startswith(fragment)


def exposed_comm_share(est: EstimateResult) -> float:
    """Share of the step in exposed communication: every breakdown entry that is not compute,
    recompute, bubble or optimizer (the estimator lists only the exposed part of overlapped comm)."""
    if est.step_time_s <= 0:
        return 0.0
    not_comm = ("compute", "recompute", "bubble", "optimizer")
    comm = sum(v for k, v in est.time_breakdown_s.items() if not any(_matches(k, n) for n in not_comm)
               and not _is_total(k))
    return comm / est.step_time_s


def _is_total(key: str) -> bool:
    return key.lower() in ("total", "step", "step_time")


def bubble_share(est: EstimateResult) -> float:
    return component_share(est, "bubble")


def layout_label(p: ParallelConfig) -> str:
    """Compact layout name for tables: `TP4 PP4 VPP5 CP2 EP1 DP2 MBS1 selective`."""
    parts = [f"TP{p.tp}", f"PP{p.pp}" + ("" if p.pipeline_split.is_even else f"({split_label(p)})")]
    if p.vpp > 1:
        parts.append(f"VPP{p.vpp}")
    parts.append(f"CP{p.cp}" + ("(a2a)" if p.cp_comm_type == "a2a" else ""))
    if p.ep > 1 or p.etp is not None:
        parts.append(f"EP{p.ep}" + (f" ETP{p.etp}" if p.etp is not None else ""))
    parts += [f"DP{p.dp}", f"MBS{p.mbs}"]
    parts.append(_recompute_label(p))
    if p.cpu_offloading_num_layers:
        parts.append(f"offload×{p.cpu_offloading_num_layers}L")
    if p.fsdp:
        parts.append("FSDP")
    return " ".join(parts)


def split_label(p: ParallelConfig) -> str:
    """The end ranks' layer counts of an uneven split, the middle ranks elided: `7,…,7`; `+E+L` for the
    account-for flags; the layout string."""
    if not p.uneven_pipeline:
        return p.pipeline_split.label()
    ends = ["…"]
    if p.first_stage_layers is not None:
        ends.insert(0, str(p.first_stage_layers))
    if p.last_stage_layers is not None:
        ends.append(str(p.last_stage_layers))
    return ",".join(ends)


def _recompute_label(p: ParallelConfig) -> str:
    if p.recompute == "selective" and p.recompute_modules is not None:
        return f"selective({','.join(p.recompute_modules)})"
    if p.recompute != "full":
        return p.recompute
    if p.recompute_method == "block":
        return f"full×{p.recompute_num_layers}L"
    return "full"


# The flag a hybrid's uneven or interleaved split is written in (`launch.hybrid_split`): its vocabulary row names the
# release that reads it.
HYBRID_SEGMENTS_FLAG = "--hybrid-layer-pattern"


def _hybrid_segments(p: ParallelConfig) -> str:
    """Where a hybrid's uneven or interleaved split goes, and the Megatron-LM release that reads it there."""
    since = vocabulary.term(HYBRID_SEGMENTS_FLAG).since
    stages = f"PP={p.pp}" + (f" x VPP={p.vpp}" if p.vpp > 1 else "")
    return (f"{stages} on a hybrid stack: the script writes the split as | segments of {HYBRID_SEGMENTS_FLAG}, "
            f"which Megatron-LM reads from {since} on (`megapilot script --megatron-version` says what an older "
            "release takes)")


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %" if x < 0.1 else f"{x * 100:.0f} %"


def _gib(x: float) -> str:
    return f"{x:.1f} GiB"


class Explainer:
    """Builds the reasons for planned layouts from the search's results and what-if estimates."""

    def __init__(self, cost: CostModel, best_by: dict[tuple[str, object], Fit] | None = None) -> None:
        self.cost = cost
        self.model, self.cluster, self.training = cost.model, cost.cluster, cost.training
        self.best_by = best_by or {}

    # -- what-ifs
    def _variant(self, p: ParallelConfig, **changes: object) -> tuple[ParallelConfig, EstimateResult] | None:
        """Re-cost `p` with some fields changed (DP re-derived); None if the variant is not a legal layout."""
        fields = p.model_dump()
        fields.update(changes)
        tp, pp, cp = fields["tp"], fields["pp"], fields["cp"]
        if "cpu_offloading_num_layers" not in changes and (fields["recompute"] != "none" or pp > 1):
            fields["cpu_offloading_num_layers"] = 0  # Megatron offloads only without recompute and at PP 1
        if pp != p.pp and "first_stage_layers" not in changes:  # a new PP gets its own split
            splits = space.pipeline_splits(self.model, pp)
            new_split = splits[0] if splits else space.EVEN_SPLIT
            fields["first_stage_layers"], fields["last_stage_layers"] = (new_split.first_stage_layers,
                                                                         new_split.last_stage_layers)
            fields["account_for_embedding"] = new_split.account_for_embedding
            fields["account_for_loss"] = new_split.account_for_loss
            fields["pipeline_layout"] = new_split.layout
            if new_split.layout is not None:
                fields["vpp"] = 1  # the layout string fixes VPP
        split = space.PipelineSplit(
            first_stage_layers=fields["first_stage_layers"], last_stage_layers=fields["last_stage_layers"],
            account_for_embedding=fields["account_for_embedding"], account_for_loss=fields["account_for_loss"],
            layout=fields["pipeline_layout"])
        if "vpp" not in changes and (pp == 1 or space.pp_rule(self.model, pp, fields["vpp"], split)):
            fields["vpp"] = 1  # interleaving that the new PP cannot keep is dropped, not held against it
        world = self.cluster.world_size
        if world % (tp * pp * cp):
            return None
        fields["dp"] = world // (tp * pp * cp)
        fields["sequence_parallel"] = tp > 1
        if fields["etp"] is not None and fields["etp"] == tp:
            fields["etp"] = None
        if fields["recompute"] != "full":
            fields["recompute_num_layers"] = None
        if "cp_comm_type" not in changes:  # a new CP exchanges attention as the planner walks it
            fields["cp_comm_type"] = cp_comm_type_for(self.model, cp, p.cp_comm_type if p.cp > 1 else None)
        try:
            variant = ParallelConfig(**fields)
            if variant.recompute == "full" and variant.recompute_method == "block":
                largest_chunk = max(variant.rank_layer_counts(self.model.num_layers)) // variant.vpp
                if (variant.recompute_num_layers or 0) > largest_chunk:
                    variant = variant.model_copy(update={"recompute_method": "uniform", "recompute_num_layers": 1})
            if any(r is not None for r in self._rules(variant)):
                return None
            return variant, self.cost(variant)
        except (MegapilotError, ValueError):
            return None

    def _floor_variant(self, p: ParallelConfig, **changes: object) -> tuple[ParallelConfig, EstimateResult] | None:
        """The most lenient what-if: the change, at MBS 1 with full recompute of every layer."""
        return self._variant(p, mbs=1, recompute="full", recompute_method="uniform", recompute_num_layers=1,
                             **changes)

    def _rules(self, p: ParallelConfig) -> Iterable[space.Rejection | None]:
        yield space.cp_rule(self.model, self.training, p.tp, p.cp, p.cp_comm_type)
        yield space.pp_rule(self.model, p.pp, p.vpp, p.pipeline_split)
        yield space.batch_rule(self.training, p.dp, p.mbs)
        yield space.interleave_rule(self.training, p.pp, p.vpp, p.dp, p.mbs)
        yield space.expert_rule(self.model, p.tp, p.cp, p.dp, p.ep, p.expert_tp)
        yield space.tensor_split_rule(self.model, p.tp)

    def _speed_delta(self, base: EstimateResult, other: EstimateResult) -> str:
        """`12 % slower` / `3.1 % faster` for `other` against `base`."""
        ratio = other.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu - 1
        if abs(ratio) < TIE_FRACTION:
            return "as fast (within 0.2 %)"
        return f"{_pct(abs(ratio))} {'faster' if ratio > 0 else 'slower'}"

    def _too_big(self, est: EstimateResult) -> str:
        return f"{_gib(est.memory_gib.total)} > {_gib(est.memory_gib.capacity)}"

    def _versus(self, dim: str, value: int, p: ParallelConfig, est: EstimateResult) -> str | None:
        """How the best layout with `dim=value` compares, or why no such layout fits."""
        name = dim.upper()
        found = self.best_by.get((dim, value))
        if found is not None:
            text = f"the best {name}={value} layout ({layout_label(found[0])}) is {self._speed_delta(est, found[1])}"
            cause = _largest_growth(est, found[1])
            slower = found[1].tokens_per_s_per_gpu < est.tokens_per_s_per_gpu * (1 - TIE_FRACTION)
            return f"{text} ({cause})" if cause and slower else text
        floor = self._floor_variant(p, **{dim: value})
        if floor is not None and not self.cost.fits(floor[1]):
            return f"{name}={value} does not fit even at MBS 1 with full recompute ({self._too_big(floor[1])})"
        return None

    # -- per-dimension reasons
    def explain(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        reasons = [self._memory(est)]
        for part in (self._tp, self._pp, self._cp, self._experts, self._dp, self._mbs, self._recompute, self._fsdp,
                     self._optimizer):
            reasons += [r for r in part(p, est) if r]
        return reasons

    def _memory(self, est: EstimateResult) -> str:
        m = est.memory_gib
        return (f"memory {_gib(m.total)} of {_gib(m.capacity)}: weights {m.weights:.1f}, grads {m.gradients:.1f}, "
                f"optimizer {m.optimizer:.1f}, activations {m.activations:.1f}, overhead {m.overhead:.1f} GiB")

    def _tp(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        out: list[str] = []
        if p.tp > 1:
            out.append(f"TP={p.tp} exposes {_pct(component_share(est, 'tp'))} of step time in TP communication")
        for other in _neighbours(p.tp, self._legal_tp()):
            versus = self._versus("tp", other, p, est)
            if versus:
                out.append(f"TP={p.tp}: {versus}")
        # the next TP up, where the job has the GPUs for it (a one-node job has no inter-node network to avoid)
        if space.tp_limit(self.cluster) < p.tp * 2 <= self.cluster.world_size:
            out.append(self._tp_across_nodes(p, est))
        return out

    def _legal_tp(self) -> list[int]:
        world, limit = self.cluster.world_size, space.tp_limit(self.cluster)
        return [t for t in space.divisors(world) if t <= limit and space.tensor_split_rule(self.model, t) is None]

    def _tp_across_nodes(self, p: ParallelConfig, est: EstimateResult) -> str:
        """The 'TP ≤ GPUs per node' rule, checked against the cost model by costing TP across nodes; where one NVLink
        domain spans the nodes (an NVL72 rack's trays) the limit is `space.tp_limit`'s, stated as such."""
        node, limit, wider = self.cluster.gpus_per_node, space.tp_limit(self.cluster), p.tp * 2
        if limit == node:
            rule, fate = f"TP ≤ GPUs per node ({node})", "would run TP all-reduces across nodes"
        else:
            fabric = self.cluster.gpu.scaleup_fabric
            rule = f"TP ≤ {limit} over the {node}-GPU nodes of one {fabric} domain"
            fate = (f"is past the largest TP a calibration run checks (its all-reduces would still ride {fabric})"
                    if wider <= self.cluster.scaleup_domain_gpus else f"would run TP all-reduces beyond {fabric}")
        if (split := space.tensor_split_rule(self.model, wider)) is not None:
            return f"{rule}; TP={wider} is ruled out anyway: {split.message}"
        # Doubling TP may leave too few GPUs for the same PP; then trade a pipeline stage for it.
        beyond = self._variant(p, tp=wider) or (
            self._variant(p, tp=wider, pp=p.pp // 2, vpp=1) if p.pp > 1 else None)
        if beyond is None:
            if limit == node:
                return f"{rule}: TP={wider} would put TP all-reduces on the inter-node network"
            return f"{rule}: TP={wider} {fate}"
        verdict = (self._speed_delta(est, beyond[1]) if self.cost.fits(beyond[1])
                   else f"not fit ({self._too_big(beyond[1])})")
        return f"{rule}: TP={wider} {fate} and would be {verdict}"

    def _pp(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        out = []
        if p.pp > 1:
            micro = p.num_microbatches(self.training.global_batch_size)
            flat = self._variant(p, **self._without_interleaving(p)) if p.vpp > 1 else None
            if flat:
                out.append(f"PP={p.pp} bubble {_pct(bubble_share(flat[1]))} at {micro} micro-batches; "
                           f"VPP={p.vpp} cuts it to {_pct(bubble_share(est))}")
            else:
                out.append(f"PP={p.pp} bubble {_pct(bubble_share(est))} at {micro} micro-batches")
        if p.uneven_pipeline:
            out.append(self._uneven_split(p))
        elif p.account_for_embedding or p.account_for_loss:
            out.append(self._accounted_split(p))
        if self.model.is_hybrid and (p.vpp > 1 or not p.pipeline_split.is_even):
            out.append(_hybrid_segments(p))
        possible = space.divisors(self.cluster.world_size // (p.tp * p.cp))
        layers = self.model.num_layers
        legal = [v for v in possible if v <= layers and space.pipeline_splits(self.model, v)]
        blocked = [v for v in possible if v > p.pp and not space.pipeline_splits(self.model, v)]
        if blocked:
            shown = ", ".join(str(v) for v in blocked[:4])
            out.append(f"PP is limited by num_layers={layers}: PP={shown} would divide the GPUs but leave no "
                       "legal layer split (not even with lighter first/last stages)")
        for other in _neighbours(p.pp, legal):
            versus = self._versus("pp", other, p, est)
            if versus and other < p.pp and "does not fit" in versus:
                out.append(f"PP={p.pp} because the model is too large for fewer stages: {versus}")
            elif versus:
                out.append(f"PP={p.pp}: {versus}")
        return out

    def _without_interleaving(self, p: ParallelConfig) -> dict[str, object]:
        """The changes that make `p` run at VPP 1: a layout string fixes its own VPP, so it is swapped for the
        planner's layout string at VPP 1 (`space.pipeline_splits`), or dropped where there is none."""
        if p.pipeline_layout is None:
            return {"vpp": 1}
        flat = next((split.layout for split in space.pipeline_splits(self.model, p.pp) if split.layout), None)
        return {"vpp": 1, "pipeline_layout": flat}

    def _accounted_split(self, p: ParallelConfig) -> str:
        """Say that the embedding/loss take a layer slot, and what that buys."""
        layers = self.model.num_layers
        slots = layers + int(p.account_for_embedding) + int(p.account_for_loss)
        named = " and ".join(name for name, on in (("embedding", p.account_for_embedding),
                                                   ("loss", p.account_for_loss)) if on)
        counts = p.rank_layer_counts(layers, self.model.mtp_num_layers)
        return (f"PP={p.pp} with the {named} counted as a layer ({slots} slots, "
                f"--account-for-*-in-pipeline-split): {layers} layers do not divide by {p.pp}; the end stages "
                f"hold {counts[0]} and {counts[-1]} layers, the others {max(counts)}")

    def _uneven_split(self, p: ParallelConfig) -> str:
        """Say which ranks hold fewer layers and why (the layer count, and what the end ranks carry)."""
        layers = self.model.num_layers
        counts = p.rank_layer_counts(layers)
        middle = counts[1] if p.pp > 2 else None
        ends = []
        if p.first_stage_layers is not None:
            ends.append("first")
        if p.last_stage_layers is not None:
            ends.append("last")
        # in the order the stages are named (first, then last), once where both ends hold the same count
        given = [c for c in (p.first_stage_layers, p.last_stage_layers) if c is not None]
        count_words = " and ".join(str(c) for c in (given if len(set(given)) > 1 else given[:1]))
        why = (f"{layers} layers do not divide by {p.pp}" if layers % p.pp
               else f"{layers} layers would divide by {p.pp}, but the end ranks carry more than layers")
        one = given == [1] or given == [1, 1]
        text = (f"PP={p.pp} with {count_words} layer{'' if one else 's'} on the {' and '.join(ends)} stage"
                f"{'s' if len(ends) > 1 else ''}: {why}; the embedding/output stages get fewer")
        if middle is not None:
            text += f" ({middle} on each middle stage)"
        return text

    def _cp(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        out = []
        seq = self.training.seq_length
        if p.cp > 1:
            out.append(f"CP={p.cp} exposes {_pct(component_share(est, 'cp'))} of step time in CP communication")
            if p.cp_comm_type == "a2a":
                heads = self.model.num_attention_heads // (p.tp * p.cp)
                what = a2a_only_attention(self.model)
                why = "" if what is None else f" ({what} {'runs' if what.startswith('a ') else 'run'} under CP only so)"
                out.append(f"CP={p.cp} with --cp-comm-type a2a{why}: all-to-alls of q, k, v and the output give each "
                           f"rank the whole sequence of {heads} attention heads, no K/V ring")
            without = self._floor_variant(p, cp=1)
            if without and not self.cost.fits(without[1]):
                out.append(f"CP={p.cp} because seq {seq:,} × MBS 1 activations need "
                           f"{_gib(without[1].memory_gib.activations)} at CP=1 even with full recompute, "
                           f"total {self._too_big(without[1])}")
            else:
                versus = self._versus("cp", 1, p, est)
                if versus:
                    out.append(f"CP={p.cp}: {versus}")
        return out

    def _experts(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        moe = self.model.moe
        if moe is None:
            return []
        experts = moe.num_experts
        span = p.ep * p.expert_tp
        # the domain the cost model prices (comm.scaleup_domain): the node, or the NVL72 rack across its trays
        fabric = self.cluster.gpu.scaleup_fabric
        where = f"inside one {fabric} domain" if span <= scaleup_domain(self.cluster) else f"across {fabric} domains"
        out = [f"EP={p.ep}: {experts} experts / {p.ep} = {experts // p.ep} per rank (EP divides the expert "
               f"count); all-to-all {where}, {_pct(component_share(est, 'ep'))} of step time"]
        if p.ep > 1:
            single = self._variant(p, ep=1)
            if single:
                fits = "fits" if self.cost.fits(single[1]) else f"does not fit: {self._too_big(single[1])}"
                sharded = f"; FSDP already shards the experts over DP={p.dp}" if p.fsdp else ""
                out.append(f"EP memory: weights+grads+optimizer {_gib(_static(single[1]))} per GPU at EP=1 vs "
                           f"{_gib(_static(est))} at EP={p.ep} (EP=1 {fits}{sharded})")
        for other in _neighbours(p.ep, list(space.divisors(experts))):
            versus = self._versus("ep", other, p, est)
            if versus:
                out.append(f"EP={p.ep}: {versus}")
        contrast = self._ep_other_side_of_the_node(p, est, inside=where.startswith("inside"))
        if contrast:
            out.append(contrast)
        out.append(f"router: top-{moe.router_topk} of {experts}, load balancing {moe.load_balancing_type}, "
                   f"aux-loss coefficient {moe.aux_loss_coeff:g}")
        return out

    def _ep_other_side_of_the_node(self, p: ParallelConfig, est: EstimateResult, *, inside: bool) -> str | None:
        """Compare with the best layout whose expert group sits on the other side of the NVLink domain's boundary."""
        domain = scaleup_domain(self.cluster)
        others = [(q, e) for (dim, _), (q, e) in self.best_by.items()
                  if dim == "ep" and (q.ep * q.expert_tp <= domain) != inside]
        if not others:
            return None
        q, other = max(others, key=lambda pair: pair[1].tokens_per_s_per_gpu)
        fabric = self.cluster.gpu.scaleup_fabric
        side = f"across {fabric} domains" if inside else f"inside one {fabric} domain"
        return (f"EP={p.ep}: the best layout with the all-to-all {side} ({layout_label(q)}) is "
                f"{self._speed_delta(est, other)} (EP all-to-all {_pct(component_share(other, 'ep'))} of its step)")

    def _dp(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        world, gbs = self.cluster.world_size, self.training.global_batch_size
        out = [f"DP={p.dp} fills the rest: {world:,} GPUs / (TP {p.tp} × PP {p.pp} × CP {p.cp}) = {p.dp}; "
               f"DP gradient sync exposes {_pct(component_share(est, 'dp'))} of step time"]
        # DP divides both the GPUs and the batch: where their common factors stop it at a small share of the GPUs,
        # the batch, not the model, chose this layout (GBS 1,021 on 96 GPUs: DP=1, the GPUs spent on PP and CP)
        cap = math.gcd(gbs, world)
        if p.dp == cap and cap * 8 <= world:
            near = min(range(max(1, gbs * 19 // 20), gbs * 21 // 20 + 1),
                       key=lambda n: (-math.gcd(n, world), abs(n - gbs)))
            hint = f" (e.g. {near:,}, DP up to {math.gcd(near, world)})" if math.gcd(near, world) > cap else ""
            out.append(f"DP ≤ {cap}: DP must divide both the global batch ({gbs:,}) and the {world:,} GPUs, whose "
                       f"largest common factor is {cap}; a batch sharing more factors with the GPU count{hint} "
                       "could free GPUs now spent on TP, PP and CP, where memory allows")
        return out

    def _mbs(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        micro = p.num_microbatches(self.training.global_batch_size)
        text = f"MBS={p.mbs}: {micro} micro-batch{'es' if micro != 1 else ''} per replica"
        larger = self._variant(p, mbs=p.mbs * 2)
        if larger and not self.cost.fits(larger[1]):
            text += f"; MBS={p.mbs * 2} would not fit ({self._too_big(larger[1])})"
        elif larger:
            text += f"; MBS={p.mbs * 2} would be {self._speed_delta(est, larger[1])}"
            if p.mbs * 2 > space.MAX_MBS:  # costed here, but never a candidate: say so, or the faster one looks missed
                text += f", but the search stops at MBS {space.MAX_MBS} (pass --mbs {p.mbs * 2} to take it)"
        return [text]

    def _recompute(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        if p.recompute == "none" and p.cpu_offloading_num_layers:
            return self._offload(p, est)
        if p.recompute == "none":
            return ["no activation recompute: every activation fits"]
        lighter = "none" if p.recompute == "selective" else "selective"
        less = self._variant(p, recompute=lighter, recompute_method="uniform", recompute_num_layers=None)
        share = component_share(est, "recompute")
        text = f"{_recompute_label(p)} recompute costs {_pct(share)} of step time"
        if less and not self.cost.fits(less[1]):
            text += f"; with {lighter} recompute activations would need {_gib(less[1].memory_gib.activations)}, " \
                    f"total {self._too_big(less[1])}"
        return [text]

    def _offload(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        """Why activations go to host memory: what they would need on the GPU, and what the copies cost."""
        layers = p.cpu_offloading_num_layers
        text = (f"no activation recompute: the activations of the first {layers} layers go to host memory while "
                f"the later ones compute (--cpu-offloading-num-layers {layers}); the copies the host link "
                f"({self.cluster.gpu.host_link_gbps:.0f} GB/s) cannot hide cost {_pct(component_share(est, 'offload'))}"
                " of step time")
        kept = self._variant(p, cpu_offloading_num_layers=0)
        if kept and not self.cost.fits(kept[1]):
            text += f"; kept on the GPU they would need {self._too_big(kept[1])}"
        recomputed = self._variant(p, recompute="full", recompute_method="uniform", recompute_num_layers=1)
        if recomputed and self.cost.fits(recomputed[1]):
            text += f"; full recompute instead would be {self._speed_delta(est, recomputed[1])}"
        return [text]

    def _fsdp(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        if not p.fsdp:
            return []
        plain = self._variant(p, fsdp=False)
        if plain and not self.cost.fits(plain[1]):
            return [f"FSDP shards weights and grads over DP={p.dp}: without it {self._too_big(plain[1])}"]
        if plain:
            return [f"FSDP over DP={p.dp}; plain distributed optimizer would be {self._speed_delta(est, plain[1])}"]
        return []

    def _optimizer(self, p: ParallelConfig, est: EstimateResult) -> list[str]:
        """Muon: what it costs per step, and why the layouts run without Adam's sharding."""
        if not self.training.uses_muon:
            return []
        sharing = f"dealt out over DP={p.dp}" if self.training.optimizer == "dist_muon" else "on every DP rank"
        return [f"optimizer {self.training.optimizer}: its step, Newton-Schulz {sharing}, takes "
                f"{_pct(component_share(est, 'optimizer'))} of step time; no distributed optimizer or Megatron-FSDP "
                "(Megatron refuses them beside Muon)"]

    # -- summary across candidates
    def runners_up(self, ranked: Sequence[tuple[ParallelConfig, EstimateResult]],
                   ranked_lower_by: Callable[[ParallelConfig, EstimateResult], str | None] | None = None,
                   ) -> list[str]:
        """Why each runner-up lost to the winner: the time component that grew the most, or for one predicted
        faster, the tie-break rule `ranked_lower_by` names for it (the planner's recipe preferences)."""
        if not ranked:
            return []
        best = ranked[0][1]
        lines = []
        for index, (p, est) in enumerate(ranked[1:], start=2):
            delta = 1 - est.tokens_per_s_per_gpu / best.tokens_per_s_per_gpu
            rule = ranked_lower_by(p, est) if ranked_lower_by is not None and delta < TIE_FRACTION else None
            if rule:
                speed = "ties on speed" if delta > -TIE_FRACTION else (
                    f"is predicted {_pct(-delta)} faster, within the model's error")
                lines.append(f"#{index} {layout_label(p)} {speed}: ranked lower by the recipe tie-break ({rule})")
                continue
            if delta < TIE_FRACTION:
                lines.append(f"#{index} {layout_label(p)} ties on speed; ranked lower on memory "
                             f"({_gib(est.memory_gib.total)} vs {_gib(best.memory_gib.total)}) or simplicity")
                continue
            cause = _largest_growth(best, est)
            lines.append(f"#{index} {layout_label(p)} is {_pct(delta)} slower" + (f": {cause}" if cause else ""))
        return lines


def _neighbours(value: int, legal: list[int]) -> list[int]:
    """The next smaller and next larger legal value (what a reader would compare with)."""
    below = [v for v in legal if v < value]
    above = [v for v in legal if v > value]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def _static(est: EstimateResult) -> float:
    m = est.memory_gib
    return m.weights + m.gradients + m.optimizer


def _largest_growth(best: EstimateResult, other: EstimateResult) -> str:
    keys = set(best.time_breakdown_s) | set(other.time_breakdown_s)
    growth = {k: other.time_breakdown_s.get(k, 0.0) - best.time_breakdown_s.get(k, 0.0)
              for k in keys if not _is_total(k)}
    if not growth:
        return ""
    key = max(growth, key=growth.__getitem__)
    if growth[key] <= 0:
        return ""
    return (f"{component_words(key)} {format_duration(other.time_breakdown_s.get(key, 0.0))} vs "
            f"{format_duration(best.time_breakdown_s.get(key, 0.0))} per step")
