"""Layout rules: each broken rule is one MegapilotError naming the field and the fix."""

from __future__ import annotations

import re

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.spec import ClusterSpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec, validate_layout
from megapilot.spec.pipeline import NoPipelineSplit
from megapilot.spec.validate import (
    SplitRule,
    context_split_refusal,
    flex_backend_refusal,
    overlaps_assumed,
    sequence_parallel_refusal,
    tensor_split_refusal,
)

LLAMA_70B = ModelSpec(
    name="llama-70b-like", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
    num_attention_heads=64, num_query_groups=8, vocab_size=128256,
)
MOE = ModelSpec(
    name="tiny-moe", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8,
    vocab_size=1000, moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=512),
)


def _cluster(gpu: str = "h100", gpus: int = 64) -> ClusterSpec:
    return ClusterSpec.from_gpu_count(get_gpu(gpu), gpus)


def _layout(world: int = 64, **kw) -> ParallelConfig:
    return ParallelConfig.for_world(world, **kw)


def test_valid_llama70b_layout_passes():
    warnings = validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                               _layout(tp=8, pp=4, sequence_parallel=True))
    assert warnings == []


@pytest.mark.parametrize(
    ("model", "kw", "training", "gpu", "field"),
    [
        (LLAMA_70B, dict(tp=16, pp=4), {}, "h100", "tp"),  # 16 > 8 GPUs per node, 8 KV heads
        (LLAMA_70B, dict(tp=8, pp=3), {}, "h100", "gpus"),  # 3*8 does not divide 64
        (LLAMA_70B, dict(tp=8, pp=8, vpp=3), {}, "h100", "vpp"),  # 80 % 24
        (LLAMA_70B, dict(tp=8, cp=8), dict(seq_length=4100), "h100", "cp"),
        (LLAMA_70B, dict(tp=8), dict(global_batch_size=12), "h100", "global_batch_size"),
        (LLAMA_70B, dict(tp=8), dict(precision="fp8"), "a100", "precision"),
        (MOE, dict(ep=3), {}, "h100", "ep"),
        (MOE, dict(tp=8, pp=4, ep=8, dp=2), {}, "h100", "ep"),
    ],
)
def test_broken_rule_names_field_and_fix(model, kw, training, gpu, field):
    spec = TrainingSpec(**({"seq_length": 4096, "global_batch_size": 1024} | training))
    with pytest.raises(MegapilotError) as err:
        validate_layout(model, _cluster(gpu), spec, _layout(**kw))
    assert err.value.field == field
    assert err.value.fix


def test_tp_above_kv_heads_replicates_them_and_an_unrelated_tp_is_refused():
    """Megatron-Core 0.16+ (TransformerConfig): num_query_groups must be a multiple or a divisor of TP; above the KV
    heads each head serves tp/groups ranks."""
    training = TrainingSpec(seq_length=4096, global_batch_size=1024)
    replicated = LLAMA_70B.model_copy(update={"num_query_groups": 4})
    assert validate_layout(replicated, _cluster(), training, _layout(tp=8, sequence_parallel=True)) == []
    unrelated = ModelSpec(name="gqa-12", num_layers=8, hidden_size=6144, ffn_hidden_size=16384,
                          num_attention_heads=48, num_query_groups=12, vocab_size=32000)
    with pytest.raises(MegapilotError, match="neither a divisor nor a multiple of the 12 KV heads") as err:
        validate_layout(unrelated, _cluster(), training, _layout(tp=8, sequence_parallel=True))
    assert err.value.field == "tp" and err.value.fix == "use a TP from: 1, 2, 3, 4, 6, 12, 24, 48"


def test_world_mismatch_is_refused():
    with pytest.raises(MegapilotError, match="TP\\*PP\\*CP\\*DP"):
        validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                        ParallelConfig(tp=8, pp=4, dp=1))


def test_dense_model_refuses_expert_parallel():
    with pytest.raises(MegapilotError) as err:
        validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024),
                        _layout(tp=8, ep=2))
    assert err.value.field == "ep"


