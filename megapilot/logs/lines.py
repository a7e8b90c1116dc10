"""Turning bytes into numbered lines: files, stdin and growing files.

Line numbers count `\\n`-terminated lines, as an editor does, so evidence can be found again. A
`\\r` inside a line (progress bars, CRLF files) splits it into segments that share the line number;
empty segments are dropped. Binary runs (NUL padding, garbage: `decode_log_text`) are cut out like a `\r`
and counted; other bytes that are not UTF-8 become U+FFFD. A truncated last line (no
final newline) is still yielded. Memory is bounded by the chunk size plus `MAX_LINE_BYTES`: an unfinished line
that grows past it is handed on up to its last `\r` (its segments so far, the line still open: a progress bar
that writes a whole run as one line of `\r` updates loses none), and one with no `\r` to end a segment there is
cut (the rest of it is dropped, not kept in memory).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20

# What a node that died mid-write leaves in its log: runs of NUL bytes (blocks the filesystem allocated but the
# write never filled), or binary garbage. Invalid UTF-8 bytes arrive as lone surrogates (`surrogateescape`).
# A run is NULs, or at least four bad bytes (NUL, control bytes a terminal does not use, invalid UTF-8) each within
# three bytes of the next, inside one line; a single invalid byte (a Latin-1 `é`) is text that is not UTF-8 and
# stays (as U+FFFD). A run becomes `\r`: the text on either side of it is read as segments of the same line.
_BAD = "\x00-\x07\x0b\x0e-\x1a\x1c-\x1f\x7f\udc80-\udcff"
BINARY_RUN_RE = re.compile(f"\x00+|[{_BAD}](?:[^\n]{{0,3}}[{_BAD}]){{3,}}")
_CONTROL_RE = re.compile("[\x00-\x07\x0b\x0e-\x1a\x1c-\x1f\x7f]")
_ESCAPED_RE = re.compile("[\udc80-\udcff]+")
MAX_BINARY_RUNS_KEPT = 20
# A last line with no newline was cut mid-write (a crash, a copy of a live log) and may end inside a number:
# `elapsed time per iteration (ms): 520` of 5200. Its trailing number is not read.
_CUT_NUMBER_RE = re.compile(rb"[0-9][0-9.eE+-]*$")


def cut_line(unterminated: bytes) -> bytes:
    """A stream's last line, which no newline ended, without the trailing number the cut may have shortened."""
    return _CUT_NUMBER_RE.sub(b"", unterminated)


class Offsets(NamedTuple):
    """Where a block's bytes lie in their file: byte i at `start + i`, `dropped` more from `cut_at` on (the rest of an
    over-long line was dropped there; -1: nothing was)."""

    start: int
    cut_at: int = -1
    dropped: int = 0

    def at(self, i: int) -> int:
        return self.start + i + (self.dropped if 0 <= self.cut_at <= i else 0)

    def shifted(self, by: int) -> Offsets:
        """The offsets of block[by:]."""
        if self.cut_at < 0 or by >= self.cut_at:
            return Offsets(self.at(by))
        return Offsets(self.start + by, self.cut_at - by, self.dropped)


@dataclass
class BinaryTally:
    """Binary data skipped in one source: bytes in all, and where (first line, last line, bytes, byte offset in the
    file of its first byte) for the first `MAX_BINARY_RUNS_KEPT` stretches (runs on consecutive lines are one
    stretch)."""

    bytes_skipped: int = 0
    runs: list[tuple[int, int, int, int]] = field(default_factory=list)
    runs_dropped: int = 0

    def add(self, line_no: int, size: int, offset: int) -> None:
        self.bytes_skipped += size
        if self.runs and self.runs[-1][1] + 1 >= line_no:
            first, _, total, first_offset = self.runs[-1]
            self.runs[-1] = (first, line_no, total + size, first_offset)
        elif len(self.runs) < MAX_BINARY_RUNS_KEPT:
            self.runs.append((line_no, line_no, size, offset))
        else:
            self.runs_dropped += 1


