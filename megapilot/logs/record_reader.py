"""Reading a growing log line by line into a sink, handing every record to a callback.

`RecordReader` has `BulkReader`'s interface (`feed(chunk)`, `end()`), so a follower can read a file either way: the
bulk reader when only the summary matters (fastest), this one when each record must be seen as it arrives (a live
view printing every new iteration). Both give the sink the same records and return the same `SourceEnd`: this is
the line path `parse_logs` takes for a file (`collect._feed`), fed chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from megapilot.logs.bulk import RecordSink, SourceEnd
from megapilot.logs.lines import BinaryTally, LineSplitter
from megapilot.logs.parser import LineParser
from megapilot.logs.records import Evidence, Record


class RecordReader:
    """One file's bytes → lines → records: each record goes to the sink, then to `on_record`."""

    def __init__(self, sink: RecordSink, parser: LineParser, on_record: Callable[[Record], None] | None = None) -> None:
        self.sink = sink
        self.parser = parser
        self.on_record = on_record
        self.binary = BinaryTally()
        self._splitter = LineSplitter(self.binary)
        self._lines_read = 0
        self._last: tuple[int, str] | None = None

    def feed(self, chunk: bytes) -> None:
        """More bytes of the file (any size; a line split across chunks is joined)."""
        self.read_lines(self._splitter.feed(chunk))

    def end(self) -> SourceEnd:
        """The file ended: its unterminated last line is read; what it contributes beyond records is returned."""
        self.read_lines(self._splitter.flush())
        last = None if self._last is None else Evidence(self.parser.file, self._last[0], self._last[1])
        return SourceEnd(self._lines_read, last, self.parser.last_time_s, self.parser.framework_hints, self.binary)

    def read_lines(self, lines: Iterable[tuple[int, str]]) -> None:
        """Lines already split and numbered (a whole file's, or text held in memory)."""
        add, feed, on_record = self.sink.add, self.parser.feed, self.on_record
        for line_no, text in lines:
            self._lines_read = line_no
            if text:
                self._last = (line_no, text)
            for record in feed(line_no, text):
                add(record)
                if on_record is not None:
                    on_record(record)
