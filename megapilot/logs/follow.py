"""Following every log of a run at once (64 nodes' training logs, say), at the cost of the bytes they gain.

`RunFollower(paths).poll()` looks at each file's size (one `stat`); a file that grew is read from where the last
poll stopped, only its new bytes, through the bulk reader (`megapilot.logs.bulk`: the line parser only for the
lines that need it), into that file's summary-only collector. A file that shrank or was replaced is read again
from its start; a file that does not exist yet is waited for. Memory is bounded per file by the bulk reader's (one
chunk plus the longest line), whatever the files' sizes, so a poll costs O(files) system calls plus O(new bytes)
of parsing, and an idle poll reads nothing.

Each file keeps its own summary: the files grow interleaved, and the steady-state rule counts records in the
order they arrive, so one summary over all of them would depend on the polling. `summaries()` gives each file's
so far; `finish()` ends every file (its unterminated last line is read) and returns one `ParsedLog` per file,
each the same as `parse_logs([file], summary_only=True)` on the final file. With `on_record`, files are read line by
line (`megapilot.logs.record_reader`) and every record is handed over as it arrives (a live view of N nodes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.logs.bulk import BulkReader
from megapilot.logs.collect import LogCollector, ParsedLog
from megapilot.logs.lines import CHUNK_BYTES
from megapilot.logs.parser import LineParser, ParseOptions
from megapilot.logs.record_reader import RecordReader
from megapilot.logs.records import Record
from megapilot.logs.summary import RunSummary


@dataclass
class _Followed:
    """One file: where the last poll stopped, and the reader holding its parse state."""

    path: Path
    collector: LogCollector
    reader: BulkReader | RecordReader
    offset: int = 0
    identity: tuple[int, int] | None = None
    # readers of the file's earlier incarnations (rotated or truncated), ended at finish
    pending: list[BulkReader | RecordReader] = field(default_factory=list)


class RunFollower:
    """Follows several growing logs of one run, each into its own summary-only `ParsedLog`."""

    def __init__(self, paths: list[str | Path], options: ParseOptions | None = None,
                 chunk_bytes: int = CHUNK_BYTES, on_record: Callable[[Record], None] | None = None) -> None:
        self.options = options
        self.chunk_bytes = chunk_bytes
        self.on_record = on_record  # given: every record as it arrives (its `file` names the file), read line by line
        self._files = [self._start(Path(path)) for path in paths]
        self.bytes_read = 0

    def _start(self, path: Path) -> _Followed:
        collector = LogCollector(summary_only=True)
        collector.log.files.append(str(path))
        return _Followed(path, collector, self._reader(collector, path))

    def _reader(self, collector: LogCollector, path: Path) -> BulkReader | RecordReader:
        parser = LineParser(str(path), self.options, collector.log.arguments)
        if self.on_record is not None:
            return RecordReader(collector, parser, self.on_record)
        return BulkReader(collector, parser)

    def poll(self) -> int:
        """Read what every file gained since the last poll; the number of new bytes read."""
        gained = 0
        for followed in self._files:
            gained += self._poll_one(followed)
        self.bytes_read += gained
        return gained

    def _poll_one(self, followed: _Followed) -> int:
        try:
            stat = os.stat(followed.path)
        except FileNotFoundError:
            return 0
        identity = (stat.st_dev, stat.st_ino)
        if followed.identity is not None and (identity != followed.identity or stat.st_size < followed.offset):
            followed.pending.append(followed.reader)  # rotated or truncated: what was read stays counted
            followed.reader, followed.offset = self._reader(followed.collector, followed.path), 0
        followed.identity = identity
        if stat.st_size <= followed.offset:
            return 0
        read = 0
        with open(followed.path, "rb") as stream:
            stream.seek(followed.offset)
            while read < stat.st_size - followed.offset:
                chunk = stream.read(min(self.chunk_bytes, stat.st_size - followed.offset - read))
                if not chunk:
                    break
                followed.reader.feed(chunk)
                read += len(chunk)
        followed.offset += read
        return read

    def summaries(self) -> dict[str, RunSummary]:
        """Each file's steady-state summary of what was read so far (following goes on)."""
        return {str(followed.path): followed.collector.summary.result() for followed in self._files}

    def finish(self) -> list[ParsedLog]:
        """End every file (unterminated last lines read) and return each file's parse, in the order given."""
        logs = []
        for followed in self._files:
            for reader in [*followed.pending, followed.reader]:
                followed.collector.end_source(reader.end())
            logs.append(followed.collector.finish())
        return logs
