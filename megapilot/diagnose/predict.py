"""Predictions for a layout, from `megapilot.estimate` (this package owns no formula).

A layout the estimator refuses as a user error (`MegapilotError`: an impossible split, a layout
Megatron would reject) has no prediction. Anything else the estimator raises is a defect of the
estimator and propagates: a silent "no prediction" would hide it from the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.errors import MegapilotError
from megapilot.estimate import EstimateOptions, estimate
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, TrainingSpec


@dataclass(frozen=True)
class Prediction:
    """What the estimators predict for one layout (per GPU, most-loaded rank for memory)."""

    memory_gib: float
    capacity_gib: float
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None

    @property
    def fits(self) -> bool:
        return self.memory_gib <= self.capacity_gib


def predict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
            options: EstimateOptions | None = None) -> Prediction | None:
    """The estimator's answer for exactly this layout and these run switches (the overlaps and dispatcher the
    flags turn on; None: the estimator's defaults), or None when it refuses the layout."""
    try:
        result = estimate(model, cluster, training, parallel, options or EstimateOptions())
    except MegapilotError:
        return None
    return Prediction(memory_gib=result.memory_gib.total, capacity_gib=result.memory_gib.capacity,
                      step_time_s=result.step_time_s, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
                      mfu=result.mfu)


def refusal(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
            options: EstimateOptions | None = None) -> str | None:
    """Why the estimator refuses this layout (the rule and its fix), or None when it answers."""
    try:
        estimate(model, cluster, training, parallel, options or EstimateOptions())
    except MegapilotError as exc:
        return str(exc)
    return None
