"""The one verdict of a suite run: what the banner, the terminal, the run deck, JUnit and the exit code say.

Each of them reads `run_outcome(result)`, so they can never disagree. The policy:

    INTERRUPTED  the run did not finish (Ctrl-C, SIGTERM): exit 130, whatever finished is shown
    FAIL         a stage or combo failed its gates: exit 1
    FAIL         a headline metric regressed beyond its band against the history, with `regressions.enforce`
                 (config) or `--enforce-regressions` (CLI): exit 1
    WARN         the same regression without enforcement: exit 0, but never shown green
    PASS         every stage and combo within its gates, no regression beyond its band: exit 0
    RECORD       measured, nothing gated: exit 0
    SKIPPED      nothing was measured: exit 0
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megapilot.compat import StrEnum
from megapilot.suite.results import Regression, SuiteResult, Verdict

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class RunStatus(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    RECORD = "RECORD"
    SKIPPED = "SKIPPED"
    INTERRUPTED = "INTERRUPTED"


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
                Verdict.SKIPPED: RunStatus.SKIPPED}
_PLAIN = {RunStatus.PASS: "every stage and combo within its gates", RunStatus.RECORD: "measured; nothing gated",
          RunStatus.SKIPPED: "nothing was measured", RunStatus.FAIL: "a stage or combo failed its gates"}


def run_outcome(result: SuiteResult) -> RunOutcome:
    """The one verdict of `result`, by the policy above."""
    worse = [r for r in result.regressions if r.worse]
    enforced = result.regressions_enforced
    if not result.finished:
        gates = f"; {result.verdict.value} so far" if result.verdict is Verdict.FAIL else ""
        return RunOutcome(RunStatus.INTERRUPTED, f"interrupted: results so far are shown{gates}", EXIT_INTERRUPTED,
                          worse, enforced)
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


__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "RunOutcome", "RunStatus", "run_outcome"]
