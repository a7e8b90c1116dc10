"""The routed experts in BF16, FP8, MXFP8 and NVFP4: what each precision's kernels cost beyond the GEMMs' FLOPs
(bench/calibration/physics.md, "The families the later releases get wrong", items 3 and 4)."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.efficiency import CALIBRATED, gemm_time_s
from megapilot.estimate.latency import moe_kernels
from megapilot.estimate.quantization import (
    NVFP4_CAST_HBM_FRACTION,
    cast_bytes_per_value,
    cast_kernels,
    rht_unfused_share,
)
from megapilot.estimate.step_time import EstimateOptions, layer_terms
from megapilot.spec import ParallelConfig, TrainingSpec
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec, MoESpec

B200, H100 = get_gpu("b200"), get_gpu("h100")
QWEN3_30B_LIKE = ModelSpec(
    name="qwen3-30b-like", num_layers=4, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
    num_query_groups=4, kv_channels=128, vocab_size=151936,
    moe=MoESpec(num_experts=128, router_topk=8, moe_ffn_hidden_size=768),
)
TOKEN_DROP = QWEN3_30B_LIKE.model_copy(update={"moe": QWEN3_30B_LIKE.moe.model_copy(  # type: ignore[union-attr]
    update={"capacity_factor": 1.0, "pad_to_capacity": True})})
EP8 = ParallelConfig(tp=1, dp=8, ep=8)


def _terms(model: ModelSpec, gpu_name: str, precision: str) -> dict[str, float]:
    cluster = ClusterSpec.from_gpu_count(get_gpu(gpu_name), 8)
    training = TrainingSpec(seq_length=4096, global_batch_size=64, precision=precision)
    return layer_terms(model, 0, cluster, training, EP8, EstimateOptions(), recomputed=False)


def test_cast_kernels_per_tensor_follow_each_quantizer():
    """Current scaling: amax, scale, cast; MXFP8: one kernel writes both layouts; NVFP4: the Hadamard amax, the
    rowwise cast and the fused Hadamard cast, one more where it cannot fuse, one more for a gradient's RNG."""
    assert cast_kernels(None, "activation") == 0
    assert cast_kernels("fp8-tensorwise", "activation") == cast_kernels("fp8-tensorwise", "grad") == 3
    assert cast_kernels("mxfp8", "activation") == cast_kernels("mxfp8", "grad") == 1
    assert cast_kernels("nvfp4", "activation") == 3
    assert cast_kernels("nvfp4", "grad", unfused_share=1.0) == 5
    assert cast_kernels("nvfp4", "weight", unfused_share=1.0) == 2
    fp8, mxfp8 = (moe_kernels(16, per_expert_gemms=True, fp8_casts=True, cast_kernels=(k, k)) for k in (3, 1))
    assert fp8.serial - mxfp8.serial == 16 * 2 * (2 + 2)  # fc1, fc2 inputs and gradients, 2 kernels fewer each


def test_the_hadamard_cast_fuses_only_on_aligned_shapes():
    """TE fuses the columnwise Hadamard cast for rows % 64 and cols % 128: GPT-OSS's 2880-wide tensors never are."""
    assert rht_unfused_share("nvfp4", 2880, True) == 1.0
    assert rht_unfused_share("nvfp4", 7168, True) == 0.0
    assert rht_unfused_share("nvfp4", 7168, None) == 0.5  # ragged counts padded to 32
    assert rht_unfused_share("mxfp8", 2880, None) == 0.0


def test_nvfp4_experts_pay_their_casts_below_hbm_speed_and_more_kernels_than_mxfp8():
    """The same Qwen3-30B-A3B-like layer on B200 in MXFP8 and NVFP4: the NVFP4 experts' tensor-core time halves, its
    token passes (casts at `NVFP4_CAST_HBM_FRACTION` of HBM speed) and kernels grow."""
    mx, fp4 = _terms(QWEN3_30B_LIKE, "b200", "mxfp8"), _terms(QWEN3_30B_LIKE, "b200", "nvfp4")
    assert fp4["experts"] < 0.75 * mx["experts"]
    assert fp4["moe_token_passes"] > 1.5 * mx["moe_token_passes"]
    assert fp4["kernels"] > mx["kernels"]


def _grouped_linear_s(precision: str, experts: int) -> tuple[float, float]:
    """The model's TE GroupedLinear forward + backward at TE #2281's benchmark shape on B200 (DeepSeek-V3's experts:
    M = 65,536 rows over the experts, K = 7168, N = 2048; weights cast every call), NVFP4's casts at HBM speed."""
    m, k, n = 65536 / experts, 7168, 2048
    gemm_s = gemm_time_s(6 * m * k * n, m, k, n, B200, precision, CALIBRATED)
    gemms = experts * gemm_s / CALIBRATED.grouped_gemm_fraction
    casts = B200.hbm_time_s(65536 * k * cast_bytes_per_value(precision, "activation", "blackwell")
                            + 65536 * n * cast_bytes_per_value(precision, "grad", "blackwell")
                            + experts * k * n * cast_bytes_per_value(precision, "weight", "blackwell"))
    kernels = experts * (3 + sum(cast_kernels(precision, role) for role in ("activation", "grad", "weight")))
    return gemms + casts + kernels * CALIBRATED.kernel_overhead_s, casts


def test_the_nvfp4_cast_rate_is_what_te_2281s_module_speedup_leaves_for_the_casts():
    """NVFP4 GroupedLinear was at most 1.15x MXFP8 (TE #2281): with the GEMMs and kernels as priced, the casts must
    run at ~0.66 of HBM speed for the module to be no faster than that."""
    fractions = []
    for experts in (4, 8):
        mxfp8, _ = _grouped_linear_s("mxfp8", experts)
        nvfp4, nvfp4_casts = _grouped_linear_s("nvfp4", experts)
        assert mxfp8 / nvfp4 > 1.2  # at HBM speed the casts would make NVFP4 faster than TE measured
        fractions.append(nvfp4_casts / (mxfp8 / 1.15 - (nvfp4 - nvfp4_casts)))
    assert sum(fractions) / 2 == pytest.approx(NVFP4_CAST_HBM_FRACTION, abs=0.03)
