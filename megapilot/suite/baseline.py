"""Where `baseline` thresholds get their history: a protocol the lifecycle calls, the store implements.

The suite does not import the store (the store reads the suite's results, so it sits after it); the
CLI hands a `BaselineSource` built on the run history to the lifecycle.
"""

from __future__ import annotations

from typing import Protocol

from megapilot.suite.gates import BaselineLookup
from megapilot.suite.results import ComboResult, RunCard


class BaselineSource(Protocol):
    """Gives, for one combo of one run, the lookup its `baseline` gates call per metric."""

    def lookup_for(self, card: RunCard, combo: ComboResult, *, run_id: str, last_n: int) -> BaselineLookup: ...


__all__ = ["BaselineSource"]
