"""Fixed MoE costs: kernel gaps, the dispatcher's host sync and wave quantisation, on worked examples."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.latency import (
    HOST_LAUNCH_FLOOR_S,
    HOST_SYNC_S,
    KERNEL_GAP_S,
    expert_wave_slowdown,
    moe_fixed_latency_s,
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
    gaps = 247 * KERNEL_GAP_S
    assert moe_fixed_latency_s(kernels, host_sync=False, forward_after_sync_gpu_s=0.0) == pytest.approx(gaps)
    busy = moe_fixed_latency_s(kernels, host_sync=True, forward_after_sync_gpu_s=1e-3)
    assert busy == pytest.approx(gaps + HOST_SYNC_S)  # the GPU's work outlasts 134 launches
    idle = moe_fixed_latency_s(kernels, host_sync=True, forward_after_sync_gpu_s=0.0)
    host_paced = 134 * HOST_LAUNCH_FLOOR_S - 110 * KERNEL_GAP_S
    assert idle == pytest.approx(gaps + HOST_SYNC_S + host_paced)
    assert idle == pytest.approx(0.636e-3, rel=0.01)


def _moe_terms(options: EstimateOptions, mbs: int = 1, gpu: str = "b200") -> dict[str, float]:
    cluster = ClusterSpec.from_gpu_count(get_gpu(gpu), 8)
    layout = ParallelConfig(tp=1, dp=8, ep=8, mbs=mbs)
    return layer_terms(QWEN3_30B_LIKE, 0, cluster, FP8_4K, layout, options, recomputed=False)


def test_a_qwen3_30b_moe_layer_pays_a_quarter_millisecond_of_fixed_latency_whatever_the_micro_batch():
    small, large = _moe_terms(EstimateOptions()), _moe_terms(EstimateOptions(), mbs=4)
    # 247 kernel gaps + one sync: the GPU's work after the sync outlasts the host's 134 launches.
    assert small["moe_fixed"] == pytest.approx(247 * KERNEL_GAP_S + HOST_SYNC_S)
    assert large["moe_fixed"] == small["moe_fixed"]
    assert small["moe_fixed"] / sum(small.values()) > 3 * large["moe_fixed"] / sum(large.values())
    flex = _moe_terms(EstimateOptions(moe_flex_dispatcher=True))
    assert small["moe_fixed"] - flex["moe_fixed"] == pytest.approx(HOST_SYNC_S)
    legacy = _moe_terms(EstimateOptions(moe_legacy_grouped_gemm=True))
    # One grouped GEMM per kind instead of 4 rounds of 4 streams: 3 fewer rounds for fc1, fc2 and their 4 backward.
    assert small["moe_fixed"] - legacy["moe_fixed"] == pytest.approx(18 * KERNEL_GAP_S)


def test_expert_gemms_pay_wave_quantisation_on_the_gpus_sm_count():
    # 16 local experts x 2048 rows on B200 (148 SMs) and H100 (132 SMs): the same tiles fill their waves differently.
    b200, h100 = _moe_terms(EstimateOptions()), _moe_terms(EstimateOptions(), gpu="h100")
    from megapilot.estimate.step_time import _expert_wave_slowdown

    layout = ParallelConfig(tp=1, dp=8, ep=8)
    slow_b200 = _expert_wave_slowdown(QWEN3_30B_LIKE, 2048, layout, get_gpu("b200"))
    slow_h100 = _expert_wave_slowdown(QWEN3_30B_LIKE, 2048, layout, get_gpu("h100"))
    assert 1.0 < slow_b200 < 1.05 and 1.0 < slow_h100 < 1.05
    assert b200["experts"] > 0 and h100["experts"] > 0


def test_a_dense_layer_has_no_moe_fixed_latency():
    dense = ModelSpec(name="dense", num_layers=2, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16,
                      vocab_size=32000)
    cluster = ClusterSpec.from_gpu_count(get_gpu("b200"), 8)
    terms = layer_terms(dense, 0, cluster, FP8_4K, ParallelConfig(tp=1, dp=8), EstimateOptions(), recomputed=False)
    assert terms["moe_fixed"] == 0.0
