"""Threshold gates (every kind at and around its bound, margins' sign, optional/missing, enforce off,
min_ratio, baseline history, NaN) and the built-in gates on measured logs."""

from __future__ import annotations

import math

import pytest

from megapilot.suite.curves import LossCurveGate
from megapilot.suite.gates import BaselineStats, builtin_gates, evaluate
from megapilot.suite.metrics import ConvergenceGate, measure_combo
from megapilot.suite.results import MetricRow, Verdict
from megapilot.suite.thresholds import threshold
from tests.suite.conftest import DATA, Step, falling_steps, iteration_lines

TPUT = "training.throughput_per_gpu"
STEP = "training.elapsed_time_per_iteration"
UNITS = {TPUT: "TFLOP/s/GPU", STEP: "ms"}


def one(value: float | None, spec: dict, *, name: str = TPUT, enforce: bool = True, **kwargs) -> MetricRow:
    rows = evaluate({name: value}, UNITS, {name: threshold(**spec)}, enforce=enforce, **kwargs)
    return next(row for row in rows if row.name == name)


@pytest.mark.parametrize("kind", ["min", "min_tok_s"])
def test_lower_bounds_pass_at_the_bound_and_fail_just_below(kind):
    at = one(100.0, {"kind": kind, "value": 100})
    assert at.verdict is Verdict.PASS and at.margin_pct == 0.0 and at.threshold == ">= 100"
    below = one(99.99, {"kind": kind, "value": 100})
    assert below.verdict is Verdict.FAIL and below.margin_pct == pytest.approx(-0.01)
    above = one(110.0, {"kind": kind, "value": 100})
    assert above.verdict is Verdict.PASS and above.margin_pct == pytest.approx(10.0)
    assert above.kind == kind and above.unit == "TFLOP/s/GPU" and above.enforced


@pytest.mark.parametrize(("kind", "unit_text"), [("max", ""), ("max_ms", " ms")])
def test_upper_bounds_pass_at_the_bound_and_fail_just_above(kind, unit_text):
    at = one(500.0, {"kind": kind, "value": 500}, name=STEP)
    assert at.verdict is Verdict.PASS and at.margin_pct == 0.0
    above = one(500.5, {"kind": kind, "value": 500}, name=STEP)
    assert above.verdict is Verdict.FAIL and above.margin_pct == pytest.approx(-0.1)
    assert f"500.5{unit_text} > 500{unit_text}" in above.reason
    inside = one(400.0, {"kind": kind, "value": 500}, name=STEP)
    assert inside.margin_pct == pytest.approx(20.0)


def test_within_passes_on_both_edges_and_fails_just_outside_either():
    spec = {"kind": "within", "value": 200, "tolerance_pct": 5}
    assert one(190.0, spec).verdict is Verdict.PASS and one(210.0, spec).verdict is Verdict.PASS
    assert one(190.0, spec).margin_pct == pytest.approx(0.0, abs=1e-9)
    low, high = one(189.9, spec), one(210.1, spec)
    assert low.verdict is high.verdict is Verdict.FAIL
    assert low.margin_pct < 0 and high.margin_pct < 0
    centre = one(200.0, spec)
    assert centre.margin_pct == pytest.approx(5.0)  # 10 to the nearer bound, of 200
    assert centre.threshold == "200 +/-5%"


def test_min_ratio_divides_by_another_actual_of_the_cell():
    specs = {TPUT: threshold(kind="min_ratio", value=0.9, reference="training.baseline_tput")}
    rows = {r.name: r for r in evaluate({TPUT: 90.0, "training.baseline_tput": 100.0}, UNITS, specs, enforce=True)}
    assert rows[TPUT].verdict is Verdict.PASS and rows[TPUT].margin_pct == pytest.approx(0.0, abs=1e-9)
    rows = {r.name: r for r in evaluate({TPUT: 89.0, "training.baseline_tput": 100.0}, UNITS, specs, enforce=True)}
    assert rows[TPUT].verdict is Verdict.FAIL and rows[TPUT].margin_pct < 0
    assert "0.89" in rows[TPUT].reason


