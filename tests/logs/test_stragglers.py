"""Per-rank timing lines: the embedded trainer's and Megatron's `--log-straggler` reports."""

from __future__ import annotations

from pathlib import Path

from megapilot.logs import parse_text
from megapilot.logs.stragglers import read_straggler_lines
from megapilot.trainer import logfmt

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def test_the_trainers_rank_line_round_trips_with_nodes():
    line = logfmt.rank_compute_line([12.31, 12.5, 20.11, 19.98], [0, 0, 1, 1])
    found = read_straggler_lines("node1.log", ["noise", line])
    [times] = found.rank_times
    assert times.compute_ms == (12.31, 12.5, 20.11, 19.98) and times.node_of_rank == (0, 0, 1, 1)
    assert times.evidence.line == 2 and times.evidence.file == "node1.log"


def test_the_trainers_rank_line_is_no_error_and_no_iteration_to_the_log_parser():
    log = parse_text(logfmt.rank_compute_line([1.0, 2.0], [0, 1]))
    assert log.errors == [] and log.iterations == []


def test_megatron_straggler_reports_with_their_bottom_ranks():
    found = read_straggler_lines("train.log", (DATA / "fake_log_straggler.log").read_text().splitlines())
    assert [r.slowest_rank for r in found.reports] == [5, 5, 6]
    first = found.reports[0]
    assert (first.fastest_rank, first.fastest_ms, first.slowest_ms) == (2, 1180.2, 1502.77)
    assert first.lowest_throughput_ranks == (5, 6)
    assert found.reports[2].lowest_throughput_ranks == (6,)  # no Bottom line: the MnEtpt rank alone
    assert found.rank_times == []


def test_the_log_parser_records_the_timing_lines_so_a_log_is_read_once():
    log = parse_text("\n".join(["iteration lines only", logfmt.rank_compute_line([1.0, 2.0], [0, 1]),
                                 *(DATA / "fake_log_straggler.log").read_text().splitlines()]))
    assert [t.compute_ms for t in log.rank_times] == [(1.0, 2.0)]
    found = read_straggler_lines("train.log", (DATA / "fake_log_straggler.log").read_text().splitlines())
    assert [(r.slowest_rank, r.lowest_throughput_ranks) for r in log.straggler_reports] == \
        [(r.slowest_rank, r.lowest_throughput_ranks) for r in found.reports]  # each Bottom line amends its report