def test_dense_model_refuses_an_expert_tp_its_stage_cannot_hold():
    """Megatron's initialize_model_parallel builds the expert groups for a dense model too: ETP 2 on one GPU per
    stage fails there (it used to divide by a zero expert-DP in the memory model)."""
    with pytest.raises(MegapilotError) as err:
        validate_layout(LLAMA_70B, _cluster(gpus=1), TrainingSpec(seq_length=4096, global_batch_size=8),
                        _layout(world=1, etp=2))
    assert err.value.field == "etp"
    assert "set etp to one of 1" in err.value.fix


def test_pipeline_that_never_fills_warns():
    warnings = validate_layout(LLAMA_70B, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=4),
                               _layout(tp=8, pp=8, sequence_parallel=True))
    assert any("never fills" in w for w in warnings)


# ---- uneven pipeline split ---------------------------------------------------------------------

LLAMA_405B = ModelSpec(
    name="llama-405b-like", num_layers=126, hidden_size=16384, ffn_hidden_size=53248, num_attention_heads=128,
    num_query_groups=8, vocab_size=128256,
)
SEQ_8K = TrainingSpec(seq_length=8192, global_batch_size=2048)


def test_126_layers_at_pp16_need_an_uneven_split_and_pass_with_7_on_the_ends():
    with pytest.raises(MegapilotError, match="first_stage_layers") as err:
        validate_layout(LLAMA_405B, _cluster(gpus=2048), SEQ_8K, _layout(2048, tp=8, pp=16))
    assert err.value.field == "pp"
    layout = _layout(2048, tp=8, pp=16, sequence_parallel=True, first_stage_layers=7, last_stage_layers=7)
    assert validate_layout(LLAMA_405B, _cluster(gpus=2048), SEQ_8K, layout) == []


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(pp=16, first_stage_layers=7, last_stage_layers=8), "first_stage_layers"),  # 111 over 14 ranks
        (dict(pp=8, vpp=2, first_stage_layers=7, last_stage_layers=7), "first_stage_layers"),  # 7 % vpp
        (dict(pp=8, vpp=2, first_stage_layers=8, last_stage_layers=12), "first_stage_layers"),  # 106 over 6 ranks
        (dict(pp=2, first_stage_layers=60, last_stage_layers=60), "first_stage_layers"),  # 6 left, no middle rank
    ],
)
def test_uneven_splits_megatron_refuses_name_the_field(kw, field):
    with pytest.raises(MegapilotError) as err:
        validate_layout(LLAMA_405B, _cluster(gpus=2048), SEQ_8K, _layout(2048, tp=8, **kw))
    assert err.value.field == field and err.value.fix


def test_uneven_split_with_interleaving_that_megatron_accepts_passes():
    # 126 - 8 - 10 = 108 over 6 middle ranks = 18 each, 9 per chunk; 8 and 10 are even: accepted.
    layout = _layout(2048, tp=8, pp=8, vpp=2, sequence_parallel=True, first_stage_layers=8, last_stage_layers=10)
    validate_layout(LLAMA_405B, _cluster(gpus=2048), SEQ_8K, layout)


def test_uneven_split_needs_pipeline_parallelism():
    with pytest.raises(ValueError, match="pp > 1"):
        ParallelConfig(first_stage_layers=3)


def test_tp_across_nodes_passes_when_allowed():
    layout = _layout(tp=16, sequence_parallel=True)
    model = LLAMA_70B.model_copy(update={"num_query_groups": 16})
    with pytest.raises(MegapilotError, match="force-tp-across-nodes"):
        validate_layout(model, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024), layout)
    validate_layout(model, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024), layout,
                    allow_tp_across_nodes=True)


