"""`plan()`: search, rank, explain — and when nothing fits, say what bites and the smallest change that fits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from megapilot.catalog.gpus import load_gpus
from megapilot.errors import MegapilotError
from megapilot.estimate import LOW_HEADROOM_FRACTION, EstimateOptions, cross_domain_flex_backend
from megapilot.estimate.coverage import coverage_for
from megapilot.estimate.moe_terms import ep_leaves_domain
from megapilot.limits import MAX_GPUS
from megapilot.plan.cost import DEFAULT_HEADROOM_FRACTION, CostModel, LayoutEstimator
from megapilot.plan.preferences import (
    ErrorBand,
    LayoutContext,
    deciding_rule,
    exotic_flags,
    low_headroom,
    order_by_recipe,
    tie_break_reason,
)
from megapilot.plan.reasons import Explainer, layout_label
from megapilot.plan.search import (
    TIE_BAND,
    Candidate,
    Fit,
    PlanResult,
    SearchOutcome,
    ShapeKey,
    rank_key,
    search_layouts,
    shape_key,
)
from megapilot.plan.space import Pins, RejectReason
from megapilot.spec import ClusterSpec, EstimateResult, ModelSpec, ParallelConfig, TrainingSpec

if TYPE_CHECKING:
    from megapilot.estimate import EstimateOptions

DEFAULT_TOP = 5
# The error band of a case no published run checks (AMD GPUs, hybrid models): a typical calibrated median.
UNCHECKED_ERROR_BAND = 0.10


def plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    top: int = DEFAULT_TOP,
    pins: Pins | None = None,
    estimator: LayoutEstimator | None = None,
    options: EstimateOptions | None = None,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
) -> PlanResult:
    """The `top` best layouts for this model on this cluster, each with its reasons.

    Ranked by predicted tokens/s/GPU, except that the best layouts of the shapes predicted within the
    estimator's own median error of the fastest (`model_error_band`) are ordered by the recipes' preferences
    (`preferences.PREFERENCES`); the winner's reasons name the rule when that put it ahead of a faster one.
    `options` are the estimator's run features (the overlaps, the MoE dispatcher); None = defaults.
    `headroom_fraction`: the share of each GPU's HBM a planned layout must leave free beyond the estimate's
    own overhead allowance (default 0: that allowance is the margin).

    Raises MegapilotError when a pinned value is illegal, or when no layout fits; the latter names
    the constraint that bites and the smallest relaxation (more GPUs, shorter sequence, ...) that fits.
    """
    if top < 1:
        raise MegapilotError(f"must be at least 1, got {top}", field="top", fix="pass --top 1 or more")
    pins = pins or Pins()
    if not 0 <= headroom_fraction < 1:
        raise MegapilotError(f"must be in [0, 1), got {headroom_fraction}", field="headroom",
                             fix="give the share of HBM to leave free, e.g. 0.05")
    gbs = training.global_batch_size
    if pins.mbs and gbs % pins.mbs:  # no DP can split it: say so, rather than what the search cut on the way
        fitting = [str(m) for m in range(1, min(gbs, 16) + 1) if gbs % m == 0]
        raise MegapilotError(f"mbs={pins.mbs} does not divide the global batch ({gbs}): no data-parallel replica "
                             "runs a whole number of micro-batches", field="mbs",
                             fix=f"pin an MBS from {', '.join(fitting)}, or pass a --gbs that is a multiple of "
                                 f"{pins.mbs}")
    options, cross_domain_backend = (options, None) if estimator else cross_domain_dispatcher(model, cluster, options)
    cost = CostModel(model, cluster, training, estimator, options, headroom_fraction)
    band = model_error_band(model, cluster, training)
    outcome = search_layouts(model, cluster, training, pins=pins, cost=cost, reach=band.fraction)
    if not outcome.ranked:
        raise _nothing_fits(cost, pins, outcome)
    context = LayoutContext.of(model, cluster)
    by_speed = sorted(outcome.best_by_shape.values(), key=lambda fit: rank_key(*fit))
    chosen = distinct_shapes(order_by_recipe(by_speed, band, context), top)
    explainer = Explainer(cost, shown_best_by(outcome))
    candidates = []
    for rank, (parallel, _) in enumerate(chosen):
        # The public estimate validates the layout (the search's pre-filters must agree with the spec)
        # and carries Megatron's warnings for it.
        est = cost.validated(parallel)
        reasons = explainer.explain(parallel, est) + [f"note: {w}" for w in est.warnings]
        if rank == 0:
            reasons += _tie_break_reasons(chosen[0], by_speed[0], band, context)
        reasons += _plainer_variant(Fit(parallel, est), outcome.fastest_by_shape.get(shape_key(parallel)), band)
        backend = cross_domain_backend if cross_domain_backend and ep_leaves_domain(cluster, parallel) else None
        if backend:
            reasons.append(f"experts: EP×ETP = {parallel.ep * parallel.expert_tp} leaves the NVLink domain, so the "
                           f"plan runs the flex dispatcher ({backend}): a token crosses to each remote domain once")
        candidates.append(Candidate(parallel=parallel, estimate=est, reasons=reasons, moe_flex_dispatcher=backend))
    return PlanResult(
        model=model, cluster=cluster, training=training, candidates=candidates,
        rejected={reason.value: count for reason, count in sorted(outcome.rejected.items(), key=lambda kv: -kv[1])},
        summary=explainer.runners_up(chosen, _deciding_rule_against(chosen[0], context)) + _fsdp_twins(candidates),
        layouts_costed=cost.calls, memory_checks=cost.memory_calls, layouts_fitting=outcome.layouts_fitting,
    )


# The dimensions a shape is made of (`search.shape_key`): each shape is shown by one variant (`_representatives`).
_SHAPE_DIMENSIONS = ("tp", "pp", "cp", "ep", "fsdp")


def shown_best_by(outcome: SearchOutcome) -> dict[tuple[str, object], Fit]:
    """The layout the reasons compare with for each value of each dimension: for a shape dimension (TP, PP, CP, EP,
    FSDP), the best of the layouts the plan shows its shapes by, so that `the best PP=8 layout` is the PP=8 row
    the table shows (a faster variant the rules set aside, e.g. one filling HBM, is the `variant:` reason's);
    a value no shown layout has keeps the search's fastest."""
    chosen = dict(outcome.best_by)
    seen: set[tuple[str, object]] = set()
    for fit in sorted(outcome.best_by_shape.values(), key=lambda fit: rank_key(*fit)):
        fields = fit.parallel.model_dump(include=set(_SHAPE_DIMENSIONS))
        for dim in _SHAPE_DIMENSIONS:
            if (dim, fields[dim]) not in seen:
                seen.add((dim, fields[dim]))
                chosen[(dim, fields[dim])] = fit
    return chosen


def cross_domain_dispatcher(
    model: ModelSpec, cluster: ClusterSpec, options: EstimateOptions | None
) -> tuple[EstimateOptions | None, str | None]:
    """The run options the search costs with, and the flex backend it gives expert groups that leave the NVLink
    domain. With no dispatcher stated (alltoall everywhere), such a layout is costed, and later scripted, with the
    flex dispatcher where a backend runs: pricing cross-node EP with one copy per remote expert would rule it out
    for a dispatcher nobody runs it with. Inside the domain the layout keeps alltoall."""
    stated = options or EstimateOptions()
    backend = cross_domain_flex_backend(model, cluster)
    if backend is None or stated.moe_flex_dispatcher is not False:
        return options, None
    return replace(stated, moe_flex_dispatcher=None), backend


def model_error_band(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> ErrorBand:
    """The estimator's own median |error| where this case lies (its calibrated cell, or the nearest); 10 %
    when no published run checks the case."""
    coverage = coverage_for(model, cluster.gpu, training.gemm_format)
    cell = coverage.nearest
    if cell is None:
        return ErrorBand(UNCHECKED_ERROR_BAND, f"no published run checks {coverage.family} models on this GPU "
                                               f"vendor: a typical calibrated median assumed")
    where = "" if coverage.exact else " (nearest calibrated cell)"
    return ErrorBand(cell.median_abs_error, f"median |error| over {cell.runs} published runs of {cell.family} "
                                            f"models on {cell.gpu} {cell.precision}{where}")


def _fsdp_twins(candidates: list[Candidate]) -> list[str]:
    """Say which candidates are one TP/PP/CP/EP layout twice, with and without Megatron-FSDP: the alternative they
    offer is how weights and optimizer state are sharded (and the memory that frees), not another layout."""
    lines = []
    first_rank: dict[tuple[int, int, int, int], int] = {}
    for rank, c in enumerate(candidates, start=1):
        p = c.parallel
        key = (p.tp, p.pp, p.cp, p.ep)
        if key in first_rank:
            lines.append(f"#{rank} is #{first_rank[key]}'s TP/PP/CP/EP {'with' if p.fsdp else 'without'} "
                         "Megatron-FSDP: the same layout, the other way to shard weights and optimizer state")
        else:
            first_rank[key] = rank
    return lines


def _plainer_variant(shown: Fit, fastest: Fit | None, band: ErrorBand) -> list[str]:
    """Say so when a layout is shown by a variant slower than its fastest: one the rules hold less against (no
    exotic flag, memory headroom), inside the model's error."""
    if fastest is None or fastest.parallel == shown.parallel:
        return []
    gain = fastest.estimate.tokens_per_s_per_gpu / shown.estimate.tokens_per_s_per_gpu - 1
    if gain <= 0:
        return []
    flags = [flag for flag in exotic_flags(fastest.parallel) if flag not in exotic_flags(shown.parallel)]
    held = [f"needs {', '.join(flags)}"] if flags else []
    if low_headroom(fastest.estimate) and not low_headroom(shown.estimate):
        held.append(f"leaves under {100 * LOW_HEADROOM_FRACTION:.0f} % of HBM free")
    why = " and ".join(held) or "is held back by the recipe rules"
    return [f"variant: {layout_label(fastest.parallel)} is estimated {100 * gain:.1f} % faster, inside the model's "
            f"error (±{100 * band.fraction:.1f} %), but {why}; this one does without"]


def _tie_break_reasons(winner: Fit, fastest: Fit, band: ErrorBand, context: LayoutContext) -> list[str]:
    """Say so when the recipe tie-break put a slower layout first, naming the rule that decided."""
    if winner.estimate.tokens_per_s_per_gpu * TIE_BAND >= fastest.estimate.tokens_per_s_per_gpu:
        return []
    reason = tie_break_reason(winner, fastest, band, context, f"{layout_label(fastest.parallel)}")
    return [reason] if reason else []


def _deciding_rule_against(
    winner: Fit, context: LayoutContext
) -> Callable[[ParallelConfig, EstimateResult], str | None]:
    """For a runner-up: the name of the recipe rule that ranked the winner ahead of it, if one did."""
    def name(other: ParallelConfig, est: EstimateResult) -> str | None:
        rule = deciding_rule(winner, Fit(other, est), context)
        return f"{rule.name}: the recipes prefer {rule.prefers}" if rule else None

    return name


def distinct_shapes(ranked: list[Fit], top: int) -> list[Fit]:
    """The best layout of each parallel shape (TP, PP, CP, EP, FSDP or not), `top` of them.

    Variants of one shape (another VPP, MBS, recompute or expert TP) are tuning of the same choice; showing
    five of them would hide the real alternatives.
    """
    seen: set[ShapeKey] = set()
    chosen: list[Fit] = []
    for fit in ranked:
        key = shape_key(fit[0])
        if key not in seen:
            seen.add(key)
            chosen.append(fit)
        if len(chosen) == top:
            break
    return chosen


# ---- nothing fits ----------------------------------------------------------------------------

def _nothing_fits(cost: CostModel, pins: Pins, outcome: SearchOutcome) -> MegapilotError:
    bites = _what_bites(outcome)
    fixes = _relaxations_that_fit(cost, pins)
    world, gbs = cost.cluster.world_size, cost.training.global_batch_size
    if outcome.smallest_floor is None and outcome.rejected.get(RejectReason.BATCH):
        # no layout got as far as memory, and the batch split cut some: the GPU count and the batch do not factor
        bites += (f"; {world:,} GPUs = TP×PP×CP×DP with DP dividing the global batch ({gbs:,}) leaves TP×PP×CP no "
                  "legal value")
        fixes.append(f"use a GPU count that is a legal TP×PP×CP times a divisor of {gbs:,}, or a --gbs the GPUs "
                     "divide")
    graphs = cost.options.cuda_graphs if cost.options is not None else None
    if graphs is not None and graphs.scope != ("full_iteration",):  # the search left full recompute out for them
        bites += f"; with CUDA graphs over {', '.join(graphs.scope) or 'each whole layer'} no layout recomputes fully"
        fixes.append("--cuda-graph-impl local --cuda-graph-scope full_iteration (full recompute runs under it), or no "
                     "CUDA graphs")
    fix = "; or ".join(fixes) if fixes else _beyond_relaxations(cost, outcome)
    return MegapilotError(f"no layout fits: {bites}", field=_bite_field(outcome), fix=fix)


def _beyond_relaxations(cost: CostModel, outcome: SearchOutcome) -> str:
    """The fix when no relaxation `_relaxations_that_fit` tries fits (16× the GPUs among them): what the footprint
    is made of and what it takes, not 'a larger GPU' for a footprint many times any GPU's memory."""
    if outcome.smallest_floor is None:
        return "use a larger GPU or a smaller model"
    memory = outcome.smallest_floor[1]
    by_sequence = memory.activations_gib > memory.static_gib
    shorter = f"a much shorter --seq-len (activations are {memory.activations_gib:.0f} GiB of it)"
    smaller = f"a smaller model (weights, gradients and optimizer state are {memory.static_gib:.0f} GiB of it)"
    first, then = (shorter, smaller) if by_sequence else (smaller, shorter)
    lesser = min(memory.activations_gib, memory.static_gib)
    # the lesser part is named too only where shrinking it would matter: a quarter of the footprint or more
    use = f"{first}, or {then}" if lesser >= memory.total_gib / 4 else first
    usable = memory.capacity_gib / cost.cluster.gpu.hbm_gib  # the share of HBM --headroom leaves a layout
    what = "memory" if usable == 1 else "memory left by --headroom"
    fix = (f"the smallest footprint is {memory.total_gib / memory.capacity_gib:.0f}× this GPU's {what} and does not "
           f"fit on 16× the GPUs ({16 * cost.cluster.world_size:,}) either: use {use}, or more GPUs still")
    needed = memory.total_gib / usable
    larger = sorted((gpu for gpu in load_gpus().values() if gpu.hbm_gib >= needed), key=lambda gpu: gpu.hbm_gib)
    if larger:
        fix += f"; or a GPU with {needed:.0f} GiB or more ({', '.join(gpu.alias for gpu in larger)})"
    return fix


def _binding(outcome: SearchOutcome) -> tuple[RejectReason, int] | None:
    """The rule that cut the most layouts (dominance cuts are not constraints, so they never bite)."""
    cuts = {reason: count for reason, count in outcome.rejected.items() if not reason.dominated}
    return max(cuts.items(), key=lambda kv: kv[1]) if cuts else None


def _what_bites(outcome: SearchOutcome) -> str:
    """What stopped every layout: the rule that cut the most, and the smallest footprint of the legal layouts, which
    comes first where a layout rule cut more (every legal layout overflowed, so memory is what a user must change)."""
    binding = _binding(outcome)
    if binding is None:
        return "no layout passes the rules"
    reason, count = binding
    cut = f"{count} layout{'s' if count != 1 else ''} cut by '{reason.value}'"
    if outcome.smallest_floor is None:
        return cut
    parallel, memory = outcome.smallest_floor
    floor = (f"the smallest footprint found ({layout_label(parallel)}) needs {memory.total_gib:.1f} GiB per GPU "
             f"of {memory.capacity_gib:.1f} GiB")
    return f"{cut}; {floor}" if reason.memory else f"{floor}; {cut}"


def _bite_field(outcome: SearchOutcome) -> str:
    binding = _binding(outcome)
    if binding is None:
        return "parallel"
    if outcome.smallest_floor is not None or binding[0].memory:
        return "memory"
    return "gbs" if binding[0] is RejectReason.BATCH else binding[0].value.split()[0]


def _fits(cost: CostModel, pins: Pins) -> bool:
    try:
        return bool(search_layouts(cost.model, cost.cluster, cost.training, pins=pins, cost=cost).ranked)
    except MegapilotError:
        return False


def _relaxations_that_fit(cost: CostModel, pins: Pins) -> list[str]:
    """Re-run the search on relaxed inputs; report the smallest relaxation of each kind that fits."""
    cluster, training = cost.cluster, cost.training
    found: list[str] = []
    loose = Pins(tp=pins.tp, pp=pins.pp, vpp=pins.vpp, cp=pins.cp, ep=pins.ep, etp=pins.etp)
    if loose != pins and _fits(cost.with_inputs(), loose):
        found.append("drop the --mbs/--recompute/--fsdp pins (a lower MBS or more recompute fits)")
    if cost.headroom_fraction and _fits(cost.with_inputs(headroom_fraction=0.0), pins):
        found.append(f"use a smaller --headroom (layouts fit without the {100 * cost.headroom_fraction:g} % of HBM it "
                     "keeps free)")
    for factor in (2, 4, 8, 16):
        if cluster.world_size * factor > MAX_GPUS:  # no cluster that large is planned (spec.hardware.MAX_GPUS)
            break
        bigger = ClusterSpec(gpu=cluster.gpu, num_nodes=cluster.num_nodes * factor,
                             gpus_per_node=cluster.gpus_per_node)
        # The batch needs to divide by DP only, not by the GPU count (TP, PP and CP take the rest): it is scaled
        # with the GPUs only where the batch as given does not fit them.
        scaled = training.model_copy(update={"global_batch_size": training.global_batch_size * factor})
        batches = (training, scaled) if training.global_batch_size % bigger.world_size else (training,)
        relaxed = next((batch for batch in batches if _fits(cost.with_inputs(cluster=bigger, training=batch), pins)),
                       None)
        if relaxed is not None:
            batch = "" if relaxed is training else f" (and --gbs {relaxed.global_batch_size})"
            found.append(f"use {bigger.world_size:,} GPUs ({factor}× more){batch}")
            break
    for factor in (2, 4, 8):
        shorter = training.seq_length // factor
        if shorter < 512 or training.seq_length % factor:
            break
        if _fits(cost.with_inputs(training=training.model_copy(update={"seq_length": shorter})), pins):
            found.append(f"use --seq-len {shorter}")
            break
    fp8_could_help = cluster.gpu.supports("fp8") and training.precision in ("bf16", "fp16")
    if fp8_could_help and _fits(cost.with_inputs(training=training.model_copy(update={"precision": "fp8"})), pins):
        found.append("use --precision fp8")
    return found
