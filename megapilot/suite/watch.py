"""Watch a running job's node logs for fatal errors, so a combo fails early with evidence.

CVS `cat`s the whole last-node log over SSH twice per 120 s poll and only matches four case-sensitive
patterns. Here every node's log is read incrementally (only the bytes written since the last poll) by the log
analysis itself: each node has its own `LineParser` behind the bulk reader (`megapilot.logs.bulk.BulkReader`, the
reader of `parse_logs` and `RunFollower`), and the watch judges no line of its own. The first error record of a
fatal category stops the job: an OOM or an NCCL timeout never recovers, and waiting for the hang watchdog would only
waste the cluster's time. The records are the ones `parse_logs` hands `diagnose` after the run, so the live verdict
and the analysis afterwards cannot disagree (tests/suite/test_watch.py runs every fixture log through both): a c10d
warning is no rendezvous failure, nor is a store gone after torchrun said its workers finished, here as there
(`LineParser._error`).

When a record comes, and so when the watch stops: on its own line for a line an error signature names; on the
exception line for a traceback its frames classify (a `TypeError` under a checkpoint writer's frames is a failed
save), the traceback's last line, so at the first poll after the traceback ends; a few lines under a crash line
for a crash whose stack shows the checkpoint writer. A line is read once its newline has come (the parser reads
whole lines); a file that stays quiet for `QUIET_S` with a line unfinished (a process that died or hangs mid-line)
has that line judged as it stands, by a copy of the parser, the reader still waiting for the newline.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

from megapilot.diagnose.findings import EXPLANATIONS, Finding
from megapilot.logs.bulk import BulkReader
from megapilot.logs.parser import LineParser
from megapilot.logs.records import ErrorRecord, Evidence, Record
from megapilot.logs.signatures import Category
from megapilot.logs.summary import SummaryBuilder

# Categories after which a training job cannot finish well. process_crash is left to the executor
# (it sees the exit code and names the rank); config_error ends the job by itself within seconds.
FATAL_CATEGORIES: frozenset[Category] = frozenset({
    "oom", "nccl_timeout", "nccl_error", "gpu_hw_fault", "shm_insufficient", "rendezvous_failure",
    "checkpoint_save_failure", "checkpoint_load_failure"})
MAX_READ_BYTES = 8 * 1024 * 1024  # per file per poll: a flood of output is read over several polls
# A line unfinished for this long is judged as it stands: longer than a healthy writer leaves a line half-flushed
# (a block-buffered stdout flushes within a step), short beside the hang watchdog's minutes.
QUIET_S = 5.0
MAX_TITLE_CHARS = 300


def is_fatal(record: Record) -> TypeGuard[ErrorRecord]:
    """Whether a record stops a running job: an error of a fatal category."""
    return isinstance(record, ErrorRecord) and record.category in FATAL_CATEGORIES


class _FatalSink:
    """Where the bulk reader puts one node's records: the first fatal error not reported yet is kept. The summary
    and dialect counts are the reader's working state (it folds iteration lines into them), not read here."""

    def __init__(self) -> None:
        self.summary = SummaryBuilder()
        self.dialects: Counter[str] = Counter()
        self.fatal: ErrorRecord | None = None
        self.reported_through = 0  # the line of the last fatal record reported (a quiet line judged, then ended)

    def add(self, record: Record) -> None:
        if self.fatal is None and is_fatal(record) and record.line > self.reported_through:
            self.fatal = record

    def take(self) -> ErrorRecord | None:
        fatal, self.fatal = self.fatal, None
        if fatal is not None:
            self.reported_through = fatal.line
        return fatal


@dataclass
class _NodeLog:
    """One node's log: where the last poll stopped, and the reader holding its parse state."""

    reader: BulkReader
    sink: _FatalSink
    identity: tuple[int, int]
    grew_at_s: float
    offset: int = 0
    judged_at: int = -1  # the offset at which its unfinished line was last judged

    @classmethod
    def start(cls, path: Path, identity: tuple[int, int], now_s: float, engine: str | None) -> _NodeLog:
        sink = _FatalSink()
        return cls(BulkReader(sink, LineParser(str(path)), engine), sink, identity, now_s)


@dataclass
class FatalWatch:
    """Reads new lines of each node log at every `scan` and returns the first fatal finding."""

    nodes: dict[Path, _NodeLog] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    quiet_s: float = QUIET_S
    engine: str | None = None  # the bulk reader's engine (`megapilot.logs.bulk.choose_engine`); None: the default

    def scan(self, node_logs: list[Path]) -> Finding | None:
        for node, path in enumerate(node_logs):
            fatal = self._read(Path(path))
            if fatal is not None:
                return _finding(fatal, node)
        return None

    def _read(self, path: Path) -> ErrorRecord | None:
        """What the node's log gained since the last poll, through its parser; its next fatal record, if any."""
        now_s = self.clock()
        try:
            stat = path.stat()
        except OSError:  # not written yet
            return None
        identity = (stat.st_dev, stat.st_ino)
        state = self.nodes.get(path)
        if state is None or state.identity != identity or stat.st_size < state.offset:
            state = self.nodes[path] = _NodeLog.start(path, identity, now_s, self.engine)  # new, replaced, truncated
        if stat.st_size > state.offset:
            with path.open("rb") as handle:
                handle.seek(state.offset)
                data = handle.read(min(stat.st_size - state.offset, MAX_READ_BYTES))
            state.offset += len(data)
            state.grew_at_s = now_s
            state.reader.feed(data)
        elif now_s - state.grew_at_s >= self.quiet_s and state.judged_at != state.offset:
            state.judged_at = state.offset
            for record in state.reader.records_if_ended():
                state.sink.add(record)
        return state.sink.take()


def _finding(record: ErrorRecord, node: int) -> Finding:
    """The finding a fatal record stops the job with: its category and line, quoted as `diagnose` quotes it."""
    category, name = record.category, Path(record.file).name
    return Finding(category=category, severity="critical",
                   title=f"{category} ({name} line {record.line}): {record.text.strip()[:MAX_TITLE_CHARS]}",
                   evidence=[Evidence(record.file, record.line, record.text.strip())], cause=EXPLANATIONS[category],
                   node=node, rank=record.rank)


__all__ = ["FATAL_CATEGORIES", "FatalWatch", "is_fatal"]