def test_tp_across_the_trays_of_one_nvlink_domain_is_accepted():
    """GB200's 4-GPU trays share one 72-GPU NVLink domain: TP 8 spans two trays over NVLink, as the planner walks it;
    TP beyond the domain is still refused unless forced."""
    training = TrainingSpec(seq_length=4096, global_batch_size=1024)
    gb200 = _cluster("gb200", gpus=64)
    assert gb200.gpus_per_node == 4
    assert validate_layout(LLAMA_70B, gb200, training, _layout(tp=8, sequence_parallel=True)) == []
    wide = LLAMA_70B.model_copy(update={"num_attention_heads": 128, "num_query_groups": 128})
    with pytest.raises(MegapilotError, match="the 72 GPUs of one NVLink domain") as err:
        validate_layout(wide, _cluster("gb200", gpus=128), training, _layout(128, tp=128, sequence_parallel=True))
    assert err.value.field == "tp" and "force-tp-across-nodes" in (err.value.fix or "")


def test_learned_positions_bound_the_sequence_length():
    gpt = ModelSpec(name="gpt-like", num_layers=4, hidden_size=128, ffn_hidden_size=512, num_attention_heads=4,
                    vocab_size=1024, max_position_embeddings=128, position_embedding="learned_absolute")
    with pytest.raises(MegapilotError) as err:
        validate_layout(gpt, _cluster(gpus=2), TrainingSpec(seq_length=256, global_batch_size=16), _layout(2))
    assert err.value.field == "seq_length" and "128" in err.value.fix
    rope = gpt.model_copy(update={"position_embedding": "rope"})
    assert validate_layout(rope, _cluster(gpus=2), TrainingSpec(seq_length=256, global_batch_size=16),
                           _layout(2)) == []


def test_a_hybrid_mamba_model_splits_and_interleaves_as_megatron_0_17_places_its_pattern_segments():
    """MambaModel's select_pipeline_segment (core 0.17): first/last stage layers at VPP 1, any PP x VPP stages by the
    pattern's | segments (a layout string here); arguments.py refuses the account-for flags; VPP beside first/last
    stage layers is refused; the embedding and loss stay on the end stages."""
    from megapilot.spec.model import MambaSpec

    hybrid = ModelSpec(name="hybrid", num_layers=8, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                       vocab_size=1000, hybrid_override_pattern="M-M*M-M-", mamba=MambaSpec(head_dim=16))
    training, cluster = TrainingSpec(seq_length=1024, global_batch_size=64), _cluster(gpus=8)
    accepted = [_layout(8, pp=2), _layout(8, pp=2, vpp=2), _layout(8, pp=4, first_stage_layers=1, last_stage_layers=3),
                _layout(8, pp=2, pipeline_layout="Et|ttt|ttt|tL")]
    for layout in accepted:
        assert validate_layout(hybrid, cluster, training, layout) == []
    refused = {"account_for_embedding": _layout(8, pp=2, account_for_loss=True, account_for_embedding=True),
               "vpp": _layout(8, pp=4, vpp=2, first_stage_layers=2, last_stage_layers=2),
               "pipeline_layout": _layout(8, pp=2, pipeline_layout="Etttt|tttt|L|")}
    for field, layout in refused.items():
        with pytest.raises(MegapilotError) as err:
            validate_layout(hybrid, cluster, training, layout)
        assert err.value.field == field and err.value.fix


def test_a_hybrid_that_pp_does_not_divide_is_offered_only_the_splits_a_hybrid_takes():
    nemotron_h = get_model("nemotron-h-56b")  # 118 layers: 118 + E + L = 120 would divide by PP 4 on a GPT model
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    with pytest.raises(NoPipelineSplit) as err:  # its type kept, so `estimate` still prices the balanced split
        validate_layout(nemotron_h, _cluster(), training, _layout(tp=8, pp=4, sequence_parallel=True))
    assert err.value.field == "pp" and "account_for" not in (err.value.fix or "")
    assert (err.value.fix or "").startswith("first_stage_layers=29 and last_stage_layers=29")


def test_gated_delta_net_takes_context_parallelism_over_whole_heads_per_tp_x_cp_rank():
    """Megatron-Core 0.18's TransformerConfig: linear key and value heads are multiples of tp * cp."""
    qwen3_next = get_model("qwen3-next-80b-a3b")  # 16 key / 32 value heads
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    validate_layout(qwen3_next, _cluster("b200"), training, _layout(tp=2, cp=8, ep=16, etp=1, sequence_parallel=True))
    with pytest.raises(MegapilotError, match=r"tp\*cp=4\*8=32 does not divide Gated DeltaNet's 16 key heads") as err:
        validate_layout(qwen3_next, _cluster("b200"), training, _layout(tp=4, cp=8, ep=16, etp=1,
                                                                        sequence_parallel=True))
    assert err.value.field == "cp" and err.value.fix == "use a TP x CP from: 1, 2, 4, 8, 16"


