"""Text → Megatron indexed dataset, read back by Megatron-Core's own IndexedDataset and GPTDataset."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("megatron.core")

from megapilot.data import ByteTokenizer
from megapilot.errors import MegapilotError
from megapilot.trainer.corpus import default_dataset_prefix, prepare_indexed_dataset


def test_prepared_documents_read_back_token_for_token(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    source = tmp_path / "docs.txt"
    source.write_text("In the beginning.\n\nAnd the earth — void.\n")
    prepared = prepare_indexed_dataset(source, str(tmp_path / "out"))
    assert (prepared.documents, prepared.vocab_size) == (2, 258)

    dataset = IndexedDataset(prepared.prefix)
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
