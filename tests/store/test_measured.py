"""Measured runs from a `megapilot run --plan`: the plan's layout, the prediction made before it started and the
measured step, as one row of its cluster that the calibration reads back."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.store.history import open_history
from megapilot.store.measured import from_plan_run
from megapilot.suite.predicted import predict_combo


def _plan(mbs: int) -> SavedPlan:
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=1024, max_position_embeddings=128)
    return SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=2),
                     training=TrainingSpec(seq_length=64, global_batch_size=8, train_iters=4),
                     parallel=ParallelConfig.for_world(2, mbs=mbs, recompute="none"))


def test_a_plan_run_is_a_measured_run_with_its_prediction_beside_it(tmp_path) -> None:
    plan = _plan(mbs=1)
    predicted = predict_combo(plan, plan.cluster.gpu)
    # a step near its prediction (1.2 ms for this tiny model): one more than 20x off would calibrate nothing
    row = from_plan_run("run/a@1", "lab", plan, predicted, 0.0015, completed=True, recorded_at="2026-12-05T06:00:00")
    assert row is not None and row.origin == "run" and row.verdict == "PASS" and row.calibrates
    assert (row.gpus, row.tp, row.mbs, row.gbs, row.seq_len) == (2, 1, 1, 8, 64)
    assert row.predicted_step_time_s == pytest.approx(predicted.uncalibrated_step_time_ms / 1000)
    assert row.measured_tokens_per_s_per_gpu == pytest.approx(8 * 64 / (0.0015 * 2))

    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record_measured([row])
        [back] = history.calibration_runs("lab")
    assert back.run_id == "run/a@1" and back.measured_step_time_s == 0.0015 and back.key.microbatches == 4
    # the next prediction of the cluster calibrates on it
    again = predict_combo(_plan(mbs=2), plan.cluster.gpu, [back])
    assert again.calibration_runs == ["run/a@1"]


def test_a_run_that_did_not_complete_is_listed_and_calibrates_nothing() -> None:
    plan = _plan(mbs=1)
    predicted = predict_combo(plan, plan.cluster.gpu)
    row = from_plan_run("run/b@1", "lab", plan, predicted, 0.5, completed=False, recorded_at="now")
    assert row is not None and row.verdict == "FAIL" and not row.calibrates
    assert from_plan_run("run/c@1", "lab", plan, predicted.model_copy(update={"uncalibrated_step_time_ms": None}),
                         0.5, completed=True, recorded_at="now") is None


def _predicted_combo_of_a_cluster(tmp_path):
    """A suite run recorded under cluster `lab`, and its passing combo with a prediction of its layout."""
    from megapilot.suite.results import Prediction
    from tests.report.factory import passing_combo, suite_result

    result = suite_result(tmp_path)
    result = result.model_copy(update={"card": result.card.model_copy(update={"cluster_name": "lab"})})
    combo = passing_combo().model_copy(update={"predicted": Prediction(
        step_time_ms=1050.0, tokens_per_s_per_gpu=3900.0, device="H100-SXM5-80GB", family="dense",
        uncalibrated_step_time_ms=1050.0, uncalibrated_components_ms={"compute": 1000.0, "optimizer": 50.0})})
    return result, combo


def test_a_suite_combo_calibrates_on_the_step_its_tokens_per_s_implies(tmp_path) -> None:
    from megapilot.store.measured import from_combo

    result, combo = _predicted_combo_of_a_cluster(tmp_path)
    row = from_combo(result, combo, "now")
    # 8 x 1024 tokens a step over 2 GPUs at the 3650 tokens/s/GPU it reported, not its 1122 ms per iteration: the
    # calibration fits the figure the gates and the report compare with the prediction
    assert row is not None and row.measured_step_time_s == pytest.approx(8 * 1024 / (3650.0 * 2))


def test_a_combo_of_a_run_still_going_calibrates_as_the_history_will_keep_it(tmp_path) -> None:
    from megapilot.store.measured import calibration_run_of, from_combo, to_calibration_run
    from megapilot.suite.results import Verdict

    result, combo = _predicted_combo_of_a_cluster(tmp_path)
    run = calibration_run_of(result, combo)
    row = from_combo(result, combo, "")
    assert row is not None and run == to_calibration_run(row)
    assert calibration_run_of(result, combo.model_copy(update={"verdict": Verdict.FAIL})) is None  # calibrates nothing
    assert calibration_run_of(result, combo.model_copy(update={"predicted": None})) is None


def test_a_plan_run_whose_step_is_implausible_is_kept_but_calibrates_nothing_and_is_named(tmp_path) -> None:
    """`history import` refuses a step more than 20x from its layout's prediction; `megapilot run` recorded one (a run
    that timed one warm-up step, a unit slip) and every later prediction of the cluster fitted on it."""
    plan = _plan(mbs=1)
    predicted = predict_combo(plan, plan.cluster.gpu)
    step_s = predicted.uncalibrated_step_time_ms / 1000
    healthy = from_plan_run("run/a@1", "lab", plan, predicted, 1.2 * step_s, completed=True, recorded_at="1")
    warmup = from_plan_run("run/warmup@2", "lab", plan, predicted, 500 * step_s, completed=True, recorded_at="2")
    assert healthy is not None and warmup is not None
    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record_measured([healthy, warmup])
        assert [row.id for row in history.measured("lab")] == ["run/a@1", "run/warmup@2"]  # nothing lost
        runs = history.calibration_runs("lab")
    again = predict_combo(_plan(mbs=2), plan.cluster.gpu, runs)
    assert again.calibration_runs == ["run/a@1"]
    assert again.calibration is not None and "run/warmup@2" in again.calibration and "set aside" in again.calibration
    assert "500 times the" in again.calibration


def test_a_suite_combo_whose_step_is_implausible_is_kept_but_calibrates_nothing(tmp_path) -> None:
    from megapilot.estimate.history_calibration import calibrate

    result, combo = _predicted_combo_of_a_cluster(tmp_path)
    # its prediction given in seconds where milliseconds were meant: the measured step is ~1000x it
    slipped = combo.model_copy(update={"predicted": combo.predicted.model_copy(update={
        "uncalibrated_step_time_ms": 1.05, "uncalibrated_components_ms": {"compute": 1.0, "optimizer": 0.05}})})
    result = result.model_copy(update={"combos": [slipped]})
    with open_history(str(tmp_path / "h.sqlite")) as history:
        history.record(result)
        [row] = history.measured("lab")
        [run] = history.calibration_runs("lab")
    assert row.origin == "suite" and row.calibrates  # recorded as measured: the calibration decides
    calibrated = calibrate(run.key, run.predicted, [run])
    assert not calibrated.applied and calibrated.runs_used == ()
    assert [aside.run_id for aside in calibrated.set_aside] == [row.id] and row.id in calibrated.reason
