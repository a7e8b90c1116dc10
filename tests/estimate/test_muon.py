"""Muon (Megatron-LM's `--optimizer muon | dist_muon`): its state in memory, its Newton-Schulz step and its
data-parallel traffic, and what Megatron refuses beside it."""

from __future__ import annotations

import pytest

from megapilot.errors import MegapilotError
from megapilot.estimate import build_case, step_time
from megapilot.estimate.memory import GIB, ShardParams, optimizer_gib, shard_params
from megapilot.estimate.params import embedding_params, output_layer_params
from megapilot.estimate.step_time import MUON_NS_STEPS, newton_schulz_flops
from megapilot.spec import ModelSpec, ParallelConfig, TrainingSpec

LLAMA_8B = dict(model="llama3.1-8b", gpu="h100", gpus=64, tp=2, gbs=512, seq_len=8192, recompute="full")
# One layer, no vocabulary to speak of: four weights whose shapes are easy to count by hand.
ONE_LAYER = ModelSpec(name="one", num_layers=1, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=128, max_position_embeddings=128)


def test_muon_keeps_8_bytes_per_weight_and_adam_12_for_the_vocabulary():
    case = build_case(**LLAMA_8B, optimizer="muon")
    shard = shard_params(case.model, case.parallel, 0)
    model = case.model
    vocab = (embedding_params(model, padded_vocab=True, tp=2) + output_layer_params(model, padded_vocab=True, tp=2))
    assert shard.vocab == vocab / 2  # PP 1: both ends on this rank, split over TP
    on_muon = shard.dense - shard.vocab + shard.expert
    expected = (on_muon * 8 + (shard.vocab + shard.replicated) * 12) / GIB
    assert optimizer_gib(shard, case.parallel, "muon") == pytest.approx(expected)
    # dist_muon deals the same state out over the 32 DP ranks; Adam's distributed optimizer shards its 12 B.
    assert optimizer_gib(shard, case.parallel, "dist_muon") == pytest.approx(expected / 32)
    adam = build_case(**LLAMA_8B)
    assert optimizer_gib(shard, adam.parallel, "adam") == pytest.approx(
        (shard.dense + shard.replicated + shard.expert) * 12 / 32 / GIB)


def test_newton_schulz_counts_each_weight_matrix_of_the_rank():
    """Quintic steps on an m x N block (m <= N): X X^T, the polynomial, and its product with X."""
    def per_matrix(k: int, n: int) -> float:
        m, wide = min(k, n), max(k, n)
        return MUON_NS_STEPS * (4 * m * m * wide + 2 * m ** 3)

    dense, expert = newton_schulz_flops(ONE_LAYER, 1, 1, 1, 1, 1, ParallelConfig(dp=1).pipeline_split)
    qkv, proj, fc1, fc2 = (64, 192), (64, 64), (64, 512), (256, 64)  # MHA: q, k, v of 64 each; SwiGLU fc1 2 x 256
    assert expert == 0 and dense == pytest.approx(sum(per_matrix(k, n) for k, n in (qkv, proj, fc1, fc2)))
    halved, _ = newton_schulz_flops(ONE_LAYER, 2, 1, 1, 1, 2, ParallelConfig(dp=1).pipeline_split)
    assert halved < dense  # each TP rank orthogonalises its own block


def test_dist_muon_shares_the_newton_schulz_work_and_plain_muon_cannot_hide_its_all_reduce():
    adam, muon, dist = (build_case(**LLAMA_8B, **extra) for extra in ({}, {"optimizer": "muon"},
                                                                       {"optimizer": "dist_muon"}))
    terms = {name: step_time(c.model, c.cluster, c.training, c.parallel, c.options).breakdown_s
             for name, c in (("adam", adam), ("muon", muon), ("dist", dist))}
    assert terms["muon"]["optimizer"] > 10 * terms["dist"]["optimizer"] > terms["adam"]["optimizer"]
    # the all-reduce waits for the last backward; Adam's reduce-scatter and gather hide, paying only the SMs NCCL
    # holds beside the compute (16 of 132)
    assert terms["muon"]["dp_comm"] > 5 * terms["adam"]["dp_comm"] > 0


@pytest.mark.parametrize(("extra", "field"), [
    ({"optimizer": "muon", "distributed_optimizer": True}, "distributed_optimizer"),
    ({"optimizer": "dist_muon", "fsdp": True}, "fsdp"),
    ({"optimizer": "muon", "precision": "fp16"}, "optimizer"),
    ({"optimizer": "lamb"}, "optimizer"),
])
def test_what_megatron_refuses_beside_muon_is_named(extra, field):
    with pytest.raises(MegapilotError) as refused:
        build_case(**(LLAMA_8B | extra))
    assert refused.value.field == field


def test_muon_turns_the_distributed_optimizer_default_off():
    assert build_case(**LLAMA_8B).parallel.distributed_optimizer
    assert not build_case(**LLAMA_8B, optimizer="dist_muon").parallel.distributed_optimizer
    assert TrainingSpec(seq_length=8, global_batch_size=1, optimizer="muon").uses_muon


def test_vocabulary_share_of_a_shard_is_where_the_embedding_and_output_layer_sit():
    case = build_case(model="llama3.1-8b", gpu="h100", gpus=16, pp=2, gbs=64, seq_len=4096)
    first, last = (shard_params(case.model, case.parallel, stage) for stage in (0, 1))
    assert first.vocab == embedding_params(case.model, padded_vocab=True)
    assert last.vocab == output_layer_params(case.model, padded_vocab=True)
    assert ShardParams(dense=1, replicated=0, expert=0).vocab == 0


def test_a_muon_estimate_says_no_published_run_checks_it():
    from megapilot.estimate import estimate

    for optimizer, caveat in (("dist_muon", True), ("adam", False)):
        case = build_case(**LLAMA_8B, optimizer=optimizer)
        result = estimate(case.model, case.cluster, case.training, case.parallel, case.options)
        assert any("no published Muon run checks" in w for w in result.warnings) is caveat
