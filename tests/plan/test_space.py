"""The layout space: divisor enumeration, the Megatron rules as pre-filters, and pinned values."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.errors import MegapilotError
from megapilot.plan import plan, space
from megapilot.plan.space import Pins
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec, validate_layout


@pytest.fixture(scope="module")
def llama70b():
    return get_model("llama3.1-70b")


@pytest.fixture(scope="module")
def h100x64():
    return ClusterSpec.from_gpu_count(get_gpu("h100"), 64)


def test_divisors_are_complete_and_sorted():
    assert space.divisors(12) == (1, 2, 3, 4, 6, 12)
    assert space.divisors(1) == (1,)
    assert space.divisors(61) == (1, 61)


def test_tp_rule_follows_kv_heads_and_node_size(llama70b, h100x64):
    assert space.tp_rule(llama70b, h100x64, 8) is None
    assert space.tp_rule(llama70b, h100x64, 16).category == "tp exceeds GPUs per node"  # a multiple of 8 KV groups
    gpt = get_model("gpt3-175b")  # 96 heads, MHA
    assert space.tp_rule(gpt, h100x64, 16).category == "tp exceeds GPUs per node"
    assert space.tp_rule(gpt, h100x64, 5).category == "tp does not divide attention heads"


def test_tp_rule_walks_tp_above_the_kv_heads_where_it_is_a_multiple_of_them(h100x64):
    """The estimate's predicate (Megatron-Core 0.16+: num_query_groups a multiple or a divisor of TP)."""
    gqa4 = get_model("gpt3-175b").model_copy(update={"num_query_groups": 4})
    assert space.tp_rule(gqa4, h100x64, 8) is None  # each KV head on two ranks
    gqa12 = get_model("gpt3-175b").model_copy(update={"num_query_groups": 12})
    refused = space.tp_rule(gqa12, h100x64, 8)
    assert refused.category == "tp neither divides nor is a multiple of the KV heads"
    assert refused.fix == "use a TP from: 1, 2, 3, 4, 6, 12, 24, 48, 96"


def test_cp_rule_needs_two_cp_chunks_per_sequence(llama70b):
    training = TrainingSpec(seq_length=6, global_batch_size=8)
    assert space.cp_rule(llama70b, training, 1, 3) is None
    assert space.cp_rule(llama70b, training, 1, 2).category == "seq_length not divisible by 2*cp"


def test_gated_delta_net_takes_cp_and_tp_over_whole_linear_heads_per_tp_x_cp_rank(h100x64):
    qwen3_next = get_model("qwen3-next-80b-a3b")  # 16 key / 32 value heads of Gated DeltaNet, 2 KV groups
    training = TrainingSpec(seq_length=4096, global_batch_size=8)
    assert space.cp_rule(qwen3_next, training, 1, 1) is None
    assert space.cp_rule(qwen3_next, training, 2, 8) is None  # 16 ranks, one key head each
    assert space.cp_rule(qwen3_next, training, 4, 8).category == "tp*cp does not divide the Gated DeltaNet heads"
    assert space.tp_rule(qwen3_next, h100x64, 2) is None
    assert space.tp_rule(qwen3_next, h100x64, 8) is None  # TP 8 over 2 KV groups: each on four ranks
    shrunk = qwen3_next.model_copy(update={"gated_delta_net": qwen3_next.gated_delta_net.model_copy(
        update={"key_heads": 3, "value_heads": 6})})
    assert space.tp_rule(shrunk, h100x64, 2).category == "tp does not divide attention heads"


def test_the_mamba_mixer_splits_whole_heads_and_groups_over_tp_and_cp(h100x64):
    nemotron_h = get_model("nemotron-h-8b")  # 128 Mamba-2 heads, 8 groups
    training = TrainingSpec(seq_length=8192, global_batch_size=8)
    assert space.tp_rule(nemotron_h, h100x64, 8) is None
    assert space.cp_rule(nemotron_h, training, 8, 2) is None  # one group per TP rank, its 16 heads shared by CP
    four_groups = nemotron_h.model_copy(update={"mamba": nemotron_h.mamba.model_copy(update={"num_groups": 4})})
    assert space.tp_rule(four_groups, h100x64, 8).category == "tp does not divide the Mamba-2 heads and groups"
    few_heads = nemotron_h.model_copy(update={"mamba": nemotron_h.mamba.model_copy(update={"num_heads": 24})})
    assert space.cp_rule(few_heads, training, 8, 2).category == \
        "cp does not split the Mamba-2 heads and groups of a TP rank"  # 3 heads per TP rank


