"""Tokenizer choice, dataset sizes and the sampler's bookkeeping (which rank reads which sample), without training."""

from __future__ import annotations

import pytest
import torch

from megapilot.data import ByteTokenizer
from megapilot.errors import MegapilotError
from megapilot.trainer.config import build_config
from megapilot.trainer.data_loading import DEFAULT_MOCK_VOCAB_SIZE, build_datasets, build_tokenizer, microbatches

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
        "--train-iters", "10", "--lr", "1e-3", "--micro-batch-size", "2", "--global-batch-size", "8"]


def _config(*extra: str, mbs: int = 2, gbs: int = 8):
    flags = TINY + ["--micro-batch-size", str(mbs), "--global-batch-size", str(gbs), *extra]
    return build_config(flags if "--data-path" in extra else flags + ["--mock-data"])


def _numbered(samples: int) -> list[dict[str, torch.Tensor]]:
    """A dataset whose sample i carries its own index, so a batch says which samples it holds."""
    return [{"tokens": torch.tensor([i, i]), "labels": torch.tensor([i])} for i in range(samples)]


def _indices(batch: dict[str, torch.Tensor]) -> list[int]:
    return batch["labels"][:, 0].tolist()


def _global_batch(dataset, config, dp: int, first_sample: int) -> list[list[int]]:
    """The samples each data-parallel rank reads during one global batch."""
    per_rank = config.global_batch_size // (config.micro_batch_size * dp)
    reads = []
    for rank in range(dp):
        stream = microbatches(dataset, config, rank, dp, first_sample)
        reads.append([i for _ in range(per_rank) for i in _indices(next(stream))])
    return reads


def test_null_tokenizer_has_the_vocabulary_plus_one_end_of_document_id():
    assert build_tokenizer(_config("--vocab-size", "100")).vocab_size == 101
    assert build_tokenizer(_config()).vocab_size == DEFAULT_MOCK_VOCAB_SIZE


def test_byte_tokenizer_is_the_embedded_trainers_own():
    assert isinstance(build_tokenizer(_config("--tokenizer-type", "ByteTokenizer")), ByteTokenizer)


def test_micro_batch_m_of_rank_d_reads_the_mbs_samples_at_m_dp_plus_d_times_mbs():
    config = _config(mbs=2, gbs=8)
    reads = _global_batch(_numbered(64), config, dp=2, first_sample=0)
    # micro-batch 0: rank 0 -> 0,1  rank 1 -> 2,3; micro-batch 1: rank 0 -> 4,5  rank 1 -> 6,7
    assert reads == [[0, 1, 4, 5], [2, 3, 6, 7]]


@pytest.mark.parametrize(("dp", "mbs"), [(1, 8), (1, 2), (2, 2), (4, 1), (4, 2)])
def test_one_global_batch_covers_exactly_its_gbs_samples_once(dp, mbs):
    config = _config(mbs=mbs, gbs=8)
    for step in range(3):
        reads = _global_batch(_numbered(64), config, dp, first_sample=step * 8)
        assert sorted(i for rank in reads for i in rank) == list(range(step * 8, step * 8 + 8))


def test_a_resumed_run_reads_what_the_uninterrupted_run_would_have_read():
    config = _config(mbs=2, gbs=8)
    dataset = _numbered(64)
    uninterrupted = microbatches(dataset, config, 1, 2, first_sample=0)
    for _ in range(2 * 3):  # three iterations of two micro-batches on this rank
        next(uninterrupted)
    resumed = microbatches(dataset, config, 1, 2, first_sample=3 * 8)  # consumed samples = iteration x GBS
    for _ in range(4):
        assert _indices(next(resumed)) == _indices(next(uninterrupted))


def test_micro_batches_wrap_around_the_end_of_the_dataset_and_never_stop():
    config = _config(mbs=2, gbs=8)
    stream = microbatches(_numbered(5), config, 0, 1, first_sample=4)
    assert [_indices(next(stream)) for _ in range(3)] == [[4, 0], [1, 2], [3, 4]]


def test_micro_batches_stack_each_field_along_a_leading_batch_dimension():
    batch = next(microbatches(_numbered(8), _config(mbs=2, gbs=8), 0, 1, first_sample=0))
    assert batch.keys() == {"tokens", "labels"}
    assert batch["tokens"].shape == (2, 2) and batch["labels"].shape == (2, 1)


def test_mock_datasets_hold_enough_samples_for_training_and_evaluation():
    config = _config("--eval-iters", "2", "--eval-interval", "5")
    tokenizer = build_tokenizer(config)
    datasets = build_datasets(config, tokenizer, data_parallel_size=1)
    assert len(datasets.train) >= config.train_iters * config.global_batch_size
    assert datasets.valid is not None and len(datasets.valid) >= (10 // 5 + 1) * 2 * 8
    sample = datasets.train[0]
    assert sample["tokens"].shape == (16,) and int(sample["tokens"].max()) < tokenizer.vocab_size


def test_no_evaluation_means_no_validation_set():
    config = _config("--eval-iters", "0")
    assert build_datasets(config, build_tokenizer(config), data_parallel_size=1).valid is None


def test_a_data_prefix_without_its_bin_and_idx_is_refused_naming_data_path(tmp_path):
    (tmp_path / "corpus_text_document.bin").write_bytes(b"")
    config = _config("--data-path", str(tmp_path / "corpus_text_document"))
    with pytest.raises(MegapilotError, match=r"corpus_text_document\.idx does not exist") as err:
        build_datasets(config, build_tokenizer(config), data_parallel_size=1)
    assert err.value.field == "--data-path" and "megapilot data prepare" in err.value.fix
