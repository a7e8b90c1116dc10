"""Which files make up a run: a directory, several paths or a glob become one ordered list of text logs.

A failed job leaves its story in several places: every node's training log, a SLURM job's `.out`/`.err`
files, a rank's stderr, a `dmesg` excerpt. `expand_log_paths` turns what a user passes into those files:
- a file is taken as it is (`-` is standard input), provided it is text;
- a directory is searched recursively for log-like files (`*.log`, `*.out`, `*.err`, `*.txt`, `stdout`,
  `stderr`, `dmesg*`, ...) that are text; torchrun's per-rank mirrors (`ranks/` under a node's directory that
  also has a combined log) are skipped, since the node's log already holds the same lines;
- a pattern with `*`, `?` or `[` is expanded (`**` recurses), for shells that pass it unexpanded;
- a gzip-, xz- or bzip2-compressed log (`training.log.gz`, told by its magic bytes) is read decompressed
  (`open_log`); a zstd one is refused naming the format and how to unpack it;
- a pipe or other stream (`<(zcat run.log.gz)`, a FIFO, `/dev/stdin`) and standard input are judged on the bytes
  the reading takes first (`open_log`), then read from their start: what the sniff took is handed back first;
  compressed bytes there (`cat run.log.gz |`) are unpacked and judged on what they hold;
- standard input is read once: a reader that may read the logs twice (`diagnose` with flags that turn out not to be
  the log's run) opens them inside `stdin_read_again`, and the second reading gets a copy of what the first read.
"Text" is judged on the first `SNIFF_BYTES`: no NUL byte, and at least `MIN_PRINTABLE_FRACTION` of the bytes
printable or UTF-8 (a checkpoint, a core dump or a `.npy` file is not a log).
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from megapilot.errors import MegapilotError
from megapilot.files import is_disk_full
from megapilot.logs.lines import BINARY_RUN_RE

SNIFF_BYTES = 8192
SNIFF_SPAN_BYTES = 1 << 20  # a crash's NUL padding can fill the start of a log: text is looked for this far
# A line a person could read: 16 printable characters in a row, a space among them (the strings of a checkpoint's
# zip and pickle, `archive/data.pkl`, `_rebuild_tensor_v2`, have none).
TEXT_LINE_RE = re.compile(r"(?=[\x21-\x7e\t ]{16})[\x21-\x7e]*[\t ]")
MAX_GARBAGE_FRACTION = 0.5  # binary runs in a crash log's text (random bytes and checkpoints are nearly all runs)
NUL_RUN_RE = re.compile("\x00+")
MIN_PRINTABLE_FRACTION = 0.9  # ANSI colours and a few mangled bytes still read as text; binary data is far below
LOG_SUFFIXES = frozenset({".log", ".out", ".err", ".txt", ".stdout", ".stderr", ".trace"})
LOG_NAMES = re.compile(r"^(?:stdout|stderr|dmesg|console|output|error)(?:[._-].*)?$", re.IGNORECASE)
RANK_MIRROR_DIR = "ranks"  # torchrun's --log-dir as the executors set it: copies of the node's combined log
# Directories a run keeps next to its logs that hold no log: dataset index caches, checkpoints, Python caches.
SKIPPED_DIRS = frozenset({"cache", "checkpoints", "checkpoint", "ckpt", "__pycache__", "node_modules"})
_GLOB_CHARS = frozenset("*?[")


GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
BZIP2_MAGIC, BZIP2_BLOCK = b"BZh", b"1AY&SY"  # `BZh<level>`, then the first block's magic (pi's digits)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# What log rotation and archiving compress with, as the files name it (a directory's `training.log.xz` is a log).
COMPRESSED_SUFFIXES = frozenset({".gz", ".xz", ".bz2"})


def compression_of(path: Path) -> str | None:
    """`gzip`, `xz`, `bzip2` or `zstd` when the file starts with that format's magic bytes, else None."""
    with open(path, "rb") as stream:
        return compression_of_head(stream.read(10))


