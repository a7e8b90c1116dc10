"""Text → Megatron indexed dataset, read back by Megatron-Core's own IndexedDataset and GPTDataset; the rules of
the output prefix (torch-free, so run without megatron-core too)."""

from __future__ import annotations

import json
import os

import pytest

from megapilot.data import ByteTokenizer
from megapilot.data.indexed import IndexedDatasetWriter
from megapilot.errors import MegapilotError
from megapilot.trainer.corpus import default_dataset_prefix, prepare_indexed_dataset


def test_prepared_documents_read_back_token_for_token(tmp_path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")

    source = tmp_path / "docs.txt"
    source.write_text("In the beginning.\n\nAnd the earth — void.\n")
    prepared = prepare_indexed_dataset(source, str(tmp_path / "out"))
    assert (prepared.documents, prepared.vocab_size) == (2, 258)

    dataset = indexed.IndexedDataset(prepared.prefix)
    tokenizer = ByteTokenizer()
    texts = [tokenizer.detokenize(list(dataset[i])) for i in range(len(dataset))]
    assert texts == ["In the beginning.", "And the earth — void."]
    assert all(int(dataset[i][-1]) == tokenizer.eod for i in range(len(dataset)))
    assert prepared.tokens == sum(len(dataset[i]) for i in range(len(dataset)))


def test_relative_output_prefix_is_refused_before_writing(tmp_path):
    source = tmp_path / "docs.txt"
    source.write_text("text\n")
    with pytest.raises(MegapilotError) as err:
        prepare_indexed_dataset(source, "relative/prefix")
    assert err.value.field == "--output-prefix"


def test_empty_input_leaves_no_half_written_files(tmp_path):
    source = tmp_path / "empty.jsonl"
    source.write_text("\n")
    with pytest.raises(MegapilotError, match="no text"):
        prepare_indexed_dataset(source, str(tmp_path / "out"))
    assert not list(tmp_path.glob("out.*"))


def test_shipped_corpus_is_built_once_and_gpt_dataset_serves_real_text(tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefix = default_dataset_prefix(tmp_path)
    built_at = os.stat(prefix + ".bin").st_mtime_ns
    assert default_dataset_prefix(tmp_path) == prefix
    assert os.stat(prefix + ".bin").st_mtime_ns == built_at  # second call reuses the cache

    tokenizer = ByteTokenizer()
    config = GPTDatasetConfig(random_seed=1, sequence_length=64, blend=([prefix], None), split="98,2,0",
                              tokenizer=tokenizer, reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=str(tmp_path / "cache"))
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [16, None, None], lambda: True, config).build()
    sample = train[0]
    assert sample["tokens"].shape == (64,) and sample["labels"].shape == (64,)
    assert (sample["tokens"][1:] == sample["labels"][:-1]).all()
    text = tokenizer.detokenize(sample["tokens"].tolist())
    assert sum(ch.isalpha() for ch in text) > 32  # English text, not noise


def _jsonl(path, *texts: str, bad_last: bool = False):
    lines = [json.dumps({"text": text}) for text in texts] + ([json.dumps({"body": "no text key"})] if bad_last else [])
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_existing_dataset_is_replaced_only_when_forced_and_only_by_a_whole_one(tmp_path):
    # a failed run removed the files at the prefix: a library caller lost the dataset that was there
    prefix = str(tmp_path / "ds")
    prepare_indexed_dataset(_jsonl(tmp_path / "one.jsonl", "hello"), prefix)
    before = {suffix: (tmp_path / f"ds{suffix}").read_bytes() for suffix in (".bin", ".idx")}
    with pytest.raises(MegapilotError, match="already there") as info:
        prepare_indexed_dataset(_jsonl(tmp_path / "two.jsonl", "a", "b"), prefix)
    assert info.value.field == "--output-prefix" and "--force" in (info.value.fix or "")
    with pytest.raises(MegapilotError, match="line 2"):  # fails half-way through, forced
        prepare_indexed_dataset(_jsonl(tmp_path / "bad.jsonl", "hi", bad_last=True), prefix, force=True)
    assert {suffix: (tmp_path / f"ds{suffix}").read_bytes() for suffix in (".bin", ".idx")} == before
    assert prepare_indexed_dataset(tmp_path / "two.jsonl", prefix, force=True).documents == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "ds.bin", "ds.idx", "one.jsonl", "two.jsonl"]


@pytest.mark.parametrize("prefix", ["{tmp}/out/", "{tmp}/out", "{tmp}/x.bin", "{tmp}/x.idx", "{tmp}/half"])
def test_a_prefix_that_names_a_folder_or_a_file_of_the_pair_is_refused_by_the_library(tmp_path, prefix):
    # 'out/' wrote out.bin beside the folder and 'x.bin' wrote x.bin.bin; a folder at half.idx was found only
    # after half.bin had been replaced
    (tmp_path / "out").mkdir()
    (tmp_path / "half.idx").mkdir()
    source = _jsonl(tmp_path / "docs.jsonl", "hello")
    with pytest.raises(MegapilotError) as info:
        prepare_indexed_dataset(source, prefix.format(tmp=tmp_path), force=True)
    assert info.value.field == "--output-prefix" and info.value.fix
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["docs.jsonl", "half.idx", "out"]


def test_a_failed_write_names_the_output_and_keeps_the_dataset_there(tmp_path, monkeypatch):
    prefix = str(tmp_path / "ds")
    prepare_indexed_dataset(_jsonl(tmp_path / "one.jsonl", "hello"), prefix)
    before = (tmp_path / "ds.bin").read_bytes()

    def disk_full(self, token_ids):
        raise OSError(28, "No space left on device")  # as a write() raises it: no file name

    monkeypatch.setattr(IndexedDatasetWriter, "add_document", disk_full)
    with pytest.raises(MegapilotError, match="No space left") as info:
        prepare_indexed_dataset(tmp_path / "one.jsonl", prefix, force=True)
    assert info.value.field == "--output-prefix"
    assert (tmp_path / "ds.bin").read_bytes() == before and (tmp_path / "ds.idx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.bin", "ds.idx", "one.jsonl"]
