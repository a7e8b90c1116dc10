"""The verdict types alone: a stage's or combo's `Verdict` and a run's one `RunStatus` (megapilot.suite.outcome).

Kept apart from the results and the outcome policy, which load the findings, the layout and budget types and
through them most of the estimator: the history reads and prints verdicts (`megapilot history list|show`) without
any of that.
"""

from __future__ import annotations

from megapilot.compat import StrEnum


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    RECORD = "RECORD"
    SKIPPED = "SKIPPED"
    INTERRUPTED = "INTERRUPTED"


class RunStatus(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    RECORD = "RECORD"
    SKIPPED = "SKIPPED"
    INTERRUPTED = "INTERRUPTED"