def compression_of_head(head: bytes) -> str | None:
    """`compression_of` for a stream's first bytes (standard input, a pipe)."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(BZIP2_MAGIC) and head[4:10] == BZIP2_BLOCK:
        return "bzip2"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return None


def is_gzip(path: Path) -> bool:
    return compression_of(path) == "gzip"


def refuse_unreadable_compression(path: Path, flag: str = "FILE") -> None:
    """A zstd log (Python 3.11's standard library has no zstd) is refused naming the format and the way round it,
    not as 'not a text file'."""
    if path.is_file() and compression_of(path) == "zstd":
        raise MegapilotError(f"{path} is zstd-compressed, which megapilot cannot unpack", field=flag,
                             fix=f"unpack it first (zstd -d {path}), or pipe it in as `-`: "
                                 f"zstd -dc {path} | megapilot diagnose -")


def is_stream(path: Path) -> bool:
    """A path that exists but is neither a regular file nor a directory: a pipe, a FIFO, a character device."""
    return path.exists() and not path.is_file() and not path.is_dir()


STDIN_NAME = "<stdin>"  # standard input's name in messages and evidence (`-` on the command line)


def shown_name(path: str) -> str:
    """A log's name in records and messages: `<stdin>` for `-`, else the path as given."""
    return STDIN_NAME if path == "-" else path
NOT_TEXT_FIX = "pass a log (text a job printed), not a checkpoint or other binary file"


@contextmanager
def open_log(path: str) -> Iterator[BinaryIO]:
    """A log's bytes, decompressed when gzip, xz or bzip2 wrote it; `-` is standard input, a pipe is read as it
    comes. Standard input and a pipe are refused as a file is (`is_text`) when their first bytes are not text."""
    if path == "-":
        spool = _StdinSpool.current
        if spool is None:
            yield _SniffedStream.of_stdin().replayed()
        else:
            with spool.open() as stream:
                yield stream
        return
    file = Path(path)
    if not (file.is_file() or is_stream(file)):
        raise MegapilotError(f"no such log file: {path}", field="FILE",
                             fix="pass the path of a training log, or - for stdin")
    compression = compression_of(file) if file.is_file() else None
    if compression == "zstd":
        refuse_unreadable_compression(file)
    with open(file, "rb") as stream:
        if compression is not None:  # gzip, xz or bzip2: unpacked as a piped one is (`_unpacking`)
            with _unpacking(compression, stream) as unpacked:
                yield unpacked
        elif is_stream(file):  # nothing to read twice: judged on the bytes the reading takes first
            yield _SniffedStream(stream, path).replayed()
        else:
            yield stream


def _sniff_head(stream: BinaryIO) -> bytes:
    """The bytes a log is judged on (`is_text`): the first SNIFF_BYTES, or up to SNIFF_SPAN_BYTES past a NUL."""
    head = stream.read(SNIFF_BYTES)
    if b"\x00" in head:  # padding can fill the start of a log: look further for its text
        head += stream.read(SNIFF_SPAN_BYTES - len(head))
    return head


class _SniffedStream:
    """A stream read once (standard input, a pipe) whose head was taken to judge it: `replayed` reads it from its
    start. Standard input is sniffed once per process (`of_stdin`), by the first of `expand_log_paths` (which
    refuses it under the option's name) and `open_log`."""

    _stdin: _SniffedStream | None = None

    def __init__(self, source: BinaryIO, name: str) -> None:
        self.source, self.name = source, name
        self._reader = source  # what is read after the head: the source, or what it unpacks to
        self.head = _sniff_head(source)
        self.compression = compression_of_head(self.head)
        if self.compression in ("gzip", "xz", "bzip2"):  # `zcat`-less `cat run.log.gz |`: judged on what it holds
            self._reader = _unpacking(self.compression, io.BufferedReader(_Replay(self.head, source)))
            self.head = _sniff_head(self._reader)
        self.text = self.compression != "zstd" and head_is_text(self.head)

    @classmethod
    def of_stdin(cls) -> _SniffedStream:
        stdin = sys.stdin.buffer
        if cls._stdin is None or cls._stdin.source is not stdin:  # a new standard input (tests swap it)
            cls._stdin = cls(stdin, STDIN_NAME)
        return cls._stdin

    def refuse_if_binary(self, flag: str = "FILE") -> None:
        if self.compression == "zstd":
            raise MegapilotError(f"{self.name} is zstd-compressed, which megapilot cannot unpack", field=flag,
                                 fix="unpack it on the way in: zstd -dc <file> | megapilot diagnose -")
        if not self.text:
            raise MegapilotError(f"{self.name} is not a text file", field=flag, fix=NOT_TEXT_FIX)

    def replayed(self) -> io.BufferedReader:
        """The whole stream, head first (refused if it is not text); the head is handed back once."""
        self.refuse_if_binary()
        if _SniffedStream._stdin is self:
            _SniffedStream._stdin = None  # read from here on: a later opening reads what is left
        head, self.head = self.head, b""
        return io.BufferedReader(_Replay(head, self._reader), buffer_size=SNIFF_BYTES)


def _unpacking(compression: str, stream: BinaryIO) -> BinaryIO:
    """A reader of what a gzip, xz or bzip2 stream holds."""
    if compression == "gzip":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]  # reads as a binary stream
    if compression == "xz":
        import lzma  # late: only an xz log needs it

        return lzma.LZMAFile(stream)  # type: ignore[return-value]  # reads as a binary stream
    import bz2  # late: only a bzip2 log needs it

    return bz2.BZ2File(stream)  # type: ignore[return-value]  # reads as a binary stream


