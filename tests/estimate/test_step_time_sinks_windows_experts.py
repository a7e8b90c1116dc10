"""Step time of the sliding-window + attention-sink family with biased, clamped experts (GPT-OSS): each piece costs
what its code path runs, keyed on the model's properties, so any model with them pays it and no other does."""

from __future__ import annotations

import math

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.models import get_model
from megapilot.estimate.attention_bounds import attention_core_bound
from megapilot.estimate.efficiency import CALIBRATED, attention_time_s
from megapilot.estimate.flops import attention_core_flops
from megapilot.estimate.latency import (
    ROPE_KERNELS,
    UNFUSED_ROPE_KERNELS,
    layer_kernels,
    moe_kernels,
    unfused_rope,
)
from megapilot.estimate.moe_terms import (
    CLAMP_BYTES_PER_VALUE,
    CLAMP_FORWARD_BYTES_PER_VALUE,
    EXPERT_BIAS_BYTES_PER_VALUE,
    EXPERT_BIAS_BYTES_PER_VALUE_FP32_PROBS,
)
from megapilot.estimate.step_time import (
    TE_UNFUSED_SINK_SCORE_BYTES,
    UNFUSED_ROPE_BYTES_PER_VALUE,
    EstimateOptions,
    _unfused_attention_core_s,
    fused_attention_bytes_per_token,
    layer_terms,
    step_time,
    window_block_share,
)
from megapilot.spec import ClusterSpec, ParallelConfig, TrainingSpec
from megapilot.spec.model import YarnRopeScaling

GPT_OSS = get_model("gpt-oss-20b")  # 24 layers, 32 experts top-4, window 128 on even layers (0-based), sinks
H100 = get_gpu("h100")
CLUSTER = ClusterSpec.from_gpu_count(H100, 8)
SEQ_8K = TrainingSpec(seq_length=8192, global_batch_size=64)
EP8 = ParallelConfig(tp=1, pp=1, dp=8, ep=8, mbs=1, recompute="none")
WINDOWED, FULL = 0, 1  # GPT-OSS slides on layers 1, 3, ... (1-based) and attends globally on every second


def _terms(model, layer=WINDOWED, layout=EP8, options=None, training=SEQ_8K):
    return layer_terms(model, layer, CLUSTER, training, layout, options or EstimateOptions(), recomputed=False)


def _hbm_s(moved_bytes: float) -> float:
    return moved_bytes / (H100.hbm_bw_tbps * 1e12)


def test_a_window_computes_every_score_block_it_touches():
    # 64 rows of 128 x 128 blocks; a 128-token window touches two blocks per row, the first row one
    assert window_block_share(128, 8192) == pytest.approx((1 + 2 * 63) / (64 * 65 / 2))
    assert window_block_share(8192, 8192) == 1.0 and window_block_share(20000, 8192) == 1.0
    assert window_block_share(2, 8192) == window_block_share(129, 8192)  # both reach back into the previous block
    assert window_block_share(130, 8192) > window_block_share(129, 8192)  # 130 tokens reach a third block
    assert window_block_share(1, 8192) == pytest.approx(64 / (64 * 65 / 2))  # the diagonal alone
    shares = [window_block_share(w, 8192) for w in (1, 128, 512, 2048, 8192)]
    assert shares == sorted(shares)


def test_a_128_token_window_costs_its_blocks_not_its_mean_keys():
    windowed = _terms(GPT_OSS)["mixer_core"]
    full = _terms(GPT_OSS, FULL)["mixer_core"]
    assert windowed == pytest.approx(full * window_block_share(128, 8192))
    exponentials = attention_core_bound(GPT_OSS, WINDOWED, H100)  # head dim 64 on Hopper (attention_bounds.py)
    mean_keys = attention_time_s(attention_core_flops(GPT_OSS, 8192, window=128) * exponentials * 8192, H100,
                                 CALIBRATED)
    assert windowed == pytest.approx(2 * mean_keys, rel=0.02)  # two 128-key blocks a query, not its 127 keys


