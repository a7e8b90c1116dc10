"""nccl-tests' table and the probe's own sections read back the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.logs.collectives import (
    CollectiveSample,
    bus_bandwidth_gbps,
    bus_factor,
    format_average,
    format_header,
    format_row,
    parse_collectives,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


@pytest.mark.parametrize(("collective", "ranks", "factor"), [
    ("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4), ("alltoall", 2, 0.5),
    ("broadcast", 8, 1.0), ("sendrecv", 2, 1.0), ("all_reduce", 1, 0.0)])
def test_bus_factor_is_nccl_tests(collective, ranks, factor):
    assert bus_factor(collective, ranks) == pytest.approx(factor)


def test_unknown_collective_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="all_reduce"):
        bus_factor("allreduce_fancy", 4)


def test_bus_bandwidth_of_one_gigabyte_all_reduce_in_ten_ms_on_8_ranks():
    algbw, busbw = bus_bandwidth_gbps("all_reduce", 1_000_000_000, 0.01, 8)
    assert algbw == pytest.approx(100.0) and busbw == pytest.approx(175.0)


def test_nccl_tests_output_reads_the_out_of_place_half_and_counts_ranks():
    [run] = parse_collectives((DATA / "fake_all_reduce_perf.txt").read_text().splitlines(), collective="all_reduce")
    assert run.ranks == 16 and run.scope == ""
    assert [s.size_bytes for s in run.samples][:2] == [8, 1024]
    assert run.samples[-1].busbw_gbps == 181.09 and run.samples[-1].time_us == 88940.2
    assert run.avg_busbw_gbps == pytest.approx(90.0287)
    assert run.large_message_busbw_gbps(1 << 30) == pytest.approx((179.73 + 181.09) / 2)
    assert run.large_message_busbw_gbps(1 << 40) is None


def test_probe_sections_round_trip_with_their_scope():
    sample = CollectiveSample("all_reduce", 4096, 52.31, 0.078, 0.117, 0, 4, 0)
    text = [*format_header("all_reduce", 4, 2), format_row(sample, 1024), format_average(0.117),
            *format_header("all_reduce", 2, 1, scope="node1"), format_row(sample, 1024), format_average(0.05)]
    whole, node = parse_collectives(text)
    assert (whole.collective, whole.scope, whole.ranks, whole.nodes) == ("all_reduce", "", 4, 2)
    assert whole.samples[0].time_us == 52.31 and whole.samples[0].busbw_gbps == 0.117
    assert (node.scope, node.ranks, node.avg_busbw_gbps) == ("node1", 2, 0.05)


def test_rows_without_a_named_collective_are_not_guessed():
    assert parse_collectives((DATA / "fake_all_reduce_perf.txt").read_text().splitlines()) == []


def test_torchruns_rank_prefix_is_read_through():
    sample = CollectiveSample("alltoall", 4096, 12.5, 0.33, 0.25, 0, 4, 0)
    text = [f"[default0]:{line}" for line in (*format_header("alltoall", 4, 2), format_row(sample, 1024, redop="none"),
                                              format_average(0.25))]
    [run] = parse_collectives(text)
    assert run.collective == "alltoall" and run.nodes == 2 and run.samples[0].busbw_gbps == 0.25