def _mamba_hybrid(**mamba: int) -> ModelSpec:
    """Nemotron-H 8B with other Mamba-2 head and group counts."""
    nemotron_h = get_model("nemotron-h-8b")  # 128 Mamba heads of 64 channels, 8 groups; 32 attention heads, 8 KV
    return nemotron_h.model_copy(update={"mamba": nemotron_h.mamba.model_copy(update=mamba)})


def test_the_mamba_mixer_takes_whole_heads_and_groups_per_tp_rank():
    """MambaMixer (core 0.16-0.19) asserts nheads % tp == 0 and ngroups % tp == 0."""
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    validate_layout(get_model("nemotron-h-8b"), _cluster(), training, _layout(tp=8, sequence_parallel=True))
    with pytest.raises(MegapilotError, match="Mamba-2 mixer's 128 heads and 4 groups") as err:
        validate_layout(_mamba_hybrid(num_groups=4), _cluster(), training, _layout(tp=8, sequence_parallel=True))
    assert err.value.field == "tp" and err.value.fix == "use a TP from: 1, 2, 4"


@pytest.mark.parametrize(("mamba", "tp", "cp", "words", "fix"), [
    # 24 heads over TP 8: 3 per rank, which CP 2 cannot split
    (dict(num_heads=24), 8, 2, "does not divide the 3 Mamba-2 heads of a TP rank", "use a CP from: 1, 3"),
    # 96 heads, 12 groups over TP 2: 48 heads and 6 groups per rank; CP 4 and 6 groups do not divide one another
    (dict(num_heads=96, num_groups=12), 2, 4, "the 6 Mamba-2 groups of a TP rank do not divide one another",
     "use a CP from: 1, 2, 3, 6, 12, 24, 48"),
])
def test_mamba_context_parallelism_gives_each_cp_rank_whole_heads_and_groups_or_a_share_of_one(
        mamba, tp, cp, words, fix):
    """MambaContextParallel (core 0.16-0.19): heads per TP rank divisible by CP; groups per TP rank and CP divide
    one another (a CP rank holds whole groups, or a share of one group's heads)."""
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    with pytest.raises(MegapilotError, match=words) as err:
        validate_layout(_mamba_hybrid(**mamba), _cluster(), training, _layout(tp=tp, cp=cp, sequence_parallel=True))
    assert err.value.field == "cp" and err.value.fix == fix
    # 8 groups over TP 8: one group per rank, whose 16 heads CP 2 shares
    validate_layout(get_model("nemotron-h-8b"), _cluster(), training, _layout(tp=8, cp=2, sequence_parallel=True))


def test_the_mamba_mixer_in_fp8_needs_an_input_projection_a_multiple_of_16_wide():
    """MambaMixer asserts (2 d_inner + 2 groups x state + heads) % 16 == 0 with config.fp8."""
    fp8, cluster = TrainingSpec(seq_length=8192, global_batch_size=256, precision="fp8"), _cluster()
    validate_layout(get_model("nemotron-h-8b"), cluster, fp8, _layout(tp=8, sequence_parallel=True))  # 18560
    odd = _mamba_hybrid(num_heads=120)  # 2 x 7680 + 2 x 8 x 128 + 120 = 17528
    with pytest.raises(MegapilotError, match="17528 wide") as err:
        validate_layout(odd, cluster, fp8, _layout(tp=8, sequence_parallel=True))
    assert err.value.field == "precision"
    validate_layout(odd, cluster, fp8.model_copy(update={"precision": "bf16"}), _layout(tp=8, sequence_parallel=True))