def test_a_fused_attention_kernel_costs_at_least_its_bytes():
    tiny = GPT_OSS.model_copy(update={"sliding_window": 1})  # the diagonal blocks alone: the bytes bind
    floor_s = _hbm_s(fused_attention_bytes_per_token(tiny, WINDOWED, EP8) * 8192)
    assert _terms(tiny)["mixer_core"] == pytest.approx(floor_s)
    blocks_s = _terms(tiny, FULL)["mixer_core"] * window_block_share(1, 8192)
    assert floor_s > blocks_s
    # Q, O, dO, dQ (22 bytes a value) over 64 heads of 64; K, V (12 bytes a value) over 8; 16 bytes of row statistics
    assert fused_attention_bytes_per_token(GPT_OSS, WINDOWED, EP8) == 64 * (64 * 22 + 16) + 8 * 64 * 12
    # a causal layer at 8K is far from its floor: priced at its FLOPs, as the fit saw it
    full = _terms(GPT_OSS, FULL)["mixer_core"]
    exponentials = attention_core_bound(GPT_OSS, FULL, H100)
    assert full == attention_time_s(attention_core_flops(GPT_OSS, 8192) * exponentials * 8192, H100, CALIBRATED)
    assert full > 10 * _hbm_s(fused_attention_bytes_per_token(GPT_OSS, FULL, EP8) * 8192)


def test_the_sink_costs_nothing_in_the_fused_kernel_and_the_whole_square_without_it():
    vanilla = GPT_OSS.model_copy(update={"softmax_type": "vanilla"})
    old_cudnn = EstimateOptions(fused_sink_attention=False)
    for layer in (WINDOWED, FULL):
        assert _terms(GPT_OSS, layer)["mixer_core"] == _terms(vanilla, layer)["mixer_core"]
        unfused = _terms(GPT_OSS, layer, options=old_cudnn)["mixer_core"]
        assert unfused == _unfused_attention_core_s(GPT_OSS, SEQ_8K, EP8, H100, CALIBRATED,
                                                    TE_UNFUSED_SINK_SCORE_BYTES)
        assert unfused > _hbm_s(64 * 8192 * 8192 * TE_UNFUSED_SINK_SCORE_BYTES)  # every head's s x s scores
        assert _terms(vanilla, layer, options=old_cudnn) == _terms(vanilla, layer)  # no sink, no fallback
    # windowed or not, the unfused path computes the whole square: a window no longer saves anything
    assert _terms(GPT_OSS, WINDOWED, options=old_cudnn)["mixer_core"] == \
        _terms(GPT_OSS, FULL, options=old_cudnn)["mixer_core"]
    slow = step_time(GPT_OSS, CLUSTER, SEQ_8K, EP8, old_cudnn).step_time_s
    assert slow > 3 * step_time(GPT_OSS, CLUSTER, SEQ_8K, EP8).step_time_s


def test_biased_experts_pay_fc2s_bias_expert_by_expert_and_a_clamp_its_passes():
    plain = GPT_OSS.model_copy(update={"add_bias_linear": False, "activation_clamp": None})
    biased = plain.model_copy(update={"add_bias_linear": True})
    clamped = plain.model_copy(update={"activation_clamp": 7.0})
    copies = 8192 * 4  # top-4 copies of each token, balanced over EP 8: a rank receives as many as it sends
    base = _terms(plain)
    bias_s = _terms(biased)["moe_token_passes"] - base["moe_token_passes"]
    clamp_s = _terms(clamped)["moe_token_passes"] - base["moe_token_passes"]
    assert bias_s == pytest.approx(_hbm_s(copies * 2880 * EXPERT_BIAS_BYTES_PER_VALUE))
    assert clamp_s == pytest.approx(_hbm_s(copies * 2 * 2880 * CLAMP_BYTES_PER_VALUE))
    assert _terms(GPT_OSS)["moe_token_passes"] == pytest.approx(base["moe_token_passes"] + bias_s + clamp_s)
    local = 32 // 8
    kernels = {name: layer_kernels(m, WINDOWED, 8, eight_bit=False, per_expert_gemms=True)
               for name, m in (("plain", plain), ("biased", biased), ("clamped", clamped))}
    assert kernels["biased"] - kernels["plain"] == 6 * local + 3  # 2 forward + 4 backward per expert, 3 cats
    assert kernels["clamped"] - kernels["plain"] == 6
    with_bias = moe_kernels(local, per_expert_gemms=True, fp8_casts=False, biased_experts=True)
    without = moe_kernels(local, per_expert_gemms=True, fp8_casts=False)
    assert with_bias.forward_after_sync_launches - without.forward_after_sync_launches == 2 * local + 1
    for name in ("experts", "mixer_core", "mixer_gemms", "glue", "ep_comm"):
        assert _terms(biased)[name] == base[name]