def decode_log_text(raw: bytes | bytearray, first_line_no: int = 1, tally: BinaryTally | None = None,
                    offsets: Offsets | None = None) -> str:
    """Bytes of whole lines → text, binary runs cut out (`BINARY_RUN_RE`, each counted in `tally` with its line and
    its byte offset in the file: `offsets` says where raw[0] lies, else 0) and other undecodable bytes as U+FFFD.
    The one decoding of both reading paths, so they read the same text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "surrogateescape")
    else:
        if _CONTROL_RE.search(text) is None:
            return text
    if BINARY_RUN_RE.search(text) is not None:
        pieces, pos, byte_pos = [], 0, 0
        for found in BINARY_RUN_RE.finditer(text):
            if tally is not None:
                byte_pos += len(text[pos:found.start()].encode("utf-8", "surrogateescape"))
                size = len(found.group().encode("utf-8", "surrogateescape"))
                offset = offsets.at(byte_pos) if offsets is not None else byte_pos
                tally.add(first_line_no + text.count("\n", 0, found.start()), size, offset)
                byte_pos += size
            pieces.append(text[pos:found.start()])
            pieces.append("\r")
            pos = found.end()
        pieces.append(text[pos:])
        text = "".join(pieces)
    return _ESCAPED_RE.sub(lambda found: "\ufffd" * len(found.group()), text)


def split_carriage_returns(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Split each numbered line at `\\r` into segments sharing its number; drop empty segments."""
    for line_no, line in lines:
        if "\r" in line:
            for segment in line.split("\r"):
                if segment:
                    yield line_no, segment
        else:
            yield line_no, line


def _split_text(text: str, first_line_no: int) -> Iterator[tuple[int, str]]:
    return split_carriage_returns(enumerate(text.split("\n"), start=first_line_no))


def block_end(buffer: bytes | bytearray, filled: int, limit: int = MAX_LINE_BYTES) -> tuple[int, bool]:
    """Where the block of buffer[:filled] ends (0: none yet) and whether its last line goes on past it. The block
    is the complete lines; when the unfinished line after them is longer than `limit` and holds a `\r` after its
    first byte, the block takes that line up to its last `\r` too (that `\r` stands for the newline the block ends
    with; the line goes on past it). The one rule of both splitters (`BlockSplitter` and the bulk reader's reused
    buffer), so both engines read the same segments, and of the executors' `LogTail`."""
    end = buffer.rfind(b"\n", 0, filled) + 1
    if filled - end > limit:
        segments_end = buffer.rfind(b"\r", end, filled)
        if segments_end > end:
            return segments_end + 1, True
    return end, False


class BlockSplitter:
    """Incremental bytes → blocks of lines, as (buffer, end) with buffer[:end] the lines (each ending with its
    newline); the unfinished line waits for the next chunk. One that grows past `MAX_LINE_BYTES` is handed on up
    to its last `\r` (`block_end`; `continues` is then true: the block's last line goes on in the next block),
    else cut there, so memory stays bounded."""

    def __init__(self) -> None:
        self._tail = b""
        self._tail_offsets = Offsets(0)
        self.offsets = Offsets(0)  # where the last block returned (or the flushed line) lies in the file
        self.continues = False  # the last block returned ends inside a line (at a `\r`), not at its newline

    def feed(self, chunk: bytes) -> tuple[bytes, int] | None:
        """The lines the chunk finishes (and an over-long line's segments), or None when it finishes none."""
        buffer = self._tail + chunk if self._tail else chunk
        offsets = self._tail_offsets
        end, continues = block_end(buffer, len(buffer))
        if end == 0:
            self._tail = buffer[:MAX_LINE_BYTES]
            if len(buffer) > len(self._tail):
                self._tail_offsets = Offsets(offsets.start, len(self._tail),
                                             offsets.dropped + len(buffer) - len(self._tail))
            return None
        self._tail = buffer[end:end + MAX_LINE_BYTES]
        dropped = len(buffer) - end - len(self._tail)
        self._tail_offsets = Offsets(offsets.at(end), len(self._tail) if dropped else -1, dropped)
        self.offsets = offsets
        self.continues = continues
        if continues:  # the `\r` the segments end at becomes the block's final newline
            return buffer[:end - 1] + b"\n", end
        return buffer, end

    @property
    def pending(self) -> bytes:
        """The unfinished line so far (what `flush` would give), left where it is."""
        return self._tail

    def flush(self) -> bytes | None:
        """The unterminated last line, if any, without a trailing number the cut may have shortened."""
        tail, self._tail = self._tail, b""
        self.offsets = self._tail_offsets
        return cut_line(tail) if tail else None  # a line still, if only a number was on it


class LineSplitter:
    """Incremental bytes → (line_no, text) splitter; `feed` chunks, then `flush` at the end."""

    def __init__(self, tally: BinaryTally | None = None) -> None:
        self.lines_done = 0
        self._blocks = BlockSplitter()
        self.tally = tally

    def feed(self, chunk: bytes) -> Iterator[tuple[int, str]]:
        block = self._blocks.feed(chunk)
        if block is None:
            return
        buffer, end = block
        complete = buffer[:end - 1]  # without the final newline
        first = self.lines_done + 1
        self.lines_done += complete.count(b"\n") + (0 if self._blocks.continues else 1)
        yield from _split_text(decode_log_text(complete, first, self.tally, self._blocks.offsets), first)

    def flush(self) -> Iterator[tuple[int, str]]:
        """Yield the unterminated last line, if any."""
        tail = self._blocks.flush()
        if tail is not None:
            yield from _split_text(decode_log_text(tail, self.lines_done + 1, self.tally, self._blocks.offsets),
                                   self.lines_done + 1)
            self.lines_done += 1


