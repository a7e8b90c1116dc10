"""suite.verdicts: the verdict types alone, which the history reads without the suite's results."""

from __future__ import annotations

import subprocess
import sys

from megapilot.suite import outcome, results
from megapilot.suite.verdicts import RunStatus, Verdict


def test_the_results_and_the_outcome_policy_hold_these_very_types():
    assert results.Verdict is Verdict and outcome.RunStatus is RunStatus


def test_every_gate_verdict_is_a_run_status_too():
    """A run's status is its gates' verdict, or WARN for a regression not enforced."""
    assert {v.value for v in Verdict} | {"WARN"} == {s.value for s in RunStatus}


def test_importing_the_verdicts_loads_nothing_of_the_suite_else():
    """Checked in a fresh interpreter (this test process has imported everything already)."""
    probe = "import sys, megapilot.suite.verdicts; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            timeout=60).stdout.split()
    assert [m for m in loaded if m.startswith("megapilot.")] == ["megapilot.compat", "megapilot.errors",
                                                                 "megapilot.suite", "megapilot.suite.verdicts"]
    assert "pydantic" not in loaded