def test_attention_sinks_take_no_cp():
    gpt_oss = get_model("gpt-oss-120b")
    training = TrainingSpec(seq_length=4096, global_batch_size=8)
    assert space.cp_rule(gpt_oss, training, 1, 1) is None
    assert space.cp_rule(gpt_oss, training, 1, 2).category == "cp on an attention-sink model"


def test_sparse_attention_takes_no_cp():
    v32 = get_model("deepseek-v3.2")
    training = TrainingSpec(seq_length=4096, global_batch_size=8)
    assert space.cp_rule(v32, training, 1, 1) is None
    assert space.cp_rule(v32, training, 1, 2).category == "cp on a DeepSeek Sparse Attention model"
    assert space.cp_rule(get_model("deepseek-v3"), training, 1, 2) is None


@pytest.mark.parametrize(("name", "tp", "cp", "seq", "category"), [
    ("phi3-medium", 4, 1, 4096, "tp neither divides nor is a multiple of the KV heads"),
    ("qwen3-next-80b-a3b", 4, 8, 4096, "tp*cp does not divide the Gated DeltaNet heads"),
    ("gpt-oss-120b", 1, 2, 4096, "cp on an attention-sink model"),
    ("nemotron-h-56b", 16, 1, 4096, "tp does not divide the Mamba-2 heads and groups"),
    ("llama3.1-8b", 1, 4, 4100, "seq_length not divisible by 2*cp"),
    ("deepseek-v3.2", 1, 2, 4096, "cp on a DeepSeek Sparse Attention model"),
    ("deepseek-v4-flash", 2, 1, 4096, "tp above 1 on DeepSeek-V4's compressed attention"),
    ("llama3.1-8b", 8, 1, 4100, "seq_length/cp not divisible by tp (sequence parallel)"),
])
def test_a_split_the_planner_cuts_is_refused_as_the_estimate_refuses_it(name, tp, cp, seq, category, h100x64):
    """The planner asks the estimate's own rules (`spec.validate.SplitRule`): TP's and CP's over the heads, CP's over
    the sequence and sequence parallel's, so its message and fix are the estimate's, under the planner's category."""
    model, training = get_model(name), TrainingSpec(seq_length=seq, global_batch_size=64)
    cut = space.tp_rule(model, h100x64, tp) or space.cp_rule(model, training, tp, cp)
    assert cut is not None and cut.category == category
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), tp * cp * 8)
    with pytest.raises(MegapilotError) as refused:
        validate_layout(model, cluster, training, ParallelConfig.for_world(
            tp * cp * 8, tp=tp, cp=cp, sequence_parallel=tp > 1), allow_tp_across_nodes=True)
    assert (cut.field, cut.message, cut.fix) == (refused.value.field, refused.value.problem, refused.value.fix)


def test_expert_rule_checks_expert_count_and_group_product():
    mixtral = get_model("mixtral-8x7b")
    assert space.expert_rule(mixtral, 2, 1, 4, 8, 1) is None
    assert space.expert_rule(mixtral, 2, 1, 4, 3, 1).category == "ep does not divide experts"
    assert space.expert_rule(mixtral, 1, 1, 4, 8, 1).category == "ep*etp does not divide tp*cp*dp"


def test_a_pinned_etp_on_a_dense_model_keeps_to_the_stages_its_expert_groups_fit():
    """Megatron carves expert groups for a dense model too: ETP 2 over TP1 PP8 on 8 GPUs has one rank per stage, and
    the search costed it, an expert-DP of 0 that the memory model divided by (an internal ZeroDivisionError)."""
    llama = get_model("llama3.1-8b")
    refused = space.expert_rule(llama, 1, 1, 1, 1, 2)
    assert refused is not None and refused.field == "etp" and refused.category == "ep*etp does not divide tp*cp*dp"
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 8)
    result = plan(llama, cluster, TrainingSpec(seq_length=4096, global_batch_size=64), top=5, pins=Pins(etp=2))
    assert result.candidates and all(c.parallel.expert_dp >= 1 for c in result.candidates)


def test_vpp_values_split_each_stage_evenly(llama70b):
    assert space.vpp_values(llama70b, 1, Pins()) == (1,)
    assert space.vpp_values(llama70b, 4, Pins()) == (1, 2, 4, 5, 10, 20)  # 80 layers / 4 stages = 20


