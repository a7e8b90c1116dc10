"""Loss-curve sampling (warm-up cut, multiples, milestones, first and last), the slope fit, report thinning."""

from __future__ import annotations

import itertools
import math

import pytest

from megapilot.suite.curves import (
    LossCurveGate,
    downsample,
    least_squares_slope,
    loss_slope,
    sample_loss_points,
    warmup_cutoff,
)
from megapilot.suite.results import Curve


def line(first: int, last: int, intercept: float = 5.0, slope: float = -0.01) -> list[tuple[int, float]]:
    return [(step, intercept + slope * step) for step in range(first, last + 1)]


def test_warmup_cutoff_is_ten_percent_of_the_planned_steps_rounded_down():
    assert [warmup_cutoff(n) for n in (None, 0, 9, 10, 20, 25, 1000)] == [0, 0, 0, 1, 2, 2, 100]


def test_sampling_keeps_multiples_milestones_and_the_first_and_last_after_the_warm_up():
    sampled = sample_loss_points(line(1, 203), sample_every=50, milestone_steps=(75, 120, 5000), planned_steps=203)
    # cutoff int(20.3) = 20: step 21 is the first kept; 5000 is never reached; 203 is the last
    assert [step for step, _ in sampled] == [21, 50, 75, 100, 120, 150, 200, 203]


def test_cvs_default_twenty_steps_give_three_points():
    gate = LossCurveGate()
    sampled = sample_loss_points(line(1, 20), sample_every=gate.sample_every, milestone_steps=gate.milestone_steps,
                                 planned_steps=20)
    assert [step for step, _ in sampled] == [3, 10, 20]


def test_sampling_skips_non_finite_losses_and_sorts_by_step():
    points = [(30, 1.0), (10, math.nan), (20, 2.0), (40, math.inf), (11, 3.0)]
    assert sample_loss_points(points, sample_every=10, milestone_steps=(), planned_steps=None) == [
        (11, 3.0), (20, 2.0), (30, 1.0)]


def test_least_squares_slope_recovers_a_straight_line():
    assert least_squares_slope(line(1, 50, slope=-0.02)) == pytest.approx(-0.02)
    assert least_squares_slope([(1, 1.0), (2, 1.5), (3, 1.7)]) == pytest.approx(0.35)


@pytest.mark.parametrize("points", [[], [(5, 1.0)], [(5, 1.0), (5, 2.0)]])
def test_no_slope_from_fewer_than_two_distinct_steps(points):
    assert least_squares_slope(points) is None


def test_loss_slope_counts_the_sampled_points():
    slope, sampled = loss_slope(line(1, 100, slope=0.01), LossCurveGate(sample_every=25), 100)
    assert sampled == 5 and slope == pytest.approx(0.01)  # 11, 25, 50, 75, 100 (milestone 100 too)


def test_downsample_keeps_at_most_500_points_with_the_first_and_last():
    curve = Curve(name="loss", points=[(i, float(i)) for i in range(1, 2001)])
    thinned = downsample(curve)
    steps = [step for step, _ in thinned.points]
    assert len(steps) == 500 and steps[0] == 1 and steps[-1] == 2000
    assert steps == sorted(set(steps))
    assert max(b - a for a, b in itertools.pairwise(steps)) <= 5  # evenly spread, no big hole


def test_downsample_leaves_short_curves_alone():
    curve = Curve(name="loss", points=[(i, 1.0) for i in range(500)])
    assert downsample(curve) is curve
    assert downsample(curve, max_points=3).points == [(0, 1.0), (250, 1.0), (499, 1.0)]
