"""Suite results: verdict rules and suite.json written atomically and read back, NaN included."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import pytest

from megapilot.errors import MegapilotError
from megapilot.suite.results import (
    SUITE_RESULT_VERSION,
    ComboResult,
    Curve,
    JobSummary,
    RunCard,
    StageResult,
    SuiteResult,
    Verdict,
    overall_verdict,
    read_suite_result,
)

CARD = RunCard(suite_name="s", model="tiny", gpu="CPU", nodes=1, gpus_per_node=2, executor="local", backend="megapilot")


def _result(tmp_path, **fields) -> SuiteResult:
    return SuiteResult(run_id="r1", run_dir=str(tmp_path), verdict=Verdict.SKIPPED, card=CARD,
                       started_at=datetime(2026, 12, 1, tzinfo=timezone.utc), **fields)


@pytest.mark.parametrize(("verdicts", "expected"), [
    ([Verdict.PASS, Verdict.FAIL, Verdict.RECORD], Verdict.FAIL),
    ([Verdict.SKIPPED, Verdict.PASS, Verdict.RECORD], Verdict.PASS),
    ([Verdict.SKIPPED, Verdict.RECORD], Verdict.RECORD),
    ([Verdict.SKIPPED], Verdict.SKIPPED),
    ([], Verdict.SKIPPED),
    ([Verdict.PASS, Verdict.INTERRUPTED], Verdict.INTERRUPTED),
    ([Verdict.FAIL, Verdict.INTERRUPTED], Verdict.FAIL),
])
def test_fail_wins_then_interrupted_then_pass_then_record(verdicts, expected):
    assert overall_verdict(verdicts) is expected


def test_suite_json_round_trips_with_a_nan_loss(tmp_path):
    combo = ComboResult(key="A", directory="A", verdict=Verdict.FAIL, backend="megapilot",
                        curves=[Curve(name="loss", points=[(1, 7.0), (2, math.nan)])])
    result = _result(tmp_path, stages=[StageResult(name="smoke", verdict=Verdict.PASS)], combos=[combo])
    assert result.recompute_verdict() is Verdict.FAIL
    path = result.write()
    assert json.loads(path.read_text())["combos"][0]["curves"][0]["points"][1][1] == "NaN"
    back = read_suite_result(tmp_path)
    assert math.isnan(back.combos[0].curves[0].points[1][1]) and back.combo("A") is not None
    assert back.combo("missing") is None
    assert not list(tmp_path.glob(".suite.*"))  # the temporary file was renamed into place


def test_a_missing_or_damaged_result_is_a_user_error(tmp_path):
    with pytest.raises(MegapilotError, match=r"has no suite\.json"):
        read_suite_result(tmp_path)
    (tmp_path / "suite.json").write_text("{not json")
    with pytest.raises(MegapilotError, match="is not a suite result"):
        read_suite_result(tmp_path)


def test_a_damaged_result_names_the_field_at_fault_and_a_newer_one_the_version(tmp_path):
    combo = ComboResult(key="A", directory="A", verdict=Verdict.PASS, backend="megapilot")
    data = json.loads(_result(tmp_path, combos=[combo]).write().read_text())
    data["combos"][0]["verdict"] = "GREAT"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    with pytest.raises(MegapilotError) as damaged:
        read_suite_result(tmp_path)
    assert "is not a suite result (combos.0.verdict: Input should be " in str(damaged.value)
    assert "(found 'GREAT')" in str(damaged.value)
    del data["run_id"]
    (tmp_path / "suite.json").write_text(json.dumps(data))
    with pytest.raises(MegapilotError, match=r"\(run_id: Field required; and 1 more\)"):
        read_suite_result(tmp_path)
    data.update(run_id="r", version=SUITE_RESULT_VERSION + 1)
    data["combos"][0]["verdict"] = "PASS"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    with pytest.raises(MegapilotError, match=f"is suite result version {SUITE_RESULT_VERSION + 1}; this megapilot "
                                             f"reads up to version {SUITE_RESULT_VERSION}"):
        read_suite_result(tmp_path)


@pytest.mark.parametrize(("where", "value"), [
    ("duration_s", math.nan), ("stages.0.duration_s", "Infinity"), ("combos.0.duration_s", "NaN"),
    ("combos.0.job.duration_s", -math.inf),
])
def test_a_duration_that_is_not_a_finite_number_is_refused_by_its_field(tmp_path, where, value):
    # the run deck's schema holds a number for each duration: a NaN would be written there as null
    combo = ComboResult(key="A", directory="A", verdict=Verdict.PASS, backend="megapilot",
                        job=JobSummary(executor="local", job_id="1", state="COMPLETED", duration_s=3.0))
    data = json.loads(_result(tmp_path, stages=[StageResult(name="smoke", verdict=Verdict.PASS)],
                              combos=[combo]).write().read_text())
    *parents, field = where.split(".")
    held = data
    for part in parents:
        held = held[int(part)] if part.isdigit() else held[part]
    held[field] = value
    (tmp_path / "suite.json").write_text(json.dumps(data))  # json writes a float NaN as the bare token NaN
    with pytest.raises(MegapilotError) as damaged:
        read_suite_result(tmp_path)
    assert f"is not a suite result ({where}: Input should be a finite number (found " in str(damaged.value)
    assert damaged.value.field == "run_dir" and "correct that field" in (damaged.value.fix or "")


def _every_number_kind(tmp_path) -> dict:
    """suite.json of a run holding a number of each kind: a gate's value and margin, Megatron's timers, a prediction,
    a regression and a budget projection."""
    from megapilot.spec.prediction import Prediction
    from megapilot.suite.budget import BudgetProjection
    from megapilot.suite.results import MetricRow, Regression

    combo = ComboResult(key="A", directory="A", verdict=Verdict.PASS, backend="megapilot",
                        metrics=[MetricRow(name="training.tokens_per_gpu", value=950.0, threshold=">= 900", kind="min",
                                           verdict=Verdict.PASS, margin_pct=5.6)],
                        timers_ms={"forward-compute": 12.5}, predicted=Prediction(step_time_ms=1000.0))
    regression = Regression(combo="A", metric="training.tokens_per_gpu", value=950.0, baseline_median=1000.0,
                            change_pct=-5.0, runs_compared=3, worse=True, message="tokens/s -5 %")
    budget = BudgetProjection(tokens=1e9, days=2.0, days_band=(1.5, 2.5))
    return json.loads(_result(tmp_path, combos=[combo], regressions=[regression], budget=budget).write().read_text())


@pytest.mark.parametrize(("where", "value", "found"), [
    ("combos.0.metrics.0.margin_pct", math.nan, "nan"), ("combos.0.metrics.0.value", "950", "'950'"),
    ("combos.0.timers_ms.forward-compute", True, "True"), ("combos.0.timers_ms.forward-compute", "NaN", "'NaN'"),
    ("regressions.0.baseline_median", math.inf, "inf"), ("regressions.0.change_pct", "-Infinity", "'-Infinity'"),
    ("budget.days_band.1", "Infinity", "'Infinity'"), ("regressions.0.runs_compared", "3", "'3'"),
])
def test_any_number_that_is_not_a_finite_json_number_is_refused_by_its_path_and_value(tmp_path, where, value, found):
    # one rule for every number, not only the durations: a gate, a regression or a prediction read from a damaged
    # file would pass on a NaN (or a number written as text) to the report, the run deck and the history
    data = _every_number_kind(tmp_path)
    *parents, field = where.split(".")
    held = data
    for part in parents:
        held = held[int(part)] if part.isdigit() else held[part]
    held[int(field) if field.isdigit() else field] = value
    (tmp_path / "suite.json").write_text(json.dumps(data))
    with pytest.raises(MegapilotError) as damaged:
        read_suite_result(tmp_path)
    assert f"is not a suite result ({where}: Input should be a finite number (found {found}))" in str(damaged.value)
    assert damaged.value.field == "run_dir" and "correct that field" in (damaged.value.fix or "")


def test_an_earlier_writers_infinite_or_nan_number_reads_as_unset_where_the_field_may_be_unset(tmp_path):
    # before the writer wrote null for them, a margin with no bound or a value the log made infinite was written
    # "Infinity"/"NaN": such a run still reads (as the writer now writes it); a field that must hold a number refuses
    data = _every_number_kind(tmp_path)
    data["combos"][0]["metrics"][0]["value"] = "Infinity"
    data["combos"][0]["metrics"][0]["margin_pct"] = "-Infinity"
    data["combos"][0]["predicted"]["step_time_ms"] = "NaN"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    result = read_suite_result(tmp_path)
    row = result.combos[0].metrics[0]
    assert (row.value, row.margin_pct) == (None, None)
    assert result.combos[0].predicted is not None and result.combos[0].predicted.step_time_ms is None


def test_a_number_that_is_not_finite_is_written_as_null_so_the_run_reads_its_own_file_back(tmp_path):
    # a margin with no bound (a step time of 0 against a prediction), a checkpoint interval with no failures: the
    # reader refuses a non-finite number, so the writer never writes one; a curve keeps its NaN reading
    from megapilot.suite.budget import BudgetProjection
    from megapilot.suite.results import MetricRow

    combo = ComboResult(key="A", directory="A", verdict=Verdict.PASS, backend="megapilot",
                        metrics=[MetricRow(name="training.step_time_p50_ms", value=0.0, verdict=Verdict.PASS,
                                           margin_pct=math.inf)],
                        curves=[Curve(name="loss", points=[(1, 7.0), (2, math.nan)])])
    budget = BudgetProjection(tokens=1e9, checkpoint_interval_s=math.inf)
    stored = json.loads(_result(tmp_path, combos=[combo], budget=budget).write().read_text())
    assert stored["combos"][0]["metrics"][0]["margin_pct"] is None and stored["budget"]["checkpoint_interval_s"] is None
    assert stored["combos"][0]["curves"][0]["points"][1][1] == "NaN"
    back = read_suite_result(tmp_path)
    assert back.combos[0].metrics[0].margin_pct is None and back.budget is not None
    assert back.budget.checkpoint_interval_s is None and math.isnan(back.combos[0].curves[0].points[1][1])


def _combo(key: str, verdict: Verdict) -> ComboResult:
    return ComboResult(key=key, directory=key, verdict=verdict, backend="megapilot")


def test_an_unfinished_run_names_what_it_stopped_in_and_what_it_never_started(tmp_path):
    result = _result(tmp_path, planned_combos=["A", "B", "A", "C"], stages=[
        StageResult(name="prepare", verdict=Verdict.PASS), StageResult(name="smoke", verdict=Verdict.SKIPPED),
        StageResult(name="train", combo="A", verdict=Verdict.PASS),
        StageResult(name="train", combo="B", verdict=Verdict.INTERRUPTED)],
        combos=[_combo("smoke", Verdict.PASS), _combo("A", Verdict.PASS), _combo("B", Verdict.INTERRUPTED)])
    assert result.interrupted_combo() is result.combos[2] and result.interrupted_stage() is None
    assert result.not_started() == ["A", "C"]  # the key listed twice ran once
    assert result.finished_verdict() is Verdict.PASS and result.recompute_verdict() is Verdict.INTERRUPTED
    result.finished = True
    assert result.not_started() == []


def test_the_stage_it_stopped_in_is_a_run_wide_interrupted_row(tmp_path):
    result = _result(tmp_path, stages=[StageResult(name="smoke", verdict=Verdict.INTERRUPTED),
                                       StageResult(name="preflight", verdict=Verdict.FAIL)])
    assert result.interrupted_stage() is result.stages[0] and result.interrupted_combo() is None
    assert result.finished_verdict() is Verdict.FAIL and result.failure_summary() == "stage preflight failed"


def test_an_interrupted_result_round_trips_and_one_written_before_reads_with_nothing_planned(tmp_path):
    result = _result(tmp_path, stopped_by="SIGTERM", planned_combos=["A"], combos=[_combo("A", Verdict.INTERRUPTED)])
    result.verdict = Verdict.INTERRUPTED
    result.write()
    back = read_suite_result(tmp_path)
    assert (back.verdict, back.stopped_by, back.planned_combos) == (Verdict.INTERRUPTED, "SIGTERM", ["A"])
    stored = json.loads((tmp_path / "suite.json").read_text())
    for name in ("stopped_by", "planned_combos"):
        del stored[name]
    stored["verdict"] = "FAIL"  # what an interrupted run said before INTERRUPTED was a verdict of its own
    (tmp_path / "suite.json").write_text(json.dumps(stored))
    earlier = read_suite_result(tmp_path)
    assert (earlier.stopped_by, earlier.planned_combos, earlier.not_started()) == (None, [], [])