def test_min_ratio_with_a_missing_reference_fails_or_skips_when_optional():
    spec = {"kind": "min_ratio", "value": 0.9, "reference": "training.tokens_per_gpu"}
    assert one(90.0, spec).verdict is Verdict.FAIL
    assert one(90.0, spec | {"optional": True}).verdict is Verdict.SKIPPED
    unknown = one(90.0, spec | {"reference": "training.tokens_per_gpus"})
    assert unknown.verdict is Verdict.FAIL and "training.tokens_per_gpu" in unknown.reason


def test_info_is_recorded_never_gated():
    row = one(1.0, {"kind": "info", "value": 85})
    assert row.verdict is Verdict.RECORD and row.threshold == "info (85)"


def test_baseline_uses_the_callers_history_and_records_without_one():
    spec = {"kind": "baseline", "tolerance_pct": 5}
    seen = []

    def history(metric: str) -> BaselineStats | None:
        seen.append(metric)
        return BaselineStats(median=100.0, runs=5)

    inside, outside = one(104.0, spec, baseline=history), one(106.0, spec, baseline=history)
    assert seen == [TPUT, TPUT]
    assert inside.verdict is Verdict.PASS and inside.margin_pct == pytest.approx(1.0)
    assert outside.verdict is Verdict.FAIL and outside.margin_pct == pytest.approx(-1.0)
    assert "median of 5 run(s)" in outside.reason
    first = one(104.0, spec, baseline=lambda metric: None)
    assert first.verdict is Verdict.RECORD and "no history" in first.reason
    assert one(104.0, spec).verdict is Verdict.RECORD  # no lookup given at all


def test_missing_metric_fails_naming_the_expected_log_line_unless_optional():
    missing = one(None, {"kind": "min", "value": 100})
    assert missing.verdict is Verdict.FAIL and "missing from the log" in missing.reason
    assert "throughput per GPU (TFLOP/s/GPU)" in missing.reason
    why = one(None, {"kind": "min", "value": 100}, why_missing={TPUT: "the iteration lines print no TFLOP/s/GPU"})
    assert "print no TFLOP/s/GPU" in why.reason
    optional = one(None, {"kind": "max", "value": 0.85, "optional": True}, name="training.mem_usage")
    assert optional.verdict is Verdict.SKIPPED and optional.value is None


@pytest.mark.parametrize(("spec", "verdict", "reason"), [
    ({"kind": "min", "value": 100}, Verdict.SKIPPED, "not measured (printed 0.0)"),
    ({"kind": "predicted", "min_ratio": 0.9}, Verdict.SKIPPED, "not measured (printed 0.0)"),
    ({"kind": "min", "value": 100, "optional": True}, Verdict.SKIPPED, "optional, not measured (printed 0.0)"),
    ({"kind": "info"}, Verdict.RECORD, "info: not measured (printed 0.0)"),
])
def test_a_metric_printed_below_its_resolution_is_skipped_not_failed(spec, verdict, reason):
    row = one(None, spec, why_missing={TPUT: "printed 0.0"}, unresolved={TPUT})
    assert (row.value, row.verdict, row.reason) == (None, verdict, reason)


def test_a_cpu_runs_zero_tflops_gates_as_not_measured_under_min_and_info(log_file):
    lines = [line.replace("(TFLOP/s/GPU): 2.0", "(TFLOP/s/GPU): 0.0")
             for line in iteration_lines(falling_steps(1, 20), train_iters=20)]
    m = measured(log_file, lines)
    for spec, verdict in (({"kind": "min", "value": 0.01}, Verdict.SKIPPED), ({"kind": "info"}, Verdict.RECORD)):
        [row] = [r for r in evaluate(m.actuals, m.units, {TPUT: threshold(**spec)}, enforce=True,
                                     why_missing=m.why_missing, unresolved=m.unresolved) if r.name == TPUT]
        assert (row.value, row.verdict) == (None, verdict) and "below the one decimal" in row.reason


def test_unknown_metric_name_fails_naming_close_names():
    rows = evaluate({TPUT: 120.0}, UNITS, {"training.throughput_per_gpus": threshold(kind="min", value=1)},
                    enforce=True)
    wrong = next(r for r in rows if r.name == "training.throughput_per_gpus")
    assert wrong.verdict is Verdict.FAIL and "unknown metric" in wrong.reason and TPUT in wrong.reason


