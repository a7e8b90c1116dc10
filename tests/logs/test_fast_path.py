"""The summary-only fast path gives exactly the summary of the full parser, on every fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.logs import ParseOptions, parse_logs
from megapilot.logs.parser import LineParser

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
FIXTURES = sorted(DATA.glob("**/*.log"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_summary_only_matches_full_parse(path: Path):
    options = ParseOptions(seq_length=4096, world_size=8)
    full = parse_logs([path], options=options)
    fast = parse_logs([path], options=options, summary_only=True)
    assert fast.summary.to_dict() == full.summary.to_dict()
    assert (fast.dialect, fast.lines_read, fast.last_time_s) == (full.dialect, full.lines_read, full.last_time_s)
    assert [(e.line, e.category) for e in fast.errors] == [(e.line, e.category) for e in full.errors]
    assert fast.iterations == [] and fast.memory == []


def test_fast_path_declines_lines_it_cannot_read_exactly():
    parser = LineParser("f")
    canonical = (" [2026-01-01 00:00:01] iteration        2/      20 | consumed samples:           32 | elapsed time per "
                 "iteration (ms): 658.3 | throughput per GPU (TFLOP/s/GPU): 1441.4 | learning rate: 1.000000E-04 | "
                 "global batch size:    16 | lm loss: 1.250274E+01 | loss scale: 1.0 | grad norm: 2.772 | "
                 "number of skipped iterations:   0 | number of nan iterations:   0 |")
    assert parser.fast_iteration(canonical)[:4] == (2, 20, " [2026-01-01 00:00:01] ", 658.3)
    assert parser.fast_iteration(canonical.replace("658.3 |", "654.5/735.1 |")) is None  # Primus pair
    assert parser.fast_iteration(canonical.replace("658.3 |", "658.3 | mem usages: 0.54 |")) is None
    assert parser.fast_iteration(canonical.replace("1.250274E+01", "1.2x")) is None
