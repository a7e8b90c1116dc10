"""Step time: each term behaves as its physics says (the calibration on published runs: test_calibration.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.efficiency import CALIBRATED
from megapilot.estimate.step_time import EstimateOptions, step_time
from megapilot.spec import ClusterSpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec

LLAMA3_70B = ModelSpec(
    name="llama3-70b", num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
    num_query_groups=8, vocab_size=128256,
)
MIXTRAL = ModelSpec(
    name="mixtral", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
    num_query_groups=8, vocab_size=32000, moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=14336),
)
H100 = get_gpu("h100")
SEQ_4K = TrainingSpec(seq_length=4096, global_batch_size=512)


def _h100s(n: int) -> ClusterSpec:
    return ClusterSpec.from_gpu_count(H100, n)


def _layout(**kw) -> ParallelConfig:
    base = {"tp": 8, "pp": 4, "dp": 2, "sequence_parallel": True}
    return ParallelConfig(**(base | kw))


def test_mfu_is_model_flops_over_step_time_world_and_precision_peak():
    result = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout())
    expected = result.model_flops_per_step / (result.step_time_s * 64 * H100.bf16_dense_tflops * 1e12)
    assert result.mfu == pytest.approx(expected)
    assert result.tokens_per_s_per_gpu == pytest.approx(4096 * 512 / (result.step_time_s * 64))
    assert 0.2 < result.mfu < 0.7


def test_step_time_is_the_sum_of_its_terms():
    result = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout())
    assert sum(result.breakdown_s.values()) == pytest.approx(result.step_time_s)


def test_warnings_name_the_terms_that_take_too_large_a_share_of_the_step():
    few_microbatches = TrainingSpec(seq_length=4096, global_batch_size=8)  # 4 per pipeline of depth 4
    result = step_time(LLAMA3_70B, _h100s(64), few_microbatches, _layout())
    bubble = result.breakdown_s["pp_bubble"] / result.step_time_s
    assert bubble > 0.15
    assert f"pipeline bubble is {bubble:.0%} of the step: raise the global batch, use interleaving (--vpp) or " \
           "lower pp" in result.warnings
    quiet = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout(vpp=5))
    assert not any(w.startswith("pipeline bubble") for w in quiet.warnings)


def test_pipeline_bubble_follows_pp_minus_one_over_microbatches_and_shrinks_with_interleaving():
    plain = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout())
    interleaved = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout(vpp=5))
    microbatches = 512 // 2
    per_microbatch = (plain.step_time_s - plain.breakdown_s["pp_bubble"] - plain.breakdown_s["dp_comm"]
                      - plain.breakdown_s["optimizer"]) / microbatches
    # The slowest (last) stage sets the micro-batch time; the bubble counts the three lighter ones, without the
    # logits and cross-entropy: a little under 3 micro-batches.
    assert 0.9 * 3 * per_microbatch < plain.breakdown_s["pp_bubble"] < 3 * per_microbatch
    assert interleaved.breakdown_s["pp_bubble"] == pytest.approx(plain.breakdown_s["pp_bubble"] / 5, rel=0.1)


def test_recompute_costs_more_the_more_is_recomputed():
    times = {r: step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout(recompute=r)) for r in ("none", "selective", "full")}
    assert times["none"].breakdown_s["recompute"] == 0
    assert 0 < times["selective"].breakdown_s["recompute"] < times["full"].breakdown_s["recompute"]
    full = times["full"].breakdown_s
    # one more forward of every layer: a third of their forward+backward (the logits are not recomputed)
    assert full["compute"] / 4 < full["recompute"] <= full["compute"] / 3
    assert times["full"].mfu < times["selective"].mfu < times["none"].mfu


def test_tp_overlap_hides_most_of_the_tp_communication():
    exposed = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout(), EstimateOptions(tp_comm_overlap=False))
    hidden = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout())
    assert hidden.breakdown_s["tp_comm"] == pytest.approx(exposed.breakdown_s["tp_comm"] * 0.2)


def test_amd_instinct_has_no_userbuffers_to_hide_tp_communication_behind():
    mi300x = ClusterSpec.from_gpu_count(get_gpu("mi300x"), 64)
    asked = step_time(LLAMA3_70B, mi300x, SEQ_4K, _layout())
    exposed = step_time(LLAMA3_70B, mi300x, SEQ_4K, _layout(), EstimateOptions(tp_comm_overlap=False))
    assert asked.breakdown_s["tp_comm"] == exposed.breakdown_s["tp_comm"] > 0


def test_nvfp4_runs_its_tp_communication_without_the_userbuffers_overlap():
    """Megatron-Bridge's recipes run every NVFP4 layout without --tp-comm-overlap, and `script` does not write it:
    priced exposed, while MXFP8 on the same layout keeps the overlap."""
    b200s = ClusterSpec.from_gpu_count(get_gpu("b200"), 64)
    tp_s = {precision: step_time(LLAMA3_70B, b200s, SEQ_4K.model_copy(update={"precision": precision}), _layout(),
                                 EstimateOptions()).breakdown_s["tp_comm"] for precision in ("mxfp8", "nvfp4")}
    assert tp_s["mxfp8"] == pytest.approx(tp_s["nvfp4"] * 0.2) and tp_s["nvfp4"] > 0


def test_tp_above_the_kv_heads_gathers_each_layers_qkv_over_the_tp_group():
    """Megatron-Core 0.16+: with 4 KV heads on TP 8 every rank all-gathers the whole QKV output (forward) and
    reduce-scatters its gradient (backward), outside the userbuffers overlap; at TP <= KV heads nothing is added."""
    from megapilot.estimate import comm
    from megapilot.estimate.step_time import layer_terms

    cluster, options = _h100s(64), EstimateOptions()
    four_kv = LLAMA3_70B.model_copy(update={"num_query_groups": 4})

    def tp_comm(model: ModelSpec, tp: int) -> float:
        return layer_terms(model, 0, cluster, SEQ_4K, _layout(tp=tp, dp=16 // tp), options,
                           recomputed=False)["tp_comm"]

    gathered = (64 + 2 * 4) * LLAMA3_70B.head_dim * 4096 * 2  # bf16 [tokens x (q + 2 kv) x head_dim]
    expected = 2 * comm.all_gather_s(gathered, 8, comm.group_bandwidth_bytes_per_s(cluster, 8))
    assert tp_comm(four_kv, 8) - tp_comm(LLAMA3_70B, 8) == pytest.approx(expected)
    assert tp_comm(four_kv, 4) == pytest.approx(tp_comm(LLAMA3_70B, 4))


def test_gated_delta_net_under_cp_pays_two_all_to_alls_each_way_and_its_attention_layers_the_ring():
    """Megatron-Core 0.18: in_proj's output goes sequence -> heads before the delta rule and the normed output back,
    forward and backward; the full-attention layers keep ring attention's K/V exchange."""
    from megapilot.catalog import get_model
    from megapilot.estimate import comm
    from megapilot.estimate.step_time import layer_terms

    qwen3_next = get_model("qwen3-next-80b-a3b")
    gdn = qwen3_next.gated_delta_net
    assert gdn is not None and qwen3_next.is_linear_attention_layer(0) and not qwen3_next.is_linear_attention_layer(3)
    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 64)
    training = TrainingSpec(seq_length=8192, global_batch_size=256)
    layout = ParallelConfig(tp=2, cp=4, ep=8, etp=1, dp=8, sequence_parallel=True)
    linear = layer_terms(qwen3_next, 0, cluster, training, layout, EstimateOptions(), recomputed=False)
    tokens = 8192 / 4
    sent = tokens * (gdn.in_proj_width + gdn.value_width) / 2 * 2
    assert linear["cp_comm"] == pytest.approx(
        2 * comm.all_to_all_s(sent, 4, comm.group_bandwidth_bytes_per_s(cluster, 4, stride=2)))
    unsplit = layer_terms(qwen3_next, 0, cluster, training, layout.model_copy(update={"cp": 1, "dp": 32}),
                          EstimateOptions(), recomputed=False)
    assert unsplit["cp_comm"] == 0.0
    full = layer_terms(qwen3_next, 3, cluster, training, layout, EstimateOptions(), recomputed=False)
    assert full["cp_comm"] != linear["cp_comm"]


