"""suite.outcome: the one verdict of a run and its exit code, by the policy in the module's docstring."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.suite.outcome import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunStatus, run_outcome
from megapilot.suite.results import Regression, SuiteResult, Verdict
from tests.report.factory import suite_result


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


@pytest.mark.parametrize(("verdict", "said"), [(Verdict.PASS, ""), (Verdict.FAIL, "; FAIL so far")])
def test_an_unfinished_run_is_interrupted_whatever_its_gates_say_so_far(tmp_path, verdict, said):
    outcome = run_outcome(_result(tmp_path, verdict, worse=1, enforced=True, finished=False))
    assert (outcome.status, outcome.exit_code) == (RunStatus.INTERRUPTED, EXIT_INTERRUPTED)
    assert outcome.summary == f"interrupted: results so far are shown{said}"
