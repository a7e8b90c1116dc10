"""Human-readable quantities for tables and sentences (never for `--json`, which keeps plain numbers).

`format_duration(0.000123) == "123 µs"`: a duration is shown in the largest of s / ms / µs that keeps
it at 1 or more, with three significant digits, so a tiny model's 40 µs step and a 405B model's
12.3 s step read equally well (a fixed "%.2f s" shows the first as "0.00 s"). `format_count` does
the same for parameter counts (k, M, B, T).
"""

from __future__ import annotations

import math

SIGNIFICANT_DIGITS = 3
# (scale, suffix), largest first; the last one is also used below 1 of it.
_DURATION_UNITS = ((1.0, " s"), (1e-3, " ms"), (1e-6, " µs"))
_COUNT_UNITS = ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e3, " k"))


def format_duration(seconds: float) -> str:
    """`seconds` with three significant digits in s, ms or µs ("12.3 s", "4.56 ms", "789 µs", "0 s")."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    return _three_significant(seconds, _DURATION_UNITS)


def format_count(count: float) -> str:
    """A count with three significant digits and a k / M / B / T suffix ("70.6 B", "6.91 M"); whole below 1000."""
    if abs(round(count)) < 1000 or not math.isfinite(count):
        return f"{count:,.0f}" if math.isfinite(count) else f"{count:g}"
    return _three_significant(count, _COUNT_UNITS)


def _three_significant(value: float, units: tuple[tuple[float, str], ...]) -> str:
    rounded = float(f"{abs(value):.{SIGNIFICANT_DIGITS}g}")  # round first: 999.96 ms is "1.00 s"
    scale, suffix = next(((s, u) for s, u in units if rounded >= s), units[-1])
    scaled = rounded / scale
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(scaled)))
    sign = "-" if value < 0 else ""
    return f"{sign}{scaled:,.{decimals}f}{suffix}"