def test_expert_all_to_all_is_slower_across_nodes():
    train = TrainingSpec(seq_length=4096, global_batch_size=256)
    inside = step_time(MIXTRAL, _h100s(64), train, ParallelConfig(tp=1, dp=64, ep=8))
    across = step_time(MIXTRAL, _h100s(64), train, ParallelConfig(tp=2, dp=32, ep=8, sequence_parallel=True))
    assert 0 < inside.breakdown_s["ep_comm"] < across.breakdown_s["ep_comm"]


def test_context_parallel_ring_hides_behind_long_attention_but_not_short():
    long_seq = TrainingSpec(seq_length=32768, global_batch_size=64)
    short_seq = TrainingSpec(seq_length=2048, global_batch_size=64)
    layout = ParallelConfig(tp=8, cp=8, dp=1, sequence_parallel=True)  # CP across nodes
    assert step_time(LLAMA3_70B, _h100s(64), long_seq, layout).breakdown_s["cp_comm"] == 0
    assert step_time(LLAMA3_70B, _h100s(64), short_seq, layout).breakdown_s["cp_comm"] > 0


def test_overlapped_gradient_reduction_is_exposed_less():
    layout = ParallelConfig(tp=1, dp=64)
    train = TrainingSpec(seq_length=4096, global_batch_size=64)
    small = LLAMA3_70B.model_copy(update={"num_layers": 8})
    overlapped = step_time(small, _h100s(64), train, layout)
    serial = step_time(small, _h100s(64), train, layout,
                       EstimateOptions(overlap_grad_reduce=False, overlap_param_gather=False))
    assert overlapped.breakdown_s["dp_comm"] < serial.breakdown_s["dp_comm"]


def test_fp8_is_faster_but_its_mfu_against_the_fp8_peak_is_lower():
    bf16 = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout())
    fp8 = step_time(LLAMA3_70B, _h100s(64), SEQ_4K.model_copy(update={"precision": "fp8"}), _layout())
    assert fp8.step_time_s < bf16.step_time_s
    assert fp8.mfu < bf16.mfu


def test_more_data_parallel_gpus_shorten_the_step():
    layout32 = ParallelConfig(tp=8, pp=4, dp=1, sequence_parallel=True)
    t32 = step_time(LLAMA3_70B, _h100s(32), SEQ_4K, layout32).step_time_s
    t64 = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, _layout()).step_time_s
    assert t64 == pytest.approx(t32 / 2, rel=0.05)


def test_fsdp_moves_more_data_parallel_traffic_than_the_distributed_optimizer():
    serial = EstimateOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    layout = ParallelConfig(tp=8, dp=8)
    distopt = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, layout, serial)
    fsdp = step_time(LLAMA3_70B, _h100s(64), SEQ_4K, layout.model_copy(update={"fsdp": True}), serial)
    assert fsdp.breakdown_s["dp_comm"] > 2 * distopt.breakdown_s["dp_comm"]


def test_fsdp_hides_its_traffic_under_the_step_except_the_first_gather_and_last_reduce_of_a_layer():
    from megapilot.estimate.step_time import _fsdp_exposed_s

    overlapped = EstimateOptions()  # the edges alone: no SMs held (share 0; the next test holds them)
    # 4 micro-batches of 10 s, 10 layers; per step: 2 gathers x 0.5 s x 4 + one 1 s reduce-scatter = 5 s.
    exposed, total = _fsdp_exposed_s(1.0, 0.5, overlapped, 10.0, 4, 10, share=0.0)
    assert total == pytest.approx(5.0)
    assert exposed == pytest.approx((4 * 0.5 + 1.0) / 10)  # one layer's gather per micro-batch + its reduce
    # Traffic longer than the compute (4 x 0.5 s) shows its excess on top.
    assert _fsdp_exposed_s(1.0, 0.5, overlapped, 0.5, 4, 10, share=0.0)[0] == pytest.approx(3.0 + 0.3)
    serial = EstimateOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    assert _fsdp_exposed_s(1.0, 0.5, serial, 10.0, 4, 10, share=0.0)[0] == pytest.approx(5.0)


def test_fsdp_traffic_that_hides_still_slows_the_compute_beside_it_by_the_sms_nccls_kernels_hold():
    from megapilot.estimate.step_time import _fsdp_exposed_s

    overlapped, share = EstimateOptions(), 16 / 132
    # 5 s of traffic, 0.3 s of it the unhidden first gathers and last reduce; the other 4.7 s run beside compute
    exposed, _ = _fsdp_exposed_s(1.0, 0.5, overlapped, 10.0, 4, 10, share)
    assert exposed == pytest.approx(0.3 + share * 4.7)
    # traffic that outlasts the compute shows its excess (3 s), already more than its SMs' toll (0.57 s)
    assert _fsdp_exposed_s(1.0, 0.5, overlapped, 0.5, 4, 10, share)[0] == pytest.approx(3.0 + 0.3)
    serial = EstimateOptions(overlap_grad_reduce=False, overlap_param_gather=False)
    assert _fsdp_exposed_s(1.0, 0.5, serial, 10.0, 4, 10, share)[0] == pytest.approx(5.0)