class _Replay(io.RawIOBase):
    """`head`, then the rest of `source`."""

    def __init__(self, head: bytes, source: BinaryIO) -> None:
        self._head, self._source = memoryview(head), source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as view:
            if self._head:
                size = min(len(view), len(self._head))
                view[:size], self._head = self._head[:size], self._head[size:]
                return size
            data = self._source.read(len(view))
            view[:len(data)] = data
            return len(data)


class _StdinSpool:
    """Standard input as `stdin_read_again` keeps it: the first opening reads it through, a copy going to an
    anonymous temporary file; every later opening reads that copy from its start."""

    current: _StdinSpool | None = None

    def __init__(self) -> None:
        self.copy: BinaryIO = tempfile.TemporaryFile()  # noqa: SIM115  # closed by `stdin_read_again`
        self.read = False

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        if self.read:
            with open(os.dup(self.copy.fileno()), "rb") as again:  # its own descriptor: the reader may close it
                again.seek(0)
                yield again
            return
        teed = io.BufferedReader(_Tee(_SniffedStream.of_stdin().replayed(), self.copy), buffer_size=SNIFF_BYTES)
        yield teed
        while teed.read(SNIFF_BYTES):  # what the reader left unread is copied too: the copy is the whole input
            pass
        self.copy.flush()
        self.read = True


class _Tee(io.RawIOBase):
    """`source`'s bytes, each also written to `copy`."""

    def __init__(self, source: io.BufferedReader, copy: BinaryIO) -> None:
        self._source, self._copy = source, copy

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as view:
            size = self._source.readinto(view)
            if size:
                try:
                    self._copy.write(view[:size])
                except OSError as exc:
                    if not is_disk_full(exc):
                        raise
                    raise MegapilotError(f"no room to keep a copy of standard input in {tempfile.gettempdir()} "
                                         "(a log read from a pipe is read twice)", field="LOG",
                                         fix="set TMPDIR to a folder with room, or pass the log as a file") from None
            return size or 0


@contextmanager
def stdin_read_again() -> Iterator[None]:
    """Within it, `open_log("-")` may be called more than once and reads the whole of standard input each time:
    standard input itself is read once, by the first, and copied to a temporary file (deleted on leaving) that the
    later ones read. Without it a second reading finds standard input used up. Nested, the outer copy serves."""
    if _StdinSpool.current is not None:
        yield
        return
    spool = _StdinSpool.current = _StdinSpool()
    try:
        yield
    finally:
        _StdinSpool.current = None
        spool.copy.close()


def is_text(path: Path) -> bool:
    """Whether the file holds text (an empty file is text: a log that has not started), judged on its head
    (`head_is_text`)."""
    with open_log(str(path)) as stream:  # a gzip'd log is judged by what it holds
        return head_is_text(_sniff_head(stream))


def head_is_text(head: bytes) -> bool:
    """Whether a log's first bytes (`_sniff_head`) are text. A crashed node's log may hold blocks of NULs between its
    lines, or some garbage (`lines.decode_log_text` cuts both out): NUL runs are left out of the judgement, and at
    most half of the rest may be garbage; a file with no text at all (NULs only, a checkpoint, random bytes) is not
    text: it holds no line of words (`TEXT_LINE_RE`)."""
    if not head:
        return True
    text = head.decode("utf-8", "surrogateescape")
    if "\x00" not in text and _readable(text):
        return True
    text = NUL_RUN_RE.sub("", text)
    if TEXT_LINE_RE.search(text) is None:
        return False
    garbage = sum(len(found.group()) for found in BINARY_RUN_RE.finditer(text))
    return _readable(text) or garbage <= MAX_GARBAGE_FRACTION * len(text)


def _readable(text: str) -> bool:
    unreadable = sum(1 for ch in text if (ch < " " and ch not in "\t\n\r\x1b\x08\x0c") or "\udc80" <= ch <= "\udcff")
    return unreadable <= (1 - MIN_PRINTABLE_FRACTION) * len(text)


def _looks_like_log(path: Path) -> bool:
    if path.suffix.lower() in COMPRESSED_SUFFIXES:  # training.log.gz: a compressed log, named as the log it holds
        path = path.with_suffix("")
    return path.suffix.lower() in LOG_SUFFIXES or bool(LOG_NAMES.match(path.name)) or \
        path.name.startswith("slurm-")


def _is_json_document(path: Path) -> bool:
    """A `.txt` that holds one JSON document (dataset descriptions, configs) is data, not a log."""
    with open(path, "rb") as stream:
        head = stream.read(SNIFF_BYTES).lstrip()
    return head[:1] in (b"{", b"[") and path.stat().st_size <= SNIFF_BYTES and head.rstrip()[-1:] in (b"}", b"]")


