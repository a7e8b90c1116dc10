"""`plan()`: search, rank, explain — and when nothing fits, say what bites and the smallest change that fits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from megapilot.errors import MegapilotError
from megapilot.plan.cost import DEFAULT_HEADROOM_FRACTION, CostModel, LayoutEstimator
from megapilot.plan.reasons import Explainer, layout_label
from megapilot.plan.search import Candidate, Fit, PlanResult, RankKey, SearchOutcome, rank_key, search_layouts
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

    `options` are the estimator's run features (overlap, bf16 gradient reduction); None = defaults.
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
    cost = CostModel(model, cluster, training, estimator, options, headroom_fraction)
    outcome = search_layouts(model, cluster, training, pins=pins, cost=cost)
    if not outcome.ranked:
        raise _nothing_fits(cost, pins, outcome)
    band = model_error_band(model, cluster, training)
    chosen = distinct_shapes(prefer_recipe_shapes(outcome.ranked, band), top)
    explainer = Explainer(cost, outcome.best_by)
    candidates = []
    for rank, (parallel, _) in enumerate(chosen):
        # The public estimate validates the layout (the search's pre-filters must agree with the spec)
        # and carries Megatron's warnings for it.
        est = cost.validated(parallel)
        reasons = explainer.explain(parallel, est) + [f"note: {w}" for w in est.warnings]
        if rank == 0:
            reasons += _recipe_preference_reason(chosen, band)
        candidates.append(Candidate(parallel=parallel, estimate=est, reasons=reasons))
    return PlanResult(
        model=model, cluster=cluster, training=training, candidates=candidates,
        rejected={reason.value: count for reason, count in sorted(outcome.rejected.items(), key=lambda kv: -kv[1])},
        summary=explainer.runners_up(chosen),
        layouts_costed=cost.calls, memory_checks=cost.memory_calls, layouts_fitting=outcome.layouts_fitting,
    )


def model_error_band(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> float:
    """The estimator's own median error where this case lies (its calibrated cell, or the nearest); 10 % when no
    published run checks the case."""
    from megapilot.estimate.coverage import coverage_for

    coverage = coverage_for(model, cluster.gpu, training.precision)
    return coverage.nearest.median_abs_error if coverage.nearest is not None else UNCHECKED_ERROR_BAND


def prefer_recipe_shapes(ranked: list[Fit], band: float) -> list[Fit]:
    """Rank layouts the published recipes use (TP/PP/VPP with overlap) ahead of Megatron-FSDP ones that are
    predicted faster by less than the model's own error: within that band the prediction cannot tell them
    apart, and the recipe shape is the one measured at scale."""
    return sorted(ranked, key=lambda fit: recipe_rank_key(fit[0], fit[1], band))


def recipe_rank_key(p: ParallelConfig, est: EstimateResult, band: float) -> RankKey:
    """`search.rank_key` with a non-FSDP layout's throughput credited by the error band."""
    credited = est.tokens_per_s_per_gpu * (1.0 if p.fsdp else 1.0 + band)
    return rank_key(p, est.model_copy(update={"tokens_per_s_per_gpu": credited}))


def _recipe_preference_reason(chosen: list[Fit], band: float) -> list[str]:
    best = chosen[0]
    faster = [fit for fit in chosen[1:] if fit[0].fsdp and fit[1].tokens_per_s_per_gpu > best[1].tokens_per_s_per_gpu]
    if best[0].fsdp or not faster:
        return []
    gain = faster[0][1].tokens_per_s_per_gpu / best[1].tokens_per_s_per_gpu - 1
    return [f"a Megatron-FSDP layout ({layout_label(faster[0][0])}) is predicted {100 * gain:.1f} % faster, within "
            f"the model's {100 * band:.0f} % median error here: the recipes' TP/PP shape is ranked first"]


def distinct_shapes(ranked: list[Fit], top: int) -> list[Fit]:
    """The best layout of each parallel shape (TP, PP, CP, EP, ETP, FSDP), `top` of them.

    Variants of one shape (another VPP, MBS or recompute) are tuning of the same choice; showing
    five of them would hide the real alternatives.
    """
    seen: set[tuple[int, int, int, int, int | None, bool]] = set()
    chosen: list[Fit] = []
    for fit in ranked:
        parallel = fit[0]
        key = (parallel.tp, parallel.pp, parallel.cp, parallel.ep, parallel.etp, parallel.fsdp)
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
    fix = "; or ".join(fixes) if fixes else "use a larger GPU or a smaller model"
    return MegapilotError(f"no layout fits: {bites}", field=_bite_field(outcome), fix=fix)


def _binding(outcome: SearchOutcome) -> tuple[RejectReason, int] | None:
    """The rule that cut the most layouts (dominance cuts are not constraints, so they never bite)."""
    cuts = {reason: count for reason, count in outcome.rejected.items() if not reason.dominated}
    return max(cuts.items(), key=lambda kv: kv[1]) if cuts else None


def _what_bites(outcome: SearchOutcome) -> str:
    binding = _binding(outcome)
    if binding is None:
        return "no layout passes the rules"
    reason, count = binding
    text = f"{count} layouts cut by '{reason.value}'"
    if outcome.smallest_floor is not None:
        parallel, memory = outcome.smallest_floor
        text += (f"; the smallest footprint found ({layout_label(parallel)}) needs "
                 f"{memory.total_gib:.1f} GiB per GPU of {memory.capacity_gib:.1f} GiB")
    return text


def _bite_field(outcome: SearchOutcome) -> str:
    binding = _binding(outcome)
    if binding is None:
        return "parallel"
    return "memory" if binding[0].memory else binding[0].value.split()[0]


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
    for factor in (2, 4, 8, 16):
        bigger = ClusterSpec(gpu=cluster.gpu, num_nodes=cluster.num_nodes * factor,
                             gpus_per_node=cluster.gpus_per_node)
        relaxed = training.model_copy(update={"global_batch_size": training.global_batch_size * factor}) \
            if training.global_batch_size % bigger.world_size else training
        if _fits(cost.with_inputs(cluster=bigger, training=relaxed), pins):
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
