"""Predictions for a layout (`megapilot.spec.Prediction`), from `megapilot.estimate` (this package owns no formula).

A layout the estimator refuses as a user error (`MegapilotError`: an impossible split, a layout
Megatron would reject) has no prediction. Anything else the estimator raises is a defect of the
estimator and propagates: a silent "no prediction" would hide it from the tests.
"""

from __future__ import annotations

from megapilot.errors import MegapilotError
from megapilot.estimate import EstimateOptions, estimate
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, Prediction, TrainingSpec


def predict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
            options: EstimateOptions | None = None) -> Prediction | None:
    """The estimator's answer for exactly this layout and these run switches (the overlaps and dispatcher the
    flags turn on; None: the estimator's defaults), or None when it refuses the layout."""
    try:
        result = estimate(model, cluster, training, parallel, options or EstimateOptions())
    except MegapilotError:
        return None
    return Prediction(memory_gib=result.memory_gib.total, capacity_gib=result.memory_gib.capacity,
                      step_time_ms=result.step_time_s * 1000.0, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
                      tflops_per_gpu=result.tflops_per_gpu, mfu_pct=result.mfu * 100.0, device=cluster.gpu.name)


def refusal(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig,
            options: EstimateOptions | None = None) -> str | None:
    """Why the estimator refuses this layout (the rule and its fix), or None when it answers."""
    try:
        estimate(model, cluster, training, parallel, options or EstimateOptions())
    except MegapilotError as exc:
        return str(exc)
    return None
