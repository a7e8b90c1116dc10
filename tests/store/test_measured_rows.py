"""store.measured: a suite combo or an imported case as one measured row, and back as a calibration run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.cases import Case
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec
from megapilot.store.measured import COLUMNS, MeasuredRow, from_case, from_combo, to_calibration_run
from megapilot.suite.results import ComboResult, MetricRow, Prediction, SuiteResult, Verdict
from tests.report.factory import passing_combo, suite_result

UNCALIBRATED = Prediction(step_time_ms=1200.0, tflops_per_gpu=40.0, memory_gib=49.0, device="H100", family="dense",
                          uncalibrated_step_time_ms=1000.0, uncalibrated_tokens_per_s_per_gpu=4100.0,
                          uncalibrated_components_ms={"compute": 600.0, "pp_bubble": 100.0, "tp_comm": 50.0,
                                                      "dp_comm": 150.0})


def _result(tmp_path: Path, cluster: str | None = "lab-a") -> SuiteResult:
    result = suite_result(tmp_path)
    result.card = result.card.model_copy(update={"cluster_name": cluster})
    return result


def _combo(*rows: MetricRow, predicted: Prediction | None = UNCALIBRATED) -> ComboResult:
    return passing_combo().model_copy(update={"metrics": list(rows), "predicted": predicted})


def _row(name: str, value: float) -> MetricRow:
    return MetricRow(name=name, value=value, verdict=Verdict.RECORD)


def test_a_combo_becomes_a_row_of_its_cluster_with_its_uncalibrated_prediction(tmp_path):
    combo = _combo(_row("training.elapsed_time_per_iteration", 1150.0), _row("training.step_time_p50_ms", 1100.0),
                   _row("training.tokens_per_gpu", 3650.0), _row("training.throughput_per_gpu", 41.0))
    row = from_combo(_result(tmp_path), combo, "2026-03-02T09:00:00Z")
    assert row is not None
    assert (row.id, row.cluster, row.origin, row.gpus, row.gpu, row.family) == (
        "20260302-090000-llama-tiny/" + combo.key, "lab-a", "suite", 2, "H100", "dense")
    # the step its tokens/s implies (GBS 8 x 1024 tokens over 2 GPUs), the figure its gates compare with the
    # prediction, not the median step the log prints beside it
    assert row.measured_step_time_s == pytest.approx(8 * 1024 / (3650.0 * 2))
    assert row.measured_tokens_per_s_per_gpu == 3650.0 and row.measured_tflops_per_gpu == 41.0
    assert row.predicted_step_time_s == pytest.approx(1.0)  # uncalibrated, not the calibrated 1.2 s
    # one node: data-parallel traffic stays inside it; fixed time is what the named terms leave of the step
    assert (row.predicted_compute_s, row.predicted_bubble_s, row.predicted_scaleup_comm_s,
            row.predicted_scaleout_comm_s, row.predicted_fixed_s) == pytest.approx((0.6, 0.1, 0.2, 0.0, 0.1))
    # the calibrated 1.2 s step gave 40 TFLOP/s; the uncalibrated 1.0 s step does the same work faster
    assert row.predicted_tflops_per_gpu == pytest.approx(40.0 * 1200 / 1000)
    assert row.calibrates


def test_without_a_step_time_the_step_comes_from_tokens_per_second(tmp_path):
    combo = _combo(_row("training.tokens_per_gpu", 2048.0))
    row = from_combo(_result(tmp_path), combo, "now")
    assert row is not None  # GBS 8 x 1024 tokens over 2 GPUs at 2048 tokens/s each
    assert row.measured_step_time_s == pytest.approx(8 * 1024 / (2048.0 * 2))


@pytest.mark.parametrize("case", ["no cluster", "no prediction", "nothing measured", "not finite"])
def test_a_combo_that_cannot_calibrate_gives_no_row(tmp_path, case):
    result = _result(tmp_path, cluster=None if case == "no cluster" else "lab-a")
    rows = {"nothing measured": [_row("training.lm_loss", 3.0)],
            "not finite": [_row("training.step_time_p50_ms", math.nan), _row("training.tokens_per_gpu", 0.0)]}
    combo = _combo(*rows.get(case, [_row("training.step_time_p50_ms", 900.0)]),
                   predicted=None if case == "no prediction" else UNCALIBRATED)
    assert from_combo(result, combo, "now") is None


def test_a_row_survives_the_database_columns_and_non_finite_numbers_become_null(tmp_path):
    row = from_combo(_result(tmp_path), _combo(_row("training.step_time_p50_ms", 1100.0)), "now")
    assert row is not None
    values = row.values()
    assert len(values) == len(COLUMNS) and values[COLUMNS.index("multi_node")] == 0
    assert MeasuredRow.from_values(values) == row
    odd = MeasuredRow(**{**row.__dict__, "measured_memory_gib": math.inf})
    assert odd.values()[COLUMNS.index("measured_memory_gib")] is None


def test_a_failed_run_never_calibrates_and_the_calibration_run_carries_the_components(tmp_path):
    row = from_combo(_result(tmp_path), _combo(_row("training.step_time_p50_ms", 1100.0)), "now")
    assert row is not None
    assert not MeasuredRow(**{**row.__dict__, "verdict": "FAIL"}).calibrates
    run = to_calibration_run(row)
    assert (run.key.gpus, run.key.tp, run.key.family, run.measured_step_time_s) == (2, 1, "dense", pytest.approx(1.1))
    assert run.run_id == row.id
    assert run.predicted.compute_s == pytest.approx(0.6) and run.predicted.fixed_s == pytest.approx(0.1)


def test_an_imported_case_takes_its_step_from_whichever_figure_it_gives():
    case = Case(model=get_model("tiny"), cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=8),
                training=TrainingSpec(seq_length=128, global_batch_size=64),
                parallel=ParallelConfig.for_world(8, mbs=1, recompute="none"))
    by_tokens = from_case("r1", "lab-a", "runs.csv", case, {"tp": 1}, {"tokens_per_s_per_gpu": 8192.0}, {}, "now")
    assert by_tokens.measured_step_time_s == pytest.approx(64 * 128 / (8192.0 * 8))
    given = from_case("r2", "lab-a", "runs.csv", case, {}, {"step_time_s": 0.5, "tokens_per_s_per_gpu": 1.0}, {}, "now")
    assert given.measured_step_time_s == 0.5
    assert (given.origin, given.verdict, given.gpus, given.case) == ("import", "RECORD", 8, {})
    assert given.predicted_step_time_s and given.predicted_step_time_s > 0 and given.calibrates
