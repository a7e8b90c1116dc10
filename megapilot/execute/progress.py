"""Progress, completion and hang detection from a training log, one line at a time.

The executors read each job's log as it grows and feed every line to a `ProgressTracker`. The
tracker knows three things: how far training got (the last iteration line), whether that is the
end (the final iteration), and when silence has lasted long enough to call the job hung.

Lines are read by the streaming parser of `megapilot.logs` (every dialect it knows: Megatron-LM,
Megatron-Bridge, Primus; with or without a launcher's rank prefix such as torchrun's
`[default1]:`), so progress here and `megapilot logs parse` never disagree about a line.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from megapilot.execute.base import HangPolicy
from megapilot.logs import CheckpointEvent, IterationRecord, LineParser
from megapilot.logs.records import Record

# How many recent gaps between iteration lines the hang window looks back over.
_RECENT_GAPS = 8


@dataclass(frozen=True)
class IterationMark:
    """The progress facts of one iteration line."""

    iteration: int
    train_iters: int
    step_time_ms: float | None


def parse_iteration_line(line: str) -> IterationMark | None:
    """The iteration and total of one iteration line, or None for any other line."""
    for record in LineParser("line").feed(1, line):
        if isinstance(record, IterationRecord):
            return _mark_of(record)
    return None


def _mark_of(record: IterationRecord) -> IterationMark | None:
    if record.train_iters is None:  # torchtitan-style `step: N` lines print no total
        return IterationMark(record.iteration, 0, record.elapsed_ms) if record.iteration else None
    return IterationMark(record.iteration, record.train_iters, record.elapsed_ms)


def position_text(iteration: int | None, train_iters: int | None) -> str:
    """Where a stopped job had got to, for its reason: `at iteration 7/200`, or `before its first iteration (of
    200)` when no iteration line was read (not `iteration None/200`)."""
    if iteration is None:
        return "before its first iteration" + (f" (of {train_iters})" if train_iters else "")
    return f"at iteration {iteration}/{train_iters if train_iters else '?'}"


class ProgressTracker:
    """Follows one job's log: last iteration, observed step time, completion, hang deadline.

    Times are seconds on one monotonic clock chosen by the caller (`time.monotonic()` in the
    executors; plain numbers in tests).
    """

    def __init__(self, policy: HangPolicy, started_at_s: float, train_iters: int | None = None,
                 source: str = "training.log"):
        self.policy = policy
        self._parser = LineParser(source)
        self._line_no = 0
        self.started_at_s = started_at_s
        self.expected_train_iters = train_iters
        self.iteration: int | None = None
        self.printed_train_iters: int | None = None
        self.reported_step_time_ms: float | None = None
        self.loss: float | None = None  # the last logged training loss, for a progress display
        self.log_interval: int | None = None
        self.last_iteration_at_s: float | None = None
        self._gaps_s: deque[float] = deque(maxlen=_RECENT_GAPS)
        self._step_times_s: deque[float] = deque(maxlen=_RECENT_GAPS)
        self._checkpoint_until_s: float | None = None

    # -- feeding ------------------------------------------------------------------------------

    def feed(self, line: str, now_s: float) -> tuple[Record, ...]:
        """Take one log line seen at `now_s`; return the log records parsed from it."""
        self._line_no += 1
        records = self._parser.feed(self._line_no, line)
        for record in records:
            if isinstance(record, CheckpointEvent) and record.kind == "save" and record.phase == "start":
                self._checkpoint_until_s = now_s + self.policy.checkpoint_allowance_s
            elif isinstance(record, IterationRecord) and (mark := _mark_of(record)) is not None:
                self._advance(mark, now_s)
                self.loss = record.lm_loss if record.lm_loss is not None else self.loss
        return records

    def _advance(self, mark: IterationMark, now_s: float) -> None:
        if self.iteration is not None and mark.iteration > self.iteration:
            advanced = mark.iteration - self.iteration
            gap_s = now_s - (self.last_iteration_at_s or now_s)
            self.log_interval = advanced
            self._gaps_s.append(gap_s)
            self._step_times_s.append(gap_s / advanced)
        if self.iteration is None or mark.iteration != self.iteration:
            self.last_iteration_at_s = now_s
            self._checkpoint_until_s = None
        self.iteration = mark.iteration
        self.printed_train_iters = mark.train_iters or None
        self.reported_step_time_ms = mark.step_time_ms

    # -- what it knows ------------------------------------------------------------------------

    @property
    def train_iters(self) -> int | None:
        """The final iteration: the job spec's if given, else the one the log prints."""
        return self.expected_train_iters or self.printed_train_iters

    @property
    def step_time_s(self) -> float | None:
        """Seconds per iteration: the one the log reports (the trainer's own clock), else observed.

        Observed times come from when lines were read, which an executor does in batches, so
        they are only as precise as its polling; the reported one is exact.
        """
        if self.reported_step_time_ms is not None:
            return self.reported_step_time_ms / 1000.0
        if self._step_times_s:
            return self._step_times_s[-1]
        return None

    def reached_final_iteration(self) -> bool:
        """True once the final iteration was logged.

        Megatron logs only every `log_interval` iterations, so when train_iters is not a multiple
        of it the last line falls short of train_iters; the run counts as finished when the next
        line would have been past the end (interval inferred from the last two lines).
        """
        if self.iteration is None or self.train_iters is None:
            return False
        if self.iteration >= self.train_iters:
            return True
        return self.log_interval is not None and self.iteration + self.log_interval > self.train_iters

    def hang_window_s(self) -> float:
        """Seconds of silence allowed after the last iteration line (see HangPolicy)."""
        if self.policy.fixed_window_s is not None:
            return self.policy.fixed_window_s
        interval_s = self._interval_estimate_s()
        if interval_s is None:
            return self.policy.startup_s
        return max(self.policy.min_window_s, self.policy.factor * interval_s)

    def hang_deadline_s(self) -> float:
        """The clock time after which, without a new iteration line, the job is hung."""
        if self.last_iteration_at_s is None:
            deadline = self.started_at_s + self.policy.startup_s
        else:
            deadline = self.last_iteration_at_s + self.hang_window_s()
        if self._checkpoint_until_s is not None:
            deadline = max(deadline, self._checkpoint_until_s)
        return deadline

    def hang_reason(self, now_s: float) -> str | None:
        """Why the job counts as hung at `now_s`, or None while it is within its window."""
        if now_s < self.hang_deadline_s():
            return None
        if self.last_iteration_at_s is None:
            return (f"no iteration line within the start-up allowance of {self.policy.startup_s:.0f} s "
                    f"(raise it with the hang policy's startup_s / --startup-timeout-s)")
        silent_s = now_s - self.last_iteration_at_s
        rule = (f"fixed window {self.policy.fixed_window_s:.0f} s" if self.policy.fixed_window_s is not None
                else f"{self.policy.factor:g} x the observed {self._interval_estimate_s() or 0:.2f} s "
                     f"between iteration lines, at least {self.policy.min_window_s:.0f} s")
        return (f"hung: no new iteration for {silent_s:.1f} s after iteration {self.iteration}/"
                f"{self.train_iters} ({rule})")

    def _interval_estimate_s(self) -> float | None:
        """Seconds between iteration lines, erring long: the largest recent observed gap, or the
        reported step time x the log interval if that is longer (lines read in batches make some
        observed gaps look short)."""
        reported_s = None
        if self.reported_step_time_ms is not None and self.iteration is not None:
            # With one line only, assume the interval so far (the first line at iteration = log interval).
            lines_apart = self.log_interval or max(1, self.iteration)
            reported_s = self.reported_step_time_ms / 1000.0 * lines_apart
        candidates = [gap for gap in (max(self._gaps_s, default=None), reported_s) if gap is not None]
        return max(candidates) if candidates else None
