"""Per-iteration curves: the loss-curve gate's sampling and slope, and thinning curves for the report.

The loss-curve gate follows CVS's rule, stated once here:
1. Drop non-finite losses, and the warm-up: every step <= int(0.10 x planned steps).
2. Keep a point when `step % sample_every == 0`, when the step is a milestone, or when it is the first
   or the last point left.
3. Fit an ordinary least-squares line over the kept points; the gate passes when its slope is below
   `max_slope` (default 0: the loss must go down). Fewer than 2 points: no slope, the gate is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from megapilot.suite.results import Curve

WARMUP_FRACTION = 0.10
MAX_REPORT_POINTS = 500

Point = tuple[int, float]


class LossCurveGate(BaseModel):
    """How the loss curve is sampled and gated (the caller maps a suite config's `loss_curve` block here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sample_every: int = Field(default=10, ge=1, description="Keep steps that are multiples of this.")
    milestone_steps: tuple[int, ...] = Field(default=(100, 500, 1000, 5000), description="Always kept when reached.")
    max_slope: float = Field(default=0.0, description="PASS iff the fitted slope (loss per step) is below this.")
    enforce: bool = Field(default=True, description="False: the gate is recorded, never failed.")


def warmup_cutoff(planned_steps: int | None) -> int:
    """Steps up to and including this one are warm-up for the loss curve: int(0.10 x planned)."""
    return int(WARMUP_FRACTION * planned_steps) if planned_steps else 0


def sample_loss_points(points: Sequence[Point], *, sample_every: int, milestone_steps: Sequence[int],
                       planned_steps: int | None) -> list[Point]:
    """The points the slope is fitted on (see the module docstring), in step order."""
    cutoff = warmup_cutoff(planned_steps)
    usable = sorted((step, loss) for step, loss in points if step > cutoff and math.isfinite(loss))
    if not usable:
        return []
    milestones = set(milestone_steps)
    last_index = len(usable) - 1
    return [(step, loss) for index, (step, loss) in enumerate(usable)
            if index in (0, last_index) or step % sample_every == 0 or step in milestones]


def least_squares_slope(points: Sequence[Point]) -> float | None:
    """Slope of the ordinary least-squares line through the points; None for fewer than 2 distinct steps."""
    n = len(points)
    if n < 2:
        return None
    sum_x = sum(float(step) for step, _ in points)
    sum_y = sum(loss for _, loss in points)
    sum_xy = sum(step * loss for step, loss in points)
    sum_xx = sum(float(step) * step for step, _ in points)
    denominator = n * sum_xx - sum_x * sum_x
    if denominator == 0:
        return None
    return (n * sum_xy - sum_x * sum_y) / denominator


def loss_slope(points: Sequence[Point], gate: LossCurveGate, planned_steps: int | None) -> tuple[float | None, int]:
    """The gated slope and how many sampled points it was fitted on."""
    sampled = sample_loss_points(points, sample_every=gate.sample_every, milestone_steps=gate.milestone_steps,
                                 planned_steps=planned_steps)
    return least_squares_slope(sampled), len(sampled)


def downsample(curve: Curve, max_points: int = MAX_REPORT_POINTS) -> Curve:
    """At most `max_points` points, evenly spread by index, always the first and the last (for the report)."""
    points = curve.points
    if len(points) <= max_points:
        return curve
    if max_points < 2:
        raise ValueError("max_points must be at least 2 (the first and the last point)")
    last = len(points) - 1
    indices = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
    return curve.model_copy(update={"points": [points[i] for i in indices]})


__all__ = [
    "MAX_REPORT_POINTS",
    "LossCurveGate",
    "downsample",
    "least_squares_slope",
    "loss_slope",
    "sample_loss_points",
    "warmup_cutoff",
]
