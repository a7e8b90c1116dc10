"""Context parallelism by --cp-comm-type a2a (Ulysses): exposed q, k, v and output all-to-alls on the CP group, the
core on the whole sequence of cp-th of the heads, no ring; the p2p ring unchanged beside it."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.estimate import comm
from megapilot.estimate.step_time import EstimateOptions, fused_attention_bytes_per_token, layer_terms, step_time
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, TrainingSpec

LLAMA3_70B = ModelSpec(
    name="llama3-70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
    num_query_groups=8, vocab_size=128256,
)
H100S = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
LONG = TrainingSpec(seq_length=32768, global_batch_size=64)


def _terms(model: ModelSpec, layout: ParallelConfig, training: TrainingSpec = LONG, layer: int = 0) -> dict:
    return layer_terms(model, layer, H100S, training, layout, EstimateOptions(), recomputed=False)


def _layout(cp: int, comm_type: str = "a2a", tp: int = 2) -> ParallelConfig:
    return ParallelConfig.for_world(64, tp=tp, cp=cp, cp_comm_type=comm_type, sequence_parallel=tp > 1,
                                    recompute="none")


def test_a2a_prices_the_qkv_and_output_all_to_alls_on_the_cp_group_and_no_ring():
    """Per rank and direction: q and out (32 heads of a TP rank) and k, v (4 KV heads) of its s/cp tokens, sent to
    the other cp-1 ranks, over the CP group whose ranks are TP apart; forward and backward."""
    layout = _layout(4)
    tokens = 32768 / 4
    sent = tokens * 2 * (32 + 4) * 128 * 2
    expected = 2 * comm.all_to_all_s(sent, 4, comm.group_bandwidth_bytes_per_s(H100S, 4, stride=2))
    a2a = _terms(LLAMA3_70B, layout)
    assert a2a["cp_comm"] == pytest.approx(expected)
    ring = _terms(LLAMA3_70B, _layout(4, "p2p"))
    assert ring["cp_comm"] == 0.0  # the ring hides behind a 32k core: a2a has nothing to hide behind
    assert a2a["cp_comm"] > ring["cp_comm"]


def test_the_all_to_all_grows_with_cps_share_of_the_heads_sent_away():
    """Each rank keeps 1/cp of its q, k, v and sends the rest: at a fixed sequence shard (the sequence grows with
    cp) the bytes on the wire grow as (cp - 1) / cp."""
    def seconds(cp: int) -> float:
        training = TrainingSpec(seq_length=8192 * cp, global_batch_size=64)
        return _terms(LLAMA3_70B, _layout(cp, tp=1), training)["cp_comm"]
    assert 0 < seconds(2) < seconds(4) < seconds(8)
    # inside the node the wire time tracks the share sent: 1/2 then 3/4 of the same shard
    assert seconds(4) / seconds(2) == pytest.approx((3 / 4) / (1 / 2), rel=0.05)


def test_the_core_runs_the_same_flops_without_reading_every_ranks_keys():
    """Ulysses' core attends over the whole sequence with heads / (TP x CP): FLOPs per GPU equal the ring's, and its
    K and V are read once, not once per CP rank."""
    ring, a2a = _layout(4, "p2p"), _layout(4)
    assert fused_attention_bytes_per_token(LLAMA3_70B, 0, a2a) < fused_attention_bytes_per_token(LLAMA3_70B, 0, ring)
    assert _terms(LLAMA3_70B, a2a)["mixer_core"] == pytest.approx(_terms(LLAMA3_70B, ring)["mixer_core"])  # FLOP-bound
    whole = step_time(LLAMA3_70B, H100S, LONG, a2a)
    assert whole.model_flops_per_step == step_time(LLAMA3_70B, H100S, LONG, ring).model_flops_per_step


def test_recomputing_the_core_reruns_its_forward_all_to_alls():
    """Megatron checkpoints TE's DotProductAttention whole: selective core_attn recompute repeats the forward's
    q, k, v and output all-to-alls (half of the layer's CP traffic)."""
    plain = _terms(LLAMA3_70B, _layout(4))
    selective = _terms(LLAMA3_70B, _layout(4).model_copy(update={"recompute": "selective"}))
    assert selective["recompute"] - selective["mixer_core"] / 3 == pytest.approx(plain["cp_comm"] / 2)


def test_gpt_oss_on_64_h100s_at_32k_takes_cp_2_by_a2a():
    """GPT-OSS-120B's sinks run under CP only by a2a: estimated, with its all-to-alls, beside CP 1."""
    gpt_oss = get_model("gpt-oss-120b")
    layout = ParallelConfig.for_world(64, tp=2, cp=2, cp_comm_type="a2a", ep=8, etp=1, fsdp=True,
                                      sequence_parallel=True)
    result = step_time(gpt_oss, H100S, LONG, layout)
    assert result.breakdown_s["cp_comm"] > 0 and result.tokens_per_s_per_gpu > 0
    without = step_time(gpt_oss, H100S, LONG, layout.model_copy(update={"cp": 1, "cp_comm_type": "p2p", "dp": 32}))
    assert without.breakdown_s["cp_comm"] == 0
