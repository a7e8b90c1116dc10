"""suite.metric_table: one entry per metric, and entries for the same quantity that agree with each other."""

from __future__ import annotations

from collections import defaultdict

from megapilot.store.history import PREDICTED_QUANTITIES
from megapilot.suite import metric_table
from megapilot.suite.metric_table import (
    HEADLINE_METRICS,
    MEASURED_METRICS,
    METRICS,
    measured_name,
    measured_quantity,
    measured_value,
    metric_info,
    zero_unmeasured_metrics,
    zero_unmeasured_quantities,
)


def test_every_metric_is_named_once():
    names = [info.name for info in metric_table._TABLE]
    assert len(names) == len(set(names)) == len(METRICS)
    assert all(name.startswith("training.") for name in names)


def test_a_watched_metric_has_a_direction_and_a_positive_band():
    # a regression is a move in the bad direction beyond the band: a headline metric needs both
    for name in HEADLINE_METRICS:
        assert METRICS[name].direction in ("higher", "lower"), name
    assert all(info.band_pct > 0 for info in METRICS.values())


def test_names_of_one_predicted_quantity_agree_on_direction_unit_and_zero_rule():
    by_quantity = defaultdict(set)
    for info in METRICS.values():
        if info.quantity is not None:
            by_quantity[info.quantity].add((info.direction, info.unit, info.zero_unmeasured))
    assert set(by_quantity) <= set(PREDICTED_QUANTITIES)
    assert {quantity: len(kinds) for quantity, kinds in by_quantity.items()} == dict.fromkeys(by_quantity, 1)


def test_measured_metrics_say_which_log_line_they_come_from_in_table_order():
    assert MEASURED_METRICS[0] == "training.throughput_per_gpu"
    assert [name for name in METRICS if METRICS[name].expected_line] == list(MEASURED_METRICS)
    assert "training.tokens_per_s_per_gpu" in METRICS and "training.tokens_per_s_per_gpu" not in MEASURED_METRICS


def test_an_unknown_metric_gets_a_neutral_entry_named_after_it():
    info = metric_info("training.all_reduce_bus_gbps")
    assert (info.label, info.unit, info.direction, info.headline) == ("all reduce bus gbps", "", None, False)
    assert metric_info("training.step_time_p95_ms") is METRICS["training.step_time_p95_ms"]


def test_a_zero_below_its_print_s_resolution_is_not_measured_and_other_zeros_are():
    assert zero_unmeasured_metrics() == ("training.mfu_pct", "training.tflops_per_gpu", "training.throughput_per_gpu")
    assert zero_unmeasured_quantities() == ("mfu_pct", "tflops_per_gpu")
    assert measured_value("training.throughput_per_gpu", 0.0) is None
    assert measured_value("training.throughput_per_gpu", 0.1) == 0.1
    assert measured_value("training.nan_iterations", 0.0) == 0.0  # a counter's zero is a measurement
    assert measured_value("training.all_reduce_bus_gbps", 0.0) == 0.0  # not in the table: taken as given
    assert measured_quantity("mfu_pct", 0.0) is None and measured_quantity("tokens_per_s_per_gpu", 0.0) == 0.0


def test_a_median_over_the_steps_is_one_of_the_metrics_paced_by_them():
    # the step-noise band a median widens is only given to metrics paced by the steps (store.regress)
    assert [name for name, info in METRICS.items() if info.median_of_steps] == ["training.step_time_p50_ms"]
    assert all(info.paced_by_steps for info in METRICS.values() if info.median_of_steps)


def test_another_dialect_s_name_of_a_measured_metric_is_that_metric():
    assert measured_name("training.time_to_target_seconds") == "training.time_to_target_s"  # CVS's name
    assert measured_name("training.time_to_target_s") == "training.time_to_target_s"
    assert measured_name("training.tflops_per_gpu") == "training.tflops_per_gpu"  # history only: not another name
    assert measured_name("training.no_such_metric") == "training.no_such_metric"
    assert all(METRICS[info.same_as].expected_line for info in METRICS.values() if info.same_as)
