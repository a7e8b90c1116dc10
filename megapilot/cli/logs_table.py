"""What `megapilot logs parse`'s table prints, read in bulk with memory bounded whatever the log's size.

The table shows the run's summary, its dialect and framework, the lines read, the count of memory reports,
checkpoint operations and error lines (the first 10 of them), the binary data skipped, and the Megatron-LM release
the log was written by (`megapilot.diagnose.megatron_version`: a release line, else the arguments block, else a
container's name, else the format of the first dated iteration line). A full parse kept a record per iteration
line for that (44 CPU-s and 1.2 GB on a 424 MB multi-rank log; bench/log_parse/table_results.json: now 1.5 CPU-s
and 54 MB). `read_table_log` reads the files as `--summary-only` does (`megapilot.logs.bulk`: the same summary,
errors, checkpoints, arguments block and lines read), and keeps beside it only what the rest of the table reads:

- the `memory (MB)` reports are parsed (the bulk scan would skip them) and counted, not kept;
- progress markers: the first `MARKER_CAPACITY` release lines and the first `MARKER_CAPACITY` others (the release
  is told by the first release line that names a known version);
- of the iteration lines, the first whose format tells the release (`RowProbe`: canonical lines read in bulk are
  tested on their bytes, only until one matches).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megapilot.logs.bulk import RowProbe, read_bulk
from megapilot.logs.collect import LogCollector, ParsedLog
from megapilot.logs.parser import LineParser, ParseOptions
from megapilot.logs.records import IterationRecord, MemoryRecord, ProgressMarker, Record
from megapilot.logs.sources import open_log, shown_name
from megapilot.logs.summary import SummaryBuilder

if TYPE_CHECKING:
    from megapilot.diagnose.megatron_version import RecognisedVersion

MARKER_CAPACITY = 1024  # of release lines, and of other progress markers (a restart prints a few of each)


@dataclass
class TableLog:
    """A run's logs as the table shows them: `log` holds no iteration, memory, timer or theoretical-memory records
    (as under `--summary-only`), only a bounded share of its progress markers."""

    log: ParsedLog
    memory_reports: int  # `MemoryRecord`s a full parse keeps (`len(ParsedLog.memory)`)
    format_record: IterationRecord | None  # the first iteration record whose format tells the release
    rows_tested: int = 0  # canonical iteration lines the format probe tested (the probe's cost)

    def version(self) -> RecognisedVersion | None:
        """`recognise_megatron_version` of the full parse: it reads the iteration records only up to the first whose
        format tells the release, which is `format_record`."""
        from megapilot.diagnose.megatron_version import recognise_megatron_version

        kept = [self.format_record] if self.format_record is not None else []
        return recognise_megatron_version(dataclasses.replace(self.log, iterations=kept))


class _TableSink:
    """The collector as the bulk reader's sink, keeping beside it the memory count, the markers and the format
    probe's offers (records reach `add` in log order, among the rows the probe tests)."""

    def __init__(self, collector: LogCollector, probe: RowProbe) -> None:
        self.summary: SummaryBuilder = collector.summary
        self.dialects: Counter[str] = collector.dialects
        self._collect = collector.add
        self._probe = probe
        self.memory_reports = 0
        self.markers: list[ProgressMarker] = []
        self._marker_counts = {True: 0, False: 0}  # by "is a release line"

    def add(self, record: Record) -> None:
        self._collect(record)
        if isinstance(record, IterationRecord):
            self._probe.offer(record)
        elif isinstance(record, MemoryRecord):
            self.memory_reports += 1
        elif isinstance(record, ProgressMarker):
            release = record.marker.startswith("release:")
            if self._marker_counts[release] < MARKER_CAPACITY:
                self._marker_counts[release] += 1
                self.markers.append(record)


def read_table_log(paths: Iterable[str], options: ParseOptions | None = None) -> TableLog:
    """Read the logs of one run (`-`: stdin) for the table, in bulk (see the module docstring)."""
    from megapilot.diagnose.megatron_version import ITERATION_FORMAT_RE

    collector = LogCollector(summary_only=True)
    probe = RowProbe(ITERATION_FORMAT_RE)
    sink = _TableSink(collector, probe)
    for path in paths:
        name = str(path)
        collector.log.files.append(name)
        # as `parse_logs` reads: an arguments block read from an earlier file serves later ones
        parser = LineParser(shown_name(name), options, collector.log.arguments)
        with open_log(name) as stream:
            collector.end_source(read_bulk(sink, parser, stream, keep_memory=True, row_probe=probe))
    log = collector.finish()
    log.markers = sink.markers
    return TableLog(log, sink.memory_reports, probe.found, probe.rows_tested)
