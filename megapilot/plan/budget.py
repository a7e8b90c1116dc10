"""The plan for a token budget: each candidate's time to train (`megapilot.estimate.budget`), and the candidates
ranked by it. Per-step throughput ranks layouts for one step; over a budget, a layout that is slower in a
long-context phase or during the batch warm-up can lose its lead, so with a budget the elapsed time decides
(ties keep the planner's order)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from megapilot.errors import MegapilotError
from megapilot.estimate.budget import (
    BudgetRequest,
    Fleet,
    Shape,
    ShapeCost,
    StepCost,
    TimeBand,
    TimeToTrain,
    estimate_band,
    layout_step_cost,
    time_to_train,
)
from megapilot.estimate.goodput import DEFAULT_CHECKPOINT_GBPS_PER_GPU, checkpoint_bytes, estimated_checkpoint
from megapilot.plan.reasons import layout_label
from megapilot.plan.search import Candidate, PlanResult
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import TrainingSpec


@dataclass(frozen=True)
class ClusterCorrection:
    """The cluster's own runs' say on a layout (megapilot.estimate.history_calibration): its calibrated step over
    the estimator's, and the band of the calibration's held-out errors (tokens/s within a factor 1 + band of the
    calibrated figure, `history_calibration.calibrated_interval`)."""

    step_scale: float
    band_fraction: float
    source: str


def run_budget(request: BudgetRequest, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               parallel: ParallelConfig, options: object | None = None,
               correction: ClusterCorrection | None = None) -> TimeToTrain:
    """One layout's whole run: phases costed by the estimator, the checkpoint estimated from the model's size
    over the storage bandwidth (or the request's measured one), the band from the estimate's calibration; with a
    `correction` from the cluster's runs, every phase's step scaled by it and the band its own."""
    size = checkpoint_bytes(model, training.optimizer)
    gbps = DEFAULT_CHECKPOINT_GBPS_PER_GPU * cluster.world_size if request.checkpoint_gbps is None \
        else request.checkpoint_gbps
    checkpoint = estimated_checkpoint(size, gbps)
    cost = layout_step_cost(model, cluster, training, parallel, options)
    if correction is None:
        band = estimate_band(model, cluster, training)
    else:
        cost, band = _scaled(cost, correction.step_scale), TimeBand.within_factor(correction.band_fraction,
                                                                                  correction.source)
    return time_to_train(request, training, Fleet.of(cluster), cost, checkpoint=checkpoint, band=band)


def _scaled(cost: StepCost, scale: float) -> StepCost:
    def scaled(shape: Shape) -> ShapeCost:
        found = cost(shape)
        return replace(found, step_time_s=found.step_time_s * scale)

    return scaled


@dataclass(frozen=True)
class BudgetedPlan:
    """The plan's candidates in time-to-train order, each with its run."""

    plan: PlanResult  # candidates reordered
    runs: tuple[TimeToTrain, ...]  # aligned with plan.candidates

    def to_json(self) -> dict[str, object]:
        document = self.plan.to_json()
        rows: list[dict[str, object]] = document["candidates"]  # type: ignore[assignment]  # to_json's list
        document["candidates"] = [row | {"budget": run.to_json()} for row, run in zip(rows, self.runs, strict=True)]
        document["ranked_by"] = "time_to_train"
        return document


def rank_by_time_to_train(result: PlanResult, request: BudgetRequest, options: object | None = None) -> BudgetedPlan:
    """Each candidate's run for the budget, the candidates ordered by expected elapsed time (stable). A candidate
    whose warm-up batch or phase its layout cannot train (a batch its MBS x DP does not divide) is left out, said
    so on the first; the budget is refused only when no candidate can train it."""
    runs: list[TimeToTrain] = []
    kept: list[Candidate] = []
    left_out: list[tuple[Candidate, MegapilotError]] = []
    for candidate in result.candidates:
        try:
            runs.append(run_budget(request, result.model, result.cluster, result.training, candidate.parallel,
                                   options))
            kept.append(candidate)
        except MegapilotError as exc:
            left_out.append((candidate, exc))
    if not kept and left_out:
        raise left_out[0][1]
    order = sorted(range(len(runs)), key=lambda i: runs[i].elapsed_s)
    candidates: list[Candidate] = [kept[i] for i in order]
    notes = [f"left out of the budget ranking: {layout_label(c.parallel)} ({exc.field}: {exc.problem})"
             for c, exc in left_out]
    if order and order[0] != 0:  # the budget moved another layout first: say why
        first, fastest = runs[order[0]], runs[0]
        notes.insert(0, f"first by time to train: {first.days.value:,.1f} days against {fastest.days.value:,.1f} "
                        "for the layout with the fastest main step (its other phases or batch warm-up cost it the "
                        "lead)")
    if candidates and notes:
        candidates[0] = candidates[0].model_copy(update={"reasons": [*notes, *candidates[0].reasons]})
    return BudgetedPlan(result.model_copy(update={"candidates": candidates}), tuple(runs[i] for i in order))