def test_attention_sinks_take_no_context_parallelism_on_the_p2p_ring():
    """Transformer Engine 2.8-2.11 serves a learnable softmax under CP only with cp_comm_type a2a: GPT-OSS with CP > 1
    on Megatron's default p2p ring is refused by that field, and the fix names a2a."""
    gpt_oss, training = get_model("gpt-oss-20b"), TrainingSpec(seq_length=8192, global_batch_size=256)
    validate_layout(gpt_oss, _cluster(), training, _layout(tp=2, ep=8, etp=1, sequence_parallel=True))
    with pytest.raises(MegapilotError, match="a2a") as err:
        validate_layout(gpt_oss, _cluster(), training, _layout(tp=2, cp=2, ep=8, etp=1, sequence_parallel=True))
    assert err.value.field == "cp_comm_type" and err.value.fix == "use --cp-comm-type a2a (or cp 1)"
    validate_layout(gpt_oss, _cluster(), training,
                    _layout(tp=2, cp=2, cp_comm_type="a2a", ep=8, etp=1, sequence_parallel=True))


def test_a2a_context_parallelism_needs_each_tp_ranks_heads_and_kv_heads_to_divide_by_cp():
    """TE's AttnFuncWithCPAndQKVOA2A asserts the query heads and KV heads a TP rank holds divide by cp: GPT-OSS
    (64 heads, 8 KV heads) takes cp 2 at tp 4 (16 and 2 per rank) but not at tp 8 (8 and 1), and cp 8 not at tp 2
    (32 and 4); the sink refusal then offers only what a2a can split."""
    gpt_oss, training = get_model("gpt-oss-120b"), TrainingSpec(seq_length=8192, global_batch_size=256)
    validate_layout(gpt_oss, _cluster(gpus=64), training, _layout(64, tp=4, cp=2, cp_comm_type="a2a", ep=8, etp=1,
                                                               sequence_parallel=True))
    with pytest.raises(MegapilotError, match="8 attention heads and 1 KV heads of a TP rank") as err:
        validate_layout(gpt_oss, _cluster(gpus=64), training, _layout(64, tp=8, cp=2, cp_comm_type="a2a", ep=8, etp=1,
                                                                   sequence_parallel=True))
    assert err.value.field == "cp" and err.value.fix == "use cp 1, or a smaller tp with --cp-comm-type a2a"
    refusal = context_split_refusal(gpt_oss, 2, 8, seq_length=8192, cp_comm_type="a2a")
    assert refusal.rule is SplitRule.ATTENTION_HEADS_OVER_CP and refusal.error.fix.startswith("use a cp from 1, 2, 4")
    sink = context_split_refusal(gpt_oss, 8, 2, seq_length=8192)  # p2p: the sinks first, offering no a2a at tp 8
    assert sink.rule is SplitRule.ATTENTION_SINK and sink.error.fix.startswith("use cp 1 (a2a splits")
    # a model without sinks may keep the ring where a2a cannot split its heads; MLA takes no a2a at all
    llama = get_model("llama3.1-8b")  # 32 heads, 8 KV heads
    assert context_split_refusal(llama, 8, 2, seq_length=8192) is None
    assert context_split_refusal(llama, 8, 2, seq_length=8192, cp_comm_type="a2a").error.fix.endswith(
        "or --cp-comm-type p2p")
    mla = context_split_refusal(get_model("deepseek-v3"), 1, 2, seq_length=8192, cp_comm_type="a2a")
    assert mla.error.field == "cp_comm_type" and mla.error.fix == "use --cp-comm-type p2p"


@pytest.mark.parametrize(("model", "tp", "cp", "seq", "field", "words"), [
    # 2*cp = 6 does not divide 4096, and tp*cp = 3 does not divide the 16 Gated DeltaNet key heads
    ("qwen3-next-80b-a3b", 1, 3, 4096, "cp", "not divisible by 2*cp=6"),
    # the sinks take no CP on the p2p ring, whatever the sequence
    ("gpt-oss-20b", 1, 3, 4096, "cp_comm_type", "attention sinks"),
    # the chunks fit; the heads do not
    ("qwen3-next-80b-a3b", 1, 3, 6144, "cp", "Gated DeltaNet's 16 key heads"),
])
def test_a_layout_breaking_two_context_rules_is_refused_by_sinks_then_chunks_then_heads(
        model, tp, cp, seq, field, words):
    training = TrainingSpec(seq_length=seq, global_batch_size=48)
    with pytest.raises(MegapilotError, match=re.escape(words)) as err:
        validate_layout(get_model(model), _cluster(gpus=48), training, _layout(48, tp=tp, cp=cp))
    assert err.value.field == field


