"""Why a job failed, in one line, from what its launcher printed.

torchrun ends a failed run with a summary whose "Root Cause (first observed failure)" block names
the rank, its exit code or signal and its PID; that is the most precise reason there is. Without
it (a plain script, a launcher killed itself) the last Python exception line is the next best.
`FailureClues` is fed every log line as the executor reads it, so nothing has to be re-read.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from megapilot.logs import ErrorRecord, IterationRecord
from megapilot.logs.parser import LAUNCHER_FIELD_RE, LAUNCHER_SUMMARY_NEEDLE
from megapilot.logs.records import Record
from megapilot.logs.signatures import EXCEPTION_LINE_RE

_RANK = re.compile(r"(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)")
_EXITCODE = re.compile(r"(?P<code>-?\d+)\s*\(pid:\s*(?P<pid>\d+)\)")
# "[default0]:[rank0]: RuntimeError: ..." or a bare "ValueError: ..." at the end of a traceback.
_RANK_PREFIX = re.compile(r"^(?:\[[^\]]*\]:\s?)+")
_MAX_REASON_CHARS = 400
# A launch that failed before Python raised anything: the interpreter lacks a module, a file or a command.
_LAUNCH_FAILURE = re.compile(r"No module named \S+|can't open file|command not found|No such file or directory|"
                             r"Permission denied|cannot execute")
# A program that refused its command line before it ran: argparse's "train.py: error: unrecognized arguments: ..." or
# the trainer's "error: --flag: unknown flag — fix: ...". It exits with a code and no exception, so nothing else names
# it. A scheduler's "srun: error: ..." is its last words about the job, not the cause.
_USAGE_ERROR = re.compile(r"^(?:[\w./-]+\.py: )?error: \S")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit_code(exit_code: int) -> str:
    """'exit code 3' or 'killed by SIGKILL' (a negative code is a signal, as Popen reports it)."""
    if exit_code < 0:
        return f"killed by {signal_name(-exit_code)}"
    if exit_code > 128 and exit_code - 128 in {s.value for s in signal.Signals}:
        return f"exit code {exit_code} ({signal_name(exit_code - 128)})"
    return f"exit code {exit_code}"


class FailureClues:
    """Collects failure evidence from log lines: torchrun's root cause and the last exception."""

    def __init__(self) -> None:
        self._in_root_cause = False
        self._root_cause: dict[str, str] = {}
        self.last_exception: str | None = None
        self.last_line: str | None = None
        self.first_error: ErrorRecord | None = None
        self.first_failure: str | None = None
        self.usage_error: str | None = None

    def feed(self, line: str, records: Sequence[Record] = ()) -> None:
        """One log line, with the records `megapilot.logs` parsed from it (see ProgressTracker.feed)."""
        for record in records:
            # The first error signature of the taxonomy (OOM, NCCL timeout, bad argument...); a
            # launcher's "signal received" is left to the root cause, which says more.
            if isinstance(record, ErrorRecord) and record.category != "process_crash" and self.first_error is None:
                self.first_error = record
        text = line.rstrip("\n")
        if LAUNCHER_SUMMARY_NEEDLE in text:  # the block's header and fields as the log parser reads them
            self._in_root_cause = True
            self._root_cause = {}
            return
        if self._in_root_cause:
            field = LAUNCHER_FIELD_RE.match(text)
            if field:
                self._root_cause[field.group(1)] = field.group(2)
            elif text.startswith("="):
                self._in_root_cause = False
            return
        bare = _RANK_PREFIX.sub("", text).strip()
        if bare and not any(isinstance(r, IterationRecord) for r in records):  # progress is no failure clue
            self.last_line = bare[:_MAX_REASON_CHARS]
        exception = EXCEPTION_LINE_RE.match(bare)
        if exception and exception["name"] != "ChildFailedError":
            self.last_exception = bare[:_MAX_REASON_CHARS]
        if self.first_failure is None and (exception or _LAUNCH_FAILURE.search(bare)):
            self.first_failure = bare[:_MAX_REASON_CHARS]
        if self.usage_error is None and _USAGE_ERROR.match(bare):
            self.usage_error = bare[:_MAX_REASON_CHARS]

    @property
    def root_cause(self) -> str | None:
        """'rank 1 (local rank 1, pid 8285) killed by SIGKILL' from torchrun's summary, if printed."""
        if "exitcode" not in self._root_cause:
            return None
        rank = _RANK.search(self._root_cause.get("rank", ""))
        code = _EXITCODE.search(self._root_cause["exitcode"])
        who = f"rank {rank['rank']} (local rank {rank['local']}" if rank else "a worker ("
        if code is None:
            return f"{who}) failed: {self._root_cause['exitcode']}"
        how = describe_exit_code(int(code["code"]))
        text = f"{who}, pid {code['pid']}) {how}"
        host = self._root_cause.get("host")
        return f"{text} on {host}" if host else text

    def reason(self, launcher_exit_code: int | None) -> str:
        """The best one-line reason for a failed run."""
        parts = []
        if self.root_cause:
            parts.append(self.root_cause)
        # After a rank is killed the survivors' errors (connection reset...) are consequences, not
        # the cause; after a rank raised, its exception is the cause.
        killed = self.root_cause is not None and "killed by" in self.root_cause
        if self.usage_error and not killed:  # the rank's exit code alone does not say its command line was refused
            parts.append(self.usage_error)
        if self.last_exception and not killed:
            parts.append(self.last_exception)
        error_line = _RANK_PREFIX.sub("", self.first_error.text).strip() if self.first_error else None
        if self.first_error is not None and not killed and error_line != self.last_exception:
            parts.append(f"log shows {self.first_error.category} ({self.first_error.signature}): "
                         f"{(error_line or '')[:200]}")
        if not parts and self.first_failure:
            parts.append(self.first_failure)
        if not parts and self.last_line:
            parts.append(f"last output: {self.last_line}")
        if launcher_exit_code is not None:
            parts.append(f"launcher {describe_exit_code(launcher_exit_code)}")
        return "; ".join(parts)[:_MAX_REASON_CHARS] if parts else "failed"
