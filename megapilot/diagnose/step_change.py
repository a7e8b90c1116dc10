"""A one-time change of step time that lasts: where a series of step times moved to another level and stayed.

A trend rule (Theil-Sen over the whole run) misses a step: a run that jumps 30 % at one iteration and stays has a
fitted slope far below a trend's threshold (most pairs of steps lie on the same side of the jump), or, read as a
trend, is told as a steady drift that it is not. Here the series is read the way a person reads it: the median of
the `JUMP_WINDOW` logged steps before each point against the median of the `JUMP_WINDOW` from it on. A change is
one where:

- the two medians differ by at least `JUMP_MIN_FRACTION` of the level before, and by at least
  `JUMP_NOISE_MULTIPLE` x the series' own noise (the robust spread of consecutive differences: a checkpoint save's
  or a GC pause's lone slow step moves neither a median nor that spread);
- the level held on both sides (`JUMP_FLATNESS`): the median of everything before the change, and of everything
  after it, and of the last window of the series, each lie within that share of the jump from the window beside the
  change. A steady trend moves every window by its slope and fails this; a slowdown that came back fails the last
  window's test.

Pure numbers in, one change out: which records the series holds (the steady state, one batch size) is the rule's
choice (`megapilot.diagnose.rules`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

# Ten logged steps on each side: a median of ten ignores up to four slow steps (a save, an evaluation, GC) and
# varies by ~0.4 sigma of the step-to-step noise, so two of them differ by more than ~1.6 sigma nowhere along a
# noisy series of a few hundred points.
JUMP_WINDOW = 10
# 10 % that lasts is an hour a day of a multi-week run; a healthy run's step time varies by a few % (CV 1-5 %).
JUMP_MIN_FRACTION = 0.10
# ... and beyond the run's own noise: 3 sigma of its step-to-step spread is ~5 standard deviations of the difference
# of two window medians, which pure noise does not reach on any realistic log length.
JUMP_NOISE_MULTIPLE = 3.0
# The levels either side of the change must each stay within this share of the jump: a trend drifts by more.
JUMP_FLATNESS = 0.3
# How many of the largest window differences (at least a window apart) are tried: one true change shows as one peak.
JUMP_CANDIDATES = 5
_MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a normal variable is 0.6745 sigma


@dataclass(frozen=True)
class StepChange:
    """The first index at the new level, and the medians of the windows before and from it (ms)."""

    index: int
    before_ms: float
    after_ms: float
    noise_ms: float  # the series' step-to-step noise, one sigma

    @property
    def fraction(self) -> float:
        """The change as a fraction of the level before: +0.32 for 32 % slower, -0.2 for 20 % faster."""
        return self.after_ms / self.before_ms - 1.0

    @property
    def rose(self) -> bool:
        return self.after_ms > self.before_ms


def noise_sigma(values: Sequence[float]) -> float:
    """One sigma of the step-to-step noise: the median absolute consecutive difference, scaled (a difference of two
    independent draws has sqrt(2) sigma). A level change moves one difference only, a lone spike two."""
    diffs = [abs(b - a) for a, b in pairwise(values)]
    return _MAD_TO_SIGMA * statistics.median(diffs) / math.sqrt(2) if diffs else 0.0


def find_step_change(values: Sequence[float], window: int = JUMP_WINDOW) -> StepChange | None:
    """The largest lasting change of level in `values` (step times, ms, in log order), or None."""
    n = len(values)
    if n < 2 * window:
        return None
    medians = [statistics.median(values[i:i + window]) for i in range(n - window + 1)]  # medians[i]: values[i:i+w]
    # at k: the window before is values[k-w:k] (medians[k-w]), the window from it values[k:k+w] (medians[k])
    diffs = {k: medians[k] - medians[k - window] for k in range(window, n - window + 1)}
    sigma = noise_sigma(values)
    tried: list[int] = []
    for k in sorted(diffs, key=lambda k: -abs(diffs[k])):
        if len(tried) >= JUMP_CANDIDATES:
            break
        if any(abs(k - other) < window for other in tried):
            continue  # the same peak, one step aside
        tried.append(k)
        change = _lasting(values, _located(values, k, medians, window), medians, window, sigma)
        if change is not None:
            return change
    return None


def _located(values: Sequence[float], k: int, medians: list[float], window: int) -> int:
    """The split near `k` that best separates the two levels: the fewest points on the wrong side of their midpoint
    (the window difference peaks over a plateau a few points wide; the change is where the points cross)."""
    before, after = medians[k - window], medians[k]
    mid, rose = (before + after) / 2, after > before
    low, high = max(window, k - window), min(len(values) - window, k + window)
    span = values[low - window:high + window]

    def wrong(split: int) -> int:
        cut = split - (low - window)
        early, late = span[:cut], span[cut:]
        return (sum(v > mid for v in early) + sum(v < mid for v in late) if rose
                else sum(v < mid for v in early) + sum(v > mid for v in late))

    return min(range(low, high + 1), key=lambda split: (wrong(split), abs(split - k)))


def _lasting(values: Sequence[float], k: int, medians: list[float], window: int, sigma: float) -> StepChange | None:
    before, after = medians[k - window], medians[k]
    jump = after - before
    if before <= 0 or abs(jump) < JUMP_MIN_FRACTION * before or abs(jump) < JUMP_NOISE_MULTIPLE * sigma:
        return None
    allowed = JUMP_FLATNESS * abs(jump)
    levels = ((statistics.median(values[:k]), before), (statistics.median(values[k:]), after),
              (medians[-1], after))
    if any(abs(level - near) > allowed for level, near in levels):
        return None
    return StepChange(k, before, after, sigma)


__all__ = ["JUMP_MIN_FRACTION", "JUMP_NOISE_MULTIPLE", "JUMP_WINDOW", "StepChange", "find_step_change",
           "noise_sigma"]