def test_each_split_refusal_names_its_rule():
    """The rules `validate_layout` and the planner walk, in one order: TP's attention heads, KV heads, then the
    linear mixers'; CP's sinks, the sequence's 2 x CP chunks, the linear mixers' heads, then sparse attention;
    sequence parallel's split of what CP leaves a rank."""
    qwen3_next, gpt_oss = get_model("qwen3-next-80b-a3b"), get_model("gpt-oss-20b")
    odd_linear = qwen3_next.model_copy(update={"gated_delta_net": qwen3_next.gated_delta_net.model_copy(
        update={"key_heads": 3, "value_heads": 6})})
    assert tensor_split_refusal(qwen3_next, 3).rule is SplitRule.ATTENTION_HEADS  # 16 heads
    assert tensor_split_refusal(get_model("phi3-medium"), 4).rule is SplitRule.KV_HEADS  # 40 heads, 10 KV
    assert tensor_split_refusal(odd_linear, 2).rule is SplitRule.GATED_DELTA_NET_HEADS
    assert tensor_split_refusal(_mamba_hybrid(num_groups=4), 8).rule is SplitRule.MAMBA_HEADS
    assert tensor_split_refusal(qwen3_next, 2) is None
    assert context_split_refusal(gpt_oss, 1, 2, seq_length=4096).rule is SplitRule.ATTENTION_SINK
    assert context_split_refusal(gpt_oss, 1, 2, seq_length=4098).rule is SplitRule.ATTENTION_SINK
    assert context_split_refusal(qwen3_next, 4, 8, seq_length=4098).rule is SplitRule.SEQUENCE_CHUNKS
    assert context_split_refusal(qwen3_next, 4, 8, seq_length=4096).rule is SplitRule.GATED_DELTA_NET_HEADS
    assert context_split_refusal(_mamba_hybrid(num_heads=24), 8, 2, seq_length=4096).rule is SplitRule.MAMBA_HEADS
    assert context_split_refusal(get_model("deepseek-v3.2"), 1, 2, seq_length=4096).rule is SplitRule.SPARSE_ATTENTION
    assert context_split_refusal(gpt_oss, 3, 1, seq_length=4098) is None  # no CP: nothing to refuse, whatever TP
    assert sequence_parallel_refusal(8, 2, seq_length=4100).rule is SplitRule.SEQUENCE_PARALLEL  # 2,050 over 8
    assert sequence_parallel_refusal(1, 2, seq_length=4100) is None
    refusal = context_split_refusal(qwen3_next, 4, 8, seq_length=4096)
    assert (refusal.error.field, refusal.error.fix) == ("cp", "use a TP x CP from: 1, 2, 4, 8, 16")


def test_megatron_fsdp_beside_pipeline_parallelism_is_estimated_as_megatron_core_asserts_nothing_against_it():
    spec = TrainingSpec(seq_length=4096, global_batch_size=1024)
    assert validate_layout(MOE, _cluster(), spec, _layout(pp=2, dp=32, fsdp=True)) == []


def test_deepseek_sparse_attention_refuses_context_parallelism_by_field():
    model = get_model("deepseek-v3.2")
    cluster = ClusterSpec(gpu=get_gpu("h100"), num_nodes=32, gpus_per_node=8)
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    layout = ParallelConfig(tp=2, pp=8, cp=2, ep=32, etp=1, dp=8, vpp=1, first_stage_layers=7, last_stage_layers=6,
                            sequence_parallel=True)
    with pytest.raises(MegapilotError) as err:
        validate_layout(model, cluster, training, layout)
    assert err.value.field == "cp" and "Sparse Attention" in str(err.value)
    validate_layout(model, cluster, training, layout.model_copy(update={"cp": 1, "dp": 16}))