def test_expert_values_walk_largest_ep_first():
    mixtral = get_model("mixtral-8x7b")
    pairs = space.expert_values(mixtral, 2, Pins())
    assert pairs[0] == (8, 1) and pairs[-1] == (1, 2)
    assert {etp for _, etp in pairs} == {1, 2}


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "seq", "precision", "pins", "field", "text"),
    [
        ("llama3.1-70b", "h100", 64, 4096, "bf16", Pins(tp=16), "tp", "exceeds 8 GPUs per node"),  # 2 ranks per KV head
        ("gpt-oss-20b", "h100", 64, 4096, "bf16", Pins(cp=2, cp_comm_type="p2p"), "cp_comm_type",
         "--cp-comm-type a2a"),
        ("gpt-oss-20b", "h100", 64, 4096, "bf16", Pins(tp=8, cp=2), "cp", "1 KV heads of a TP rank"),
        ("nemotron-h-56b", "h100", 64, 8192, "bf16", Pins(tp=16), "tp", "256 heads and 8 groups"),
        ("gpt3-175b", "h100", 64, 2048, "bf16", Pins(tp=5), "tp", "does not divide the 64 GPUs"),
        ("mixtral-8x7b", "h100", 64, 4096, "bf16", Pins(ep=3), "ep", "does not divide num_experts=8"),
        ("llama3.1-8b", "h100", 64, 4100, "bf16", Pins(cp=4), "cp", "not divisible by 2*cp=8"),
        ("llama3.1-8b", "h100", 64, 4096, "bf16", Pins(pp=64), "pp", "num_layers=32"),  # more stages than layers
        ("llama3.1-8b", "a100", 64, 4096, "fp8", Pins(), "precision", "not supported on A100"),
        ("llama3.1-8b", "h100", 64, 4096, "bf16", Pins(ep=2), "ep", "dense model"),
        # pins that each pass but not together: they read 'no layout passes the rules', or a GPU count to buy, or
        # (ETP 2 over one GPU per stage of a dense model) an internal ZeroDivisionError
        ("llama3.1-8b", "h100", 8, 4096, "bf16", Pins(tp=8, pp=8), "tp*pp", "tp*pp = 8*8 = 64 does not divide the 8"),
        ("llama3.1-8b", "h100", 8, 4096, "bf16", Pins(pp=8, etp=2), "etp", "1 GPUs of one pipeline stage (8 / pp 8)"),
        ("llama3.1-8b", "h100", 8, 4096, "bf16", Pins(etp=16), "etp", "etp=16 does not divide the 8 GPUs"),
        ("mixtral-8x7b", "h100", 8, 4096, "bf16", Pins(ep=8, etp=2), "ep*etp", "ep*etp = 16 does not divide the 8"),
        # TP, PP and CP pinned fix DP: a batch it cannot split was told to use 'a --gbs the GPUs divide'
        ("llama3.1-8b", "h100", 8, 4096, "bf16", Pins(tp=1, pp=1, cp=1, mbs=256), "gbs",
         "global batch 1,024 does not split into MBS 256 x DP 8"),
        # interleaving needs micro-batches in multiples of PP, which GBS 1,024 never gives PP 3; it read 'no layout
        # fits' with the smallest footprint of a layout that cannot interleave, and a smaller model to use
        ("llama3.1-8b", "h100", 24, 4096, "bf16", Pins(pp=3, vpp=2), "vpp", "in multiples of pp=3"),
    ],
)
def test_impossible_pins_raise_a_named_error(model, gpu, gpus, seq, precision, pins, field, text):
    spec = get_model(model)
    cluster = ClusterSpec.from_gpu_count(get_gpu(gpu), gpus)
    training = TrainingSpec(seq_length=seq, global_batch_size=1024, precision=precision)
    with pytest.raises(MegapilotError) as info:
        space.check_pins(spec, cluster, training, pins)
    assert info.value.field == field
    assert text in str(info.value)
    assert info.value.fix


def test_interleaving_needs_a_multiple_of_pp_micro_batches():
    training = TrainingSpec(seq_length=4096, global_batch_size=64)
    assert space.interleave_rule(training, pp=4, vpp=2, dp=4, mbs=1) is None  # 16 micro-batches
    assert space.interleave_rule(training, pp=4, vpp=1, dp=32, mbs=1) is None  # 2, but no interleaving
    rejection = space.interleave_rule(training, pp=4, vpp=2, dp=32, mbs=1)  # 2 micro-batches < PP
    assert rejection.category == "micro-batches not a multiple of pp (interleaved schedule)"