def test_enforce_false_records_with_the_would_be_verdict():
    failing = one(50.0, {"kind": "min", "value": 100}, enforce=False)
    assert failing.verdict is Verdict.RECORD and "would FAIL" in failing.reason and not failing.enforced
    assert failing.margin_pct == pytest.approx(-50.0)
    passing = one(150.0, {"kind": "min", "value": 100}, enforce=False)
    assert passing.verdict is Verdict.RECORD and "would PASS" in passing.reason
    skipped = one(None, {"kind": "min", "value": 100, "optional": True}, enforce=False)
    assert skipped.verdict is Verdict.SKIPPED


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_fail_with_or_without_a_threshold(bad):
    gated = one(bad, {"kind": "max", "value": 1e9})
    assert gated.verdict is Verdict.FAIL and gated.value is None and "not a finite number" in gated.reason
    ungated = evaluate({"training.grad_norm": bad}, {}, None, enforce=True)[0]
    assert ungated.verdict is Verdict.FAIL
    assert gated.model_dump_json()  # the row stays JSON


def test_every_measured_metric_without_a_spec_is_recorded_and_unmeasured_ones_skipped():
    rows = evaluate({TPUT: 120.0, STEP: 300.0, "training.mfu_pct": None}, UNITS,
                    {TPUT: threshold(kind="min", value=100)}, enforce=True,
                    why_missing={"training.mfu_pct": "no GPU"})
    by_name = {r.name: r for r in rows}
    assert [r.name for r in rows] == [TPUT, STEP, "training.mfu_pct"]
    assert by_name[STEP].verdict is Verdict.RECORD and by_name[STEP].unit == "ms" and by_name[STEP].threshold is None
    assert by_name["training.mfu_pct"].verdict is Verdict.SKIPPED and "no GPU" in by_name["training.mfu_pct"].reason


def test_record_only_metrics_are_never_gated():
    row = one(900.0, {"kind": "max", "value": 10}, name="training.max_allocated_gib",
              record_only={"training.max_allocated_gib": "CPU run: RSS"})
    assert row.verdict is Verdict.RECORD and "CPU run: RSS" in row.reason and "would FAIL" in row.reason
    assert not row.enforced


# ---- built-in gates on measured logs -----------------------------------------------------------------------

def measured(log_file, lines: list[str], *, train_iters: int = 20, **kwargs):
    path = log_file("training.log", lines)
    return measure_combo([path], gpu=None, world_size=1, gpus_per_node=1, nodes=1, seq_length=64, gbs=8,
                         train_iters=train_iters, **kwargs)


def gates(measurement, **kwargs) -> dict[str, MetricRow]:
    return {row.name: row for row in builtin_gates(measurement, **kwargs)}


def test_a_healthy_run_passes_every_builtin_gate(log_file):
    m = measured(log_file, iteration_lines(falling_steps(1, 20), train_iters=20))
    rows = gates(m, convergence=ConvergenceGate(target_value=5.5))
    assert {name: row.verdict for name, row in rows.items()} == {
        "gate.no_errors": Verdict.PASS, "gate.finite_loss": Verdict.PASS, "gate.loss_slope": Verdict.PASS,
        "gate.convergence": Verdict.PASS, "gate.completed": Verdict.PASS}
    assert rows["gate.loss_slope"].value == pytest.approx(-0.05)


def test_loss_slope_gate_fails_a_rising_loss_and_records_it_when_not_enforced(log_file):
    rising = [Step(i, 4.0 + 0.02 * i) for i in range(1, 21)]
    m = measured(log_file, iteration_lines(rising, train_iters=20))
    assert gates(m)["gate.loss_slope"].verdict is Verdict.FAIL
    relaxed = gates(m, loss_curve=LossCurveGate(enforce=False))["gate.loss_slope"]
    assert relaxed.verdict is Verdict.RECORD and "would FAIL" in relaxed.reason
    assert gates(m, loss_curve=LossCurveGate(max_slope=0.05))["gate.loss_slope"].verdict is Verdict.PASS