def test_a_dp_reduce_and_gather_that_hide_entirely_cost_the_share_of_the_sms_nccls_channels_hold():
    """Llama 3 70B TP 8 x PP 4 x DP 2 on 64 H100, micro-batch 2: one micro-batch's backward (forward) outlasts
    the stage's reduce-scatter (all-gather), so nothing waits; but NCCL's 16 channels hold 16 of the 132 SMs for
    all of it."""
    from megapilot.estimate.latency import NCCL_COLLECTIVE_SMS
    from megapilot.estimate.step_time import _dp_comm_s, stage_costs

    layout = _layout(dp=2, mbs=2)
    stage0 = stage_costs(LLAMA3_70B, _h100s(64), SEQ_4K, layout, EstimateOptions())[0].total
    exposed, total = _dp_comm_s(LLAMA3_70B, _h100s(64), layout, EstimateOptions(), stage0,
                                layout.num_microbatches(512), SEQ_4K)
    assert NCCL_COLLECTIVE_SMS == 16
    assert exposed == pytest.approx(total * 16 / 132)


def test_fsdp_of_a_405b_model_over_two_nvl72_racks_rides_nvlink_and_hides_under_compute():
    """Megatron-FSDP TP 2 x DP 64 on 128 GB200 (the published 25.07 layout): the DP group's ring crosses the rack
    boundary through 36 NICs, not a tray's 4, so its ~2 s of traffic hides under ~5 s of compute: what shows is
    the toll its NCCL kernels take of that compute (16 of 148 SMs for its length)."""
    model = ModelSpec(name="405b-like", num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                      num_attention_heads=128, num_query_groups=8, vocab_size=128256)
    cluster = ClusterSpec.from_gpu_count(get_gpu("gb200"), 128)
    training = TrainingSpec(seq_length=8192, global_batch_size=64, precision="fp8")
    layout = ParallelConfig(tp=2, dp=64, sequence_parallel=True, fsdp=True)
    result = step_time(model, cluster, training, layout)
    assert result.breakdown_s["dp_comm"] < 0.06 * result.step_time_s
    assert 600 < result.tokens_per_s_per_gpu < 1000  # published 706 (25.07) and 729 (25.09)


def test_uneven_split_runs_at_the_middle_stages_pace_and_its_lighter_ends_shorten_the_bubble():
    from megapilot.estimate.step_time import stage_costs

    model = ModelSpec(name="405b-like", num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                      num_attention_heads=128, num_query_groups=8, vocab_size=128256)
    layout = ParallelConfig(tp=8, pp=16, dp=16, sequence_parallel=True, recompute="full",
                            first_stage_layers=7, last_stage_layers=7)
    cluster = ClusterSpec.from_gpu_count(H100, 2048)
    training = TrainingSpec(seq_length=8192, global_batch_size=2048)
    stages = [c.total for c in stage_costs(model, cluster, training, layout, EstimateOptions())]
    assert stages[0] < stages[1] == stages[7] == stages[14]  # 7 layers + embedding vs 8 layers
    assert max(stages) > stages[0]  # the lighter first rank does not set the pace
    result = step_time(model, cluster, training, layout)
    # Fill and drain add one micro-batch of every stage but the slowest: less than 15 slowest ones.
    per_microbatch = max(stages)
    assert 14 * min(stages) < result.breakdown_s["pp_bubble"] < 15 * per_microbatch + 15 * result.breakdown_s[
        "pp_comm"] / layout.num_microbatches(2048)


def test_layer_costs_add_and_scale_term_by_term():
    from megapilot.estimate.step_time import LayerCost

    a = LayerCost(compute=1.0, recompute=0.5, tp_comm=0.25)
    b = LayerCost(compute=2.0, cp_comm=0.1, ep_comm=0.2)
    total = (a + b).scaled(3)
    assert (total.compute, total.recompute, total.tp_comm) == (9.0, 1.5, 0.75)
    assert total.cp_comm == pytest.approx(0.3) and total.ep_comm == pytest.approx(0.6)
    assert total.total == pytest.approx(3 * (a.total + b.total))


def test_full_recompute_re_runs_a_third_of_each_recomputed_layer():
    from megapilot.estimate.passes import PASSES_PER_FORWARD_BACKWARD
    from megapilot.estimate.step_time import layer_cost

    layout = ParallelConfig(tp=8, dp=8, sequence_parallel=True, recompute="full")
    cost = layer_cost(LLAMA3_70B, 0, _h100s(64), SEQ_4K, layout, EstimateOptions(), recomputed=True)
    kept = layer_cost(LLAMA3_70B, 0, _h100s(64), SEQ_4K, layout, EstimateOptions(), recomputed=False)
    assert cost.recompute == pytest.approx(cost.compute / PASSES_PER_FORWARD_BACKWARD)
    assert kept.recompute == 0.0 and cost.tp_comm == pytest.approx(1.5 * kept.tp_comm)


QWEN3_30B_LIKE = ModelSpec(
    name="qwen3-30b-like", num_layers=4, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
    num_query_groups=4, kv_channels=128, vocab_size=151936,
    moe=MoESpec(num_experts=128, router_topk=8, moe_ffn_hidden_size=768),
)


def _moe_layer(model: ModelSpec, cluster: ClusterSpec, layout: ParallelConfig, options: EstimateOptions):
    from megapilot.estimate.step_time import layer_cost

    training = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")
    return layer_cost(model, 0, cluster, training, layout, options, recomputed=False)


def test_routed_experts_run_at_the_grouped_fraction_of_a_dense_gemm_of_their_shape():

    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    layout = ParallelConfig(tp=1, dp=8, ep=8)
    plain = replace(CALIBRATED, grouped_gemm_fraction=1.0, kernel_overhead_s=0.0)  # the layer's work alone
    base = _moe_layer(QWEN3_30B_LIKE, cluster, layout, EstimateOptions(efficiency=plain)).compute
    half = _moe_layer(QWEN3_30B_LIKE, cluster, layout,
                      EstimateOptions(efficiency=replace(plain, grouped_gemm_fraction=0.5))).compute
    # Half the fraction doubles the experts' GEMMs: 16 local experts x (2048 tokens x 2048 x 1536 + x 768 x 2048),
    # six FP8 passes each, slowed by their partly filled last wave; their time is what the layer gains.
    from megapilot.estimate.moe_terms import expert_mlp_wave_slowdown
    from megapilot.estimate.step_time import _mlp_gemms_s

    waves = expert_mlp_wave_slowdown(QWEN3_30B_LIKE, 2048, layout, get_gpu("b200"))
    experts = 16 * _mlp_gemms_s(QWEN3_30B_LIKE, 2048, 768, 1, cluster, "fp8", plain) * waves
    assert half - base == pytest.approx(experts)
    assert 0.1 < experts / base < 0.6  # a real share of the layer, not all of it