def test_the_moe_act_recompute_reruns_the_clamp():
    layout = ParallelConfig(tp=1, pp=1, dp=8, ep=8, mbs=1, recompute="selective", recompute_modules=("moe_act",))
    plain = GPT_OSS.model_copy(update={"activation_clamp": None})
    extra = _terms(GPT_OSS, layout=layout)["recompute"] - _terms(plain, layout=layout)["recompute"]
    assert extra == pytest.approx(_hbm_s(8192 * 4 * 2 * 2880 * CLAMP_FORWARD_BYTES_PER_VALUE))


def test_yarn_with_a_concentration_factor_rotates_q_and_k_in_pytorch_ops():
    gpt_oss_yarn = GPT_OSS.rope_scaling
    assert isinstance(gpt_oss_yarn, YarnRopeScaling)
    assert gpt_oss_yarn.concentration == pytest.approx(0.1 * math.log(32) + 1)
    deepseek_like = YarnRopeScaling(factor=40, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    assert deepseek_like.concentration == 1.0
    assert unfused_rope(GPT_OSS)
    assert not unfused_rope(GPT_OSS.model_copy(update={"rope_scaling": deepseek_like}))
    assert not unfused_rope(get_model("llama3.1-8b"))
    fused = GPT_OSS.model_copy(update={"rope_scaling": None})
    rotated = (64 + 8) * 64  # q and k heads x head dim, per token
    extra = _terms(GPT_OSS)["glue"] - _terms(fused)["glue"]
    assert extra == pytest.approx(_hbm_s(8192 * rotated * UNFUSED_ROPE_BYTES_PER_VALUE))
    extra_kernels = (layer_kernels(GPT_OSS, 0, 8, eight_bit=False, per_expert_gemms=True)
                     - layer_kernels(fused, 0, 8, eight_bit=False, per_expert_gemms=True))
    assert extra_kernels == UNFUSED_ROPE_KERNELS - ROPE_KERNELS


def test_none_of_it_reaches_a_model_without_these_properties():
    llama = get_model("llama3.1-8b")
    layout = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, recompute="none")
    for options in (EstimateOptions(), EstimateOptions(fused_sink_attention=False)):
        terms = _terms(llama, 0, layout, options)
        assert terms["mixer_core"] == attention_time_s(attention_core_flops(llama, 8192) * 8192, H100, CALIBRATED)


def test_the_flex_dispatchers_fp32_probabilities_make_the_bias_sum_dearer():
    plain = GPT_OSS.model_copy(update={"add_bias_linear": False})
    flex = EstimateOptions(moe_flex_dispatcher=True)
    bias_s = _terms(GPT_OSS, options=flex)["moe_token_passes"] - _terms(plain, options=flex)["moe_token_passes"]
    assert bias_s == pytest.approx(_hbm_s(8192 * 4 * 2880 * EXPERT_BIAS_BYTES_PER_VALUE_FP32_PROBS))
    assert EXPERT_BIAS_BYTES_PER_VALUE_FP32_PROBS > EXPERT_BIAS_BYTES_PER_VALUE
