"""Read user text files as documents: `.jsonl` (one JSON object per line) or `.txt` (paragraphs).

A `.txt` file is split into documents at blank lines, the way the shipped corpus is laid out
(one chapter per paragraph). A `.jsonl` line must be an object holding the text under `json_key`.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from megapilot.errors import MegapilotError

SUPPORTED_SUFFIXES = (".jsonl", ".txt", ".txt.gz", ".jsonl.gz")


# Called after each document with how many bytes of the file (compressed bytes for .gz) have been read.
BytesRead = Callable[[int], None]

# What a JSON value is, in the words of the JSON a user wrote.
_JSON_KINDS: dict[type, str] = {int: "a number", float: "a number", bool: "a boolean", list: "a list", str: "a string",
                                dict: "an object", type(None): "null"}


def _open_text(path: Path) -> IO[str]:
    # utf-8-sig: a byte-order mark (written by some Windows editors) is dropped, not read as the first document's
    # first three bytes (.txt) or refused as "not JSON" (.jsonl)
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open("r", encoding="utf-8-sig")


def _kind_of(path: Path) -> str:
    name = path.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".txt"):
        return "txt"
    raise MegapilotError(f"unsupported file type {path.name!r}", field="INPUT",
                         fix=f"give a file ending in one of {', '.join(SUPPORTED_SUFFIXES)}")


def _file_position(handle: IO[str]) -> Callable[[], int]:
    """How far into the file on disk a text handle has read (buffered: ahead by at most one buffer)."""
    raw = getattr(handle, "buffer", None)
    raw = getattr(raw, "fileobj", raw)  # a GzipFile: the position in the compressed file
    return raw.tell if raw is not None and hasattr(raw, "tell") else lambda: 0


def _jsonl_documents(path: Path, json_key: str, on_bytes: BytesRead | None) -> Iterator[str]:
    with _open_text(path) as handle:
        position = _file_position(handle)
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise MegapilotError(f"line {line_number} of {path} is not JSON ({exc.msg})", field="INPUT",
                                     fix="write one JSON object per line") from None
            if not isinstance(record, dict):
                raise MegapilotError(f"line {line_number} of {path} is {_JSON_KINDS.get(type(record), 'a value')}, "
                                     "not a JSON object", field="INPUT",
                                     fix=f'write one object per line, e.g. {{"{json_key}": "the text"}}')
            if json_key not in record:
                raise MegapilotError(f"line {line_number} of {path} has no field {json_key!r}",
                                     field="--json-key", fix="name the field that holds the text")
            if not isinstance(record[json_key], str):
                kind = _JSON_KINDS.get(type(record[json_key]), "something else")
                raise MegapilotError(f"line {line_number} of {path}: field {json_key!r} holds {kind}, not text",
                                     field="INPUT", fix=f"write the document's text as a JSON string in {json_key!r}")
            try:  # JSON can spell a lone surrogate (\ud800), which no UTF-8 byte sequence encodes
                if not record[json_key].isascii():
                    record[json_key].encode("utf-8")
            except UnicodeEncodeError as exc:
                raise MegapilotError(f"line {line_number} of {path}: field {json_key!r} holds a lone surrogate "
                                     f"({exc.object[exc.start:exc.end]!a}), which is no text", field="INPUT",
                                     fix="repair the line's \\u escapes (each high surrogate needs its low one)"
                                     ) from None
            if record[json_key]:
                yield record[json_key]
                if on_bytes is not None:
                    on_bytes(position())


def _txt_documents(path: Path, on_bytes: BytesRead | None) -> Iterator[str]:
    paragraph: list[str] = []
    with _open_text(path) as handle:
        position = _file_position(handle)
        for line in handle:
            if line.strip():
                paragraph.append(line.rstrip("\n"))
            elif paragraph:
                yield "\n".join(paragraph)
                paragraph = []
                if on_bytes is not None:
                    on_bytes(position())
    if paragraph:
        yield "\n".join(paragraph)


def check_input(path: Path | str) -> str:
    """Raise unless `path` is an existing `.jsonl`/`.txt` file; returns its kind."""
    path = Path(path)
    kind = _kind_of(path)
    if not path.is_file():
        raise MegapilotError(f"no such file: {path}", field="INPUT", fix="give the path of an existing file")
    return kind


def read_documents(path: Path | str, *, json_key: str = "text", on_bytes: BytesRead | None = None) -> Iterator[str]:
    """Yield the documents of a `.jsonl` or `.txt` file (optionally gzipped); `on_bytes` follows the reading.

    Every failure to read the file is a MegapilotError naming INPUT (not UTF-8, a broken .gz, an OSError), so a
    caller that also writes can tell its own failures from the input's."""
    path = Path(path)
    kind = check_input(path)
    try:
        if kind == "jsonl":
            yield from _jsonl_documents(path, json_key, on_bytes)
        else:
            yield from _txt_documents(path, on_bytes)
    except UnicodeDecodeError:
        raise MegapilotError(f"{path} is not UTF-8 text", field="INPUT", fix="convert the file to UTF-8") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:  # a .gz name on a file that is not (whole) gzip
        raise MegapilotError(f"{path} is not a readable gzip file ({exc})", field="INPUT",
                             fix="pass an intact .gz file, or drop the .gz suffix of a plain file") from None
    except OSError as exc:  # only the reading: what a caller does with each document raises in the caller
        raise MegapilotError(f"cannot read {path} ({exc.strerror or exc})", field="INPUT",
                             fix="check the INPUT path and that it is readable") from None
