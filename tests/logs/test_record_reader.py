"""RecordReader: a file fed in any pieces gives the records and the source facts of the one-shot line path."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.logs.collect import LogCollector, parse_text
from megapilot.logs.lines import cut_line
from megapilot.logs.parser import LineParser
from megapilot.logs.record_reader import RecordReader
from megapilot.logs.records import ErrorRecord, IterationRecord, Record

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"


def cut_last_line(data: bytes) -> bytes:
    """The bytes a file's reader reads: a last line no newline ended loses its trailing number (`lines.cut_line`)."""
    head, newline, last = data.rpartition(b"\n")
    return data if not last else head + newline + cut_line(last)


@pytest.mark.parametrize("name", ["synthetic_megatron_core016_full.log", "synthetic_mangled_crlf_truncated.log",
                                  "real/09_nccl_watchdog_timeout_allreduce_moe.log"])
@pytest.mark.parametrize("piece", [1, 7, 4096])
def test_pieces_of_any_size_give_the_records_and_end_of_the_whole_text(name: str, piece: int):
    data = (DATA / name).read_bytes()
    collector, seen = LogCollector(), list[Record]()
    collector.log.files.append(name)
    reader = RecordReader(collector, LineParser(name), seen.append)
    for start in range(0, len(data), piece):
        reader.feed(data[start:start + piece])
    end = reader.end()
    collector.end_source(end)
    whole = parse_text(cut_last_line(data).decode("utf-8", "replace"), file=name)  # the string as a file reads
    assert collector.finish().to_dict() == whole.to_dict()
    assert (end.lines_read, end.last_line) == (whole.lines_read, whole.last_line)
    assert [r for r in seen if isinstance(r, IterationRecord)] == whole.iterations
    assert [r for r in seen if isinstance(r, ErrorRecord)] == whole.errors


def test_without_a_callback_records_still_reach_the_sink():
    collector = LogCollector()
    reader = RecordReader(collector, LineParser("<text>"))
    reader.read_lines([(1, "RuntimeError: No CUDA GPUs are available")])
    collector.end_source(reader.end())
    assert [e.category for e in collector.finish().errors] == ["config_error"]

