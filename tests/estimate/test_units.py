"""Durations in human output: three significant digits in the unit that keeps the number readable."""

from __future__ import annotations

import pytest

from megapilot.estimate.units import format_count, format_duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (12.345, "12.3 s"),
        (1.0, "1.00 s"),
        (1234.5, "1,230 s"),
        (0.5, "500 ms"),
        (0.004567, "4.57 ms"),
        (0.0123, "12.3 ms"),
        (0.000789, "789 µs"),
        (4.2e-5, "42.0 µs"),
        (1.5e-6, "1.50 µs"),
        (3e-8, "0.0300 µs"),  # below the smallest unit: still three significant digits
        (0.0, "0 s"),
        (-0.0025, "-2.50 ms"),
    ],
)
def test_duration_keeps_three_significant_digits_in_s_ms_or_us(seconds, shown):
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(("seconds", "shown"), [(0.99996, "1.00 s"), (0.00099996, "1.00 ms")])
def test_rounding_up_to_the_next_unit_moves_to_that_unit(seconds, shown):
    assert format_duration(seconds) == shown


@pytest.mark.parametrize(
    ("count", "shown"),
    [(70_553_706_496, "70.6 B"), (6_912_000, "6.91 M"), (1_500, "1.50 k"), (999.6, "1.00 k"), (512, "512"),
     (7, "7"), (0, "0"), (1.234e12, "1.23 T")],
)
def test_counts_keep_three_significant_digits_with_a_suffix(count, shown):
    assert format_count(count) == shown