def test_dsa_topk_sharing_stays_inside_a_pipeline_stage():
    glm5 = get_model("glm-5")
    assert glm5.dsa is not None
    shared = glm5.model_copy(update={"mla": glm5.mla.model_copy(update={"dsa": glm5.dsa.model_copy(
        update={"topk_freq": 2, "skip_topk_offset": 2})})})  # layers 1, 2, 4, 6, ... run the indexer (1-based)
    cluster = ClusterSpec(gpu=get_gpu("gb200"), num_nodes=48, gpus_per_node=4)
    training = TrainingSpec(seq_length=4096, global_batch_size=256)
    # PP 3 of 78: stages start at layers 1, 27 and 53; 27 reuses layer 26's top-k
    layout = ParallelConfig(tp=1, pp=3, ep=64, etp=1, dp=64)
    with pytest.raises(MegapilotError) as err:
        validate_layout(shared, cluster, training, layout)
    assert err.value.field == "pp" and "layer 27" in str(err.value)
    validate_layout(glm5, cluster, training, layout)  # every GLM-5 layer runs its own indexer
    # 37 / 20 / 21 layers: stages start at layers 38 and 58, both running their indexer
    validate_layout(shared, cluster, training, layout.model_copy(update={"first_stage_layers": 37,
                                                                         "last_stage_layers": 21}))


@pytest.mark.parametrize(("model", "modules", "training", "words"), [
    (LLAMA_70B, ("mla_up_proj",), {}, "needs multi-latent attention"),
    (LLAMA_70B, ("core_attn", "moe_act"), {}, "moe_act recomputes MoE layers"),
    (MOE, ("shared_experts",), {}, "has none"),
    (MOE, ("moe_act", "layernorm"), {"precision": "fp8", "fp8_recipe": "delayed"},
     "delayed scaling does not support layernorm and moe_act"),
])
def test_recompute_modules_megatron_refuses_or_that_name_a_missing_part_are_refused(model, modules, training, words):
    layout = _layout(tp=1, pp=1, ep=8 if model.moe else 1, recompute_modules=modules)
    spec = TrainingSpec(seq_length=4096, global_batch_size=1024, **training)
    with pytest.raises(MegapilotError, match=words) as refused:
        validate_layout(model, _cluster(), spec, layout)
    assert refused.value.field == "recompute_modules" and refused.value.fix


def test_recompute_modules_the_model_has_pass():
    layout = _layout(tp=1, ep=8, recompute_modules=("moe_act", "layernorm", "moe", "core_attn"))
    validate_layout(MOE, _cluster(), TrainingSpec(seq_length=4096, global_batch_size=1024, precision="fp8"), layout)


def test_activation_offloading_takes_only_fewer_layers_than_the_model_has_and_never_beside_pp_or_recompute():
    """Megatron-Core's TransformerConfig: fewer than num_layers layers, no pipeline parallelism, no recompute."""
    training = TrainingSpec(seq_length=4096, global_batch_size=1024)
    validate_layout(LLAMA_70B, _cluster(), training, _layout(tp=8, recompute="none", cpu_offloading_num_layers=79))
    with pytest.raises(MegapilotError) as every_layer:
        validate_layout(LLAMA_70B, _cluster(), training,
                        _layout(tp=8, recompute="none", cpu_offloading_num_layers=80))
    assert every_layer.value.field == "cpu_offloading_num_layers" and "at most 79" in (every_layer.value.fix or "")
    with pytest.raises(ValueError, match="needs pp 1"):
        _layout(tp=8, pp=2, recompute="none", cpu_offloading_num_layers=4)
    with pytest.raises(ValueError, match="needs recompute 'none'"):
        _layout(tp=8, recompute="selective", cpu_offloading_num_layers=4)


