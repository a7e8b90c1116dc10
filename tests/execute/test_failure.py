"""Failure reasons from what a launcher really prints."""

from __future__ import annotations

from pathlib import Path

from megapilot.execute.failure import FailureClues, describe_exit_code
from megapilot.logs import LineParser

DATA = Path(__file__).parent / "data"


def clues_of(lines: list[str]) -> FailureClues:
    clues, parser = FailureClues(), LineParser("training.log")
    for number, text in enumerate(lines, start=1):
        clues.feed(text, parser.feed(number, text))
    return clues


def test_torchrun_root_cause_names_killed_rank_and_signal():
    clues = clues_of((DATA / "torchrun_rank_sigkill.log").read_text().splitlines())
    assert clues.root_cause == "rank 1 (local rank 1, pid 8285) killed by SIGKILL on localhost"
    # The surviving rank's "connection reset" is a consequence, not the reason.
    assert clues.reason(1) == "rank 1 (local rank 1, pid 8285) killed by SIGKILL on localhost; launcher exit code 1"


def test_python_exception_is_the_reason_without_a_torchrun_summary():
    clues = clues_of(["Traceback (most recent call last):", '  File "x.py", line 1',
                      "[rank0]: ValueError: bad flag --foo"])
    assert clues.reason(1) == "ValueError: bad flag --foo; launcher exit code 1"


def test_a_launch_that_failed_before_python_names_its_first_failure():
    clues = clues_of(["launch.sh: line 3: torchrun: command not found"])
    assert clues.reason(127) == "launch.sh: line 3: torchrun: command not found; launcher exit code 127"


def test_the_first_failure_not_the_schedulers_last_words():
    clues = clues_of(["/usr/bin/python3: No module named torch",
                      "srun: error: node1: task 0: Exited with exit code 1",
                      "srun: launch/slurm: _step_signal: Terminating StepId=3.0"])
    assert clues.reason(None) == "/usr/bin/python3: No module named torch"


def test_last_output_line_when_nothing_else_explains():
    clues = clues_of(["loading the model", "still loading"])
    assert clues.reason(1) == "last output: still loading; launcher exit code 1"


def test_exit_codes_are_described_as_signals_when_they_are():
    assert describe_exit_code(-9) == "killed by SIGKILL"
    assert describe_exit_code(137) == "exit code 137 (SIGKILL)"
    assert describe_exit_code(3) == "exit code 3"


def test_error_signature_from_the_log_parser_joins_the_reason():
    clues = clues_of(["[default0]: [2026-01-01 00:00:00] iteration        1/       5 | lm loss: 1.0 |",
                      "[default0]:[rank0]: NCCL watchdog thread terminated with exception: Watchdog caught "
                      "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds",
                      "[default0]:[rank0]: RuntimeError: stopped"])
    assert clues.reason(1).startswith("RuntimeError: stopped; log shows ")
    assert "Watchdog caught collective operation timeout" in clues.reason(1)


def test_an_exception_is_not_repeated_as_its_own_signature():
    clues = clues_of(["[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert clues.reason(1) == ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; "
                               "launcher exit code 1")



def test_a_refused_command_line_is_named_beside_the_rank_that_exited():
    refused = "error: --bogus-flag: unknown flag — fix: see `python -m megapilot.trainer --help`"
    lines = [f"[default1]:{refused}", f"[default0]:{refused}",
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
             "megapilot.trainer FAILED", "-" * 60, "Root Cause (first observed failure):", "[0]:",
             "  host      : localhost", "  rank      : 1 (local_rank: 1)", "  exitcode  : 2 (pid: 12842) ", "=" * 60]
    assert clues_of(lines).reason(1) == f"rank 1 (local rank 1, pid 12842) exit code 2 on localhost; {refused}; " \
                                        "launcher exit code 1"


def test_argparse_usage_error_is_the_reason_of_a_plain_script():
    clues = clues_of(["usage: train.py [-h] [--iters ITERS]", "train.py: error: unrecognized arguments: --bogus 3"])
    # the parser's signature matches the usage line, which names no flag: the refusal comes first
    assert clues.reason(2).startswith("train.py: error: unrecognized arguments: --bogus 3; ")