def _is_rank_mirror(path: Path, directory: Path) -> bool:
    """A file under a `ranks/` directory whose parent also holds a combined log."""
    relative = path.relative_to(directory).parts
    for depth, part in enumerate(relative[:-1]):
        if part == RANK_MIRROR_DIR:
            node_dir = directory.joinpath(*relative[:depth])
            if any(_looks_like_log(sibling) for sibling in node_dir.iterdir() if sibling.is_file()):
                return True
    return False


def _natural_key(path: Path) -> tuple[object, ...]:
    """`node2` before `node10`."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path)))


def logs_in_directory(directory: Path) -> list[Path]:
    """The text logs under a directory, in natural order."""
    found = [path for path in directory.rglob("*") if path.is_file() and _looks_like_log(path)
             and not _in_skipped_dir(path, directory) and not _is_rank_mirror(path, directory)]
    return sorted((path for path in found if is_text(path) and not _is_json_document(path)), key=_natural_key)


def _in_skipped_dir(path: Path, directory: Path) -> bool:
    return any(part in SKIPPED_DIRS or part.startswith(".") for part in path.relative_to(directory).parts[:-1])


def expand_log_paths(arguments: list[str], *, flag: str = "FILE") -> list[str]:
    """The log files the arguments name, each once, in the order given (a directory's and a pattern's files in
    natural order). Raises `MegapilotError` for a missing path, a directory without logs, a pattern that matches
    nothing, or a named file that is not text."""
    files: list[str] = []
    for argument in arguments:
        for name in _expand_one(argument, flag):
            if name not in files:
                files.append(name)
    return files


def expand_follow_paths(arguments: list[str], *, flag: str = "FILE") -> list[str]:
    """As `expand_log_paths`, for logs still being written (`--follow`): a named file that does not exist yet is
    kept, to be waited for (a run's logs appear once it starts); standard input cannot be followed."""
    files: list[str] = []
    for argument in arguments:
        if argument == "-":
            raise MegapilotError("standard input cannot be followed", field=flag,
                                 fix="pass the log files (or their directory) with --follow, or leave --follow out")
        waited = not Path(argument).exists() and not _GLOB_CHARS & set(argument)
        for name in [argument] if waited else _expand_one(argument, flag):
            if name not in files:
                files.append(name)
    return files


def _expand_one(argument: str, flag: str) -> list[str]:
    if argument == "-":  # judged now, under the option's name; its head waits for `open_log`
        _SniffedStream.of_stdin().refuse_if_binary(flag)
        return [argument]
    path = Path(argument)
    if path.is_dir():
        logs = logs_in_directory(path)
        if not logs:
            raise MegapilotError(f"{argument} holds no log file", field=flag,
                                 fix="pass the directory a job wrote its logs to (*.log, *.out, *.err files), "
                                     "or the log files themselves")
        return [str(log) for log in logs]
    if is_stream(path):  # a pipe: sniffing would eat what it sends
        return [argument]
    if path.is_file():
        refuse_unreadable_compression(path, flag)
        if not is_text(path):
            raise MegapilotError(f"{argument} is not a text file", field=flag, fix=NOT_TEXT_FIX)
        return [argument]
    if _GLOB_CHARS & set(argument):
        matched = sorted((Path(name) for name in glob.glob(argument, recursive=True) if Path(name).is_file()),
                         key=_natural_key)
        texts = [str(name) for name in matched if is_text(name)]
        if not texts:
            raise MegapilotError(f"no {'text ' if matched else ''}file matches {argument}", field=flag,
                                 fix="check the pattern, e.g. 'out-node*/training.log' or 'slurm-1234.*'")
        return texts
    raise MegapilotError(f"no such log file: {argument}", field=flag,
                         fix="pass the path of a training log, a directory of logs, or - for stdin")


def source_labels(files: list[str]) -> dict[str, str]:
    """Short names for evidence: each file relative to the files' common directory (`out-node1/training.log`), or
    its name alone when only one file was read."""
    real = [name for name in files if name not in ("-", STDIN_NAME)]
    if len(real) <= 1:
        return {name: Path(name).name for name in real}
    parents = [Path(name).resolve().parent for name in real]
    common = Path(*_common_parts([parent.parts for parent in parents]))
    return {name: str(Path(name).resolve().relative_to(common)) for name in real}


def _common_parts(parts: list[tuple[str, ...]]) -> tuple[str, ...]:
    common: list[str] = []
    for items in zip(*parts, strict=False):
        if len(set(items)) != 1:
            break
        common.append(items[0])
    return tuple(common) or ("/",)
