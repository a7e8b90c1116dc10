"""What `diagnose` keeps of a log's records: only what the rules read, bounded whatever the log's size.

The parser streams records (`parse_logs(..., summary_only=True, on_record=kept.add)`: the summary and the error and
checkpoint records are bounded by the collector); `RuleRecords` keeps the rest the rules need:

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

A log within the capacities gives the rules exactly the records a full parse gives. A longer one gives the trend
rules (slowdown, spikes) a decimated series: the Theil-Sen slope samples at most 400 points anyway, and the window
rules see the anomalies they would flag. Memory: ~2 KB per kept record, so ~10 MB at most.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from megapilot.diagnose.rules import NEAR_FULL_PCT, SPIKE_FACTOR, WINDOW
from megapilot.logs.collect import HANG_FLOOR_S, ParsedLog
from megapilot.logs.records import IterationRecord, MemoryRecord, ProgressMarker, Record, TheoreticalMemoryRecord

SERIES_CAPACITY = 4096  # ~10 x the 400 points the slowdown rule samples; ~8 MB of records at most
HEAD = 16
TAIL = 16
MEMORY_CAPACITY = 4096
MARKER_CAPACITY = 256
THEORETICAL_CAPACITY = 256  # a few lines per start-up


@dataclass
class _Kept:
    ordinal: int
    record: IterationRecord
    protected: bool


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
        self._recent_losses: deque[float] = deque(maxlen=WINDOW)
        self._highest_iteration = -1
        self._had_loss = False
        self._memory: list[MemoryRecord] = []
        self._memory_seen = 0
        self._memory_peak: dict[tuple[str, int | None], MemoryRecord] = {}
        self._markers: deque[ProgressMarker] = deque(maxlen=MARKER_CAPACITY)
        self._first_done: ProgressMarker | None = None
        self._theoretical: list[TheoreticalMemoryRecord] = []

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
        return log

    # ---- iterations ---------------------------------------------------------------------------------
    def _iteration(self, record: IterationRecord) -> None:
        entry = _Kept(self.seen, record, protected=self.seen < HEAD)
        self.seen += 1
        if self._is_anomaly(record) and self._anomalies < self.capacity // 2:
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

    def _is_anomaly(self, record: IterationRecord) -> bool:
        previous = self._previous.record if self._previous is not None else None
        loss = record.lm_loss
        anomaly = (record.has_nonfinite or bool(record.nan_iterations)
                   or (self._had_loss and loss is None)
                   or (record.memory_usage_pct is not None and record.memory_usage_pct >= NEAR_FULL_PCT)
                   or _gap_s(previous, record) >= HANG_FLOOR_S)
        if record.iteration > self._highest_iteration and loss is not None and math.isfinite(loss):
            self._highest_iteration = record.iteration  # the loss rules read one record per iteration number
            recent = self._recent_losses
            anomaly = anomaly or (len(recent) == WINDOW and loss > SPIKE_FACTOR * statistics.median(recent))
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


def _gap_s(before: IterationRecord | None, after: IterationRecord) -> float:
    if before is None or before.time_s is None or after.time_s is None:
        return 0.0
    return after.time_s - before.time_s
