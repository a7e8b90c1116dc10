"""Text files → Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`), and the shipped corpus.

The files are those Megatron-Core's own `IndexedDatasetBuilder` writes (byte for byte, checked by a
test), so `GPTDataset` reads them exactly as it reads data made by Megatron-LM's
`tools/preprocess_data.py` (each document followed by the end-of-document token, as with `--append-eod`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from megapilot.data import ByteTokenizer, read_documents
from megapilot.data.documents import BytesRead, check_input
from megapilot.data.indexed import IndexedDatasetWriter
from megapilot.errors import MegapilotError

SHIPPED_CORPUS = Path(__file__).parent / "data" / "corpus" / "kjv_pentateuch.txt.gz"
SHIPPED_CORPUS_NAME = "kjv_pentateuch_byte"
TOKENIZERS = ("byte",)


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


def _check_output_prefix(output_prefix: str) -> Path:
    prefix = Path(output_prefix)
    if not prefix.is_absolute():
        raise MegapilotError(f"{output_prefix!r} is not an absolute path", field="--output-prefix",
                             fix="give an absolute path prefix, e.g. /data/corpus/mytext")
    if prefix.name in ("", ".", ".."):
        raise MegapilotError("must end in a file name stem", field="--output-prefix",
                             fix="e.g. /data/corpus/mytext (writes mytext.bin and mytext.idx)")
    if not prefix.parent.is_dir():
        raise MegapilotError(f"directory {prefix.parent} does not exist", field="--output-prefix",
                             fix=f"create it first: mkdir -p {prefix.parent}")
    return prefix


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
                            json_key: str = "text", on_bytes: BytesRead | None = None) -> PreparedDataset:
    """Convert a `.jsonl`/`.txt` file into `output_prefix.bin` and `output_prefix.idx` (`on_bytes`: progress)."""
    if tokenizer not in TOKENIZERS:
        raise MegapilotError(f"unknown tokenizer {tokenizer!r}", field="--tokenizer",
                             fix=f"use one of: {', '.join(TOKENIZERS)}")
    check_input(input_path)
    prefix = _check_output_prefix(output_prefix)
    try:
        documents, tokens = _write_indexed_dataset(Path(input_path), str(prefix), json_key, on_bytes)
        if documents == 0:
            raise MegapilotError(f"{input_path} holds no text", field="INPUT",
                                 fix="give a file with at least one document")
    except BaseException:
        for suffix in (".bin", ".idx"):  # no half-written dataset left behind
            Path(str(prefix) + suffix).unlink(missing_ok=True)
        raise
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
    with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as scratch:
        partial = str(Path(scratch) / SHIPPED_CORPUS_NAME)
        _write_indexed_dataset(SHIPPED_CORPUS, partial, json_key="text")
        os.replace(partial + ".bin", str(prefix) + ".bin")
        os.replace(partial + ".idx", str(prefix) + ".idx")
    return str(prefix)
