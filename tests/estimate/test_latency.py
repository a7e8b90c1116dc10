"""Fixed costs: each layer's kernels, the MoE dispatcher's host sync and wave quantisation, on worked examples."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.efficiency import CALIBRATED
from megapilot.estimate.latency import (
    HOST_LAUNCH_FLOOR_S,
    HOST_SYNC_S,
    expert_wave_slowdown,
    layer_kernel_parts,
    layer_kernels,
    moe_host_sync_s,
    moe_kernels,
    sm_count,
    wave_efficiency,
)
from megapilot.estimate.step_time import EstimateOptions, layer_terms
from megapilot.spec import ClusterSpec, ModelSpec, MoESpec, ParallelConfig, TrainingSpec

QWEN3_30B_LIKE = ModelSpec(
    name="qwen3-30b-like", num_layers=4, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
    num_query_groups=4, kv_channels=128, vocab_size=151936,
    moe=MoESpec(num_experts=128, router_topk=8, moe_ffn_hidden_size=768),
)
FP8_4K = TrainingSpec(seq_length=4096, global_batch_size=512, precision="fp8")


def test_sm_counts_are_the_vendor_figures_and_an_unknown_gpu_takes_its_generations():
    assert sm_count(get_gpu("h100")) == 132
    assert sm_count(get_gpu("b200")) == 148
    assert sm_count(get_gpu("a100")) == 108
    assert sm_count(get_gpu("mi300x")) == 304
    custom = get_gpu("h100").model_copy(update={"name": "my-hopper"})
    assert sm_count(custom) == 132


def test_a_partly_filled_last_wave_costs_a_full_one_and_concurrent_gemms_share_the_waves():
    # 2048 x 1536 output: 16 x 12 = 192 tiles of 128 x 128; 148 SMs run them in 2 waves of which 192/296 are full.
    assert wave_efficiency(2048, 1536, 148) == pytest.approx(192 / 296)
    # 16 experts' tiles flow together: 3072 tiles in 21 waves.
    assert wave_efficiency(2048, 1536, 148, concurrent=16) == pytest.approx(3072 / (21 * 148))
    assert wave_efficiency(128 * 148, 128, 148) == pytest.approx(1.0)
    # fprop 2048 x 1536, dgrad 2048 x 2048, wgrad 2048 x 1536, alone on 148 SMs: mean of 1/efficiency.
    alone = expert_wave_slowdown(2048, 2048, 1536, 148, 1)
    assert alone == pytest.approx((296 / 192 + 296 / 256 + 296 / 192) / 3)
    assert 1.0 < expert_wave_slowdown(2048, 2048, 1536, 148, 16) < alone


def test_te_launches_one_gemm_per_local_expert_and_fp8_casts_each_experts_inputs():
    te = moe_kernels(16, per_expert_gemms=True, fp8_casts=True)
    # After the sync: 6 dispatch/combine kernels, 2 x 16 x 3 casts, 2 x 16 GEMM launches (4 rounds on 4 streams).
    assert te.forward_after_sync_launches == 6 + 96 + 32
    assert te.forward_after_sync_serial == 6 + 96 + 2 * 4
    assert te.backward_serial == 13 + 96 + 4 * 4
    assert te.serial == 12 + 110 + 125
    legacy = moe_kernels(16, per_expert_gemms=False, fp8_casts=False)
    assert legacy.forward_after_sync_launches == 6 + 2
    assert legacy.serial == 12 + 8 + 13 + 4


def test_the_host_sync_costs_its_round_trip_and_the_host_paced_launches_beyond_the_gpu_work():
    kernels = moe_kernels(16, per_expert_gemms=True, fp8_casts=True)
    overhead = 1e-6
    busy = moe_host_sync_s(kernels, forward_after_sync_gpu_s=1e-3, kernel_overhead_s=overhead)
    assert busy == pytest.approx(HOST_SYNC_S)  # the GPU's work outlasts 134 launches
    idle = moe_host_sync_s(kernels, forward_after_sync_gpu_s=0.0, kernel_overhead_s=overhead)
    assert idle == pytest.approx(HOST_SYNC_S + 134 * HOST_LAUNCH_FLOOR_S - 110 * overhead)


def test_a_layer_counts_its_kernels_forward_and_backward_and_a_moe_layer_hundreds():
    llama = get_model("llama3.1-8b")
    # attention: norm + residual 4, core 4, RoPE 4, QKV and output linears 2 x 3; MLP: 4 + 2 x 3 + activation 2
    assert layer_kernels(llama, 0, 1, eight_bit=False, per_expert_gemms=True) == 4 + 4 + 4 + 6 + 4 + 6 + 2
    # FP8: each of the 4 linears casts its input and its output gradient, 3 kernels each
    assert layer_kernels(llama, 0, 1, eight_bit=True, per_expert_gemms=True) == 30 + 4 * 6
    qwen3 = layer_kernels(QWEN3_30B_LIKE, 0, 8, eight_bit=True, per_expert_gemms=True)
    attention = 4 + 4 + 4 + 2 * 9
    assert qwen3 == attention + 4 + moe_kernels(16, per_expert_gemms=True, fp8_casts=True).serial
    with_qk_norms = QWEN3_30B_LIKE.model_copy(update={"qk_layernorm": True})  # Qwen3's per-head q and k norms
    assert layer_kernels(with_qk_norms, 0, 8, eight_bit=True, per_expert_gemms=True) == qwen3 + 4
    # Llama 4's weightless L2 norm launches the same kernels, on its RoPE layers only
    l2_on_rope_layers = QWEN3_30B_LIKE.model_copy(update={"qk_l2_norm": True, "no_rope_freq": 4})
    assert [layer_kernels(l2_on_rope_layers, i, 8, eight_bit=True, per_expert_gemms=True) - qwen3
            for i in range(4)] == [4, 4, 4, 0]  # the NoPE layer (the 4th) normalises nothing
    # fewer local experts, fewer kernels; DeepSeek-V3's dense-first layers run an MLP
    assert layer_kernels(QWEN3_30B_LIKE, 0, 64, eight_bit=True, per_expert_gemms=True) < qwen3
    dsv3 = get_model("deepseek-v3")
    assert layer_kernels(dsv3, 0, 64, eight_bit=True, per_expert_gemms=True) < 100
    assert layer_kernels(dsv3, 3, 64, eight_bit=True, per_expert_gemms=True) > 100


def _moe_terms(options: EstimateOptions, mbs: int = 1, gpu: str = "b200") -> dict[str, float]:
    cluster = ClusterSpec.from_gpu_count(get_gpu(gpu), 8)
    layout = ParallelConfig(tp=1, dp=8, ep=8, mbs=mbs)
    return layer_terms(QWEN3_30B_LIKE, 0, cluster, FP8_4K, layout, options, recomputed=False)


def test_a_qwen3_30b_moe_layer_pays_its_kernels_and_its_sync_whatever_the_micro_batch():
    small, large = _moe_terms(EstimateOptions()), _moe_terms(EstimateOptions(), mbs=4)
    kernels = layer_kernels(QWEN3_30B_LIKE, 0, 8, eight_bit=True, per_expert_gemms=True)
    assert small["kernels"] == pytest.approx(kernels * CALIBRATED.kernel_overhead_s) == large["kernels"]
    # one sync: the GPU's work after it outlasts the host's 134 launches
    assert small["moe_fixed"] == pytest.approx(HOST_SYNC_S) == large["moe_fixed"]
    fixed = ("kernels", "moe_fixed")
    assert sum(small[k] for k in fixed) / sum(small.values()) > 2 * sum(large[k] for k in fixed) / sum(large.values())
    flex = _moe_terms(EstimateOptions(moe_flex_dispatcher=True))
    assert flex["moe_fixed"] == 0.0 and flex["kernels"] == small["kernels"]
    legacy = _moe_terms(EstimateOptions(moe_legacy_grouped_gemm=True))
    # One grouped GEMM per kind instead of 4 rounds of 4 streams: 3 fewer rounds for fc1, fc2 and their 4 backward.
    assert small["kernels"] - legacy["kernels"] == pytest.approx(18 * CALIBRATED.kernel_overhead_s)


def test_expert_gemms_pay_wave_quantisation_on_the_gpus_sm_count():
    # 16 local experts x 2048 rows on B200 (148 SMs) and H100 (132 SMs): the same tiles fill their waves differently.
    b200, h100 = _moe_terms(EstimateOptions()), _moe_terms(EstimateOptions(), gpu="h100")
    from megapilot.estimate.moe_terms import expert_mlp_wave_slowdown

    layout = ParallelConfig(tp=1, dp=8, ep=8)
    slow_b200 = expert_mlp_wave_slowdown(QWEN3_30B_LIKE, 2048, layout, get_gpu("b200"))
    slow_h100 = expert_mlp_wave_slowdown(QWEN3_30B_LIKE, 2048, layout, get_gpu("h100"))
    assert 1.0 < slow_b200 < 1.05 and 1.0 < slow_h100 < 1.05
    assert b200["experts"] > 0 and h100["experts"] > 0


def test_a_dense_layer_has_no_moe_sync_and_pays_only_its_few_dozen_kernels():
    dense = ModelSpec(name="dense", num_layers=2, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16,
                      vocab_size=32000)
    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    terms = layer_terms(dense, 0, cluster, FP8_4K, ParallelConfig(tp=1, dp=8), EstimateOptions(), recomputed=False)
    assert terms["moe_fixed"] == 0.0
    assert terms["kernels"] == pytest.approx(54 * CALIBRATED.kernel_overhead_s)


def test_a_collective_beside_compute_costs_at_least_the_share_of_the_sms_it_holds_for_its_length():
    from megapilot.estimate.latency import sm_contended_exposed_s, sm_share

    assert sm_share(16, get_gpu("h100")) == pytest.approx(16 / 132)
    assert sm_share(16, get_gpu("b200")) == pytest.approx(16 / 148)
    share = sm_share(16, get_gpu("h100"))
    assert sm_contended_exposed_s(0.0, 1.32, share) == pytest.approx(0.16)  # hidden: the compute slows by 16/132
    assert sm_contended_exposed_s(0.5, 1.32, share) == 0.5  # what outlasts the compute already covers that
    assert sm_contended_exposed_s(1.32, 1.32, share) == 1.32  # not overlapped: just itself


@pytest.mark.parametrize(("model", "layer", "ep"), [
    (get_model("llama3.1-8b"), 0, 1), (QWEN3_30B_LIKE, 0, 8), (get_model("deepseek-v3"), 0, 8),
    (get_model("deepseek-v3"), 5, 64), (get_model("nemotron-h-8b"), 0, 1), (get_model("qwen3-next-80b-a3b"), 0, 8),
])
def test_the_kernels_by_graph_scope_part_add_up_to_the_layers_kernels(model, layer, ep):
    parts = layer_kernel_parts(model, layer, ep, eight_bit=True, per_expert_gemms=True)
    assert sum(parts.values()) == layer_kernels(model, layer, ep, eight_bit=True, per_expert_gemms=True)
    assert all(count > 0 for count in parts.values())


def test_a_moe_layer_splits_into_router_preprocess_and_the_rest_where_megatrons_scopes_split_it():
    parts = layer_kernel_parts(QWEN3_30B_LIKE, 0, 8, eight_bit=True, per_expert_gemms=True)
    assert parts["moe_router"] == 2 + 5 + 5  # the MLP's norm fwd/bwd, the router forward and backward
    assert parts["moe_preprocess"] == 7  # token counts, split sizes, host copies, the permute
    assert set(parts) == {"attn", "moe_router", "moe_preprocess", "moe"}
