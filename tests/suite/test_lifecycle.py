"""Lifecycle pieces that need no training: stage rows of a combo, the failure summary, run ids, JSON shape.

The whole lifecycle runs for real in tests/e2e/test_suite_local.py, test_suite_remote.py and
test_suite_history.py."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from megapilot.diagnose.findings import Finding, Fix
from megapilot.logs.records import Evidence
from megapilot.suite.lifecycle import STAGES, _combo_stages, merge_findings, new_run_id
from megapilot.suite.results import ComboResult, JobSummary, MetricRow, RunCard, StageResult, SuiteResult, Verdict
from megapilot.suite.summary import result_json

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