def test_the_flex_dispatcher_and_the_all_to_all_overlap_shrink_the_exposed_cross_node_all_to_all():
    """DeepSeek-V3-like MoE layer, EP 64 over 8 H100 nodes: the flex dispatcher sends a token once per node it
    reaches (5.29 of 8 nodes for top-8 of 256), and the overlap hides what the layer's compute covers."""
    model = ModelSpec(name="dsv3-like", num_layers=4, hidden_size=7168, ffn_hidden_size=18432,
                      num_attention_heads=128, vocab_size=129280,
                      moe=MoESpec(num_experts=256, router_topk=8, moe_ffn_hidden_size=2048,
                                  shared_expert_ffn_hidden_size=2048))
    cluster = _h100s(64)
    layout = ParallelConfig(tp=1, dp=64, ep=64)
    alltoall = _moe_layer(model, cluster, layout, EstimateOptions())
    flex = _moe_layer(model, cluster, layout, EstimateOptions(moe_flex_dispatcher=True))
    assert flex.ep_comm == pytest.approx(alltoall.ep_comm * 5.29 / 8, rel=0.01)  # NIC-bound: the remote share
    overlapped = _moe_layer(model, cluster, layout, EstimateOptions(moe_a2a_overlap=True))
    # NIC-bound (11 ms an all-to-all against 4 to 11 ms of compute a window): the overlap hides most of a
    # layer's compute's worth, never more.
    assert alltoall.ep_comm - alltoall.compute < overlapped.ep_comm < alltoall.ep_comm - 0.8 * alltoall.compute
    assert overlapped.compute == alltoall.compute
    # None: on only where the expert group leaves the NVLink domain (here it does; EP 8 inside a node does not).
    assert _moe_layer(model, cluster, layout, EstimateOptions(moe_a2a_overlap=None)).ep_comm == overlapped.ep_comm
    in_node = ParallelConfig(tp=1, dp=64, ep=8)
    assert _moe_layer(model, cluster, in_node, EstimateOptions(moe_a2a_overlap=None)).ep_comm == \
        _moe_layer(model, cluster, in_node, EstimateOptions()).ep_comm > 0


def test_an_overlapped_all_to_all_that_every_window_covers_still_costs_the_sms_its_kernels_hold():
    """EP 8 inside one H100 node: each all-to-all is shorter than the compute Megatron pairs it with, so none of
    it waits; but for its length its kernels hold 20 of the 132 SMs, and the compute beside it slows by that."""
    from megapilot.estimate.moe_terms import ALL_TO_ALL_SMS

    model = ModelSpec(name="dsv3-like", num_layers=4, hidden_size=7168, ffn_hidden_size=18432,
                      num_attention_heads=128, vocab_size=129280,
                      moe=MoESpec(num_experts=256, router_topk=8, moe_ffn_hidden_size=2048,
                                  shared_expert_ffn_hidden_size=2048))
    cluster, layout = _h100s(8), ParallelConfig(tp=1, dp=8, ep=8)
    alone = _moe_layer(model, cluster, layout, EstimateOptions())
    overlapped = _moe_layer(model, cluster, layout, EstimateOptions(moe_a2a_overlap=True))
    assert alone.ep_comm / 4 < alone.compute / 6  # every window's compute (a sixth of the layer or more) covers it
    assert ALL_TO_ALL_SMS == 20
    assert overlapped.ep_comm == pytest.approx(alone.ep_comm * 20 / 132)


def test_an_all_to_all_hides_only_under_the_compute_of_its_own_window():
    """A layer whose MLP is tiny beside its attention: the two all-to-alls paired with the MLP outlast it and
    wait, although the whole layer's compute would cover all four."""
    model = ModelSpec(name="attention-heavy", num_layers=4, hidden_size=4096, ffn_hidden_size=512,
                      num_attention_heads=32, vocab_size=32000,
                      moe=MoESpec(num_experts=8, router_topk=1, moe_ffn_hidden_size=128))
    cluster, layout = _h100s(16), ParallelConfig(tp=1, dp=16, ep=16)
    work = replace(CALIBRATED, kernel_overhead_s=0.0)  # the GEMMs and passes alone: the kernels' fixed costs aside
    alone = _moe_layer(model, cluster, layout, EstimateOptions(efficiency=work))
    overlapped = _moe_layer(model, cluster, layout, EstimateOptions(efficiency=work, moe_a2a_overlap=True))
    assert alone.ep_comm < alone.compute  # the layer as a whole would hide it
    assert overlapped.ep_comm > alone.ep_comm * 20 / 132 * 1.5  # but the MLP's windows do not


def test_a_layers_terms_add_up_to_its_cost_and_selective_recompute_reruns_only_the_attention_core():
    from megapilot.estimate.step_time import COMPUTE_TERMS, layer_cost, layer_terms

    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")
    layout = ParallelConfig(tp=1, dp=8, ep=8, recompute="selective")
    terms = layer_terms(QWEN3_30B_LIKE, 0, cluster, training, layout, EstimateOptions(), recomputed=False)
    cost = layer_cost(QWEN3_30B_LIKE, 0, cluster, training, layout, EstimateOptions(), recomputed=False)
    assert sum(terms[name] for name in COMPUTE_TERMS) == pytest.approx(cost.compute)
    assert (terms["recompute"], terms["ep_comm"]) == (cost.recompute, cost.ep_comm)
    assert terms["recompute"] == pytest.approx(terms["mixer_core"] / 3)  # not the MoE token passes
    assert min(terms[name] for name in ("router", "experts", "moe_token_passes", "glue", "ep_comm")) > 0
    assert terms["mlp_gemms"] == terms["shared_experts"] == 0.0  # no dense MLP, no shared expert


def test_recomputed_modules_rerun_their_forward_and_a_recomputed_moe_layer_its_all_to_alls_too():
    """Qwen3-30B-like MoE layer on 8 B200: each module's forward third comes back in the backward; the whole MoE
    layer reruns its GEMMs' forward, half of its token passes and host sync, its forward's kernels and its two
    forward all-to-alls."""
    from megapilot.estimate.step_time import layer_terms

    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")

    def terms(*modules: str) -> dict[str, float]:
        layout = ParallelConfig(tp=1, dp=8, ep=8, recompute_modules=modules)
        return layer_terms(QWEN3_30B_LIKE, 0, cluster, training, layout, EstimateOptions(), recomputed=False)

    base = terms("core_attn")
    moe = terms("moe")
    gemms = base["experts"] + base["router"]  # no shared expert
    assert moe["recompute"] == pytest.approx(
        (gemms + base["kernels"]) / 3 + (base["moe_token_passes"] + base["moe_fixed"] + base["ep_comm"]) / 2)
    both = terms("core_attn", "moe")
    assert both["recompute"] == pytest.approx(base["recompute"] + moe["recompute"])
    # the activation and the pre-MLP norm: passes over memory, a small share of the layer
    light = terms("moe_act", "layernorm")["recompute"]
    assert 0 < light < 0.1 * sum(base[name] for name in ("experts", "mixer_core", "mixer_gemms"))
    assert terms("mlp")["recompute"] == 0.0  # no dense MLP on a MoE layer


