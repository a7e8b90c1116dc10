"""Datasets (Megatron's GPTDataset / MockGPTDataset via BlendedMegatronDatasetBuilder) and batches.

Batches follow Megatron-LM's pretraining sampler: global batch k covers samples
[k·GBS, (k+1)·GBS); inside it, micro-batch m of data-parallel rank d takes the `micro_batch_size`
samples at offset (m·DP + d)·MBS. So a resumed run (consumed samples = iteration × GBS) reads
exactly the samples the uninterrupted run would have read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

from megapilot.data import ByteTokenizer, VocabOnlyTokenizer
from megapilot.errors import MegapilotError
from megapilot.trainer.config import TrainerConfig

DEFAULT_MOCK_VOCAB_SIZE = 1024


@dataclass
class Datasets:
    train: GPTDataset
    valid: GPTDataset | None


def build_tokenizer(config: TrainerConfig) -> ByteTokenizer | VocabOnlyTokenizer:
    if config.tokenizer_type == "ByteTokenizer":
        return ByteTokenizer()
    if config.tokenizer_type == "NullTokenizer":
        # Megatron's NullTokenizer: ids below --vocab-size, plus one end-of-document id after them.
        return VocabOnlyTokenizer((config.vocab_size or DEFAULT_MOCK_VOCAB_SIZE - 1) + 1)
    return VocabOnlyTokenizer(config.vocab_size or DEFAULT_MOCK_VOCAB_SIZE)


def _check_data_prefix(prefix: str) -> None:
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(prefix + suffix):
            raise MegapilotError(f"{prefix + suffix} does not exist", field="--data-path",
                                 fix="pass the prefix written by `megapilot data prepare` (without .bin/.idx)")


def build_datasets(config: TrainerConfig, tokenizer: ByteTokenizer | VocabOnlyTokenizer,
                   data_parallel_size: int) -> Datasets:
    """Build the train (and validation) datasets on every rank (rank 0 first, as Megatron does)."""
    if config.data_path:
        _check_data_prefix(config.data_path)
    batch = config.global_batch_size
    evaluations = config.train_iters // config.eval_interval + 1 if config.eval_iters else 0
    sizes = [config.train_iters * batch, evaluations * config.eval_iters * batch or None, None]
    dataset_config = GPTDatasetConfig(
        random_seed=config.seed, sequence_length=config.seq_length,
        blend=([config.data_path], None) if config.data_path else None,
        split=config.split, path_to_cache=config.data_cache_path, tokenizer=tokenizer,
        reset_position_ids=config.reset_position_ids, reset_attention_mask=config.reset_attention_mask,
        eod_mask_loss=config.eod_mask_loss, create_attention_mask=True,
        data_parallel_size=data_parallel_size,
    )
    dataset_class = MockGPTDataset if config.mock_data else GPTDataset
    train, valid, _ = BlendedMegatronDatasetBuilder(dataset_class, sizes, lambda: True, dataset_config).build()
    if config.eval_iters and valid is None:
        raise MegapilotError("the split gives the validation set no documents", field="--split",
                             fix="give validation a share, e.g. --split 90,10,0, or pass --eval-iters 0")
    return Datasets(train=train, valid=valid if config.eval_iters else None)


def _collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}


def microbatches(dataset: GPTDataset, config: TrainerConfig, data_parallel_rank: int, data_parallel_size: int,
                 first_sample: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches for this data-parallel rank, starting at global sample `first_sample`."""
    mbs = config.micro_batch_size
    per_step = mbs * data_parallel_size
    start = first_sample
    while True:
        offset = start + data_parallel_rank * mbs
        yield _collate([dataset[(offset + i) % len(dataset)] for i in range(mbs)])
        start += per_step