def test_the_balanced_layout_is_re_cut_for_each_vpp_the_way_deepseek_recipes_interleave():
    """61 layers + MTP at PP 8: first/last splits cannot interleave, the balanced layout string can (Bridge's
    DeepSeek-V3 H100 recipe runs PP 8 VP 4 with a layout)."""
    model = get_model("deepseek-v3")
    splits = space.pipeline_splits(model, 8)
    layout = [split for split in splits if split.layout is not None]
    assert len(layout) == 1 and space.is_balanced_layout(model, 8, layout[0])
    assert 4 in space.vpp_values(model, 8, space.Pins(), layout[0])
    cut = space.split_at_vpp(model, 8, layout[0], 4)
    assert cut.layout is not None and cut != layout[0]
    assert space.pp_rule(model, 8, 4, cut) is None
    uneven = [split for split in splits if split.first_stage_layers is not None]
    assert uneven and space.split_at_vpp(model, 8, uneven[0], 4) == uneven[0]  # only the layout string is re-cut


def test_a_pinned_vpp_is_legal_where_only_the_layout_string_interleaves():
    model = get_model("deepseek-v3")
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 1024)
    training = TrainingSpec(seq_length=4096, global_batch_size=8192)
    space.check_pins(model, cluster, training, space.Pins(tp=2, pp=8, vpp=4, ep=64))  # no error


def test_a_hybrid_walks_the_uneven_splits_its_layer_pattern_places():
    """Nemotron-H 56B's 118 layers at PP 4: Megatron-Core's hybrid stack places first/last counts and any layout as
    `|` segments of its pattern, never the account-for slots; the planner offers those the estimate accepts."""
    h56 = get_model("nemotron-h-56b")
    splits = space.pipeline_splits(h56, 4)
    assert any(split.first_stage_layers for split in splits) and any(split.layout for split in splits)
    assert not any(split.account_for_embedding or split.account_for_loss for split in splits)
    cluster, training = ClusterSpec.from_gpu_count(get_gpu("h100"), 32), TrainingSpec(seq_length=8192,
                                                                                      global_batch_size=64)
    for split in splits:
        assert space.pp_rule(h56, 4, 1, split) is None
        validate_layout(h56, cluster, training, ParallelConfig.for_world(
            32, tp=8, pp=4, first_stage_layers=split.first_stage_layers, last_stage_layers=split.last_stage_layers,
            pipeline_layout=split.layout))


def test_a_hybrid_interleaves_an_even_split_but_not_first_and_last_counts():
    """The segments interleave an even split (52 layers at PP 2: 2, 13 or 26 virtual stages per rank); first/last
    counts run at VPP 1 only, where a dense model's 16/20/16 split takes VPP 2 and 4 (Megatron refuses the counts
    beside a hybrid's interleaving), and the planner's refusal is the estimate's."""
    h8b, llama70b = get_model("nemotron-h-8b"), get_model("llama3.1-70b")
    assert space.vpp_values(h8b, 2, Pins()) == (1, 2, 13, 26)
    ends = space.PipelineSplit(first_stage_layers=16, last_stage_layers=16)
    assert space.vpp_values(llama70b.model_copy(update={"num_layers": 52}), 3, Pins(), ends) == (1, 2, 4)
    assert space.vpp_values(h8b, 3, Pins(), ends) == (1,)
    refused = space.pp_rule(h8b, 3, 2, ends)
    assert refused is not None and refused.category == "uneven pipeline split refused"
    with pytest.raises(MegapilotError) as estimate:
        validate_layout(h8b, ClusterSpec.from_gpu_count(get_gpu("h100"), 48), TrainingSpec(
            seq_length=8192, global_batch_size=64), ParallelConfig.for_world(
            48, pp=3, vpp=2, first_stage_layers=16, last_stage_layers=16))
    assert (refused.field, refused.message, refused.fix) == (
        estimate.value.field, estimate.value.problem, estimate.value.fix)


def test_pp_rule_keeps_dsa_topk_sharing_inside_each_stage():
    glm5 = get_model("glm-5")
    shared = glm5.model_copy(update={"mla": glm5.mla.model_copy(update={"dsa": glm5.dsa.model_copy(
        update={"topk_freq": 2, "skip_topk_offset": 2})})})  # 1-based layers 1, 2, 4, 6, ... run the indexer
    assert space.pp_rule(shared, 2) is None  # the second stage starts at layer 40
    assert space.pp_rule(shared, 3).category == "a pipeline stage starts on a layer sharing an earlier DSA top-k"
    assert space.pp_rule(glm5, 3) is None