def test_layouts_that_differ_only_in_their_recomputed_modules_do_not_share_a_cached_layer_cost():
    """The planner costs both rungs with the same model, cluster and options: the second must not get the first's
    cached layer cost (the cache key once left the modules out)."""
    from megapilot.estimate.step_time import step_time

    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")
    options = EstimateOptions()
    light, whole_moe = (ParallelConfig(tp=1, dp=8, ep=8, recompute_modules=modules)
                        for modules in (("core_attn",), ("core_attn", "moe")))
    first = step_time(QWEN3_30B_LIKE, cluster, training, light, options).breakdown_s["recompute"]
    second = step_time(QWEN3_30B_LIKE, cluster, training, whole_moe, options).breakdown_s["recompute"]
    assert second > 2 * first > 0


def test_an_experts_partly_filled_last_tile_costs_a_full_one():
    """EP 8 of 128 experts, top-8, 1,600 tokens per micro-batch: 800 rows per expert fill 6.25 tiles of 128,
    priced as 7 (896 rows); 1,792 tokens give 896 rows, exactly 7 tiles: the same expert time."""
    from megapilot.estimate.step_time import layer_terms

    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    layout = ParallelConfig(tp=1, dp=8, ep=8)

    def experts_s(seq: int) -> float:
        training = TrainingSpec(seq_length=seq, global_batch_size=64, precision="fp8")
        return layer_terms(QWEN3_30B_LIKE, 0, cluster, training, layout, EstimateOptions(), recomputed=False)[
            "experts"]

    assert experts_s(1600) == pytest.approx(experts_s(1792))
    assert experts_s(1664) == pytest.approx(experts_s(1792))  # 832 rows: 6.5 tiles, priced as 7
    assert experts_s(1536) < experts_s(1600)  # 768 rows: exactly 6 tiles


def test_gated_deltanet_layers_mix_tokens_in_linear_time_unlike_their_attention_layers():
    from megapilot.catalog.models import get_model
    from megapilot.estimate.step_time import layer_terms

    model = get_model("qwen3-next-80b-a3b")
    layout = _layout(tp=2, ep=8, mbs=1)
    cluster = _h100s(64)

    def per_token_ms(layer: int, seq: int, term: str) -> float:
        training = TrainingSpec(seq_length=seq, global_batch_size=512, precision="bf16")
        terms = layer_terms(model, layer, cluster, training, layout, EstimateOptions(), recomputed=False)
        return terms[term] * 1e3 / seq

    # the delta rule's state is fixed-size: per token its cost does not grow with the sequence
    assert per_token_ms(0, 32768, "mixer_core") == pytest.approx(per_token_ms(0, 4096, "mixer_core"), rel=1e-9)
    assert per_token_ms(3, 32768, "mixer_core") > 4 * per_token_ms(3, 4096, "mixer_core")  # causal attention
    # its projections are in_proj (q, k, v, z, beta, alpha) and out_proj, wider than the gated QKV here
    assert per_token_ms(0, 4096, "mixer_gemms") > per_token_ms(3, 4096, "mixer_gemms")


def test_padding_experts_to_capacity_costs_its_rows_and_saves_the_dispatcher_host_sync():
    from megapilot.catalog.models import get_model
    from megapilot.estimate.step_time import layer_terms

    model = get_model("qwen3-30b-a3b")
    layout = ParallelConfig(tp=1, pp=1, dp=8, ep=8, mbs=1)
    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)

    def terms(capacity: float | None, pad: bool) -> dict[str, float]:
        moe = model.moe.model_copy(update={"capacity_factor": capacity, "pad_to_capacity": pad})
        dropping = model.model_copy(update={"moe": moe})
        return layer_terms(dropping, 0, cluster, SEQ_4K, layout, EstimateOptions(), recomputed=False)

    dropless, padded, wide = terms(None, False), terms(1.0, True), terms(1.5, True)
    assert terms(1.5, False) == dropless  # dropping without padding: evenly routed tokens fit their capacity
    assert padded["moe_fixed"] < dropless["moe_fixed"]  # static splits: no device-to-host sync per layer
    assert padded["experts"] == pytest.approx(dropless["experts"])
    assert wide["ep_comm"] == pytest.approx(1.5 * padded["ep_comm"], rel=1e-6)  # padding rows are sent too
    assert wide["experts"] > 1.3 * padded["experts"]


def test_a_latent_moe_moves_and_computes_latent_sized_tokens_and_pays_its_two_projections():
    """Nemotron 3 Super's MoE block at EP 8 on B200: tokens leave the rank, are permuted and reach the experts 1024
    wide instead of 4096, so the all-to-all and the token passes shrink by 4 (bf16) and the experts compute on
    1024-wide rows; the projections 4096 -> 1024 -> 4096 are two dense GEMMs over the rank's tokens."""
    from megapilot.estimate.step_time import _gemm_s, _mlp_gemms_s, layer_terms

    full = ModelSpec(name="super-like", num_layers=2, hidden_size=4096, ffn_hidden_size=2688, num_attention_heads=32,
                     num_query_groups=2, kv_channels=128, vocab_size=131072, mlp_activation="squared_relu",
                     moe=MoESpec(num_experts=512, router_topk=22, moe_ffn_hidden_size=2688,
                                 shared_expert_ffn_hidden_size=5376))
    latent = full.model_copy(update={"moe": full.moe.model_copy(update={"latent_size": 1024})})
    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64, precision="bf16")
    layout = ParallelConfig(tp=1, dp=8, ep=8)

    def terms(model: ModelSpec) -> dict[str, float]:
        return layer_terms(model, 0, cluster, training, layout, EstimateOptions(), recomputed=False)

    wide, narrow = terms(full), terms(latent)
    assert narrow["ep_comm"] == pytest.approx(wide["ep_comm"] / 4)
    assert narrow["moe_token_passes"] == pytest.approx(wide["moe_token_passes"] / 4)
    assert wide["latent_projections"] == 0.0
    b200 = get_gpu("b200")
    plain = EstimateOptions().efficiency
    assert narrow["latent_projections"] == pytest.approx(
        _gemm_s(4096, 4096, 1024, b200, "bf16", plain) + _gemm_s(4096, 1024, 4096, b200, "bf16", plain))
    per_expert_rows = 4096 * 22 * 8 / 512  # 1408: 11 full tiles
    width_ratio = (_mlp_gemms_s(latent, per_expert_rows, 2688, 1, cluster, "bf16", plain, 1024)
                   / _mlp_gemms_s(full, per_expert_rows, 2688, 1, cluster, "bf16", plain))
    assert 0.25 <= width_ratio < 0.4  # a quarter of the FLOPs, at a GEMM efficiency no better than the wide one's
    assert narrow["experts"] < 0.4 * wide["experts"]
    assert narrow["shared_experts"] == wide["shared_experts"]  # the shared expert stays at full width


