"""Following every log of a run until it ends: `RunFollower` polled on a clock, with the stop rules of `--follow`.

`follow_run(paths, on_record=...)` polls all files every `poll_s` and hands each new record (its `file` names the
file) to `on_record` as it arrives. It stops when every file has logged the end of training, after `timeout_s` in
all, or when no file gained a byte for `idle_timeout_s`. A file that does not exist yet is waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from megapilot.logs.collect import ParsedLog
from megapilot.logs.follow import RunFollower
from megapilot.logs.parser import ParseOptions
from megapilot.logs.records import ProgressMarker, Record


def follow_run(
    paths: list[str | Path],
    *,
    options: ParseOptions | None = None,
    on_record: Callable[[Record], None] | None = None,
    poll_s: float = 0.2,
    timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
) -> list[ParsedLog]:
    """Follow the files until a stop rule; each file's summary-only parse, in the order given."""
    finished: set[str] = set()

    def observe(record: Record) -> None:
        if isinstance(record, ProgressMarker) and record.marker == "training_done":
            finished.add(record.file)
        if on_record is not None:
            on_record(record)

    follower = RunFollower(paths, options, on_record=observe)
    started = last_byte = time.monotonic()
    while True:
        now = time.monotonic()
        if follower.poll():
            last_byte = now
        if len(finished) == len(paths) or _past(now, started, timeout_s) or _past(now, last_byte, idle_timeout_s):
            return follower.finish()
        time.sleep(poll_s)


def _past(now: float, since: float, limit_s: float | None) -> bool:
    return limit_s is not None and now - since >= limit_s