def read_lines(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES,
               tally: BinaryTally | None = None) -> Iterator[tuple[int, str]]:
    """All lines of a binary stream (a file or stdin's buffer), to its end (binary runs counted in `tally`)."""
    splitter = LineSplitter(tally)
    while chunk := stream.read(chunk_bytes):
        yield from splitter.feed(chunk)
    yield from splitter.flush()


def follow_lines(
    path: Path,
    *,
    poll_s: float = 0.2,
    idle_timeout_s: float | None = None,
    timeout_s: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_idle: Callable[[float], None] | None = None,
) -> Iterator[tuple[int, str]]:
    """Lines of a growing file (`tail -F` style), until a stop condition.

    Stops when `should_stop()` turns true (checked after every batch of lines and every poll), when
    no new byte has arrived for `idle_timeout_s`, or after `timeout_s` in all. The file may not exist
    yet (it is waited for) and may be truncated or replaced (reading restarts from its beginning).
    `on_idle(seconds_since_last_byte)` is called on each empty poll, so a caller can raise a hang
    alert from wall-clock time. A line still unterminated when following stops is yielded last.
    """
    started = last_byte_at = time.monotonic()
    splitter = LineSplitter()
    stream: BinaryIO | None = None
    identity: tuple[int, int] | None = None
    try:
        while True:
            if stream is None and path.exists():
                stream = open(path, "rb")  # noqa: SIM115 - closed in finally
                identity = _identity(path)
            chunk = stream.read(CHUNK_BYTES) if stream is not None else b""
            now = time.monotonic()
            if chunk:
                last_byte_at = now
                yield from splitter.feed(chunk)
                if should_stop is not None and should_stop():
                    break
                continue
            if should_stop is not None and should_stop():
                break
            if timeout_s is not None and now - started >= timeout_s:
                break
            if idle_timeout_s is not None and now - last_byte_at >= idle_timeout_s:
                break
            if on_idle is not None:
                on_idle(now - last_byte_at)
            if stream is not None and _replaced_or_truncated(path, stream, identity):
                stream.close()
                stream = None
                splitter = LineSplitter()
                continue
            time.sleep(poll_s)
        yield from splitter.flush()
    finally:
        if stream is not None:
            stream.close()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _replaced_or_truncated(path: Path, stream: BinaryIO, identity: tuple[int, int] | None) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    if (stat.st_dev, stat.st_ino) != identity:
        return True
    return stat.st_size < stream.tell()


class LineWindow:
    """A binary stream with only its lines `first` to `last` (1-based, `last` None: to the end) kept: every line
    before them reads as an empty line, so the kept lines keep their numbers (a finding quotes the file's own line),
    and the stream ends after `last`. One run's part of a file that holds several runs one after the other."""

    def __init__(self, stream: BinaryIO, first: int, last: int | None = None) -> None:
        self._stream = stream
        self._first = max(1, first)
        self._last = last
        self._line = 1  # the number of the line the next byte read belongs to

    def read(self, size: int = -1) -> bytes:
        """At least one byte until the window's end (the readers stop at an empty read)."""
        while self._last is None or self._line <= self._last:
            chunk = self._stream.read(size if size is not None and size > 0 else CHUNK_BYTES)
            if not chunk:
                return b""
            kept = self._window(chunk)
            if kept:
                return kept
        return b""

    def _window(self, chunk: bytes) -> bytes:
        out = bytearray()
        start = 0
        newlines = chunk.count(b"\n")
        if self._line + newlines < self._first:  # the whole chunk before the window (a long first run)
            self._line += newlines
            return b"\n" * newlines
        while start < len(chunk) and self._line < self._first:  # before the window: each line's newline alone
            newline = chunk.find(b"\n", start)
            if newline < 0:
                return bytes(out)
            out += b"\n"
            self._line += 1
            start = newline + 1
        if self._last is None or self._line + chunk.count(b"\n", start) <= self._last:
            self._line += chunk.count(b"\n", start)
            return bytes(out) + chunk[start:]
        end = start
        while end < len(chunk) and self._line <= self._last:  # inside it: up to the newline that ends `last`
            newline = chunk.find(b"\n", end)
            if newline < 0:
                end = len(chunk)
                break
            self._line += 1
            end = newline + 1
        return bytes(out) + chunk[start:end]