def test_a_heterogeneous_layer_without_attention_pays_no_attention_time_and_half_the_tp_collectives():
    from megapilot.estimate.step_time import layer_terms
    from megapilot.spec.model import LayerBlock, Llama3RopeScaling

    model = ModelSpec(name="nas", num_layers=2, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                      num_query_groups=8, vocab_size=128256, rope_scaling=Llama3RopeScaling(factor=8.0),
                      layer_blocks=(LayerBlock(), LayerBlock(attention="none", ffn_hidden_size=14336)))
    cluster = _h100s(16)
    training = TrainingSpec(seq_length=8192, global_batch_size=64, precision="bf16")
    layout = ParallelConfig(tp=8, cp=2, dp=1, sequence_parallel=True)
    full, mlp_only = (layer_terms(model, i, cluster, training, layout, EstimateOptions(), recomputed=False)
                      for i in (0, 1))
    assert mlp_only["mixer_gemms"] == mlp_only["mixer_core"] == mlp_only["cp_comm"] == 0.0
    assert full["mixer_core"] > 0 and full["cp_comm"] >= 0
    assert mlp_only["tp_comm"] == pytest.approx(full["tp_comm"] / 2)
    assert mlp_only["mlp_gemms"] == pytest.approx(full["mlp_gemms"] / 2, rel=0.05)  # half the width


def test_the_all_to_all_warning_advises_what_the_layout_can_still_change():
    """A heavy expert all-to-all across NVLink domains: keep the group inside one, or overlap it where Megatron
    allows the overlap on the layout (the recipes that spread experts over nodes do). Already inside: overlap it.
    Already overlapped: the overlap is not advised again."""
    from megapilot.catalog import get_model
    from megapilot.estimate.step_time import _ep_advice, _warnings
    from megapilot.spec.cuda_graphs import CudaGraphs

    breakdown = {"pp_bubble": 0.0, "dp_comm": 0.0, "ep_comm": 3.0, "tp_comm": 0.0}
    model, h100 = get_model("mixtral-8x7b"), ClusterSpec.from_gpu_count(get_gpu("h100"), 32)
    training = TrainingSpec(seq_length=4096, global_batch_size=256)
    flat, piped = (ParallelConfig.for_world(32, tp=2, ep=8, etp=2, pp=pp) for pp in (1, 2))
    advice = _ep_advice(model, h100, training, flat, EstimateOptions())
    across, = _warnings(breakdown, 10.0, ep_advice=lambda: advice, fabric="NVLink")
    assert across == ("expert all-to-all is 30% of the step: keep ep*etp inside the NVLink domain, or hide it behind "
                      "another micro-batch's compute (--overlap-moe-expert-parallel-comm, off here)")
    no_vpp = _ep_advice(model, h100, training, piped, EstimateOptions())
    assert no_vpp == ": keep ep*etp inside the {fabric} domain"  # PP 2 without VPP: Megatron refuses the overlap
    overlapped = EstimateOptions(moe_a2a_overlap=True)
    assert _ep_advice(model, h100, training, flat, overlapped) == ": keep ep*etp inside the {fabric} domain"
    inside_layout = ParallelConfig.for_world(32, tp=1, ep=8)
    inside, = _warnings(breakdown, 10.0, fabric="NVLink",
                        ep_advice=lambda: _ep_advice(model, h100, training, inside_layout, EstimateOptions()))
    assert inside.startswith("expert all-to-all is 30% of the step: it runs inside the NVLink domain already")
    assert "--overlap-moe-expert-parallel-comm" in inside
    assert "overlapped already" in _ep_advice(model, h100, training, inside_layout, overlapped)
    graphed = EstimateOptions(cuda_graphs=CudaGraphs(impl="transformer_engine", scope=("moe",)))
    assert _ep_advice(model, h100, training, flat, graphed) == ": keep ep*etp inside the {fabric} domain"  # refused
    asked = []  # below its threshold no warning is given, and its advice is not worked out
    assert _warnings(breakdown | {"ep_comm": 1.0}, 10.0, ep_advice=lambda: asked.append(1) or "", fabric="NVLink") == []
    assert not asked


def test_the_all_to_all_warning_names_the_gpus_own_scale_up_links():
    """An AMD Instinct's scale-up domain is xGMI (Infinity Fabric), not NVLink: Mixtral 8x7B with an expert group of
    16 (EP 8 x ETP 2) on 16 MI300X (two 8-GPU xGMI domains) is told to keep it inside the xGMI domain."""
    from megapilot.estimate import build_case, estimate

    case = build_case(model="mixtral-8x7b", gpu="mi300x", gpus=16, seq_len=4096, gbs=256, ep=8, tp=2, etp=2)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    ep_lines = [line for line in result.warnings if line.startswith("expert all-to-all")]
    assert ep_lines and all("xGMI domain" in line and "NVLink" not in line for line in ep_lines)


