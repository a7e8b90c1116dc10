"""The throughput FLOPs match the closed form of Megatron's count (torch-free)."""

from __future__ import annotations

import pytest

from megapilot.trainer.config import build_config
from megapilot.trainer.flops import flops_per_iteration, padded_vocab_size


def test_vocab_padding_is_a_multiple_of_divisor_times_tp():
    assert padded_vocab_size(258, 128, 1) == 384
    assert padded_vocab_size(258, 128, 2) == 512
    assert padded_vocab_size(256, 128, 2) == 256


def test_dense_gpt_matches_72_bslh2_closed_form_with_causal_halving():
    # Korthikanti's model FLOPs 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) (ffn = 4h, no GQA, GELU), with the
    # attention term halved for the causal mask as Megatron-Core ≥ v0.12 counts it: s/(6h) → s/(12h).
    b, s, l, h, v = 8, 128, 4, 256, 512  # noqa: E741  (the paper's symbols; l is its layer count)
    config = build_config(["--num-layers", str(l), "--hidden-size", str(h), "--num-attention-heads", "8",
                           "--seq-length", str(s), "--train-iters", "1", "--lr", "1e-3",
                           "--global-batch-size", str(b), "--mock-data"])
    expected = 72 * b * s * l * h * h * (1 + s / (12 * h) + v / (12 * l * h))
    assert flops_per_iteration(config, v) == pytest.approx(expected, rel=1e-12)


def test_moe_counts_topk_experts_not_all_experts():
    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--num-experts", "8", "--moe-ffn-hidden-size", "64"]
    top1 = flops_per_iteration(build_config(base + ["--moe-router-topk", "1"]), 384)
    top2 = flops_per_iteration(build_config(base + ["--moe-router-topk", "2"]), 384)
    mlp_per_expert = 2 * 64 * 6.0 * 64 * 64 * 2  # tokens × layers-worth: 64 tokens, 2 layers, 6·h·f·2 GEMMs
    assert top2 - top1 == pytest.approx(mlp_per_expert)
