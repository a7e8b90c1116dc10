"""The recipe tie-break: among layouts the cost model cannot tell apart, prefer what the public recipes prefer.

The estimator is off by a measured amount: its median |error| against the published runs of the same model
family, GPU and precision (`megapilot/estimate/data/calibration_coverage.json`, read through
`megapilot.estimate.coverage`; when this was written e.g. 7.0 % for dense models on H100 in bf16 over 9 runs,
6.6 % in fp8 over 15, 16-17 % for MoE on B200 in fp8 over 5; 10 % where no published run checks the case; a
plan's reasons print the value and cell it used). Layouts predicted within
that band of the fastest (throughput >= fastest / (1 + band)) are therefore a tie as far as the prediction can
tell, and are ordered by the general preferences of the NVIDIA/AMD performance recipes (Megatron-Bridge perf
recipes, NeMo recommended configs, Primus, the Megatron-MoE model zoo), one rule after the other, then by
predicted speed. Outside the band the prediction decides alone.

Each rule is a penalty on a layout (0 = what the recipes do) computed from the layout, its estimated memory, the
model's shape, the GPU's NVLink domain and the cluster size only: no rule names a model or a published row.
What the rules leave tied (e.g. TP 2 with PP 8 against TP 4 with PP 4, where the recipes go both ways across GPUs
and releases) the prediction orders: a fixed "smaller TP first" or "TP before PP" would be a coin the recipes
do not toss the same way twice (`bench/calibration/published_top3.md` has the figures of each variant tried).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megapilot.estimate import LOW_HEADROOM_FRACTION
from megapilot.spec import ClusterSpec, EstimateResult, ModelSpec, ParallelConfig

if TYPE_CHECKING:
    from megapilot.plan.search import Fit


@dataclass(frozen=True)
class ErrorBand:
    """How far the estimator's throughput is off here (a fraction) and which published runs say so."""

    fraction: float
    source: str


@dataclass(frozen=True)
class LayoutContext:
    """What the rules may look at besides the layout: the NVLink domain and the model's expert count."""

    nvlink_gpus: int  # GPUs one NVLink (scale-up) domain gives this job
    num_experts: int | None  # None for a dense model
    one_domain: bool = False  # the whole job inside one NVLink domain (one 8-GPU node, one NVL72 rack)

    @classmethod
    def of(cls, model: ModelSpec, cluster: ClusterSpec) -> LayoutContext:
        # the cluster's domain: an HGX baseboard's NVLink ends at the node when nodes hold fewer of its GPUs
        domain = min(cluster.scaleup_domain_gpus, cluster.world_size)
        return cls(nvlink_gpus=domain, num_experts=model.moe.num_experts if model.moe else None,
                   one_domain=cluster.world_size <= cluster.scaleup_domain_gpus)

    @property
    def expert_target(self) -> int:
        """The EP the recipes aim for: the largest divisor of the expert count inside one NVLink domain."""
        experts = self.num_experts or 1
        return max(d for d in range(1, min(experts, self.nvlink_gpus) + 1) if experts % d == 0)


@dataclass(frozen=True)
class Preference:
    """One recipe rule: a penalty per layout (lower is preferred), what it prefers, and why the recipes do."""

    name: str
    prefers: str
    why: str
    penalty: Callable[[Fit, LayoutContext], float]


def _log2(x: float) -> float:
    return math.log2(max(x, 1))


def _fsdp(fit: Fit, ctx: LayoutContext) -> float:
    """Megatron-FSDP is penalised unless the model is dense and the whole job sits in one NVLink domain."""
    return float(fit.parallel.fsdp and (ctx.num_experts is not None or not ctx.one_domain))


def _expert_parallel(fit: Fit, ctx: LayoutContext) -> float:
    """Distance, in doublings, from the EP that fills the NVLink domain (0 for a dense model)."""
    if ctx.num_experts is None:
        return 0.0
    return abs(math.log2(fit.parallel.ep / ctx.expert_target))


def exotic_flags(p: ParallelConfig) -> tuple[str, ...]:
    """The flags of a layout that few recipes run (each one a code path less exercised at scale): activation
    offload to host memory, and a first/last pipeline stage sized apart from the others."""
    flags = []
    if p.cpu_offloading_num_layers:
        flags.append("--cpu-offloading-num-layers")
    if p.first_stage_layers is not None:
        flags.append("--decoder-first-pipeline-num-layers")
    if p.last_stage_layers is not None:
        flags.append("--decoder-last-pipeline-num-layers")
    return tuple(flags)


def _exotic_flags(fit: Fit, ctx: LayoutContext) -> float:
    return float(len(exotic_flags(fit.parallel)))


def _dimensions_in_use(fit: Fit, ctx: LayoutContext) -> float:
    p = fit.parallel
    return float(sum(size > 1 for size in (p.tp, p.pp, p.cp)))


def _full_recompute(fit: Fit, ctx: LayoutContext) -> float:
    return float(fit.parallel.recompute == "full")


def _context_parallel(fit: Fit, ctx: LayoutContext) -> float:
    return _log2(fit.parallel.cp)


def low_headroom(est: EstimateResult) -> bool:
    """Less HBM left free than the estimate's low-headroom line."""
    memory = est.memory_gib
    return memory.capacity - memory.total < LOW_HEADROOM_FRACTION * memory.capacity


def _memory_headroom(fit: Fit, ctx: LayoutContext) -> float:
    return float(low_headroom(fit.estimate))


def variant_penalty(p: ParallelConfig, est: EstimateResult) -> tuple[int, int]:
    """What the rules hold against one variant (VPP, MBS, recompute, offload) of a shape: its exotic flags, then
    memory left below the low-headroom line. The search shows a shape by the variant with the least of it inside
    the error band (`search._Search._representatives`)."""
    return len(exotic_flags(p)), int(low_headroom(est))