def test_tp_may_cross_the_trays_of_one_nvlink_domain_up_to_the_largest_calibrated_tp():
    """A GB200 tray holds 4 GPUs but its NVL72 rack is one NVLink domain: TP 8 spans two trays on NVLink (the
    recipes run Nemotron-4 340B at TP 8 there) and is walked; beyond TP 8 (no calibration run checks it) and on
    8-GPU HGX nodes the node is the limit; a job smaller than the domain has only its own GPUs."""
    model = get_model("llama3.1-70b")
    rack = ClusterSpec.from_gpu_count(get_gpu("gb200"), 128)
    assert rack.gpus_per_node == 4 and space.tp_limit(rack) == 8
    assert space.tp_rule(model, rack, 8) is None
    assert space.tp_rule(model, rack, 16) is not None  # beyond the largest calibrated TP
    assert space.tp_limit(ClusterSpec.from_gpu_count(get_gpu("h100"), 1024)) == 8
    assert space.tp_limit(ClusterSpec.from_gpu_count(get_gpu("gb200"), 4)) == 4


def test_tp_stops_at_a_node_smaller_than_its_gpus_baseboard_as_the_estimate_does():
    """H100 nodes of 4 GPUs: NVLink ends at the node, so TP 8 would run its all-reduces over the NICs; the estimate
    refuses that layout (without --force-tp-across-nodes), and the planner must not walk it."""
    half_nodes = ClusterSpec.from_gpu_count(get_gpu("h100"), 32, gpus_per_node=4)
    assert space.tp_limit(half_nodes) == 4
    assert space.tp_rule(get_model("llama3.1-70b"), half_nodes, 8) is not None


def test_a_plan_with_tp_across_trays_is_validated_and_costed_on_nvlink():
    from megapilot.plan import plan

    model = get_model("llama3.1-70b")
    rack = ClusterSpec.from_gpu_count(get_gpu("gb200"), 64)
    result = plan(model, rack, TrainingSpec(seq_length=8192, global_batch_size=128), top=1, pins=Pins(tp=8, pp=1))
    best = result.best
    assert best.parallel.tp == 8 and best.estimate.fits
    assert best.estimate.time_breakdown_s["tp_comm"] > 0
    from megapilot.estimate import comm

    # the estimate prices the 8-GPU group at the tray's own NVLink bandwidth, not the NICs'
    assert comm.group_bandwidth_bytes_per_s(rack, 8) == comm.group_bandwidth_bytes_per_s(rack, 4)


def _search(model: str, gpu: str, gpus: int, seq: int, gbs: int, pins: Pins):
    from megapilot.plan import search_layouts

    return search_layouts(get_model(model), ClusterSpec.from_gpu_count(get_gpu(gpu), gpus),
                          TrainingSpec(seq_length=seq, global_batch_size=gbs), pins=pins)


def test_the_search_walks_tp_above_the_kv_heads_and_gated_delta_net_cp_over_whole_heads():
    """What the estimate accepts the planner walks: Qwen3-Next's CP over its 16 Gated DeltaNet key heads (TP x CP
    up to 16) with TP 4 above its 2 KV groups; Nemotron 3 Nano's TP 8 over 2 KV groups."""
    qwen3_next = _search("qwen3-next-80b-a3b", "b200", 64, 8192, 256, Pins(cp=4))
    assert qwen3_next.ranked and {fit.parallel.cp for fit in qwen3_next.ranked} == {4}
    assert ("tp", 4) in qwen3_next.best_by and ("tp", 8) not in qwen3_next.best_by  # 8 x 4 > 16 heads
    nano = _search("nemotron3-nano-30b-a3b", "h100", 64, 8192, 512, Pins(tp=8))
    assert nano.ranked and {fit.parallel.tp for fit in nano.ranked} == {8}


def test_a_pinned_cp_walks_only_the_shapes_whose_gpus_it_divides():
    llama = _search("llama3.1-70b", "h100", 64, 8192, 256, Pins(cp=4))  # TP 8 x PP 4 leaves 2 GPUs: no CP 4 there
    assert llama.ranked and all(fit.parallel.cp == 4 and fit.parallel.world_size == 64 for fit in llama.ranked)
