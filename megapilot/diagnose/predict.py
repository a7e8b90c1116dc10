"""Predictions for a layout, from `megapilot.estimate` (this package owns no formula).

The full estimator (`megapilot.estimate.estimate`) gives memory, step time, tokens/s and MFU. Where
it is not available, memory alone comes from `megapilot.estimate.memory.memory_per_gpu`. A layout
the estimators refuse (an impossible split) has no prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.errors import MegapilotError
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


def predict(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, parallel: ParallelConfig) -> Prediction | None:
    """Prediction for the layout, or None when the estimators cannot cost it."""
    try:
        from megapilot.estimate import estimate  # type: ignore[attr-defined]
    except ImportError:
        estimate = None
    try:
        if estimate is not None:
            result = estimate(model, cluster, training, parallel)
            return Prediction(memory_gib=result.memory_gib.total, capacity_gib=result.memory_gib.capacity,
                              step_time_s=result.step_time_s, tokens_per_s_per_gpu=result.tokens_per_s_per_gpu,
                              mfu=result.mfu)
        from megapilot.estimate.memory import memory_per_gpu

        memory = memory_per_gpu(model, training, parallel, cluster.gpu.hbm_gib)
        return Prediction(memory_gib=memory.total_gib, capacity_gib=memory.capacity_gib)
    except (MegapilotError, ValueError, ZeroDivisionError, KeyError, ImportError):
        return None


def full_estimator_available() -> bool:
    try:
        from megapilot.estimate import estimate  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return False
    return True