def test_sparse_attention_pays_its_indexer_at_4k_and_wins_at_64k_with_its_caveat_stated():
    from megapilot.catalog import get_model
    from megapilot.estimate.step_time import DSA_CAVEAT

    cluster = ClusterSpec(gpu=get_gpu("gb200"), num_nodes=64, gpus_per_node=4)

    def step(name: str, seq: int, tp: int = 1) -> float:
        layout = ParallelConfig(tp=tp, pp=4, ep=16, dp=64 // tp, etp=1, first_stage_layers=13,
                                last_stage_layers=16, sequence_parallel=tp > 1, recompute="full")
        training = TrainingSpec(seq_length=seq, global_batch_size=64, precision="fp8")
        result = step_time(get_model(name), cluster, training, layout, EstimateOptions())
        assert (DSA_CAVEAT in result.warnings) == (name == "deepseek-v3.2")
        return result.step_time_s

    assert step("deepseek-v3.2", 4096) > step("deepseek-v3", 4096)
    assert step("deepseek-v3.2", 65536) < 0.8 * step("deepseek-v3", 65536)
    # TP splits MLA's heads but not the indexer, which every TP rank runs whole: TP4 gains less than TP1 did
    saved_tp1 = step("deepseek-v3", 65536) - step("deepseek-v3.2", 65536)
    saved_tp4 = step("deepseek-v3", 65536, tp=4) - step("deepseek-v3.2", 65536, tp=4)
    assert saved_tp4 < saved_tp1 / 2


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "glm-5-shared-topk"])
def test_a_stage_costs_its_layers_each_priced_as_its_own_mixer(name):
    """Layers of one window but another mixer (Gated DeltaNet or attention; a DSA indexer of its own or a shared
    top-k) are costed apart: stage 0 (no loss) is the sum of its layers' costs."""
    from megapilot.catalog import get_model
    from megapilot.estimate.step_time import layer_cost, stage_costs

    if name == "glm-5-shared-topk":
        glm5 = get_model("glm-5")
        model = glm5.model_copy(update={"mla": glm5.mla.model_copy(update={"dsa": glm5.dsa.model_copy(
            update={"topk_freq": 2, "skip_topk_offset": 2})})})
    else:
        model = get_model(name)
    cluster, training = _h100s(16), TrainingSpec(seq_length=4096, global_batch_size=64)
    layout = ParallelConfig(tp=1, pp=2, ep=8, etp=1, dp=8)
    layers = sum(layer_cost(model, i, cluster, training, layout, EstimateOptions(), recomputed=False).compute
                 for i in range(model.num_layers // 2))
    assert stage_costs(model, cluster, training, layout, EstimateOptions())[0].compute == pytest.approx(layers)


def test_offloaded_activations_cost_what_their_copies_take_beyond_their_layers_forward_and_backward():
    """Llama-3-70B-like, PP 1, MBS 2 x 8K: each offloaded layer's activations cross the host link twice. Over PCIe
    Gen5 (H100) a copy outlasts the layer's forward and backward; over a GB200's NVLink-C2C share it outlasts only
    the forward. What is exposed is the copy time beyond the layer's own work, per micro-batch."""
    from megapilot.estimate.memory import offloaded_layer_bytes
    from megapilot.estimate.passes import BACKWARD_SHARE, FORWARD_SHARE
    from megapilot.estimate.step_time import HOST_COPY_EFFICIENCY, layer_cost

    training = TrainingSpec(seq_length=8192, global_batch_size=256, precision="fp8")
    options = EstimateOptions()

    def offload(gpu: str, layers: int) -> tuple[float, float, float]:
        cluster = ClusterSpec.from_gpu_count(get_gpu(gpu), 64)
        layout = ParallelConfig.for_world(64, mbs=2, recompute="none", fsdp=True, cpu_offloading_num_layers=layers)
        result = step_time(LLAMA3_70B, cluster, training, layout, options)
        copy_s = offloaded_layer_bytes(LLAMA3_70B, training, layout)[0][1] / (
            cluster.gpu.host_link_gbps * 1e9 * HOST_COPY_EFFICIENCY) if layers else 0.0
        compute = layer_cost(LLAMA3_70B, 0, cluster, training, layout, options, recomputed=False).compute
        expected = layers * (max(0.0, copy_s - FORWARD_SHARE * compute) + max(0.0, copy_s - BACKWARD_SHARE * compute))
        return result.breakdown_s["cpu_offload"], expected * layout.num_microbatches(256), result.step_time_s

    for gpu in ("h100", "gb200"):
        exposed, expected, step = offload(gpu, 40)
        assert exposed == pytest.approx(expected) and exposed > 0
        assert step == pytest.approx(offload(gpu, 0)[2] + exposed)
    assert offload("gb200", 40)[0] < offload("h100", 40)[0] / 3  # 225 GB/s of C2C against 64 of PCIe
    assert offload("h100", 0)[0] == 0.0


def test_the_flex_dispatcher_left_to_the_layout_runs_where_the_expert_group_leaves_the_nvlink_domain():
    from megapilot.estimate.moe_terms import flex_dispatched

    cluster, planned = _h100s(32), EstimateOptions(moe_flex_dispatcher=None)
    wide = ParallelConfig(tp=1, pp=1, dp=32, ep=16, etp=1)
    narrow = ParallelConfig(tp=1, pp=1, dp=32, ep=8, etp=1)
    assert flex_dispatched(cluster, wide, planned) and not flex_dispatched(cluster, narrow, planned)
    model = MIXTRAL.model_copy(update={"moe": MoESpec(num_experts=64, router_topk=8, moe_ffn_hidden_size=1408)})
    for layout, flex in ((wide, True), (narrow, False)):
        assert step_time(model, cluster, SEQ_4K, layout, planned).step_time_s == pytest.approx(
            step_time(model, cluster, SEQ_4K, layout, EstimateOptions(moe_flex_dispatcher=flex)).step_time_s)


def test_attention_before_flash_writes_its_scores_to_hbm_and_costs_more_the_longer_the_sequence():
    """Megatron-LM's 2021-22 attention: batched GEMMs over the whole s x s square and 20 bytes of softmax and
    dropout passes per score; flash attention keeps the scores on chip."""
    from megapilot.estimate.step_time import UNFUSED_SCORE_BYTES, layer_terms

    layout = ParallelConfig(tp=8, dp=1, sequence_parallel=True)
    unfused = EstimateOptions(flash_attention=False)
    for seq in (2048, 8192):
        training = TrainingSpec(seq_length=seq, global_batch_size=8)
        flash = layer_terms(LLAMA3_70B, 0, _h100s(8), training, layout, EstimateOptions(), recomputed=False)
        old = layer_terms(LLAMA3_70B, 0, _h100s(8), training, layout, unfused, recomputed=False)
        scores = 64 / 8 * seq * seq  # heads per TP rank x s x s, one sequence
        passes_s = scores * UNFUSED_SCORE_BYTES / (H100.hbm_bw_tbps * 1e12)
        assert old["mixer_core"] > flash["mixer_core"] + passes_s  # the passes, and GEMMs over the full square
        core = ("mixer_core", "recompute")  # selective recompute re-runs the core's forward
        assert {k: v for k, v in old.items() if k not in core} == {k: v for k, v in flash.items() if k not in core}
    short, long = (layer_terms(LLAMA3_70B, 0, _h100s(8), TrainingSpec(seq_length=seq, global_batch_size=8), layout,
                               unfused, recomputed=False)["mixer_core"] for seq in (2048, 8192))
    assert long > 15 * short  # quadratic in the sequence (x16), less the thin GEMMs' better rate at 8K


def test_the_cross_entropy_costs_its_kernels_bytes_per_logit_whatever_the_glue_fit():
    from megapilot.estimate.step_time import CROSS_ENTROPY_BYTES_PER_LOGIT, _gemm_s, _output_cost

    layout = ParallelConfig(tp=2, dp=1, sequence_parallel=True)
    costs = [_output_cost(LLAMA3_70B, _h100s(2), SEQ_4K, layout, replace(CALIBRATED, elementwise_passes=passes))
             for passes in (1.0, 6.0)]
    assert costs[0] == pytest.approx(costs[1])
    logits = 4096 * LLAMA3_70B.padded_vocab_size(2) / 2
    gemm = _gemm_s(4096, 8192, LLAMA3_70B.padded_vocab_size(2) / 2, H100, "bf16", CALIBRATED)
    assert costs[0] - gemm == pytest.approx(logits * CROSS_ENTROPY_BYTES_PER_LOGIT / (H100.hbm_bw_tbps * 1e12))


def test_each_interleaved_chunk_syncs_its_gradients_behind_the_later_chunks_backwards():
    from megapilot.estimate.step_time import _chunked_sync_exposed_s

    # no interleaving: what outlasts the last micro-batch's backward
    assert _chunked_sync_exposed_s(3.0, 1.0, 4, 1, 16) == pytest.approx(2.0)
    assert _chunked_sync_exposed_s(0.5, 1.0, 4, 1, 16) == 0.0
    # 2 chunks of 1.5 s traffic, 0.5 s of backward each; PP 4: the first chunk's reduce has 4 + 1 micro-steps of
    # the second chunk's backward (2.5 s) to hide under: 3 - 2.5 = 0.5; the last chunk's shows 1.5 - 0.5 = 1.0
    assert _chunked_sync_exposed_s(3.0, 1.0, 4, 2, 16) == pytest.approx(1.0)
    # the same layout prices less exposed DP traffic interleaved than not
    train = TrainingSpec(seq_length=4096, global_batch_size=32)
    plain = step_time(LLAMA3_70B, _h100s(64), train, _layout(dp=2))
    interleaved = step_time(LLAMA3_70B, _h100s(64), train, _layout(dp=2, vpp=5))
    assert interleaved.breakdown_s["dp_comm"] <= plain.breakdown_s["dp_comm"]



# ---- DeepSeek-V4 ---------------------------------------------------------------------------------

def test_deepseek_v4_prices_each_attention_kind_its_indexer_and_its_hyper_connections():
    """The core over the window and compressed keys runs on the fused attention engine's rate, a ratio-4 layer's
    indexer scores as DSA's do; the hyper-connections add their mixing GEMMs and send n streams between stages."""
    from megapilot.catalog.models import get_model
    from megapilot.estimate.attention_bounds import attention_core_bound
    from megapilot.estimate.efficiency import attention_time_s
    from megapilot.estimate.flops import dsa_indexer_score_flops, layer_attention_core_flops
    from megapilot.estimate.step_time import layer_terms
    model, b200 = get_model("deepseek-v4-flash"), get_gpu("b200")
    cluster = ClusterSpec.from_gpu_count(b200, 256)
    layout = ParallelConfig(tp=1, pp=8, dp=32, ep=32, pipeline_layout="balanced")
    options = EstimateOptions()
    terms = [layer_terms(model, i, cluster, SEQ_4K, layout, options, recomputed=False) for i in (0, 2, 3)]
    window, csa, hca = (t["mixer_core"] for t in terms)
    assert window < hca < csa
    tokens = 4096
    indexer = dsa_indexer_score_flops(model, 4096)
    core = layer_attention_core_flops(model, 2, 4096) - indexer
    assert csa == pytest.approx(attention_time_s(
        (core * attention_core_bound(model, 2, b200) + indexer) * tokens, b200, CALIBRATED))
    plain = model.model_copy(update={"residual_streams": 1})
    plain_terms = layer_terms(plain, 0, cluster, SEQ_4K, layout, options, recomputed=False)
    assert terms[0]["mixer_gemms"] > plain_terms["mixer_gemms"] and terms[0]["glue"] > plain_terms["glue"]
    assert step_time(model, cluster, SEQ_4K, layout).breakdown_s["pp_comm"] > step_time(
        plain, cluster, SEQ_4K, layout).breakdown_s["pp_comm"]


def test_deepseek_v4s_compressor_runs_at_the_16_bit_rate_in_an_fp8_recipe():
    """Megatron-LM dev builds the compressor's projections outside FP8: a ratio-128 layer costs a window-only one
    plus those projections at the bf16 rate, whatever the recipe."""
    from megapilot.catalog.models import get_model
    from megapilot.estimate.step_time import _compressor_gemms_s, layer_terms
    model, b200 = get_model("deepseek-v4-flash"), get_gpu("b200")
    cluster = ClusterSpec.from_gpu_count(b200, 64)
    fp8 = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")
    layout = ParallelConfig(tp=1, pp=1, dp=64, ep=8)
    window, hca = (layer_terms(model, i, cluster, fp8, layout, EstimateOptions(), recomputed=False)["mixer_gemms"]
                   for i in (0, 3))
    compressor = _compressor_gemms_s(model, 3, 4096, b200, CALIBRATED)
    assert compressor > 0 and hca - window == pytest.approx(compressor)


def test_cuda_graphs_take_only_the_launch_gap_they_save_off_the_captured_kernels_and_nothing_else():
    """A graph replays a kernel with a 0.5 us gap where the host queued ahead launched it with 0.9 (NVIDIA's CUDA
    graphs blog): 0.4 us a kernel, not the whole fitted overhead, whose ramp and drain run inside a graph too.
    Priced at the graph's gap alone, the 25.09 Qwen3 30B-A3B recipe on 8 B200, which captured every layer, would
    have run 48 % faster than published instead of 6 %."""
    from megapilot.catalog import get_model
    from megapilot.estimate.latency import GRAPH_SAVES_PER_KERNEL_S, layer_kernel_parts
    from megapilot.estimate.step_time import layer_terms
    from megapilot.spec.cuda_graphs import CudaGraphs

    model, cluster = get_model("qwen3-30b-a3b"), ClusterSpec.from_gpu_count(get_gpu("gb200"), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")
    p = ParallelConfig.for_world(8, ep=8, mbs=4, recompute="none")
    eager = EstimateOptions()
    router = replace(eager, cuda_graphs=CudaGraphs(impl="transformer_engine", scope=("moe_router",)))
    everything = replace(eager, cuda_graphs=CudaGraphs(impl="local", scope=("full_iteration",)))
    kernels = {name: layer_terms(model, 0, cluster, training, p, options, recomputed=False)["kernels"]
               for name, options in (("eager", eager), ("router", router), ("all", everything))}
    parts = layer_kernel_parts(model, 0, 8, eight_bit=True, per_expert_gemms=True)
    overhead = CALIBRATED.kernel_overhead_s
    assert kernels["eager"] == pytest.approx(overhead * sum(parts.values()))
    assert pytest.approx(0.4e-6) == GRAPH_SAVES_PER_KERNEL_S
    assert kernels["eager"] - kernels["router"] == pytest.approx(GRAPH_SAVES_PER_KERNEL_S * parts["moe_router"])
    assert kernels["all"] == pytest.approx((overhead - GRAPH_SAVES_PER_KERNEL_S) * sum(parts.values()))
    times = [step_time(model, cluster, training, p, options).step_time_s for options in (eager, router, everything)]
    assert times[0] > times[1] > times[2]
    terms = layer_terms(model, 0, cluster, training, p, everything, recomputed=False)
    assert {name: value for name, value in terms.items() if name != "kernels"} == {
        name: value for name, value in layer_terms(model, 0, cluster, training, p, eager, recomputed=False).items()
        if name != "kernels"}  # a graph changes the launches, not the work
