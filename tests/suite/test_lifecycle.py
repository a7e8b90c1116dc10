"""Lifecycle pieces that need no training: stage rows of a combo, the failure summary, run ids, JSON shape.

The whole lifecycle runs for real in tests/e2e/test_suite_local.py, test_suite_remote.py and
test_suite_history.py."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

from megapilot.diagnose.findings import Finding, Fix
from megapilot.logs.records import Evidence
from megapilot.suite.config import LoadedSuite, load_suite
from megapilot.suite.lifecycle import STAGES, _combo_stages, merge_findings, new_run_id
from megapilot.suite.results import ComboResult, JobSummary, MetricRow, RunCard, StageResult, SuiteResult, Verdict
from megapilot.suite.summary import result_json
from megapilot.suite.templates import template_path

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _combo(key: str, state: str, rows: list[MetricRow], reason: str = "") -> ComboResult:
    return ComboResult(key=key, directory=key.replace("=", "").replace(",", "_"), backend="megapilot",
                       verdict=Verdict.FAIL if state != "COMPLETED" or any(r.verdict is Verdict.FAIL for r in rows)
                       else Verdict.PASS, reason=reason, metrics=rows,
                       job=JobSummary(executor="local", job_id="1", state=state, reason=reason or None, duration_s=3.0))


def test_a_combo_becomes_train_metrics_and_loss_curve_rows():
    rows = [MetricRow(name="training.tokens_per_gpu", value=10.0, verdict=Verdict.FAIL, reason="10 < 50"),
            MetricRow(name="gate.loss_slope", value=-0.1, verdict=Verdict.PASS, reason="slope -0.1 < 0")]
    train, metrics, loss = _combo_stages(_combo("MBS=1,GBS=8,PRECISION=BF16", "COMPLETED", rows), NOW)
    assert (train.name, train.verdict, train.duration_s) == ("train", Verdict.PASS, 3.0)
    assert metrics.verdict is Verdict.FAIL and "training.tokens_per_gpu: 10 < 50" in metrics.reason
    assert loss.verdict is Verdict.PASS and loss.checks[0].name == "gate.loss_slope"


def test_a_job_that_did_not_complete_fails_its_train_row_with_the_executor_reason():
    combo = _combo("MBS=1,GBS=8,PRECISION=BF16", "HUNG", [], reason="no new iteration for 30 s")
    train, metrics, loss = _combo_stages(combo, NOW)
    assert train.verdict is Verdict.FAIL and train.reason == "no new iteration for 30 s"
    assert metrics.verdict is Verdict.SKIPPED and loss.verdict is Verdict.SKIPPED


def test_the_failure_summary_names_failed_stages_then_combos():
    card = RunCard(suite_name="s", model="tiny", gpu="CPU", nodes=1, gpus_per_node=2, executor="local",
                   backend="megapilot")
    result = SuiteResult(run_id="r", run_dir="/tmp/r", verdict=Verdict.FAIL, card=card, started_at=NOW,
                         stages=[StageResult(name="preflight", verdict=Verdict.FAIL)],
                         combos=[_combo("A", "FAILED", []), _combo("B", "COMPLETED", [])])
    assert result.failure_summary() == "stage preflight failed; 1 combo(s) failed: A"
    document = result_json(result)
    assert list(document)[:3] == ["verdict", "reason", "finished"]
    assert document["combos"][0]["job"]["state"] == "FAILED"


def test_run_ids_sort_by_time_and_stages_keep_cvs_order():
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", new_run_id())
    assert STAGES == ("prepare", "preflight", "collectives", "tokenizer", "smoke", "checkpoint", "train", "metrics",
                      "loss_curve", "results", "teardown")


def _finding(category: str, line: int, *, fixes: bool) -> Finding:
    fix = [Fix(action="set", flag="--micro-batch-size", value="1", reason="halves the activations")]
    return Finding(category=category, severity="critical", title=f"{category} at line {line}",  # type: ignore[arg-type]
                   evidence=[Evidence(file="training.log", line=line, text=f"line {line}")], cause="c",
                   fixes=fix if fixes else [])


def test_the_stop_line_keeps_the_analysis_finding_with_its_fixes_first() -> None:
    stopped = _finding("oom", 40, fixes=False)
    analysed = [_finding("nan_loss", 12, fixes=True), _finding("oom", 40, fixes=True)]
    merged = merge_findings(stopped, analysed)
    assert [(f.category, f.fixes != []) for f in merged] == [("oom", True), ("nan_loss", True)]


def test_the_watch_finding_stands_alone_where_the_analysis_has_none() -> None:
    stopped = _finding("oom", 40, fixes=False)
    analysed = [_finding("nan_loss", 12, fixes=True)]
    assert merge_findings(stopped, analysed) == [stopped, *analysed]
    assert merge_findings(None, analysed) == analysed


def test_each_combo_is_calibrated_on_what_this_run_measured_before_it_the_smoke_run_first(tmp_path) -> None:
    # late: the stand-in executor and the suite it runs live with the interruption tests
    from megapilot.store.measured import calibration_run_of
    from megapilot.suite.lifecycle import RunRequest, run_suite
    from tests.suite.test_lifecycle_interrupted import FIRST, SECOND, StandInExecutor

    loaded = _stand_in_suite(tmp_path)
    request = RunRequest(out_dir=tmp_path / "runs", cluster_name="lab", measured_run_of=calibration_run_of)
    result = run_suite(loaded, request, StandInExecutor())
    smoke, first, second = (result.combo(key) for key in ("smoke", FIRST, SECOND))
    assert smoke is not None and first is not None and second is not None
    # the smoke run's speed is recorded, never gated, and counts for the combos after it
    recorded = {r.name: r for r in smoke.metrics if r.verdict is Verdict.RECORD}
    assert "training.tokens_per_gpu" in recorded and not recorded["training.tokens_per_gpu"].enforced
    assert first.predicted is not None and first.predicted.calibration_runs == [f"{result.run_id}/smoke"]
    # the smoke run is of the first combo's layout (MBS 1): once that combo has run, it stands for the layout alone
    assert second.predicted is not None and second.predicted.calibration_runs == [f"{result.run_id}/{FIRST}"]
    # the stand-in steps take 100 ms: the first combo, calibrated on the smoke run's, is predicted near it
    assert first.predicted.step_time_ms is not None and abs(first.predicted.step_time_ms / 100.0 - 1) < 0.1
    assert first.predicted.calibrated_in_run and "this run's own earlier runs" in first.predicted.calibration


def test_a_smoke_run_of_a_layout_no_combo_has_run_yet_calibrates_every_combo_after_it(tmp_path) -> None:
    # late: the stand-in executor and the suite it runs live with the interruption tests
    from megapilot.store.measured import calibration_run_of
    from megapilot.suite.lifecycle import RunRequest, run_suite
    from tests.suite.test_lifecycle_interrupted import FIRST, SECOND, StandInExecutor

    loaded = _stand_in_suite(tmp_path, smoke_mbs=2)  # the second combo's layout, run last
    request = RunRequest(out_dir=tmp_path / "runs", cluster_name="lab", measured_run_of=calibration_run_of)
    result = run_suite(loaded, request, StandInExecutor())
    first, second = result.combo(FIRST), result.combo(SECOND)
    assert first is not None and first.predicted is not None and second is not None and second.predicted is not None
    assert first.predicted.calibration_runs == [f"{result.run_id}/smoke"]
    assert sorted(second.predicted.calibration_runs) == sorted([f"{result.run_id}/smoke", f"{result.run_id}/{FIRST}"])


def test_where_the_history_has_runs_of_the_cluster_they_alone_calibrate(tmp_path) -> None:
    # late: the stand-in executor and the suite it runs live with the interruption tests
    from megapilot.store.measured import calibration_run_of
    from megapilot.suite.lifecycle import RunRequest, run_suite
    from tests.suite.test_lifecycle_interrupted import FIRST, SECOND, StandInExecutor

    loaded = _stand_in_suite(tmp_path)
    request = RunRequest(out_dir=tmp_path / "earlier", cluster_name="lab", measured_run_of=calibration_run_of)
    # steps well off the model's (about 0.1 s for these layouts), so a calibration on them is worth applying
    earlier = run_suite(loaded, request, StandInExecutor(step_ms=400.0))
    history_runs = tuple(run for combo in earlier.combos if combo.key != "smoke"
                         and (run := calibration_run_of(earlier, combo)) is not None)
    assert len(history_runs) == 2
    result = run_suite(loaded, RunRequest(out_dir=tmp_path / "runs", cluster_name="lab", history_runs=history_runs,
                                          measured_run_of=calibration_run_of), StandInExecutor(step_ms=400.0))
    second = result.combo(SECOND)
    assert second is not None and second.predicted is not None and not second.predicted.calibrated_in_run
    assert sorted(second.predicted.calibration_runs) == sorted(
        [f"{earlier.run_id}/{FIRST}", f"{earlier.run_id}/{SECOND}"])


def test_without_the_historys_rule_a_combo_is_calibrated_on_the_history_alone(tmp_path) -> None:
    # late: the stand-in executor and the suite it runs live with the interruption tests
    from megapilot.suite.lifecycle import RunRequest, run_suite
    from tests.suite.test_lifecycle_interrupted import FIRST, StandInExecutor

    loaded = _stand_in_suite(tmp_path)
    result = run_suite(loaded, RunRequest(out_dir=tmp_path / "runs", cluster_name="lab"), StandInExecutor())
    first = result.combo(FIRST)
    assert first is not None and first.predicted is not None and first.predicted.calibration_runs == []


def _stand_in_suite(tmp_path: Path, *, smoke_mbs: int = 1) -> LoadedSuite:
    """The packaged tiny-local suite with no checkpoint stage (the stand-in jobs write no checkpoint)."""
    config = json.loads(template_path("tiny-local").read_text())
    config["smoke"]["micro_batch_size"] = str(smoke_mbs)
    config["threshold_json"] = str(template_path("tiny-local").with_name("tiny-local_threshold.json"))
    config["checkpoint"]["enforce"] = False
    (tmp_path / "suite.json").write_text(json.dumps(config))
    return load_suite(tmp_path / "suite.json")
