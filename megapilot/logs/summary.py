"""Steady-state summary of a run, computed in O(1) memory.

THE RULE (one rule, the same for every dialect):
1. Count each iteration number once: a record is counted only if its iteration number is higher
   than every iteration already counted (other ranks' copies and replays after a resume are skipped).
2. Only records that carry a step time count for step-time statistics.
3. Drop the warm-up: the first max(1, ceil(10 % of the counted records)) records, at most
   `WARMUP_CAP` of them (bounded, so a summary never needs to keep more than `WARMUP_CAP` records).
   If that would leave nothing, no record is dropped (a 1-iteration log still has a step time).
4. Drop any record whose log interval contains a checkpoint save (the first record after a save
   starts), because the save time can land in its step time.
Over what is left: mean, p50, p95 (linear interpolation; exact up to `RESERVOIR_SIZE` samples, a
seeded uniform reservoir beyond), CV = population std / mean of step time; mean tokens/s/GPU,
TFLOP/s/GPU and MFU of the same records, each weighted by its step time (the run's tokens over its time; the
plain mean of per-step rates would overstate a run that slows down). Losses (final, min, first) use every counted
record whose interval had no NaN iteration.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from megapilot.logs.records import IterationRecord, _json_number

WARMUP_FRACTION = 0.10
WARMUP_CAP = 50
RESERVOIR_SIZE = 8192


class _Running:
    """Welford mean/variance plus a bounded reservoir for percentiles."""

    def __init__(self, seed: int = 0) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf
        self._reservoir: list[float] = []
        self._random = random.Random(seed)
        self._weight = 0.0
        self._next_replace = 0

    def add(self, value: float) -> None:
        count = self.count = self.count + 1
        delta = value - self.mean
        self.mean += delta / count
        self._m2 += delta * (value - self.mean)
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        if count < RESERVOIR_SIZE:
            self._reservoir.append(value)
        else:
            self.count = count - 1
            self._reservoir_step(value)

    def _reservoir_step(self, value: float) -> None:
        """Count `value` and update the reservoir (the statistics other than the count are already updated)."""
        self.count += 1
        if self.count <= RESERVOIR_SIZE:
            self._reservoir.append(value)
            if self.count == RESERVOIR_SIZE:
                self._weight = math.exp(math.log(self._random.random()) / RESERVOIR_SIZE)
                self._next_replace = self.count + self._skip()
        elif self.count == self._next_replace:
            # Li's "Algorithm L": jump straight to the next item that enters the reservoir, so the
            # random generator is called O(k log(n/k)) times instead of once per item.
            self._reservoir[self._below(RESERVOIR_SIZE)] = value
            self._weight *= math.exp(math.log(self._random.random()) / RESERVOIR_SIZE)
            self._next_replace = self.count + self._skip()

    def _below(self, n: int) -> int:
        """A uniform integer in [0, n): the draw `random.Random.randrange(n)` makes (getrandbits of n's bit length
        until one is below n), spelled out because the compiled log scanner makes the same draws in C."""
        bits = n.bit_length()
        index = self._random.getrandbits(bits)
        while index >= n:
            index = self._random.getrandbits(bits)
        return index

    def _skip(self) -> int:
        return int(math.log(self._random.random() or 1e-300) / math.log(1 - self._weight)) + 1

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count else 0.0

    def percentile(self, fraction: float) -> float | None:
        if not self._reservoir:
            return None
        ordered = sorted(self._reservoir)
        position = fraction * (len(ordered) - 1)
        low = math.floor(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class _Mean:
    """Running mean of the finite values given, each weighted by its step time: a rate's mean over a run is what
    the run did (work over time), where the plain mean of per-step rates overstates a run that slows down."""

    __slots__ = ("count", "total", "weight")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.weight = 0.0

    def add(self, value: float | None, step_ms: float) -> None:
        if value is not None and math.isfinite(value):
            self.count += 1
            self.total += value * step_ms
            self.weight += step_ms

    @property
    def mean(self) -> float:
        return self.total / self.weight if self.weight else 0.0


class IterationRow(NamedTuple):
    """What the summary takes from one iteration line; both reading paths hand it these rows (the line path
    one per record, bulk reading many at once with the timestamp left unparsed in `time_key`)."""

    iteration: int
    train_iters: int | None
    elapsed_ms: float | None
    tokens_per_s_per_gpu: float | None
    tflops_per_gpu: float | None
    loss: float | None
    nan_iterations: int | None
    skipped_iterations: int | None
    time_key: bytes = b""  # the line's prefix, its timestamp read only for the last counted row


# One steady-state candidate: (elapsed_ms, tokens/s/GPU, TFLOP/s/GPU, MFU %).
_Sample = tuple[float, float | None, float | None, float | None]


@dataclass
class RunSummary:
    """What `summary` in `megapilot logs parse --json` holds."""

    rule: str
    iterations_logged: int = 0
    iterations_counted: int = 0
    steady_iterations: int = 0
    warmup_dropped: int = 0
    checkpoint_dropped: int = 0
    first_iteration: int | None = None
    last_iteration: int | None = None
    train_iters: int | None = None
    step_time_mean_ms: float | None = None
    step_time_p50_ms: float | None = None
    step_time_p95_ms: float | None = None
    step_time_min_ms: float | None = None
    step_time_max_ms: float | None = None
    step_time_cv: float | None = None
    tokens_per_s_per_gpu_mean: float | None = None
    tflops_per_gpu_mean: float | None = None
    mfu_pct_mean: float | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    min_loss: float | None = None
    nan_iterations: int | None = None
    skipped_iterations: int | None = None
    wall_time_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_number(v) for k, v in self.__dict__.items()}


RULE_TEXT = (
    "each iteration number once; drop the first max(1, ceil(10%)) counted records (at most 50) "
    "and every record whose interval contains a checkpoint save; mean/p50/p95/CV over the rest"
)


class SummaryBuilder:
    """Feed iteration records and checkpoint-save starts in log order; `result()` at the end."""

    def __init__(self) -> None:
        self._logged = 0
        self._counted = 0
        self._max_counted: int | None = None
        self._first_iteration: int | None = None
        self._train_iters: int | None = None
        self._head: list[_Sample | None] = []  # first WARMUP_CAP counted samples (None = dropped by checkpoint)
        self._after_head = _Running()
        self._tokens_after_head = _Mean()
        self._tflops_after_head = _Mean()
        self._mfu_after_head = _Mean()
        self._checkpoint_dropped = 0
        self._save_pending = False
        self._first_loss: float | None = None
        self._final_loss: float | None = None
        self._min_loss: float | None = None
        self._nan_iterations: int | None = None
        self._skipped_iterations: int | None = None
        self._first_time: float | None = None
        self._last_time: float | None = None

    def checkpoint_save_started(self) -> None:
        self._save_pending = True

    def add(self, record: IterationRecord) -> None:
        self.add_row(IterationRow(record.iteration, record.train_iters, record.elapsed_ms, record.tokens_per_s_per_gpu,
                                  record.tflops_per_gpu, record.lm_loss, record.nan_iterations,
                                  record.skipped_iterations), time_s=record.time_s, mfu_pct=record.mfu_pct)

    def add_row(self, row: IterationRow, *, time_s: float | None = None, mfu_pct: float | None = None) -> bool:
        """One iteration line, with its timestamp and MFU when known; whether it was counted."""
        self._logged += 1
        iteration = row.iteration
        if self._max_counted is not None and iteration <= self._max_counted:
            return False
        self._max_counted = iteration
        self._counted += 1
        if self._first_iteration is None:
            self._first_iteration = iteration
        self._train_iters = row.train_iters or self._train_iters
        self._track_losses(row.loss, row.nan_iterations, row.skipped_iterations)
        if time_s is not None:
            self._first_time = self._first_time if self._first_time is not None else time_s
            self._last_time = time_s
        elapsed_ms = row.elapsed_ms
        if elapsed_ms is None or not math.isfinite(elapsed_ms):
            return True
        sample: _Sample | None = (elapsed_ms, row.tokens_per_s_per_gpu, row.tflops_per_gpu, mfu_pct)
        if self._save_pending:
            self._save_pending = False
            self._checkpoint_dropped += 1
            sample = None
        if len(self._head) < WARMUP_CAP:
            self._head.append(sample)
        elif sample is not None:
            self._fold(sample)
        return True

    def add_rows(self, rows: list[IterationRow]) -> list[bytes]:
        """Many iteration lines at once, in log order, with no MFU and no time yet: exactly `add_row` per row, in
        one loop with the state in local variables (bulk reading's hot path). Returns the `time_key`s of the
        counted rows, in order, for their timestamps to be read lazily."""
        counted_keys: list[bytes] = []
        keep = counted_keys.append
        head, cap, after = self._head, WARMUP_CAP, self._after_head
        tokens_mean, tflops_mean = self._tokens_after_head, self._tflops_after_head
        isfinite = math.isfinite
        max_counted, counted, logged = self._max_counted, self._counted, self._logged
        train_iters_kept, first_iteration = self._train_iters, self._first_iteration
        first_loss, final_loss, min_loss = self._first_loss, self._final_loss, self._min_loss
        nan_total, skipped_total, save_pending = self._nan_iterations, self._skipped_iterations, self._save_pending
        checkpoint_dropped = self._checkpoint_dropped
        count, mean, m2, minimum, maximum = after.count, after.mean, after._m2, after.minimum, after.maximum
        reservoir_append = after._reservoir.append
        next_replace = after._next_replace if after.count >= RESERVOIR_SIZE else RESERVOIR_SIZE
        for iteration, train_iters, elapsed_ms, tokens, tflops, loss, nan_iterations, skipped_iterations, key in rows:
            logged += 1
            if max_counted is not None and iteration <= max_counted:
                continue
            max_counted = iteration
            counted += 1
            if first_iteration is None:
                first_iteration = iteration
            train_iters_kept = train_iters or train_iters_kept
            if loss is not None and isfinite(loss) and not nan_iterations:
                if first_loss is None:
                    first_loss = loss
                final_loss = loss
                min_loss = loss if min_loss is None else min(min_loss, loss)
            if nan_iterations is not None:
                nan_total = (nan_total or 0) + nan_iterations
            if skipped_iterations is not None:
                skipped_total = (skipped_total or 0) + skipped_iterations
            keep(key)
            if elapsed_ms is None or not isfinite(elapsed_ms):
                continue
            if save_pending:
                save_pending = False
                checkpoint_dropped += 1
                if len(head) < cap:
                    head.append(None)
                continue
            if len(head) < cap:
                head.append((elapsed_ms, tokens, tflops, None))
                continue
            # after.add(elapsed_ms), inlined: the same operations in the same order (so the same floats)
            count += 1
            delta = elapsed_ms - mean
            mean += delta / count
            m2 += delta * (elapsed_ms - mean)
            if elapsed_ms < minimum:
                minimum = elapsed_ms
            if elapsed_ms > maximum:
                maximum = elapsed_ms
            if count < RESERVOIR_SIZE:
                reservoir_append(elapsed_ms)
            elif count >= next_replace:  # fill the last slot, or replace one: the rare steps, done by `_Running`
                after.count, after.mean, after._m2, after.minimum, after.maximum = count - 1, mean, m2, minimum, maximum
                after._reservoir_step(elapsed_ms)
                next_replace = after._next_replace if after.count >= RESERVOIR_SIZE else RESERVOIR_SIZE
            if tokens is not None:
                tokens_mean.add(tokens, elapsed_ms)
            if tflops is not None:
                tflops_mean.add(tflops, elapsed_ms)
        self._max_counted, self._counted, self._logged = max_counted, counted, logged
        self._train_iters, self._first_iteration = train_iters_kept, first_iteration
        self._first_loss, self._final_loss, self._min_loss = first_loss, final_loss, min_loss
        self._nan_iterations, self._skipped_iterations, self._save_pending = nan_total, skipped_total, save_pending
        self._checkpoint_dropped = checkpoint_dropped
        after.count, after.mean, after._m2, after.minimum, after.maximum = count, mean, m2, minimum, maximum
        return counted_keys

    @property
    def has_first_time(self) -> bool:
        """Whether a counted record with a timestamp has been seen."""
        return self._first_time is not None

    def note_last_time(self, time_s: float) -> None:
        """The timestamp of the latest counted record, when it is learnt after the record (bulk reading
        parses the timestamps of counted records lazily, only the last one that has one)."""
        self._last_time = time_s

    def _track_losses(self, loss: float | None, nan_iterations: int | None, skipped_iterations: int | None) -> None:
        # An interval with NaN iterations prints a meaningless loss (Megatron-Core prints 0.0): not a loss value.
        if loss is not None and math.isfinite(loss) and not nan_iterations:
            if self._first_loss is None:
                self._first_loss = loss
            self._final_loss = loss
            self._min_loss = loss if self._min_loss is None else min(self._min_loss, loss)
        if nan_iterations is not None:
            self._nan_iterations = (self._nan_iterations or 0) + nan_iterations
        if skipped_iterations is not None:
            self._skipped_iterations = (self._skipped_iterations or 0) + skipped_iterations

    def _fold(self, sample: _Sample) -> None:
        self._after_head.add(sample[0])
        self._tokens_after_head.add(sample[1], sample[0])
        self._tflops_after_head.add(sample[2], sample[0])
        self._mfu_after_head.add(sample[3], sample[0])

    def result(self) -> RunSummary:
        timed = len(self._head) + self._after_head.count  # records with a step time (checkpoint-dropped included)
        head = list(self._head)
        warmup = min(max(1, math.ceil(WARMUP_FRACTION * timed)), WARMUP_CAP) if timed else 0
        kept_from_head = [s for s in head[warmup:] if s is not None]
        if not kept_from_head and self._after_head.count == 0:
            warmup = 0  # too few records to drop any: keep them rather than report nothing
            kept_from_head = [s for s in head if s is not None]
        steady, tokens, tflops, mfu = _Running(), _Mean(), _Mean(), _Mean()
        for elapsed_ms, tokens_value, tflops_value, mfu_value in kept_from_head:
            steady.add(elapsed_ms)
            tokens.add(tokens_value, elapsed_ms)
            tflops.add(tflops_value, elapsed_ms)
            mfu.add(mfu_value, elapsed_ms)
        merged = _merge(steady, self._after_head)
        summary = RunSummary(
            rule=RULE_TEXT, iterations_logged=self._logged, iterations_counted=self._counted,
            steady_iterations=merged.count, warmup_dropped=warmup, checkpoint_dropped=self._checkpoint_dropped,
            first_iteration=self._first_iteration, last_iteration=self._max_counted, train_iters=self._train_iters,
            first_loss=self._first_loss, final_loss=self._final_loss, min_loss=self._min_loss,
            nan_iterations=self._nan_iterations, skipped_iterations=self._skipped_iterations,
        )
        if self._first_time is not None and self._last_time is not None:
            summary.wall_time_s = self._last_time - self._first_time
        if merged.count:
            summary.step_time_mean_ms = merged.mean
            summary.step_time_p50_ms = merged.percentile(0.50)
            summary.step_time_p95_ms = merged.percentile(0.95)
            summary.step_time_min_ms = merged.minimum
            summary.step_time_max_ms = merged.maximum
            summary.step_time_cv = merged.std / merged.mean if merged.mean else None
        summary.tokens_per_s_per_gpu_mean = _mean_of(tokens, self._tokens_after_head)
        summary.tflops_per_gpu_mean = _mean_of(tflops, self._tflops_after_head)
        summary.mfu_pct_mean = _mean_of(mfu, self._mfu_after_head)
        return summary


def _mean_of(first: _Mean, second: _Mean) -> float | None:
    weight = first.weight + second.weight
    return (first.total + second.total) / weight if weight else None


def _merge(first: _Running, second: _Running) -> _Running:
    """Combine two running stats (Chan et al. parallel variance); reservoirs are concatenated then bounded."""
    merged = _Running()
    merged.count = first.count + second.count
    if not merged.count:
        return merged
    delta = second.mean - first.mean
    merged.mean = first.mean + delta * second.count / merged.count
    merged._m2 = first._m2 + second._m2 + delta * delta * first.count * second.count / merged.count
    merged.minimum = min(first.minimum, second.minimum)
    merged.maximum = max(first.maximum, second.maximum)
    merged._reservoir = (first._reservoir + second._reservoir)[: RESERVOIR_SIZE + WARMUP_CAP]
    return merged
