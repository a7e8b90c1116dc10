"""What `diagnose` keeps of a log's records: only what the rules read, bounded whatever the log's size.

The logs are read in bulk (`parse_logs(..., summary_only=True, on_record=kept.add, on_row=kept.add_row)`: the
summary and the error and checkpoint records are bounded by the collector); canonical Megatron-LM iteration lines
arrive as rows (`megapilot.logs.bulk.RowLine`), decided on from their values and built into records only when kept
(when the row cannot tell an anomaly field, at once); `RuleRecords` keeps the rest the rules need:

- iteration records: every one while there are at most `SERIES_CAPACITY`; beyond that an evenly decimated series
  (every `stride`-th record, the stride doubling each time the series fills up), plus, whatever the stride, the
  first `HEAD` records (the first-update jump reads them), the last `TAIL` (evidence, the last step), and every
  anomaly a rule looks for with the record before it (so an interval stays exact): a NaN/Inf, a rising NaN
  counter, a loss that vanished, a loss above `SPIKE_FACTOR` x the median of the last `WINDOW` losses, memory at
  `NEAR_FULL_PCT` or more, a timestamp gap of `HANG_FLOOR_S` or more. Anomalies are kept up to half the capacity
  (the first ones: the rules quote the first few).
- memory reports: all of them up to `MEMORY_CAPACITY`; beyond, each rank's highest (the near-full rule reads the
  highest report over a threshold).
- progress markers: all up to `MARKER_CAPACITY`; beyond, the latest ones and the first end-of-training marker.
- Megatron's `--log-straggler` reports: the latest `STRAGGLER_CAPACITY` (the slowdown rule names the slow rank).

A log within the capacities gives the rules exactly the records a full parse gives. A longer one gives the trend
rules (slowdown, spikes) a decimated series: the Theil-Sen slope samples at most 400 points anyway, and the window
rules see the anomalies they would flag. Memory: ~2 KB per kept record, so ~10 MB at most.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from megapilot.diagnose.rules import NEAR_FULL_PCT, SPIKE_FACTOR, WINDOW
from megapilot.logs.bulk import RowLine
from megapilot.logs.collect import HANG_FLOOR_S, ParsedLog
from megapilot.logs.records import (
    IterationRecord,
    MemoryRecord,
    ProgressMarker,
    Record,
    StragglerReport,
    TheoreticalMemoryRecord,
)

SERIES_CAPACITY = 4096  # ~10 x the 400 points the slowdown rule samples; ~8 MB of records at most
HEAD = 16
TAIL = 16
MEMORY_CAPACITY = 4096
MARKER_CAPACITY = 256
THEORETICAL_CAPACITY = 256  # a few lines per start-up
STRAGGLER_CAPACITY = 256  # the latest `--log-straggler` reports: which rank is slowest now


class _Kept:
    """One iteration in the series: its record, or the bulk-read line that builds it when the series is filled."""

    __slots__ = ("_line", "_record", "ordinal", "protected")

    def __init__(self, ordinal: int, record: IterationRecord | None = None, line: RowLine | None = None) -> None:
        self.ordinal = ordinal
        self.protected = ordinal < HEAD
        self._record = record
        self._line = line

    @property
    def record(self) -> IterationRecord:
        if self._record is None:
            assert self._line is not None, "an entry holds a record or a line"
            self._record, self._line = self._line.record(), None
        return self._record


class RuleRecords:
    """Receives every record of a parse (`add`), keeps a bounded share, and puts it into the parsed log (`fill`)."""

    def __init__(self, capacity: int = SERIES_CAPACITY) -> None:
        self.capacity = capacity
        self.stride = 1
        self.seen = 0
        self._kept: list[_Kept] = []
        self._anomalies = 0
        self._tail: deque[_Kept] = deque(maxlen=TAIL)
        self._previous: _Kept | None = None
        self._previous_time_s: float | None = None  # the previous iteration's timestamp (the gap rule)
        self._recent_losses: deque[float] = deque(maxlen=WINDOW)
        self._highest_iteration = -1
        self._had_loss = False
        self._memory: list[MemoryRecord] = []
        self._memory_seen = 0
        self._memory_peak: dict[tuple[str, int | None], MemoryRecord] = {}
        self._markers: deque[ProgressMarker] = deque(maxlen=MARKER_CAPACITY)
        self._first_done: ProgressMarker | None = None
        self._theoretical: list[TheoreticalMemoryRecord] = []
        self._stragglers: deque[StragglerReport] = deque(maxlen=STRAGGLER_CAPACITY)

    def add(self, record: Record) -> None:
        if isinstance(record, IterationRecord):
            self._iteration(record)
        elif isinstance(record, MemoryRecord):
            self._memory_report(record)
        elif isinstance(record, ProgressMarker):
            if record.marker == "training_done" and self._first_done is None:
                self._first_done = record
            self._markers.append(record)
        elif isinstance(record, TheoreticalMemoryRecord) and len(self._theoretical) < THEORETICAL_CAPACITY:
            self._theoretical.append(record)
        elif isinstance(record, StragglerReport):
            self._stragglers.append(record)

    def fill(self, log: ParsedLog) -> ParsedLog:
        """The kept records, in log order, as the parsed log's record lists."""
        kept = {entry.ordinal: entry for entry in self._kept}
        kept.update((entry.ordinal, entry) for entry in self._tail)
        log.iterations = [kept[ordinal].record for ordinal in sorted(kept)]
        log.memory = self._memory if self._memory_seen <= MEMORY_CAPACITY else list(self._memory_peak.values())
        markers = list(self._markers)
        if self._first_done is not None and self._first_done not in markers:
            markers.insert(0, self._first_done)
        log.markers = markers
        log.theoretical_memory = self._theoretical
        log.straggler_reports = list(self._stragglers)
        return log

    # ---- iterations ---------------------------------------------------------------------------------
    def add_row(self, line: RowLine) -> None:
        """A canonical iteration line read in bulk: kept or not on the row's values as `add` decides on the record's
        (the same fields), the record built only for what `fill` returns; a line the row cannot tell is built now."""
        if not line.plain:
            self._iteration(line.record())
            return
        # a plain line's loss is finite or None: no NaN/Inf, no memory usage (`RowLine`)
        anomaly = self._is_anomaly(line.iteration, line.loss, False, line.nan_iterations, None,
                                   line.time_s)
        self._step(_Kept(self.seen, line=line), anomaly)

    def _iteration(self, record: IterationRecord) -> None:
        anomaly = self._is_anomaly(record.iteration, record.lm_loss, record.has_nonfinite, record.nan_iterations,
                                   record.memory_usage_pct, record.time_s)
        self._step(_Kept(self.seen, record=record), anomaly)

    def _step(self, entry: _Kept, anomaly: bool) -> None:
        self.seen += 1
        if anomaly and self._anomalies < self.capacity // 2:
            self._anomalies += 1
            entry.protected = True
            self._keep_previous()
        if entry.protected or entry.ordinal % self.stride == 0:
            self._kept.append(entry)
            if len(self._kept) > self.capacity:
                self._decimate()
        self._tail.append(entry)
        self._previous = entry

    def _keep_previous(self) -> None:
        """The record before an anomaly, so that the interval the rule computes is the real one."""
        previous = self._previous
        if previous is None:
            return
        previous.protected = True
        if not self._kept or self._kept[-1].ordinal != previous.ordinal:
            self._kept.append(previous)

    def _decimate(self) -> None:
        self.stride *= 2
        self._kept = [entry for entry in self._kept if entry.protected or entry.ordinal % self.stride == 0]

    def _is_anomaly(self, iteration: int, loss: float | None, nonfinite: bool, nan_iterations: int | None,
                    memory_usage_pct: float | None, time_s: float | None) -> bool:
        """Whether a rule would flag this iteration (its record's fields, or the same values read off its row)."""
        previous_time_s, self._previous_time_s = self._previous_time_s, time_s
        anomaly = (nonfinite or bool(nan_iterations)
                   or (self._had_loss and loss is None)
                   or (memory_usage_pct is not None and memory_usage_pct >= NEAR_FULL_PCT)
                   or (previous_time_s is not None and time_s is not None
                       and time_s - previous_time_s >= HANG_FLOOR_S))
        if iteration > self._highest_iteration and loss is not None and math.isfinite(loss):
            self._highest_iteration = iteration  # the loss rules read one record per iteration number
            recent = self._recent_losses
            # the median is at least the minimum: a loss within SPIKE_FACTOR x the minimum is no spike (cheap test)
            anomaly = anomaly or (len(recent) == WINDOW and loss > SPIKE_FACTOR * min(recent)
                                  and loss > SPIKE_FACTOR * statistics.median(recent))
            recent.append(loss)
        self._had_loss = self._had_loss or loss is not None
        return anomaly

    # ---- memory reports -----------------------------------------------------------------------------
    def _memory_report(self, record: MemoryRecord) -> None:
        key = (record.file, record.rank)
        best = self._memory_peak.get(key)
        if best is None or (record.peak_gib or 0.0) > (best.peak_gib or 0.0):
            self._memory_peak[key] = record
        self._memory_seen += 1
        if self._memory_seen <= MEMORY_CAPACITY:
            self._memory.append(record)
