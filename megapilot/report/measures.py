"""What the report reads out of a combo: headline values by quantity, predicted against measured, memory capacity.

The lifecycle names metrics the CVS way (`training.throughput_per_gpu` is TFLOP/s per GPU,
`training.tokens_per_gpu` is tokens/s per GPU, `training.elapsed_time_per_iteration` is ms); curves
carry megapilot's names (`step_time_ms`, `tokens_per_s_per_gpu`). A quantity is read from its gated
metric first (the number the verdict was given on) and, when no metric holds it, from the median of
its curve, so a failed combo that logged a few iterations still shows what it reached.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.suite.predicted import departure
from megapilot.suite.results import ComboResult, Curve, MetricRow


@dataclass(frozen=True)
class Quantity:
    """A headline quantity: where to find it in a combo, and how to show it."""

    key: str
    label: str
    unit: str
    metrics: tuple[str, ...]
    curve: str | None


STEP_TIME_MS = Quantity("step_time_ms", "Step time", "ms",
                        ("training.elapsed_time_per_iteration", "training.step_time_ms"), "step_time_ms")
# Units as the metric table gives the metrics measuring them (a rate per GPU says so: a job's tokens/s is every GPU's).
TOKENS_PER_S_PER_GPU = Quantity("tokens_per_s_per_gpu", "Tokens/s/GPU", "tok/s/GPU",
                                ("training.tokens_per_gpu", "training.tokens_per_s_per_gpu"), "tokens_per_s_per_gpu")
TFLOPS_PER_GPU = Quantity("tflops_per_gpu", "TFLOP/s/GPU", "TFLOP/s/GPU",
                          ("training.throughput_per_gpu", "training.tflops_per_gpu"), "tflops_per_gpu")
MFU_PCT = Quantity("mfu_pct", "MFU", "%", ("training.mfu_pct",), "mfu_pct")
MEMORY_GIB = Quantity("memory_gib", "Memory", "GiB",
                      ("training.memory_gib", "training.peak_memory_gib", "training.max_allocated_gib"), "memory_gib")
LM_LOSS = Quantity("lm_loss", "LM loss", "", ("training.lm_loss",), None)

# Quantities the estimator predicts (Prediction's fields), in the order the report shows them.
PREDICTED_QUANTITIES = (STEP_TIME_MS, TOKENS_PER_S_PER_GPU, TFLOPS_PER_GPU, MFU_PCT, MEMORY_GIB)

# CVS's memory gate is a fraction of the GPU's capacity; with the capacity known it becomes GiB.
MEMORY_RATIO_METRICS = ("training.mem_usage", "training.hip_mem_usage_ratio", "training.rocm_mem_usage_ratio")

LOSS_CURVE = "loss"
STEP_TIME_CURVE = "step_time_ms"


def finite(value: float | None) -> float | None:
    """The value, or None for a missing, NaN or infinite one (JSON and charts cannot hold those)."""
    if value is None or not math.isfinite(value):
        return None
    return value


def curve(combo: ComboResult, name: str) -> Curve | None:
    for candidate in combo.curves:
        if candidate.name == name:
            return candidate
    return None


def finite_points(series: Curve | None) -> list[tuple[int, float]]:
    """A curve's points without NaN/Inf (a NaN loss is a finding, not a point to draw)."""
    if series is None:
        return []
    return [(step, value) for step, value in series.points if math.isfinite(value)]


def metric_row(combo: ComboResult, names: tuple[str, ...]) -> MetricRow | None:
    """The first of `names` the combo measured (a row with a value)."""
    for name in names:
        for row in combo.metrics:
            if row.name == name and finite(row.value) is not None:
                return row
    return None


def measured(combo: ComboResult, quantity: Quantity, capacity_gib: float | None = None) -> float | None:
    """The combo's value of a quantity: its metric, else the median of its curve, else (memory) ratio x capacity."""
    row = metric_row(combo, quantity.metrics)
    if row is not None:
        return row.value
    points = finite_points(curve(combo, quantity.curve)) if quantity.curve else []
    if points:
        return statistics.median(value for _, value in points)
    if quantity is MEMORY_GIB and capacity_gib:
        ratio = metric_row(combo, MEMORY_RATIO_METRICS)
        if ratio is not None and ratio.value is not None:
            return ratio.value * capacity_gib
    return None


@dataclass(frozen=True)
class PredictionCheck:
    """One predicted quantity next to what was measured; error_pct = (measured - predicted) / predicted x 100."""

    quantity: Quantity
    predicted: float | None
    measured: float | None

    @property
    def error_pct(self) -> float | None:
        if self.predicted is None or self.measured is None or self.predicted == 0:
            return None
        if self.measured == 0:  # a log's 0.0 (TFLOP/s on a CPU) is below the precision it prints, not a -100 % miss
            return None
        return (self.measured - self.predicted) / self.predicted * 100.0


def prediction_checks(combo: ComboResult, capacity_gib: float | None = None) -> list[PredictionCheck]:
    """Every quantity the estimator predicted for the combo, with its measured value (None: not measured)."""
    if combo.predicted is None:
        return []
    checks = []
    for quantity in PREDICTED_QUANTITIES:
        predicted = finite(getattr(combo.predicted, quantity.key))
        if predicted is not None:
            checks.append(PredictionCheck(quantity, predicted, measured(combo, quantity, capacity_gib)))
    return checks


def departure_sentence(combo: ComboResult) -> str:
    """By how much, and in which component, the combo's measurement departs from its prediction ('' when nothing
    can be compared)."""
    step = measured(combo, STEP_TIME_MS)
    found = departure(combo.predicted, step, combo.timers_ms)
    return found.sentence if found is not None else ""


def gpu_capacity_gib(gpu_name: str) -> float | None:
    """HBM of the run's GPU from the catalog; None for a GPU the catalog does not know (the chart says so)."""
    try:
        return get_gpu(gpu_name).hbm_gib
    except MegapilotError:
        return None


__all__ = [
    "LM_LOSS",
    "LOSS_CURVE",
    "MEMORY_GIB",
    "MFU_PCT",
    "PREDICTED_QUANTITIES",
    "STEP_TIME_CURVE",
    "STEP_TIME_MS",
    "TFLOPS_PER_GPU",
    "TOKENS_PER_S_PER_GPU",
    "PredictionCheck",
    "Quantity",
    "curve",
    "departure_sentence",
    "finite",
    "finite_points",
    "gpu_capacity_gib",
    "measured",
    "metric_row",
    "prediction_checks",
]
