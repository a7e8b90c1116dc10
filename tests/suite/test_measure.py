"""One combo's logs measured and gated with the suite config's settings: the tiny-local suite's own cells and
thresholds, Megatron-format logs written with the trainer's line formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.spec import Prediction
from megapilot.suite.config import LoadedSuite, load_suite
from megapilot.suite.measure import cell_thresholds, measure_and_gate, measured_step_ms
from megapilot.suite.render import CellLaunch, build_plan
from megapilot.suite.results import Verdict
from megapilot.suite.templates import template_path
from megapilot.suite.thresholds import DEFAULT_CELL, parse_threshold
from tests.suite.conftest import falling_steps, iteration_lines, write


@pytest.fixture(scope="module")
def tiny() -> LoadedSuite:
    return load_suite(template_path("tiny-local"))


def _launch(suite: LoadedSuite, index: int = 0) -> CellLaunch:
    cell = suite.cells[index]
    return CellLaunch(key=cell.key, slug=cell.slug, backend=suite.backend, nodes=suite.nodes,
                      gpus_per_node=suite.gpus_per_node, plan=build_plan(suite, cell))


def _log(tmp_path: Path, *, start_loss: float = 7.0, per_step: float = 0.05, last: int = 20) -> Path:
    return write(tmp_path / "rank0.log", iteration_lines(falling_steps(1, last, start_loss=start_loss,
                                                                      per_step=per_step), train_iters=20))


def _rows(suite: LoadedSuite, logs: list[Path], *, gates: bool = True, **kwargs) -> dict:
    outcome = measure_and_gate(suite, suite.cells[0], _launch(suite), logs, gates=gates, **kwargs)
    return {row.name: row for row in outcome.rows}


def test_cell_thresholds_are_the_cells_own_or_the_default_cell_only_for_the_default_key(tiny: LoadedSuite) -> None:
    cell = tiny.cells[1]
    assert cell_thresholds(tiny, cell) is tiny.thresholds[cell.key]
    only_default = tiny.model_copy(update={"thresholds": {DEFAULT_CELL: {"training.lm_loss": parse_threshold(
        {"kind": "max", "value": 9.0})}}})
    assert cell_thresholds(only_default, cell) is None  # a sweep cell never borrows the default cell
    default = cell.model_copy(update={"key": DEFAULT_CELL})
    assert cell_thresholds(only_default, default) is only_default.thresholds[DEFAULT_CELL]


def test_measured_step_is_the_median_else_megatrons_elapsed_time() -> None:
    assert measured_step_ms({"training.step_time_p50_ms": 95.0, "training.elapsed_time_per_iteration": 120.0}) == 95.0
    assert measured_step_ms({"training.step_time_p50_ms": None, "training.elapsed_time_per_iteration": 120.0}) == 120.0
    assert measured_step_ms({"training.lm_loss": 2.0}) is None


def test_without_gates_only_the_built_in_gates_judge(tiny: LoadedSuite, tmp_path: Path) -> None:
    rising = _log(tmp_path, start_loss=2.0, per_step=-0.5)  # would fail the loss threshold and the slope gate
    rows = _rows(tiny, [rising], gates=False)
    assert list(rows) == ["gate.no_errors", "gate.finite_loss", "gate.completed"]
    assert all(row.verdict is Verdict.PASS for row in rows.values())


def test_a_smoke_run_records_its_speed_ungated_beside_the_built_in_gates(tiny: LoadedSuite, tmp_path: Path) -> None:
    rising = _log(tmp_path, start_loss=2.0, per_step=-0.5)
    rows = _rows(tiny, [rising], gates=False, record_speed=True)
    recorded = [name for name, row in rows.items() if row.verdict is Verdict.RECORD]
    assert "training.tokens_per_gpu" in recorded and "training.step_time_p50_ms" in recorded
    assert not any(rows[name].enforced for name in recorded)
    assert rows["training.tokens_per_gpu"].value == pytest.approx(8 * 128 / (0.1 * 2))
    assert [name for name in rows if name not in recorded] == ["gate.no_errors", "gate.finite_loss", "gate.completed"]


def test_the_cells_thresholds_the_loss_curve_and_completion_are_gated(tiny: LoadedSuite, tmp_path: Path) -> None:
    healthy = _rows(tiny, [_log(tmp_path / "ok")])
    assert healthy["training.lm_loss"].verdict is Verdict.PASS and healthy["training.lm_loss"].value == 6.0
    assert healthy["training.tokens_per_gpu"].value == pytest.approx(8 * 128 / (0.1 * 2))  # GBS x seq / (step x 2)
    assert healthy["gate.loss_slope"].verdict is Verdict.PASS and healthy["gate.completed"].verdict is Verdict.PASS
    assert "straggler.max_ratio" in healthy  # one node: nothing to compare, still reported
    rising = _rows(tiny, [_log(tmp_path / "bad", start_loss=3.0, per_step=-0.5)])
    assert rising["training.lm_loss"].value == 13.0
    assert rising["training.lm_loss"].verdict is Verdict.FAIL  # the tiny-local cell's max is 12
    assert rising["gate.loss_slope"].verdict is Verdict.FAIL
    short = _rows(tiny, [_log(tmp_path / "short", last=12)])
    assert short["gate.completed"].verdict is Verdict.FAIL


def test_a_gate_on_a_metric_a_cpu_run_cannot_have_is_skipped_with_the_reason(tiny: LoadedSuite,
                                                                             tmp_path: Path) -> None:
    """The tiny-local suite runs on CPUs: an MFU gate has no GPU peak to measure against, and the memory fraction no
    GPU memory. Neither is a failure of the run (it was 'missing from the log'): SKIPPED, with why."""
    cell = tiny.cells[0]
    specs = {**tiny.thresholds[cell.key], "training.mfu_pct": parse_threshold({"kind": "min", "value": 30}),
             "training.mem_usage": parse_threshold({"kind": "max", "value": 0.9})}
    gated = tiny.model_copy(update={"thresholds": {**tiny.thresholds, cell.key: specs}})
    rows = _rows(gated, [_log(tmp_path)])
    mfu, memory = rows["training.mfu_pct"], rows["training.mem_usage"]
    assert (mfu.value, mfu.verdict) == (None, Verdict.SKIPPED) and (memory.value, memory.verdict) == (None,
                                                                                                      Verdict.SKIPPED)
    assert mfu.reason == "not measured (a CPU run has no GPU peak to compute MFU from)"
    assert memory.reason.startswith("not measured (a CPU run has no GPU memory to take a fraction of")
    assert rows["training.lm_loss"].verdict is Verdict.PASS


def test_the_configs_enforce_switches_turn_failures_into_records(tiny: LoadedSuite, tmp_path: Path) -> None:
    config = tiny.config.model_copy(update={
        "enforce_thresholds": False,
        "loss_curve": tiny.config.loss_curve.model_copy(update={"enforce": False})})
    relaxed = tiny.model_copy(update={"config": config})
    rows = _rows(relaxed, [_log(tmp_path, start_loss=2.0, per_step=-0.5)])
    assert rows["training.lm_loss"].verdict is Verdict.RECORD and not rows["training.lm_loss"].enforced
    assert rows["gate.loss_slope"].verdict is not Verdict.FAIL


def test_the_scaling_baseline_is_read_only_when_given(tiny: LoadedSuite, tmp_path: Path) -> None:
    log = _log(tmp_path)
    assert _rows(tiny, [log])["training.scaling_efficiency_pct"].verdict is Verdict.SKIPPED
    baseline = tiny.config.scaling_baseline.model_copy(update={"tokens_per_sec_total": 10240.0, "num_nodes": 1})
    scaled = tiny.model_copy(update={"config": tiny.config.model_copy(update={"scaling_baseline": baseline})})
    row = _rows(scaled, [log])["training.scaling_efficiency_pct"]
    assert row.value == pytest.approx(100.0)  # 5120 tokens/s on each of 2 ranks = the 1-node baseline


def test_a_gate_on_scaling_efficiency_with_the_baseline_disabled_is_skipped_not_failed(tiny: LoadedSuite,
                                                                                       tmp_path: Path) -> None:
    # CVS ships `scaling_efficiency_pct: min 85` beside `tokens_per_sec_total: 0.0`, which its own comment calls
    # "disabled (record-only)": the metric is off by the config, not missing from a broken run
    cell = tiny.cells[0]
    specs = {**tiny.thresholds[cell.key],
             "training.scaling_efficiency_pct": parse_threshold({"kind": "min", "value": 85.0})}
    gated = tiny.model_copy(update={"thresholds": {**tiny.thresholds, cell.key: specs}})
    row = _rows(gated, [_log(tmp_path)])["training.scaling_efficiency_pct"]
    assert (row.value, row.verdict) == (None, Verdict.SKIPPED)
    assert "tokens_per_sec_total is 0" in row.reason
    baseline = tiny.config.scaling_baseline.model_copy(update={"tokens_per_sec_total": 10240.0 * 4})
    scaled = gated.model_copy(update={"config": gated.config.model_copy(update={"scaling_baseline": baseline})})
    assert _rows(scaled, [_log(tmp_path)])["training.scaling_efficiency_pct"].verdict is Verdict.FAIL  # 25 % < 85


def test_a_prediction_reaches_the_cells_predicted_threshold(tiny: LoadedSuite, tmp_path: Path) -> None:
    key = tiny.cells[0].key
    gated = {**tiny.thresholds, key: {"training.tokens_per_gpu": parse_threshold({"kind": "predicted",
                                                                                 "min_ratio": 0.9})}}
    suite = tiny.model_copy(update={"thresholds": gated})
    log = _log(tmp_path)  # 5120 tokens/s per rank

    def row(prediction: Prediction | None):
        return _rows(suite, [log], prediction=prediction)["training.tokens_per_gpu"]

    calibrated = {"calibration_runs": ["earlier-run"]}
    assert row(Prediction(step_time_ms=100.0, tokens_per_s_per_gpu=5120.0, **calibrated)).verdict is Verdict.PASS
    slower = row(Prediction(step_time_ms=50.0, tokens_per_s_per_gpu=10240.0, **calibrated))
    assert slower.verdict is Verdict.FAIL and "0.50x the calibrated prediction" in slower.reason
    assert row(None).verdict is Verdict.RECORD  # nothing predicted: recorded, not gated
