"""A MoE layer's own terms (moe_terms.py) as their physics says; how the layer adds them up: test_step_time.py."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.moe_terms import moe_token_passes_s
from megapilot.spec import ModelSpec, MoESpec, ParallelConfig

H100 = get_gpu("h100")
QWEN3_30B_LIKE = ModelSpec(
    name="qwen3-30b-like", num_layers=4, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
    num_query_groups=4, kv_channels=128, vocab_size=151936,
    moe=MoESpec(num_experts=128, router_topk=8, moe_ffn_hidden_size=768),
)


def test_moe_token_passes_move_twelve_times_the_top_k_copies_through_hbm_and_fp8_quantises_each_experts_inputs():
    """Qwen3-30B-A3B-like layer, 4096 tokens, top-8, h 2048: 12 x 4096 x 8 x 2048 x 2 B = 1.61 GB per micro-batch,
    0.20 ms at the B200's 8 TB/s. FP8 current scaling casts fc1 in (2048) + fc2 in (768) forward, fc2 grad-out
    (2048) + fc1 grad-out (2 x 768, gated) backward = 6400 elements per copy, at quantization.py's bytes: two
    reads of the bf16 value (amax, cast) and one FP8 copy on Blackwell (5 B: 1.05 GB, 0.13 ms more), a row- and
    a column-wise copy on Hopper (6 B)."""
    b200, layout = get_gpu("b200"), ParallelConfig(tp=1, dp=8, ep=8)
    bf16 = moe_token_passes_s(QWEN3_30B_LIKE, b200, layout, 4096, None)
    assert bf16 == pytest.approx(12 * 4096 * 8 * 2048 * 2 / (b200.hbm_bw_tbps * 1e12))
    assert bf16 == pytest.approx(0.20e-3, rel=0.02)
    fp8 = moe_token_passes_s(QWEN3_30B_LIKE, b200, layout, 4096, "fp8-tensorwise")
    assert fp8 - bf16 == pytest.approx(4096 * 8 * 6400 * 5 / (b200.hbm_bw_tbps * 1e12))
    assert fp8 - bf16 == pytest.approx(0.131e-3, rel=0.02)
    h100_bf16 = moe_token_passes_s(QWEN3_30B_LIKE, H100, layout, 4096, None)
    h100_fp8 = moe_token_passes_s(QWEN3_30B_LIKE, H100, layout, 4096, "fp8-tensorwise")
    assert h100_fp8 - h100_bf16 == pytest.approx(4096 * 8 * 6400 * 6 / (H100.hbm_bw_tbps * 1e12))
    # Another plain-FP8 recipe is priced here as the calibrated one: the recipe hook adds its difference once.
    assert moe_token_passes_s(QWEN3_30B_LIKE, b200, layout, 4096, "fp8-delayed") == fp8
