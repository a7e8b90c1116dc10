"""Reading a combo's headline values: the gated metric first, the curve's median next, memory from a ratio."""

from __future__ import annotations

import pytest

from megapilot.report import measures
from megapilot.spec import Prediction
from megapilot.suite.results import ComboResult, Curve, MetricRow, Verdict


def _combo(**fields) -> ComboResult:
    return ComboResult(key="default", directory="default", verdict=Verdict.PASS, backend="megapilot", **fields)


def test_metric_wins_over_curve():
    combo = _combo(metrics=[MetricRow(name="training.elapsed_time_per_iteration", value=900.0, verdict=Verdict.PASS)],
                   curves=[Curve(name="step_time_ms", points=[(1, 3000.0), (2, 1000.0), (3, 1002.0)])])
    assert measures.measured(combo, measures.STEP_TIME_MS) == 900.0


def test_curve_median_skips_not_finite_points():
    combo = _combo(curves=[Curve(name="step_time_ms", points=[(1, 3000.0), (2, 1000.0), (3, float("nan")),
                                                               (4, 1002.0)])])
    assert measures.measured(combo, measures.STEP_TIME_MS) == 1002.0


def test_memory_ratio_becomes_gib_with_a_capacity_only():
    combo = _combo(metrics=[MetricRow(name="training.mem_usage", value=0.5, verdict=Verdict.PASS)])
    assert measures.measured(combo, measures.MEMORY_GIB, capacity_gib=80.0) == 40.0
    assert measures.measured(combo, measures.MEMORY_GIB) is None


def test_prediction_checks_list_what_was_predicted_with_error():
    combo = _combo(predicted=Prediction(step_time_ms=1000.0, memory_gib=float("inf")),
                   metrics=[MetricRow(name="training.elapsed_time_per_iteration", value=1100.0, verdict=Verdict.PASS)])
    checks = measures.prediction_checks(combo)
    assert [check.quantity for check in checks] == [measures.STEP_TIME_MS]
    assert checks[0].error_pct == pytest.approx(10.0)


def test_catalog_capacity_and_unknown_gpu():
    assert measures.gpu_capacity_gib("H100") == 80.0
    assert measures.gpu_capacity_gib("no-such-gpu") is None


def test_a_measured_zero_is_shown_without_a_minus_100_percent_error():
    # Megatron prints TFLOP/s with one decimal: a CPU run's 0.0044 TFLOP/s reads 0.0
    combo = _combo(predicted=Prediction(tflops_per_gpu=0.0044),
                   metrics=[MetricRow(name="training.throughput_per_gpu", value=0.0, verdict=Verdict.RECORD)])
    [check] = measures.prediction_checks(combo)
    assert check.measured == 0.0 and check.error_pct is None