def test_a_sliding_window_takes_cp_only_by_a2a():
    """Transformer Engine 2.8-2.11's attn_forward_func_with_cp asserts that a sliding window (any --window-size but
    the causal -1,0) runs under CP only with a2a or all_gather: a windowed model without sinks is refused on the
    p2p ring by field cp_comm_type, with a2a as the fix, and accepted by a2a."""
    windowed = get_model("llama3.1-8b").model_copy(update={"sliding_window": 4096})
    refusal = context_split_refusal(windowed, 2, 2, seq_length=8192)
    assert refusal.rule is SplitRule.SLIDING_WINDOW
    assert refusal.error.field == "cp_comm_type" and refusal.error.fix == "use --cp-comm-type a2a (or cp 1)"
    assert context_split_refusal(windowed, 2, 2, seq_length=8192, cp_comm_type="a2a") is None
    assert context_split_refusal(get_model("llama3.1-8b"), 2, 2, seq_length=8192) is None  # no window: the ring


def test_deepseek_v4s_hash_layers_stay_in_the_embeddings_pipeline_stage():
    v4, cluster = get_model("deepseek-v4-flash"), ClusterSpec.from_gpu_count(get_gpu("b200"), 256)
    training = TrainingSpec(seq_length=4096, global_batch_size=2048)
    interleaved = ParallelConfig(tp=1, pp=4, vpp=11, dp=64, ep=8, pipeline_layout="balanced")
    with pytest.raises(MegapilotError) as refused:
        validate_layout(v4, cluster, training, interleaved)
    assert refused.value.field == "pp" and "hash" in refused.value.problem
    validate_layout(v4, cluster, training, interleaved.model_copy(update={"vpp": 1}))


@pytest.mark.parametrize("cp_comm_type", ["p2p", "a2a", "allgather"])
def test_deepseek_v4_takes_no_context_parallelism_megapilot_prices(cp_comm_type):
    """Its own kernels, not Transformer Engine's: the refusal names them before any TE rule (sinks, window, a2a)."""
    refusal = context_split_refusal(get_model("deepseek-v4-flash"), 1, 2, seq_length=4096, cp_comm_type=cp_comm_type)
    assert refusal is not None and refusal.error.field == "cp" and "THD" in refusal.error.problem


def test_deepep_runs_on_b200_nodes_smaller_than_the_baseboard_and_not_across_an_nvl72_rack():
    """DeepEP is refused where one NVLink domain spans nodes (GB200's rack); B200 nodes of 4 GPUs have NVLink
    only inside each node, as an 8-GPU B200 node does, so DeepEP runs there."""
    mixtral = get_model("mixtral-8x7b")
    assert flex_backend_refusal("deepep", ClusterSpec(gpu=get_gpu("b200"), num_nodes=4, gpus_per_node=4),
                                mixtral) is None
    rack = flex_backend_refusal("deepep", ClusterSpec(gpu=get_gpu("gb200"), num_nodes=4, gpus_per_node=4), mixtral)
    assert rack is not None and rack.field == "moe_flex_dispatcher"



def test_the_overlaps_an_estimate_prices_are_said_where_they_change_it():
    """TP's where the userbuffers run (SP on NVIDIA, not NVFP4), DP's where data parallelism reduces; a CPU's
    estimate and a one-GPU layout say neither."""
    h100, layout = get_gpu("h100"), ParallelConfig(tp=8, pp=2, dp=4, sequence_parallel=True)
    both = overlaps_assumed(h100, "bf16", layout)
    assert both == ("TP and DP communication overlapped (--tp-comm-overlap --overlap-grad-reduce "
                    "--overlap-param-gather, as `script` writes)")
    assert overlaps_assumed(get_gpu("b200"), "nvfp4", layout).startswith("DP communication overlapped")
    assert overlaps_assumed(get_gpu("mi300x"), "bf16", layout).startswith("DP communication")
    assert overlaps_assumed(h100, "bf16", ParallelConfig(tp=8, dp=1, sequence_parallel=True)).startswith("TP comm")
    assert overlaps_assumed(h100, "bf16", ParallelConfig(dp=1)) is None
    assert overlaps_assumed(get_gpu("cpu"), "bf16", ParallelConfig(dp=2)) is None
    assert overlaps_assumed(h100, "bf16") == both  # a plan's layouts: each where it runs
