"""Following every log of a run until it ends: `RunFollower` polled on a clock, with the stop rules of `--follow`.

`follow_run(paths, on_record=...)` polls all files every `poll_s` and hands each new record (its `file` names the
file) to `on_record` as it arrives. It stops when every file has logged the end of training, after `timeout_s` in
all, or when no file gained a byte for `idle_timeout_s`. A file that does not exist yet is waited for.

While following, the run is watched on the wall clock as `follow_log` watches one file: when no file has logged an
iteration for `hang_factor` x the median step time so far (at least `hang_floor_s`), `on_hang(silent_s, last)` is
called once with the last iteration seen (in a synchronous run every rank stops together, so one clock serves all
files); a new iteration re-arms it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.logs.collect import HANG_FACTOR, HANG_FLOOR_S, ParsedLog
from megapilot.logs.follow import RunFollower
from megapilot.logs.parser import ParseOptions
from megapilot.logs.records import IterationRecord, ProgressMarker, Record

RECENT_STEPS = 64  # the median step time is taken over the latest steps: a bounded window, whatever the run's length


@dataclass
class _Watch:
    """What the follower remembers across polls: files that finished, the last iteration and when it came."""

    finished: set[str] = field(default_factory=set)
    last: IterationRecord | None = None
    last_wall_s: float = 0.0
    steps_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    hang_reported: bool = False

    def hang_limit_s(self, factor: float, floor_s: float) -> float:
        typical_s = statistics.median(self.steps_ms) / 1000.0 if self.steps_ms else 0.0
        return max(floor_s, factor * typical_s)


def follow_run(
    paths: list[str | Path],
    *,
    options: ParseOptions | None = None,
    on_record: Callable[[Record], None] | None = None,
    on_hang: Callable[[float, IterationRecord], None] | None = None,
    poll_s: float = 0.2,
    timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
    hang_factor: float = HANG_FACTOR,
    hang_floor_s: float = HANG_FLOOR_S,
) -> list[ParsedLog]:
    """Follow the files until a stop rule; each file's summary-only parse, in the order given."""
    watch = _Watch()

    def observe(record: Record) -> None:
        if isinstance(record, ProgressMarker) and record.marker == "training_done":
            watch.finished.add(record.file)
        if isinstance(record, IterationRecord):
            watch.last, watch.last_wall_s, watch.hang_reported = record, time.monotonic(), False
            if record.elapsed_ms:
                watch.steps_ms.append(record.elapsed_ms)
        if on_record is not None:
            on_record(record)

    follower = RunFollower(paths, options, on_record=observe)
    started = last_byte = time.monotonic()
    while True:
        now = time.monotonic()
        if follower.poll():
            last_byte = now
        if len(watch.finished) == len(paths) or _past(now, started, timeout_s) or _past(now, last_byte, idle_timeout_s):
            return follower.finish()
        silent_s = now - watch.last_wall_s
        if watch.last is not None and not watch.hang_reported and silent_s >= watch.hang_limit_s(hang_factor,
                                                                                                 hang_floor_s):
            watch.hang_reported = True
            if on_hang is not None:
                on_hang(silent_s, watch.last)
        time.sleep(poll_s)


def _past(now: float, since: float, limit_s: float | None) -> bool:
    return limit_s is not None and now - since >= limit_s