def test_loss_slope_gate_skips_with_fewer_than_two_points(log_file):
    m = measured(log_file, iteration_lines(falling_steps(1, 3), train_iters=20), train_iters=20)
    row = gates(m, loss_curve=LossCurveGate(sample_every=10))["gate.loss_slope"]
    # cutoff 2: only step 3 is left
    assert row.verdict is Verdict.SKIPPED and "increase training_iterations" in row.reason


def test_convergence_final_and_first_crossing_disagree_on_a_dip(log_file):
    dip = [Step(i, loss) for i, loss in enumerate([5.0, 4.0, 2.9, 3.2, 3.3, 3.4], start=1)]
    m = measured(log_file, iteration_lines(dip, train_iters=6), train_iters=6)
    final = gates(m, convergence=ConvergenceGate(target_value=3.0, rule="final"))["gate.convergence"]
    crossing = gates(m, convergence=ConvergenceGate(target_value=3.0, rule="first_crossing"))["gate.convergence"]
    assert final.verdict is Verdict.FAIL and final.value == pytest.approx(3.4)
    assert crossing.verdict is Verdict.PASS and crossing.value == 3.0  # step 3
    assert "first reached at step 3" in final.reason
    assert gates(m)["gate.convergence"].verdict is Verdict.SKIPPED  # target 0: disabled


def test_completed_gate_fails_a_short_run_and_nan_losses_fail_finite_loss(log_file):
    steps = [*falling_steps(1, 5), Step(6, math.nan, nan_iterations=1)]
    m = measured(log_file, iteration_lines(steps, train_iters=20))
    rows = gates(m)
    assert rows["gate.completed"].verdict is Verdict.FAIL and "6 of 20" in rows["gate.completed"].reason
    assert rows["gate.finite_loss"].verdict is Verdict.FAIL and "node 0" in rows["gate.finite_loss"].reason
    # what it measured and what it holds that to, as gate.no_errors says it: not "not measured" beside a FAIL
    assert (rows["gate.finite_loss"].value, rows["gate.finite_loss"].threshold) == (1.0, "== 0")
    assert (gates(measured(log_file, iteration_lines(falling_steps(1, 5), train_iters=5)))["gate.finite_loss"]
            .model_dump(include={"verdict", "value", "threshold"})) == {"verdict": Verdict.PASS, "value": 0.0,
                                                                       "threshold": "== 0"}


def test_no_errors_gate_fails_on_a_real_oom_log():
    m = measure_combo([DATA / "15_oom_nccl_cuda_failure_bridge_llama3_fp8.log"], gpu=None, world_size=8,
                      gpus_per_node=8, nodes=1, seq_length=None, gbs=None, train_iters=10)
    rows = gates(m)
    assert rows["gate.no_errors"].verdict is Verdict.FAIL and "oom" in rows["gate.no_errors"].reason
    assert rows["gate.finite_loss"].verdict is Verdict.SKIPPED
    assert rows["gate.completed"].verdict is Verdict.FAIL


def test_an_unknown_metric_records_under_info_and_skips_when_optional_as_check_says():
    # a name nothing measures (CVS's `time_to_target_seconds` is no longer one: the metric table knows it as another
    # name of training.time_to_target_s, test_config_sweep)
    specs = {"training.steps_to_targets": threshold(kind="info", value=2500, optional=True),
             "training.tokens_per_gpuu": threshold(kind="min", value=1, optional=True)}
    rows = {r.name: r for r in evaluate({TPUT: 120.0}, UNITS, specs, enforce=True)}
    info = rows["training.steps_to_targets"]
    assert info.verdict is Verdict.RECORD and "training.steps_to_target" in info.reason
    optional = rows["training.tokens_per_gpuu"]
    assert optional.verdict is Verdict.SKIPPED and "training.tokens_per_gpu" in optional.reason


def test_an_optional_min_ratio_with_an_unknown_reference_skips():
    spec = {"kind": "min_ratio", "value": 0.9, "reference": "training.tokens_per_gpus", "optional": True}
    row = one(90.0, spec)
    assert row.verdict is Verdict.SKIPPED and "training.tokens_per_gpu" in row.reason
