"""`megapilot.data.indexed` writes, byte for byte, what Megatron-Core's `IndexedDatasetBuilder` writes, and
`megapilot data prepare` does it without importing torch or megatron-core."""

from __future__ import annotations

import gzip
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from megapilot.data import ByteTokenizer
from megapilot.data.indexed import IndexedDatasetWriter
from megapilot.trainer.corpus import prepare_indexed_dataset

DOCUMENTS = ["In the beginning", "é ü 中文 🚀", "x", "line one\nline two\n\ttabbed", "a" * 5000]


def _megatron_reference(prefix: str, documents: list[list[int]], vocab_size: int) -> None:
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=indexed.DType.optimal_dtype(vocab_size))
    for ids in documents:
        builder.add_item(torch.from_numpy(numpy.asarray(ids, dtype=numpy.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")


@pytest.mark.parametrize("vocab_size", [258, 128_256])  # uint16 and int32 token files
def test_files_equal_megatron_builders_byte_for_byte(tmp_path: Path, vocab_size: int):
    tokenizer = ByteTokenizer()
    documents = [tokenizer.tokenize(text) + [tokenizer.eod] for text in DOCUMENTS]
    if vocab_size > 65_500:
        documents.append([vocab_size - 1, 70_000, 0])  # ids that need the wider type
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    with IndexedDatasetWriter(ours, vocab_size) as writer:
        for ids in documents:
            writer.add_document(ids)
        writer.finish()
    _megatron_reference(theirs, documents, vocab_size)
    for suffix in (".bin", ".idx"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), suffix
    assert writer.documents == len(documents) and writer.tokens == sum(map(len, documents))


def test_megatron_reads_back_every_document(tmp_path: Path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in DOCUMENTS))
    prepared = prepare_indexed_dataset(source, str(tmp_path / "docs"))
    dataset = indexed.IndexedDataset(prepared.prefix)
    tokenizer = ByteTokenizer()
    assert len(dataset) == len(DOCUMENTS) and list(dataset.document_indices) == list(range(len(DOCUMENTS) + 1))
    assert [tokenizer.detokenize(list(dataset[i])) for i in range(len(dataset))] == DOCUMENTS


@pytest.mark.parametrize("compressed", [False, True])
def test_progress_follows_the_file_to_its_end(tmp_path: Path, compressed: bool):
    body = "".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(3000))
    source = tmp_path / ("docs.jsonl.gz" if compressed else "docs.jsonl")
    source.write_bytes(gzip.compress(body.encode()) if compressed else body.encode())
    seen: list[int] = []
    prepare_indexed_dataset(source, str(tmp_path / "docs"), on_bytes=seen.append)
    assert len(seen) == 3000 and seen == sorted(seen)
    assert 0 < seen[0] < seen[-1] == source.stat().st_size  # bytes on disk: compressed bytes for .gz


def test_data_prepare_imports_neither_torch_nor_megatron_and_takes_under_a_second(tmp_path: Path):
    source = tmp_path / "two.jsonl"
    source.write_text('{"text": "first document"}\n{"text": "second document"}\n')
    probe = (
        "import sys, time\n"
        "from megapilot.cli.app import main\n"
        "start = time.process_time()\n"
        "try:\n"
        f"    main(['data', 'prepare', {str(source)!r}, '--output-prefix', {str(tmp_path / 'two')!r}, '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('SECONDS', time.process_time() - start)\n"
        "print('MODULES', ' '.join(sorted(sys.modules)))\n"
    )
    # CPU seconds, not wall-clock: on a 2-core machine shared with other tests the wall clock measures the load
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    whole_process_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    modules = set(out.split("MODULES ", 1)[1].split())
    assert not modules & {"torch", "megatron", "numpy"}
    assert json.loads(out.split("SECONDS", 1)[0])["documents"] == 2
    assert whole_process_s < 1.0 * 3  # interpreter start included
    assert float(out.split("SECONDS ", 1)[1].split()[0]) < 1.0
