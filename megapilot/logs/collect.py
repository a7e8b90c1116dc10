"""Reading whole logs: files, stdin, growing files → one `ParsedLog`.

`parse_logs(paths)` is the library entry point (`-` means stdin). With `summary_only=True` no
per-record list is kept (records still stream through `on_record` if given), so memory stays flat
whatever the log size; errors and checkpoint operations are kept but bounded. Summary-only without
`on_record` reads in bulk (`megapilot.logs.bulk`: regexes over byte blocks, the same result as
feeding every line to the line parser, which every other mode does). Summary-only with `on_row` reads in bulk
too: canonical iteration lines reach `on_row` as `RowLine`s (a record built only on demand), every other record
`on_record`. Summary-only with `on_timer` (no `on_record`, or with `on_row`) reads in bulk as well: the timer lines are
then parsed for it (the compiled engine skips them otherwise).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from megapilot.logs.bulk import RecordSink, RowHook, SourceEnd, read_bulk
from megapilot.logs.framework import UNKNOWN_FRAMEWORK, Framework, detect_framework
from megapilot.logs.lines import BinaryTally, LineWindow, follow_lines, read_lines, split_carriage_returns
from megapilot.logs.parser import LineParser, ParseOptions
from megapilot.logs.record_reader import RecordReader
from megapilot.logs.records import (
    DIALECTS,
    UNKNOWN_DIALECT,
    ArgumentsRecord,
    CheckpointEvent,
    CheckpointOp,
    ErrorRecord,
    Evidence,
    IterationRecord,
    MemoryRecord,
    ProgressMarker,
    RankTimes,
    Record,
    StragglerReport,
    TheoreticalMemoryRecord,
    TimerRecord,
)
from megapilot.logs.sources import open_log, shown_name
from megapilot.logs.summary import RunSummary, SummaryBuilder

MAX_KEPT_ERRORS = 2000  # a crash on 1000 ranks prints the same line 1000 times; the first 2000 are evidence enough
MAX_KEPT_CHECKPOINTS = 1000
HANG_FACTOR = 10.0  # no progress for this many times the typical step time is a hang
HANG_FLOOR_S = 120.0  # ... and never less than this (start-up, evaluation and saves are slow)


@dataclass(frozen=True)
class BinarySkipped:
    """Binary data a file held (a crash's NUL padding, garbage) that was cut out of its lines, the text around it
    read: bytes in all and the first stretches as (first line, last line, bytes)."""

    file: str
    bytes_skipped: int
    runs: list[tuple[int, int, int, int]]

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes_skipped,
                "runs": [{"first_line": a, "last_line": b, "bytes": n, "offset": offset}
                         for a, b, n, offset in self.runs]}

    def describe(self) -> str:
        """`skipped 20 KB of binary data on lines 120-121, 300 at byte offsets 81920, 120000` (each stretch's first
        byte, counted from 0, as `dd skip=` and `xxd -s` take it)."""
        where = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b, _, _ in self.runs)
        lines = "lines" if "," in where or "-" in where else "line"
        offsets = ", ".join(str(offset) for _, _, _, offset in self.runs)
        at = "at byte offsets" if len(self.runs) > 1 else "at byte offset"
        return f"skipped {_size_text(self.bytes_skipped)} of binary data on {lines} {where} {at} {offsets}"


def _size_text(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.0f} {unit}" if size / scale >= 10 else f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


@dataclass
class ParsedLog:
    """Everything parsed from one or more log files of one run."""

    files: list[str]
    dialect: str = UNKNOWN_DIALECT
    dialect_counts: dict[str, int] = field(default_factory=dict)
    iterations: list[IterationRecord] = field(default_factory=list)
    memory: list[MemoryRecord] = field(default_factory=list)
    theoretical_memory: list[TheoreticalMemoryRecord] = field(default_factory=list)
    timers: list[TimerRecord] = field(default_factory=list)
    checkpoints: list[CheckpointOp] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    markers: list[ProgressMarker] = field(default_factory=list)
    summary: RunSummary | None = None
    lines_read: int = 0
    last_line: Evidence | None = None
    last_time_s: float | None = None
    errors_dropped: int = 0
    arguments: ArgumentsRecord | None = None  # the latest Megatron-LM `arguments` block read
    framework: Framework = UNKNOWN_FRAMEWORK  # who wrote the log (see `megapilot.logs.framework`)
    # Traceback frames and logger prefixes per framework or platform seen (`LineParser.framework_hints`); not in
    # the JSON schema: `framework` is what a user reads, these are its evidence.
    frame_hints: dict[str, int] = field(default_factory=dict)
    binary_skipped: list[BinarySkipped] = field(default_factory=list)  # per file with binary runs cut out
    # Per-rank timings (megapilot.logs.stragglers): the straggler verdict's input; not in the JSON schema yet.
    rank_times: list[RankTimes] = field(default_factory=list)
    straggler_reports: list[StragglerReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The stable `--json` schema of `megapilot logs parse`."""
        return {
            "dialect": self.dialect,
            "framework": self.framework,
            "files": self.files,
            "dialect_counts": self.dialect_counts,
            "lines_read": self.lines_read,
            "iterations": [r.to_dict() for r in self.iterations],
            "memory": [r.to_dict() for r in self.memory],
            "theoretical_memory": [r.to_dict() for r in self.theoretical_memory],
            "timers": [r.to_dict() for r in self.timers],
            "checkpoints": [r.to_dict() for r in self.checkpoints],
            "errors": [r.to_dict() for r in self.errors],
            "markers": [r.to_dict() for r in self.markers],
            "summary": self.summary.to_dict() if self.summary else None,
            "arguments": self.arguments.to_dict() if self.arguments else None,
            "binary_skipped": [skipped.to_dict() for skipped in self.binary_skipped],
        }


class LogCollector:
    """Accumulates records from any number of sources into a `ParsedLog`."""

    def __init__(self, *, summary_only: bool = False) -> None:
        self.summary_only = summary_only
        self.log = ParsedLog(files=[])
        self.dialects: Counter[str] = Counter()
        self.summary = SummaryBuilder()
        self._open_ops: dict[str, CheckpointEvent] = {}  # the start line of a save/load not finished yet, by kind
        self._frame_hints: Counter[str] = Counter()
        self.last_progress_time_s: float | None = None
        self.last_progress_wall_s: float | None = None

    def add(self, record: Record) -> None:
        if isinstance(record, IterationRecord):
            self.dialects[record.dialect] += 1
            self.summary.add(record)
            self.last_progress_time_s = record.time_s or self.last_progress_time_s
            self.last_progress_wall_s = time.monotonic()
            if not self.summary_only:
                self.log.iterations.append(record)
        elif isinstance(record, ErrorRecord):
            self.add_error(record)
        elif isinstance(record, CheckpointEvent):
            self._checkpoint(record)
        elif isinstance(record, TimerRecord):
            self._timer(record)
        elif isinstance(record, ArgumentsRecord):
            self.log.arguments = record  # kept in summary-only mode too: one small record per start-up
        elif self.summary_only:
            return
        elif isinstance(record, MemoryRecord):
            self.log.memory.append(record)
        elif isinstance(record, TheoreticalMemoryRecord):
            self.log.theoretical_memory.append(record)
        elif isinstance(record, ProgressMarker):
            self.log.markers.append(record)
        elif isinstance(record, RankTimes):
            self.log.rank_times.append(record)
        elif isinstance(record, StragglerReport):
            reports = self.log.straggler_reports
            if reports and reports[-1].evidence == record.evidence:
                reports[-1] = record  # amended by its `Bottom N` line
            else:
                reports.append(record)

    def end_source(self, end: SourceEnd) -> None:
        """A source was read to its end: count its lines, keep its last line and the run's latest timestamp."""
        self.log.lines_read += end.lines_read
        if end.last_line is not None:
            self.log.last_line = end.last_line
        if end.last_time_s is not None:
            self.log.last_time_s = max(self.log.last_time_s or end.last_time_s, end.last_time_s)
        self._frame_hints.update(end.framework_hints)
        if end.binary is not None and end.binary.bytes_skipped:
            self.log.binary_skipped.append(BinarySkipped(shown_name(self.log.files[-1]) if self.log.files else "",
                                                         end.binary.bytes_skipped, list(end.binary.runs)))

    def add_error(self, record: ErrorRecord) -> None:
        if len(self.log.errors) < MAX_KEPT_ERRORS:
            self.log.errors.append(record)
        else:
            self.log.errors_dropped += 1

    def _checkpoint(self, event: CheckpointEvent) -> None:
        evidence = Evidence(event.file, event.line, event.text)
        if event.phase == "not_found":
            return  # a fresh start, not an operation
        if event.phase == "start":
            if event.kind == "save":
                self.summary.checkpoint_save_started()
            self._finish_open(event.kind)
            self._open_ops[event.kind] = event
            return
        started = self._open_ops.pop(event.kind, None)
        duration = None
        if started is not None and started.time_s is not None and event.time_s is not None:
            duration = max(0.0, event.time_s - started.time_s)
        self._keep_op(CheckpointOp(
            kind=event.kind,
            iteration=event.iteration if event.iteration is not None or started is None else started.iteration,
            path=event.path or (started.path if started is not None else None), completed=True, duration_s=duration,
            duration_source="timestamps" if duration is not None else None,
            evidence=([_evidence_of(started)] if started is not None else []) + [evidence],
            started_s=started.time_s if started is not None else None,
        ))

    def _timer(self, timer: TimerRecord) -> None:
        if not self.summary_only:
            self.log.timers.append(timer)
        kind = {"save-checkpoint": "save", "load-checkpoint": "load"}.get(timer.name)
        if kind is None or not self.log.checkpoints:
            return
        last = self.log.checkpoints[-1]
        if last.kind == kind and last.duration_s is None:
            self.log.checkpoints[-1] = CheckpointOp(
                kind=last.kind, iteration=last.iteration, path=last.path, completed=last.completed,
                duration_s=timer.max_ms / 1000.0, duration_source="timer",
                evidence=last.evidence + [Evidence(timer.file, timer.line, timer.text)], started_s=last.started_s,
            )

    def _finish_open(self, kind: str) -> None:
        started = self._open_ops.pop(kind, None)
        if started is not None:
            self._keep_op(CheckpointOp(kind=started.kind, iteration=started.iteration, path=started.path,
                                       completed=False, duration_s=None, duration_source=None,
                                       evidence=[_evidence_of(started)], started_s=started.time_s))

    def _keep_op(self, op: CheckpointOp) -> None:
        if len(self.log.checkpoints) < MAX_KEPT_CHECKPOINTS:
            self.log.checkpoints.append(op)

    def finish(self) -> ParsedLog:
        for kind in list(self._open_ops):
            self._finish_open(kind)
        self.log.summary = self.summary.result()
        self.log.dialect_counts = dict(self.dialects)
        self.log.dialect = _file_dialect(self.dialects)
        self.log.framework = detect_framework(self.log.dialect, self._frame_hints, self.dialects)
        self.log.frame_hints = dict(self._frame_hints)
        return self.log


def _evidence_of(event: CheckpointEvent) -> Evidence:
    return Evidence(event.file, event.line, event.text)


def _file_dialect(counts: Counter[str]) -> str:
    """The dialect of most iteration lines; a tie goes to the more specific dialect."""
    if not counts:
        return UNKNOWN_DIALECT
    specificity = {name: len(DIALECTS) - i for i, name in enumerate(DIALECTS)}
    return max(counts, key=lambda name: (counts[name], -specificity.get(name, 0)))


def _feed(collector: LogCollector, parser: LineParser, lines: Iterable[tuple[int, str]],
          on_record: Callable[[Record], None] | None, binary: BinaryTally | None = None) -> None:
    """The line path: every line through the parser (`RecordReader`, as a follower reads a growing file);
    `binary`: what the lines' reader cut out of them."""
    reader = RecordReader(collector, parser, on_record)
    reader.read_lines(lines)
    end = reader.end()
    collector.end_source(end if binary is None else dataclasses.replace(end, binary=binary))


def _open_source(path: str, binary: BinaryTally | None = None,
                 window: tuple[int, int | None] | None = None) -> Iterator[tuple[int, str]]:
    with open_log(path) as stream:
        yield from read_lines(_windowed(stream, window), tally=binary)


def _windowed(stream: BinaryIO, window: tuple[int, int | None] | None) -> BinaryIO:
    """The stream, or only its lines `window` (the others read as empty lines, see `LineWindow`)."""
    return stream if window is None else cast(BinaryIO, LineWindow(stream, *window))


def parse_logs(
    paths: Iterable[str | Path],
    *,
    options: ParseOptions | None = None,
    summary_only: bool = False,
    on_record: Callable[[Record], None] | None = None,
    on_row: RowHook | None = None,
    on_timer: Callable[[TimerRecord], None] | None = None,
    windows: Mapping[str, tuple[int, int | None]] | None = None,
) -> ParsedLog:
    """Parse log files (or `-` for stdin) of one run into one `ParsedLog`.

    `on_record` gets every record built. `on_row` (summary-only): read in bulk, each canonical Megatron-LM
    iteration line reaches `on_row` as a `RowLine` (no record built unless asked), in log order among the records
    `on_record` gets; without `summary_only` every iteration line is a record for `on_record`. `on_timer` gets each
    of Megatron's timer records (summary-only: still read in bulk, the timer lines parsed, not skipped). `windows`:
    of the files it names, only the lines (first, last or None: to the end) are read (one run's part of a file that
    holds several), each keeping its number."""
    collector = LogCollector(summary_only=summary_only)
    for path in paths:
        name = str(path)
        collector.log.files.append(name)
        # rank 0 prints the arguments, the last rank the iterations: a block read from an earlier file serves later ones
        parser = LineParser(shown_name(name), options, collector.log.arguments)
        if summary_only and (on_record is None or on_row is not None):
            sink: RecordSink = collector if on_record is None and on_timer is None else \
                _ForwardingSink(collector, on_record, on_timer)
            with open_log(name) as stream:
                collector.end_source(read_bulk(sink, parser, _windowed(stream, (windows or {}).get(name)),
                                               on_row=on_row, keep_timers=on_timer is not None))
        else:
            binary = BinaryTally()
            _feed(collector, parser, _open_source(name, binary, (windows or {}).get(name)),
                  _with_timers(on_record, on_timer), binary)
    return collector.finish()


def _with_timers(on_record: Callable[[Record], None] | None,
                 on_timer: Callable[[TimerRecord], None] | None) -> Callable[[Record], None] | None:
    """`on_record`, each timer record also handed to `on_timer`."""
    if on_timer is None:
        return on_record

    def forward(record: Record) -> None:
        if on_record is not None:
            on_record(record)
        if isinstance(record, TimerRecord):
            on_timer(record)

    return forward


class _ForwardingSink:
    """The collector as a bulk reader's sink, each record also handed to `on_record` and each timer to `on_timer`."""

    def __init__(self, collector: LogCollector, on_record: Callable[[Record], None] | None,
                 on_timer: Callable[[TimerRecord], None] | None = None) -> None:
        self.summary = collector.summary
        self.dialects = collector.dialects
        self._collect = collector.add
        self._on_record = _with_timers(on_record, on_timer)

    def add(self, record: Record) -> None:
        self._collect(record)
        if self._on_record is not None:
            self._on_record(record)


def parse_text(text: str, *, file: str = "<text>", options: ParseOptions | None = None) -> ParsedLog:
    """Parse a log held in a string (tests, pasted excerpts): its lines are taken whole, a last one without a newline
    too (a file's is read as cut mid-write: `lines.cut_line`)."""
    collector = LogCollector()
    collector.log.files.append(file)
    texts = text.split("\n")
    if texts[-1] == "":
        texts.pop()  # a final newline ends the last line, it starts no other (as when the text is read from a file)
    lines = ((i + 1, line) for i, line in enumerate(texts))
    _feed(collector, LineParser(file, options), split_carriage_returns(lines), None)
    return collector.finish()


def follow_log(
    path: str | Path,
    *,
    options: ParseOptions | None = None,
    summary_only: bool = False,
    poll_s: float = 0.2,
    idle_timeout_s: float | None = None,
    timeout_s: float | None = None,
    stop_when_done: bool = True,
    should_stop: Callable[[], bool] | None = None,
    on_record: Callable[[Record], None] | None = None,
    hang_factor: float = HANG_FACTOR,
    hang_floor_s: float = HANG_FLOOR_S,
) -> ParsedLog:
    """Parse a growing log until training ends, a stop condition, or a timeout.

    While waiting for new lines it watches the wall clock: when no iteration has been logged for
    `hang_factor` x the median step time so far (at least `hang_floor_s`), it records one `hang`
    error (signature `no_progress_wall_clock`) with the last iteration line as evidence and passes it
    to `on_record`; following goes on until a stop condition.
    """
    name = str(path)
    collector = LogCollector(summary_only=summary_only)
    collector.log.files.append(name)
    parser = LineParser(name, options)
    state = _FollowState()

    def observe(record: Record) -> None:
        if isinstance(record, ProgressMarker) and record.marker == "training_done":
            state.done = True
        if isinstance(record, IterationRecord):
            state.last_iteration = record
            state.hang_reported = False
        if on_record is not None:
            on_record(record)

    def stop() -> bool:
        return (stop_when_done and state.done) or (should_stop is not None and should_stop())

    def on_idle(_idle_s: float) -> None:
        hang = _wall_clock_hang(collector, state, hang_factor, hang_floor_s)
        if hang is not None:
            state.hang_reported = True
            collector.add_error(hang)
            if on_record is not None:
                on_record(hang)

    lines = follow_lines(Path(name), poll_s=poll_s, idle_timeout_s=idle_timeout_s, timeout_s=timeout_s,
                         should_stop=stop, on_idle=on_idle)
    _feed(collector, parser, lines, observe)
    return collector.finish()


@dataclass
class _FollowState:
    """What `follow_log` remembers between lines: training done, the last iteration, a hang already reported."""

    done: bool = False
    hang_reported: bool = False
    last_iteration: IterationRecord | None = None


def _wall_clock_hang(collector: LogCollector, state: _FollowState, factor: float, floor_s: float) -> ErrorRecord | None:
    last = state.last_iteration
    if last is None or state.hang_reported or collector.last_progress_wall_s is None:
        return None
    typical_ms = collector.summary.result().step_time_p50_ms or last.elapsed_ms
    limit_s = max(floor_s, factor * (typical_ms or 0.0) / 1000.0)
    silent_s = time.monotonic() - collector.last_progress_wall_s
    if silent_s < limit_s:
        return None
    return ErrorRecord(
        file=last.file, line=last.line, text=last.text, category="hang", signature="no_progress_wall_clock",
        rank=last.rank, details={"silent_s": f"{silent_s:.1f}", "limit_s": f"{limit_s:.1f}",
                                 "last_iteration": str(last.iteration)},
    )
