"""Human-readable quantities for tables and sentences (never for `--json`, which keeps plain numbers).

`format_duration(0.000123) == "123 µs"`: a duration is shown in the largest of s / ms / µs that keeps
it at 1 or more, with three significant digits, so a tiny model's 40 µs step and a 405B model's
12.3 s step read equally well (a fixed "%.2f s" shows the first as "0.00 s").
"""

from __future__ import annotations

import math

_DURATION_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))  # largest first; µs is the floor
SIGNIFICANT_DIGITS = 3


def format_duration(seconds: float) -> str:
    """`seconds` with three significant digits in s, ms or µs ("12.3 s", "4.56 ms", "789 µs", "0 s")."""
    if seconds == 0 or not math.isfinite(seconds):
        return f"{seconds:g} s"
    rounded = float(f"{abs(seconds):.{SIGNIFICANT_DIGITS}g}")  # round first: 999.96 ms is "1.00 s"
    scale, unit = next(((s, u) for s, u in _DURATION_UNITS if rounded >= s), _DURATION_UNITS[-1])
    value = rounded / scale
    decimals = max(0, SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(value)))
    sign = "-" if seconds < 0 else ""
    return f"{sign}{value:,.{decimals}f} {unit}"
