"""suite.outcome: the one verdict of a run and its exit code, by the policy in the module's docstring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megapilot.suite.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunStatus, progress_words, run_outcome
from megapilot.suite.results import JobSummary, Regression, StageResult, SuiteResult, Verdict
from tests.report.factory import STOPPED, interrupted_result, suite_result


def _result(tmp_path: Path, verdict: Verdict, *, reason: str = "", worse: int = 0, enforced: bool = False,
            finished: bool = True) -> SuiteResult:
    result = suite_result(tmp_path)
    result.verdict, result.reason, result.finished, result.regressions_enforced = verdict, reason, finished, enforced
    result.regressions = [
        Regression(combo=f"c{n}", metric="training.tokens_per_gpu", value=90.0, baseline_median=100.0,
                   change_pct=-10.0, runs_compared=5, worse=True, message=f"tokens/s -10 % (#{n})")
        for n in range(worse)]
    result.regressions.append(Regression(combo="better", metric="training.tokens_per_gpu", value=110.0,
                                         baseline_median=100.0, change_pct=10.0, runs_compared=5, worse=False,
                                         message="tokens/s +10 %"))
    return result


@pytest.mark.parametrize(("verdict", "status", "summary"), [
    (Verdict.PASS, RunStatus.PASS, "every stage and combo within its gates"),
    (Verdict.RECORD, RunStatus.RECORD, "measured; nothing gated"),
    (Verdict.SKIPPED, RunStatus.SKIPPED, "nothing was measured"),
    (Verdict.FAIL, RunStatus.FAIL, "a stage or combo failed its gates"),
])
def test_the_gates_verdict_gives_the_status_and_a_plain_summary_when_no_reason_is_given(tmp_path, verdict, status,
                                                                                        summary):
    outcome = run_outcome(_result(tmp_path, verdict))
    assert (outcome.status, outcome.summary) == (status, summary)
    assert outcome.exit_code == (EXIT_FAILED if status is RunStatus.FAIL else EXIT_OK)
    assert outcome.green is (status is RunStatus.PASS)
    assert outcome.regressions == []  # an improvement is never listed


def test_a_failed_gate_keeps_its_own_reason_and_wins_over_regressions(tmp_path):
    outcome = run_outcome(_result(tmp_path, Verdict.FAIL, reason="1 of 2 combos failed", worse=2))
    assert (outcome.status, outcome.summary, outcome.exit_code) == (RunStatus.FAIL, "1 of 2 combos failed", 1)
    assert [r.combo for r in outcome.regressions] == ["c0", "c1"]


def test_a_regression_warns_unless_enforced_and_the_summary_names_at_most_three(tmp_path):
    warn = run_outcome(_result(tmp_path, Verdict.PASS, worse=5))
    assert (warn.status, warn.exit_code, warn.green) == (RunStatus.WARN, EXIT_OK, False)
    assert warn.summary.startswith("gates passed, but regressed beyond its band: c0: tokens/s -10 % (#0); c1:")
    assert "c2: tokens/s -10 % (#2) (+2 more)" in warn.summary and "c3:" not in warn.summary
    assert "set regressions.enforce" in warn.summary
    enforced = run_outcome(_result(tmp_path, Verdict.PASS, worse=1, enforced=True))
    assert (enforced.status, enforced.exit_code, enforced.regressions_enforced) == (RunStatus.FAIL, EXIT_FAILED, True)
    assert enforced.summary == "regressed beyond its band (regressions.enforce): c0: tokens/s -10 % (#0)"


def test_an_unfinished_run_is_interrupted_and_says_what_stopped_it_where_and_what_finished(tmp_path):
    result = interrupted_result(tmp_path)
    result.regressions = _result(tmp_path, Verdict.PASS, worse=1).regressions
    outcome = run_outcome(result)
    assert (outcome.status, outcome.exit_code, outcome.green) == (RunStatus.INTERRUPTED, EXIT_INTERRUPTED, False)
    assert outcome.summary == (f"stopped by SIGINT during combo 2 of 3 ({STOPPED}: train, iteration 10 of 80); "
                               "what finished: all PASS; not started: 1 combo")


@pytest.mark.parametrize(("stopped_by", "exit_code"), [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129),
                                                       (None, EXIT_INTERRUPTED), ("an error (disk gone)", 130)])
def test_the_exit_code_is_128_plus_the_signal_that_stopped_the_run(tmp_path, stopped_by, exit_code):
    result = interrupted_result(tmp_path)
    result.stopped_by = stopped_by
    assert run_outcome(result).exit_code == exit_code


def test_fail_is_said_only_when_something_that_finished_failed(tmp_path):
    result = interrupted_result(tmp_path)
    result.combos[0] = result.combos[0].model_copy(update={"verdict": Verdict.FAIL})
    assert "what finished: FAIL (1 combo(s) failed: MBS=1,GBS=8,PRECISION=BF16)" in run_outcome(result).summary
    result.combos[0] = result.combos[0].model_copy(update={"verdict": Verdict.RECORD})
    assert "what finished: PASS;" in run_outcome(result).summary  # PASS and RECORD: not all PASS, nothing failed


def test_a_stop_in_a_stage_or_with_no_signal_seen_says_so(tmp_path):
    result = interrupted_result(tmp_path)
    result.stopped_by = None
    result.combos = result.combos[:1]
    result.stages = [s for s in result.stages if s.combo != STOPPED and s.name != "smoke"]
    result.stages.append(StageResult(name="smoke", verdict=Verdict.INTERRUPTED, jobs=[
        JobSummary(executor="local", job_id="1", state="RUNNING", iterations_reached=3, train_iters=5,
                   logs=["smoke/out-node0/training.log"])]))
    assert run_outcome(result).summary == (
        "stopped (no signal seen: killed outright, or still running) during stage smoke (iteration 3 of 5); "
        "what finished: all PASS; not started: 2 combos")


def test_progress_is_told_as_far_as_the_job_got():
    job = JobSummary(executor="local", job_id="1", state="CANCELLED")
    assert progress_words(None) == "before its job started"
    assert progress_words(job) == "before its first iteration"
    assert progress_words(job.model_copy(update={"iterations_reached": 4})) == "at iteration 4"
    assert progress_words(job.model_copy(update={"iterations_reached": 4, "train_iters": 8})) == "at iteration 4 of 8"


@pytest.mark.parametrize("worse", [0, 1])
@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_gates_verdict_of_a_finished_run_has_an_outcome(tmp_path, verdict, worse):
    """Total over Verdict: a finished run whose gates say INTERRUPTED (a stage or combo that never ended) is
    INTERRUPTED, never a KeyError, and a regression does not turn it into WARN."""
    outcome = run_outcome(_result(tmp_path, verdict, worse=worse))
    assert outcome.summary
    if verdict is Verdict.INTERRUPTED:
        assert (outcome.status, outcome.exit_code, outcome.green) == (RunStatus.INTERRUPTED, EXIT_INTERRUPTED, False)
        assert outcome.summary.startswith("stopped")


def test_a_finished_run_that_holds_an_interrupted_combo_is_stored_and_read_back_as_interrupted(tmp_path):
    result = interrupted_result(tmp_path).model_copy(update={"finished": True, "reason": ""})
    result.regressions = _result(tmp_path, Verdict.PASS, worse=1).regressions
    stored = json.loads(result.model_dump_json())
    assert (stored["verdict"], stored["reason"], "gates_verdict" in stored) == ("INTERRUPTED", "", False)
    assert SuiteResult.model_validate(stored).verdict is Verdict.INTERRUPTED
