"""The compute-efficiency curve: roofline-smoothed GEMMs, fused attention, memory-bound glue."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.efficiency import (
    CALIBRATED,
    EfficiencyParams,
    attention_time_s,
    elementwise_time_s,
    gemm_bytes_per_element,
    gemm_efficiency,
    gemm_peak_tflops,
    gemm_time_s,
)

H100 = get_gpu("h100")


def test_gemm_efficiency_falls_as_the_hidden_per_tp_rank_shrinks():
    fat = gemm_efficiency(4096, 8192, 8192, H100, "bf16")
    thin = gemm_efficiency(4096, 8192, 8192 / 8, H100, "bf16")
    thinner = gemm_efficiency(4096, 1024, 256, H100, "bf16")
    assert fat > thin > thinner > 0


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_gemm_efficiency_rises_monotonically_with_size_and_stays_under_the_peak_fraction(precision):
    sizes = [16, 64, 256, 1024, 4096, 16384, 65536, 1 << 20]
    curve = [gemm_efficiency(s, s, s, H100, precision) for s in sizes]
    assert curve == sorted(curve) and len(set(curve)) == len(curve)
    cap = CALIBRATED.gemm_peak_fraction_8bit if precision == "fp8" else CALIBRATED.gemm_peak_fraction_16bit
    assert all(0 < e < cap for e in curve)
    assert curve[-1] == pytest.approx(cap, rel=0.01)  # a huge GEMM tends to the peak fraction


# Worked examples use their own parameters, so that a refit of CALIBRATED does not change them.
WORKED = EfficiencyParams(gemm_peak_fraction_16bit=0.7333, gemm_peak_fraction_8bit=0.5364, ridge_multiplier=1.3588,
                          elementwise_passes=3.104, attention_peak_fraction=0.3)


def test_gemm_efficiency_matches_the_roofline_formula_by_hand():
    # 1024^3 BF16 GEMM: I = 2*1024^3 / (2 B * 3 * 1024^2) = 341.3 FLOP/B; H100 ridge = 989.4/3.35 = 295.3 FLOP/B
    intensity = 2 * 1024**3 / (2 * 3 * 1024**2)
    ridge = 989.4 / 3.35
    expected = 0.7333 * intensity / (intensity + 1.3588 * ridge)
    assert gemm_efficiency(1024, 1024, 1024, H100, "bf16", WORKED) == pytest.approx(expected)
    assert expected == pytest.approx(0.337, abs=1e-3)


def test_operands_are_as_wide_as_their_format_with_its_block_scales():
    """FP8 one byte, MXFP8 one and an E8M0 scale per 32, NVFP4 half a byte and an E4M3 scale per 16, 16-bit two."""
    assert [gemm_bytes_per_element(p) for p in ("fp8", "mxfp8", "nvfp4", "mxfp4")] == [1.0, 1.03125, 0.5625, 0.53125]
    assert [gemm_bytes_per_element(p) for p in ("bf16", "fp16")] == [2.0, 2.0]


def test_a_thin_fp4_gemm_is_no_further_below_its_knee_than_an_fp8_one_half_its_operand_bytes_for_its_rate():
    """B200: NVFP4's GEMMs are priced at 1.42x FP8's rate and move half an FP8 operand's bytes (and their scales), so
    a thin NVFP4 GEMM sits nearer its roofline knee than the FP8 one; counted one byte wide it would sit further."""
    b200 = get_gpu("b200")
    thin = (256, 7168, 2048)  # a routed expert's rows
    fp8, nvfp4 = (gemm_efficiency(*thin, b200, p, WORKED) for p in ("fp8", "nvfp4"))
    assert fp8 < nvfp4 < 1.2 * fp8

def test_gemm_time_is_flops_over_peak_times_efficiency():
    efficiency = gemm_efficiency(8192, 8192, 8192, H100, "bf16")
    flops = 2 * 8192**3
    assert gemm_time_s(flops, 8192, 8192, 8192, H100, "bf16") == pytest.approx(
        flops / (H100.bf16_dense_tflops * 1e12 * efficiency))


def test_fp8_gemm_beats_bf16_on_a_large_gemm_but_not_by_the_full_peak_ratio():
    flops = 2 * 16384**3
    bf16 = gemm_time_s(flops, 16384, 16384, 16384, H100, "bf16")
    fp8 = gemm_time_s(flops, 16384, 16384, 16384, H100, "fp8")
    assert fp8 < bf16
    assert bf16 / fp8 < H100.peak_tflops("fp8") / H100.bf16_dense_tflops


def test_attention_runs_at_its_bf16_fraction():
    assert attention_time_s(989.4e12 * 0.3, H100, WORKED) == pytest.approx(1.0)


def test_elementwise_glue_is_priced_at_hbm_bandwidth():
    # 3.104 passes over 3.35 GB at 3.35 TB/s -> 3.104 ms
    assert elementwise_time_s(3.35e9, H100, WORKED) == pytest.approx(3.104e-3)
    doubled = EfficiencyParams(**{**CALIBRATED.__dict__, "elementwise_passes": 2 * CALIBRATED.elementwise_passes})
    assert elementwise_time_s(1e9, H100, doubled) == pytest.approx(2 * elementwise_time_s(1e9, H100))


def test_calibrated_fractions_are_fractions():
    for fraction in (CALIBRATED.gemm_peak_fraction_16bit, CALIBRATED.gemm_peak_fraction_8bit,
                     CALIBRATED.attention_peak_fraction):
        assert 0 < fraction <= 1
    assert CALIBRATED.ridge_multiplier > 0 and CALIBRATED.elementwise_passes > 0


def test_an_mxfp8_gemm_runs_at_the_share_of_fp8s_rate_te_measured_with_its_scale_swizzles():
    """B200's MXFP8 peak is its FP8 peak; TE's GEMM profiling guide measured a layer's MXFP8 GEMMs (swizzles of the
    block scales included) at 6.812 / 7.161 ms against per-tensor FP8's: a large GEMM takes 7.161 / 6.812 as long.
    (NVFP4's rate is the next test's.)"""
    b200 = get_gpu("b200")
    flops, shape = 2 * 16384**3, (16384, 16384, 16384)
    fp8, mxfp8 = (gemm_time_s(flops, *shape, b200, p) for p in ("fp8", "mxfp8"))
    assert mxfp8 / fp8 == pytest.approx(7.161 / 6.812, rel=0.005)
    assert gemm_peak_tflops(b200, "mxfp8") < b200.peak_tflops("mxfp8") == b200.peak_tflops("fp8")


def test_an_nvfp4_layer_runs_its_gemms_with_their_quantisation_at_the_multiple_of_fp8_te_measured():
    """TE's GEMM profiling guide, B300, a 5B layer's 12 GEMMs with their quantisation: FP8 current scaling 9.147 ms,
    NVFP4 6.453 ms; the model prices the layer's GEMMs in the same ratio, not at the 2.9x of the datasheet peaks."""
    b300 = get_gpu("b300")
    tokens, linears = 15872, ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))

    def layer_s(precision: str) -> float:
        return sum(gemm_time_s(2 * tokens * k * n, *shape, b300, precision)
                   for k, n in linears for shape in ((tokens, k, n), (tokens, n, k), (k, tokens, n)))

    assert b300.peak_tflops("nvfp4") / b300.peak_tflops("fp8") > 2.5
    assert layer_s("fp8") / layer_s("nvfp4") == pytest.approx(9.147 / 6.453, rel=0.05)
    assert layer_s("fp8") == pytest.approx(9.147e-3, rel=0.1)  # the fitted 8-bit fraction holds CS's casts
