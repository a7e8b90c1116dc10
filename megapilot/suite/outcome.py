"""The one verdict of a suite run: what the banner, the terminal, the run deck, JUnit, the exit code, suite.json and
the history row say.

Each of them reads `run_outcome(result)` (what is stored, through `stored_verdict`), so they can never disagree.
The policy:

    INTERRUPTED  the run did not finish (Ctrl-C, SIGTERM, killed), or it ended holding a stage or combo that did
                 not (its gates say INTERRUPTED): exit 130 (128 + the signal), whatever finished is shown; the summary
                 says what stopped it, where (the stage or combo, the iteration) and what the finished stages and
                 combos said, FAIL only when one of them failed; a regression does not make it WARN
    FAIL         a stage or combo failed its gates: exit 1
    FAIL         a headline metric regressed beyond its band against the history, with `regressions.enforce`
                 (config) or `--enforce-regressions` (CLI): exit 1
    WARN         the same regression without enforcement: exit 0, but never shown green
    PASS         every stage and combo within its gates, no regression beyond its band: exit 0
    RECORD       measured, nothing gated: exit 0
    SKIPPED      nothing was measured: exit 0
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from megapilot.suite.results import JobSummary, Regression, SuiteResult
from megapilot.suite.verdicts import RunStatus, Verdict  # a module of its own: the history reads them alone

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class RunOutcome:
    """The run's verdict, why, and the exit code that goes with it."""

    status: RunStatus
    summary: str  # one line for the banner and the terminal
    exit_code: int
    regressions: list[Regression] = field(default_factory=list)  # the worse moves beyond their band
    regressions_enforced: bool = False

    @property
    def green(self) -> bool:
        return self.status is RunStatus.PASS


_GATE_STATUS = {Verdict.PASS: RunStatus.PASS, Verdict.FAIL: RunStatus.FAIL, Verdict.RECORD: RunStatus.RECORD,
                Verdict.SKIPPED: RunStatus.SKIPPED, Verdict.INTERRUPTED: RunStatus.INTERRUPTED}
_PLAIN = {RunStatus.PASS: "every stage and combo within its gates", RunStatus.RECORD: "measured; nothing gated",
          RunStatus.SKIPPED: "nothing was measured", RunStatus.FAIL: "a stage or combo failed its gates"}


def run_outcome(result: SuiteResult) -> RunOutcome:
    """The one verdict of `result`, by the policy above."""
    worse = [r for r in result.regressions if r.worse]
    enforced = result.regressions_enforced
    if not result.finished or result.verdict is Verdict.INTERRUPTED:
        return RunOutcome(RunStatus.INTERRUPTED, interrupted_summary(result), interrupted_exit_code(result), worse,
                          enforced)
    if result.verdict is Verdict.FAIL:
        return RunOutcome(RunStatus.FAIL, result.reason or _PLAIN[RunStatus.FAIL], EXIT_FAILED, worse, enforced)
    if worse:
        moved = "; ".join(f"{r.combo}: {r.message}" for r in worse[:3]) + (f" (+{len(worse) - 3} more)"
                                                                          if len(worse) > 3 else "")
        if enforced:
            return RunOutcome(RunStatus.FAIL, f"regressed beyond its band (regressions.enforce): {moved}",
                              EXIT_FAILED, worse, enforced)
        return RunOutcome(RunStatus.WARN, f"gates passed, but regressed beyond its band: {moved} "
                                          "(not enforced; set regressions.enforce to fail the run)",
                          EXIT_OK, worse, enforced)
    status = _GATE_STATUS[result.verdict]
    return RunOutcome(status, result.reason or _PLAIN[status], EXIT_OK, [], enforced)


def stored_verdict(result: SuiteResult) -> tuple[RunStatus, str]:
    """The verdict and reason a run is stored with (its suite.json and its history row): the one verdict, with the
    gates' own reason where the gates decided it, else the summary that says what did (a regression beyond its
    band: WARN, or FAIL under enforcement). A run still going (or stopped) is stored as the lifecycle keeps it,
    INTERRUPTED until it ends: suite.json is written after every step, and the history reads an unfinished row as
    INTERRUPTED whatever it says."""
    outcome = run_outcome(result)
    if not result.finished or outcome.status.value == result.verdict.value:
        return RunStatus(result.verdict.value), result.reason  # the gates' verdict: the one verdict of such a run
    return outcome.status, outcome.summary


def interrupted_exit_code(result: SuiteResult) -> int:
    """The shell's 128 + N of the signal that stopped the run (what `suite run` exits with), else 130."""
    try:
        return 128 + signal.Signals[result.stopped_by or ""].value
    except KeyError:
        return EXIT_INTERRUPTED


def interrupted_summary(result: SuiteResult) -> str:
    """What stopped an unfinished run, where, and what finished said: 'stopped by SIGINT during combo 1 of 2
    (MBS=1,...: train, iteration 10 of 80); what finished: all PASS; not started: 1 combo'."""
    words = "stopped" + stopped_by_words(result)
    stage, combo = result.interrupted_stage(), result.interrupted_combo()
    if combo is not None:
        cells = [c for c in result.combos if c.key != "smoke"]
        place = next(index for index, c in enumerate(cells, 1) if c is combo)
        total = f" of {max(len(result.planned_combos), len(cells))}" if result.planned_combos else ""
        progress = progress_words(combo.job).removeprefix("at ")
        words += f" during combo {place}{total} ({combo.key}: train, {progress})"
    elif stage is not None:
        job = stage.jobs[-1] if stage.jobs else None
        words += f" during stage {stage.name}" + (f" ({progress_words(job).removeprefix('at ')})" if job else "")
    words += "; what finished: " + _finished_words(result)
    left = len(result.not_started())
    if left:
        words += f"; not started: {left} combo" + ("s" if left > 1 else "")
    return words


def stopped_by_words(result: SuiteResult) -> str:
    """' by SIGINT', or what can be said when nothing was seen to stop the run."""
    if result.stopped_by:
        return f" by {result.stopped_by}"
    return " (no signal seen: killed outright, or still running)"


def progress_words(job: JobSummary | None) -> str:
    """'at iteration 10 of 80', or where the job was when it had not logged one."""
    if job is None:
        return "before its job started"
    if job.iterations_reached is None:
        return "before its first iteration"
    total = f" of {job.train_iters}" if job.train_iters else ""
    return f"at iteration {job.iterations_reached}{total}"


def _finished_words(result: SuiteResult) -> str:
    """FAIL only when something that finished failed, saying what; 'all PASS' when every gate it judged passed."""
    verdict = result.finished_verdict()
    if verdict is Verdict.FAIL:
        return f"FAIL ({result.failure_summary() or 'a stage or combo failed its gates'})"
    judged = [v for v in [s.verdict for s in result.stages] + [c.verdict for c in result.combos]
              if v not in (Verdict.SKIPPED, Verdict.INTERRUPTED)]
    if not judged:
        return "nothing measured yet"
    return "all PASS" if verdict is Verdict.PASS and all(v is Verdict.PASS for v in judged) else verdict.value


__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "RunOutcome", "RunStatus", "interrupted_exit_code",
           "interrupted_summary", "progress_words", "run_outcome", "stopped_by_words", "stored_verdict"]
