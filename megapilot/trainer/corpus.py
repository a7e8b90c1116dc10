"""Text files → Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), and the shipped corpus.

The files are those Megatron-Core's own `IndexedDatasetBuilder` writes (byte for byte, checked by a
test), so `GPTDataset` reads them exactly as it reads data made by Megatron-LM's
`tools/preprocess_data.py` (each document followed by the end-of-document token, as with `--append-eod`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from megapilot.data import ByteTokenizer, read_documents
from megapilot.data.documents import BytesRead, check_input
from megapilot.data.indexed import IndexedDatasetWriter
from megapilot.errors import MegapilotError

SHIPPED_CORPUS = Path(__file__).parent / "data" / "corpus" / "kjv_pentateuch.txt.gz"
SHIPPED_CORPUS_NAME = "kjv_pentateuch_byte"
TOKENIZERS = ("byte",)
DATASET_SUFFIXES = (".bin", ".idx")  # the pair Megatron's --data-path PREFIX reads


@dataclass(frozen=True)
class PreparedDataset:
    """What `prepare_indexed_dataset` wrote."""

    prefix: str
    documents: int
    tokens: int
    tokenizer: str
    vocab_size: int

    @property
    def bin_path(self) -> str:
        return self.prefix + ".bin"

    @property
    def idx_path(self) -> str:
        return self.prefix + ".idx"


def check_output_prefix(output_prefix: str, *, force: bool = False) -> Path:
    """The rules of a dataset's prefix, for every caller: an absolute stem (Megatron's `--data-path` names the
    pair, not a folder or one of its files) in an existing folder, and no dataset there unless `force`."""
    prefix = Path(output_prefix)
    if not prefix.is_absolute():
        raise MegapilotError(f"{output_prefix!r} is not an absolute path", field="--output-prefix",
                             fix="give an absolute path prefix, e.g. /data/corpus/mytext")
    if output_prefix.endswith("/") or prefix.name in ("", "..") or prefix.is_dir():
        raise MegapilotError(f"{output_prefix!r} is a directory; the prefix is the stem of the two files",
                             field="--output-prefix",
                             fix=f"name the files inside it, e.g. --output-prefix {prefix / 'corpus'} "
                                 "(writes corpus.bin and corpus.idx)")
    if prefix.suffix in DATASET_SUFFIXES:
        raise MegapilotError(f"{output_prefix!r} ends in {prefix.suffix}; it would write {prefix.name}.bin and "
                             f"{prefix.name}.idx", field="--output-prefix",
                             fix=f"give the stem, without the suffix: --output-prefix {prefix.with_suffix('')}")
    if not prefix.parent.is_dir():
        raise MegapilotError(f"directory {prefix.parent} does not exist", field="--output-prefix",
                             fix=f"create it first: mkdir -p {prefix.parent}")
    existing = [Path(str(prefix) + suffix) for suffix in DATASET_SUFFIXES]
    existing = [path for path in existing if path.exists() or path.is_symlink()]
    folders = [str(path) for path in existing if path.is_dir()]
    if folders:  # no file can replace it, and finding out after the .bin is replaced would break the pair
        raise MegapilotError(f"{folders[0]} is a directory, where the dataset's file goes", field="--output-prefix",
                             fix="remove it, or give another --output-prefix")
    if existing and not force:
        raise MegapilotError(f"a dataset is already there ({', '.join(map(str, existing))})", field="--output-prefix",
                             fix="pass --force to replace it, or another --output-prefix")
    return prefix


@contextmanager
def _staged(prefix: Path) -> Iterator[str]:
    """A scratch prefix beside `prefix`. On a clean exit its pair is renamed into place (`.idx` last, so its
    presence means complete); on an exception nothing at `prefix` is touched and the scratch files go: a failed
    write removes only what it wrote, never a dataset already there."""
    with tempfile.TemporaryDirectory(dir=prefix.parent, prefix=f".{prefix.name}.build-") as scratch:
        partial = str(Path(scratch) / prefix.name)
        yield partial
        os.replace(partial + ".bin", str(prefix) + ".bin")
        try:
            os.replace(partial + ".idx", str(prefix) + ".idx")
        except OSError:
            Path(str(prefix) + ".bin").unlink(missing_ok=True)  # this call's .bin, not to be read with another .idx
            raise


def _write_indexed_dataset(input_path: Path, prefix: str, json_key: str,
                           on_bytes: BytesRead | None = None) -> tuple[int, int]:
    """Tokenize every document into `prefix.bin/.idx`; returns (documents, tokens).

    Written by `megapilot.data.indexed` (standard library only), byte for byte what Megatron-Core's
    `IndexedDatasetBuilder` writes, so preparing data imports neither torch nor megatron-core.
    """
    tokenizer = ByteTokenizer()
    with IndexedDatasetWriter(prefix, tokenizer.vocab_size) as writer:
        for text in read_documents(input_path, json_key=json_key, on_bytes=on_bytes):
            writer.add_document(tokenizer.tokenize(text) + [tokenizer.eod])
        writer.finish()
    return writer.documents, writer.tokens


def prepare_indexed_dataset(input_path: Path | str, output_prefix: str, *, tokenizer: str = "byte",
                            json_key: str = "text", on_bytes: BytesRead | None = None,
                            force: bool = False) -> PreparedDataset:
    """Convert a `.jsonl`/`.txt` file into `output_prefix.bin` and `output_prefix.idx` (`on_bytes`: progress).

    The prefix follows `check_output_prefix`: a dataset already there is replaced only with `force`, and only
    once the new one is whole; a failure leaves the prefix as it was. A failure to read names INPUT, one to
    write names `--output-prefix` (both MegapilotError).
    """
    if tokenizer not in TOKENIZERS:
        raise MegapilotError(f"unknown tokenizer {tokenizer!r}", field="--tokenizer",
                             fix=f"use one of: {', '.join(TOKENIZERS)}")
    check_input(input_path)
    prefix = check_output_prefix(output_prefix, force=force)
    try:
        with _staged(prefix) as partial:
            documents, tokens = _write_indexed_dataset(Path(input_path), partial, json_key, on_bytes)
            if documents == 0:
                raise MegapilotError(f"{input_path} holds no text", field="INPUT",
                                     fix="give a file with at least one document")
    except OSError as exc:  # the reader names its own failures (INPUT): an OSError here is the writing
        raise MegapilotError(f"cannot write {prefix}.bin and .idx ({exc.strerror or exc})", field="--output-prefix",
                             fix="pass an --output-prefix in a writable directory with room for the dataset") \
            from None
    return PreparedDataset(str(prefix), documents, tokens, tokenizer, ByteTokenizer().vocab_size)


def default_dataset_prefix(cache_dir: Path | str) -> str:
    """Build the shipped corpus into `cache_dir` once (byte tokens) and return its prefix.

    Safe when several ranks call it at the same time: each builds under a temporary name and the
    finished files are renamed into place (`.idx` last, so its presence means complete).
    """
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    prefix = cache / SHIPPED_CORPUS_NAME
    if Path(str(prefix) + ".idx").is_file() and Path(str(prefix) + ".bin").is_file():
        return str(prefix)
    with _staged(prefix) as partial:
        _write_indexed_dataset(SHIPPED_CORPUS, partial, json_key="text")
    return str(prefix)