# First rule first; each later rule only orders layouts the earlier ones tie. The optimizer and EP choices come
# first because the recipes make them by one fixed rule whatever the model's size; then the flags few recipes run;
# then full recompute, which the recipes leave for when nothing else fits; then how many communicating dimensions a
# layout uses, and CP, the one the recipes add only for memory; then whether the layout leaves the memory the
# estimate's own error needs. What is still tied goes by predicted speed.
PREFERENCES: tuple[Preference, ...] = (
    Preference(
        "distributed optimizer", "the distributed optimizer over Megatron-FSDP",
        "almost every performance recipe uses the distributed optimizer with TP/PP/EP, MoE ones shard experts "
        "with EP rather than FSDP, and Megatron-Bridge calls FSDP with TP/PP/CP/EP 'not benchmark-proven'; "
        "a dense model whose whole job fits one NVLink domain (an 8-GPU node, an NVL72 rack) is the exception: "
        "there FSDP's per-layer gathers and reduce-scatters ride NVLink and the recipes use it as readily",
        _fsdp),
    Preference(
        "expert parallelism", "EP filling the NVLink domain",
        "MoE recipes use EP as large as the expert count allows inside one NVLink domain (EP8 on 8-GPU "
        "nodes, EP64 on NVL72): the token all-to-all stays on NVLink and each GPU holds fewer experts",
        _expert_parallel),
    Preference(
        "fewer exotic flags", "no activation offload and even pipeline stages",
        "activation offload and hand-sized first/last pipeline stages are flags few recipes run: each is a "
        "code path less exercised at scale (offload also leans on host memory the plan does not see), so "
        "they are worth it only when the prediction says so beyond its own error",
        _exotic_flags),
    Preference(
        "lighter recompute", "selective or no recompute over full recompute",
        "full recompute reruns every recomputed layer's whole forward in the backward (about a third more "
        "compute, a cost the estimate knows well, unlike its absolute error), and the recent performance "
        "recipes reach for pipeline stages or a selective module list before it",
        _full_recompute),
    Preference(
        "fewer parallel dimensions", "fewer communication-heavy dimensions (TP, PP, CP)",
        "each dimension in use puts its own communication on the critical path (TP collectives in every "
        "layer, the PP bubble and send/recv, the CP ring), and the recipes turn one on only when memory "
        "or scale asks for it",
        _dimensions_in_use),
    Preference(
        "context parallelism", "the smaller CP (CP=1 where the sequence fits without it)",
        "CP only when the sequence needs it for memory: it cuts every attention into ring send/recv steps "
        "and shrinks the GEMMs",
        _context_parallel),
    Preference(
        "memory headroom", f"at least {100 * LOW_HEADROOM_FRACTION:.0f} % of HBM left free",
        "the memory estimate has its own error and the allocator its spikes: a layout predicted to fill the "
        "GPU to its last few GiB may run out of memory where one with room runs, so among ties the one with "
        "room goes first (the estimate warns below the same line)",
        _memory_headroom),
)


def preference_key(fit: Fit, ctx: LayoutContext, rules: Sequence[Preference] = PREFERENCES) -> tuple[float, ...]:
    return tuple(rule.penalty(fit, ctx) for rule in rules)


def within_band(fits: Sequence[Fit], band: ErrorBand) -> float:
    """The slowest throughput still inside the error band of the fastest layout."""
    fastest = max(fit.estimate.tokens_per_s_per_gpu for fit in fits)
    return fastest / (1 + band.fraction)


def order_by_recipe(fits: Sequence[Fit], band: ErrorBand, ctx: LayoutContext,
                    rules: Sequence[Preference] = PREFERENCES) -> list[Fit]:
    """`fits` (ranked by the search's own key) with the ones inside the band of the fastest ordered by the
    rules first, then by that key; the ones outside follow unchanged."""
    if not fits:
        return []
    floor = within_band(fits, band)
    inside = [fit for fit in fits if fit.estimate.tokens_per_s_per_gpu >= floor]
    outside = [fit for fit in fits if fit.estimate.tokens_per_s_per_gpu < floor]
    order = {id(fit): index for index, fit in enumerate(fits)}
    inside.sort(key=lambda fit: (preference_key(fit, ctx, rules), order[id(fit)]))
    return inside + outside


def deciding_rule(winner: Fit, other: Fit, ctx: LayoutContext,
                  rules: Sequence[Preference] = PREFERENCES) -> Preference | None:
    """The first rule that ranks `winner` ahead of `other` (None when the rules tie them)."""
    for rule in rules:
        mine, theirs = rule.penalty(winner, ctx), rule.penalty(other, ctx)
        if mine != theirs:
            return rule if mine < theirs else None
    return None


def tie_break_reason(winner: Fit, faster: Fit, band: ErrorBand, ctx: LayoutContext, label: str) -> str | None:
    """Why a slower layout ranks ahead of a faster one: the band, its source, and the rule that decided."""
    rule = deciding_rule(winner, faster, ctx)
    if rule is None:
        return None
    gain = _gain(faster.estimate, winner.estimate)
    return (f"tie-break ({rule.name}): {label} is predicted {100 * gain:.1f} % faster, within the model's "
            f"{100 * band.fraction:.1f} % error here ({band.source}); the recipes prefer {rule.prefers}: "
            f"{rule.why}")


def _gain(faster: EstimateResult, slower: EstimateResult) -> float:
    return faster.tokens_per_s_per_gpu / slower.tokens_per_s_per_gpu - 1
