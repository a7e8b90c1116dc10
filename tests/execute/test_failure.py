"""Failure reasons from what a launcher really prints."""

from __future__ import annotations

from pathlib import Path

from megapilot.execute.failure import FailureClues, describe_exit_code

DATA = Path(__file__).parent / "data"


def clues_of(lines: list[str]) -> FailureClues:
    clues = FailureClues()
    for text in lines:
        clues.feed(text)
    return clues


def test_torchrun_root_cause_names_killed_rank_and_signal():
    clues = clues_of((DATA / "torchrun_rank_sigkill.log").read_text().splitlines())
    assert clues.root_cause == "rank 1 (local rank 1, pid 8285) killed by SIGKILL on localhost"
    # The surviving rank's "connection reset" is a consequence, not the reason.
    assert clues.reason(1) == "rank 1 (local rank 1, pid 8285) killed by SIGKILL on localhost; launcher exit code 1"


def test_python_exception_is_the_reason_without_a_torchrun_summary():
    clues = clues_of(["Traceback (most recent call last):", '  File "x.py", line 1', "[rank0]: ValueError: bad flag --foo"])
    assert clues.reason(1) == "ValueError: bad flag --foo; launcher exit code 1"


def test_last_output_line_when_nothing_else_explains():
    clues = clues_of(["launch.sh: line 3: torchrun: command not found"])
    assert clues.reason(127) == "last output: launch.sh: line 3: torchrun: command not found; launcher exit code 127"


def test_exit_codes_are_described_as_signals_when_they_are():
    assert describe_exit_code(-9) == "killed by SIGKILL"
    assert describe_exit_code(137) == "exit code 137 (SIGKILL)"
    assert describe_exit_code(3) == "exit code 3"
