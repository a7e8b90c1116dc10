"""Per-flavour quantisation costs: direction between flavours and magnitude on a worked example.

Worked example: the FC1 GEMM of a Llama-3.1-8B layer at 8192 tokens per micro-batch, X 8192 x 4096,
W 4096 x 14336, dY 8192 x 14336, one micro-batch per step.
"""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.estimate import build_case, step_time
from megapilot.estimate.quantization import (
    SCHEMES,
    cast_bytes_per_value,
    gemm_peak_tflops,
    layer_linears,
    linear_cast_bytes,
    recipe_delta_s,
    saved_input_bytes_per_value,
    weight_copy_bytes_per_param,
)
from megapilot.spec import ParallelConfig, TrainingSpec

M, K, N = 8192, 4096, 14336
H100, B200, MI355X = get_gpu("h100"), get_gpu("b200"), get_gpu("mi355x")


def test_current_scaling_pays_one_amax_read_that_delayed_scaling_does_not() -> None:
    # Hopper: read bf16 (2 B) + FP8 copy and its transpose (1 + 1 B); current scaling reads the tensor once more
    assert cast_bytes_per_value("fp8-delayed", "activation", "hopper") == 4
    assert cast_bytes_per_value("fp8-tensorwise", "activation", "hopper") == 6


def test_blackwell_needs_no_transposed_per_tensor_copy() -> None:
    assert cast_bytes_per_value("fp8-delayed", "grad", "blackwell") == 3
    assert cast_bytes_per_value("fp8-tensorwise", "grad", "blackwell") == 5
    assert weight_copy_bytes_per_param("fp8-tensorwise", "blackwell") == 1
    assert weight_copy_bytes_per_param("fp8-tensorwise", "hopper") == 2


def test_block_scaled_formats_write_both_layouts_with_their_scales() -> None:
    # blockwise: FP32 scale per 128 values; MXFP8: E8M0 per 32 -> the same 1/32 byte per value on each copy
    assert cast_bytes_per_value("fp8-blockwise", "activation", "hopper") == pytest.approx(2 + 2 * (1 + 4 / 128))
    assert cast_bytes_per_value("mxfp8", "activation", "blackwell") == pytest.approx(2 + 2 * (1 + 1 / 32))
    # a 128 x 128 weight block carries one FP32 scale: 4 / 16384 B per value
    assert cast_bytes_per_value("fp8-blockwise", "weight", "hopper") == pytest.approx(2 + 2 * (1 + 4 / 128**2))


def test_nvfp4_pays_the_amax_and_hadamard_passes_but_writes_half_the_bytes() -> None:
    # X and dY: amax read + rowwise cast read + Hadamard columnwise cast read, two 4-bit copies with E4M3 scales / 16
    assert cast_bytes_per_value("nvfp4", "activation", "blackwell") == pytest.approx(3 * 2 + 2 * (0.5 + 1 / 16))
    # weights: 16 x 16 blocks, no Hadamard transform
    assert cast_bytes_per_value("nvfp4", "weight", "blackwell") == pytest.approx(2 * 2 + 2 * (0.5 + 1 / 256))
    # MXFP4 (Primus) computes block scales in the cast and has no per-tensor scale: the cheapest block-scaled
    # cast, though on Blackwell delayed FP8 (one copy, no amax read) moves fewer bytes still
    block_scaled = [f for f in SCHEMES if SCHEMES[f].block_values is not None]
    assert min(block_scaled, key=lambda f: cast_bytes_per_value(f, "activation", "blackwell")) == "mxfp4"
    assert cast_bytes_per_value("fp8-delayed", "activation", "blackwell") < cast_bytes_per_value(
        "mxfp4", "activation", "blackwell")
    assert max(SCHEMES, key=lambda f: cast_bytes_per_value(f, "activation", "blackwell")) == "nvfp4"


def test_worked_example_tensorwise_casts_cost_a_quarter_of_the_fp8_gemm_time_on_h100() -> None:
    moved = linear_cast_bytes(M, K, N, "fp8-tensorwise", "hopper")
    assert moved == pytest.approx(6 * (M * K + M * N + K * N))  # 1.26 GB
    cast_s = H100.hbm_time_s(moved)  # at 3.35 TB/s: 0.375 ms
    gemm_s = 3 * 2 * M * K * N / (gemm_peak_tflops(H100, "fp8-tensorwise") * 1e12)  # fprop+dgrad+wgrad at peak
    assert cast_s == pytest.approx(0.375e-3, rel=0.01)
    assert 0.2 < cast_s / gemm_s < 0.3
    # delayed scaling saves the amax reads: a third of the bytes
    assert linear_cast_bytes(M, K, N, "fp8-delayed", "hopper") == pytest.approx(moved * 4 / 6)


def test_weight_casts_are_shared_by_the_micro_batches_of_a_step() -> None:
    one = linear_cast_bytes(M, K, N, "mxfp8", "blackwell", microbatches=1)
    eight = linear_cast_bytes(M, K, N, "mxfp8", "blackwell", microbatches=8)
    weight = K * N * cast_bytes_per_value("mxfp8", "weight", "blackwell")
    assert one - eight == pytest.approx(weight * 7 / 8)
    with pytest.raises(ValueError, match="microbatches"):
        linear_cast_bytes(M, K, N, "mxfp8", "blackwell", microbatches=0)


def test_gemm_peak_per_flavour() -> None:
    assert gemm_peak_tflops(H100, None) == H100.bf16_dense_tflops
    assert gemm_peak_tflops(H100, "fp8-delayed") == gemm_peak_tflops(H100, "fp8-tensorwise") == H100.fp8_dense_tflops
    assert gemm_peak_tflops(H100, "fp8-blockwise") == pytest.approx(0.9 * H100.fp8_dense_tflops)  # type: ignore[operator]
    # Blackwell: TE runs blockwise GEMMs as MXFP8 (scales converted to E8M0), at MXFP8's measured share of FP8's rate
    assert gemm_peak_tflops(B200, "fp8-blockwise") == gemm_peak_tflops(B200, "mxfp8") \
        == pytest.approx(6.812 / 7.161 * B200.fp8_dense_tflops)  # type: ignore[operator]
    # NVFP4 at the multiple of FP8's rate TE's guide measures with its quantisation, below the 2x datasheet peak
    assert gemm_peak_tflops(B200, "nvfp4") == pytest.approx(9.147 / 6.453 * B200.fp8_dense_tflops)  # type: ignore[operator]
    assert gemm_peak_tflops(B200, "nvfp4") < B200.nvfp4_dense_tflops  # type: ignore[operator]
    assert gemm_peak_tflops(MI355X, "mxfp4") == MI355X.mxfp4_dense_tflops


def test_memory_kept_per_flavour() -> None:
    # saved GEMM inputs: 1 B per value for per-tensor FP8, + 1/32 B of scales for MXFP8 and blockwise
    assert saved_input_bytes_per_value("fp8-tensorwise") == 1
    assert saved_input_bytes_per_value("mxfp8") == pytest.approx(1 + 1 / 32)
    assert saved_input_bytes_per_value("nvfp4") == pytest.approx(0.5 + 1 / 16)
    # weights: MXFP8 keeps a rowwise and a columnwise copy, NVFP4 two 4-bit copies: about half of MXFP8's
    mx = weight_copy_bytes_per_param("mxfp8", "blackwell")
    nv = weight_copy_bytes_per_param("nvfp4", "blackwell")
    assert mx == pytest.approx(2 * (1 + 1 / 32))
    assert nv == pytest.approx(2 * (0.5 + 1 / 256)) and nv < 0.51 * mx


# ---- against the calibrated recipe (what the step time adds per layer) ------------------------------------------
def _training(precision: str, recipe: str = "tensorwise") -> TrainingSpec:
    return TrainingSpec(seq_length=8192, global_batch_size=8, precision=precision,  # type: ignore[arg-type]
                        fp8_recipe=recipe)  # type: ignore[arg-type]  # test inputs


def test_a_dense_layer_has_its_four_linears_per_gpu() -> None:
    model = get_model("llama3.1-8b")
    linears = layer_linears(model, 0, ParallelConfig.for_world(8, tp=2, mbs=1), tokens=M)
    # QKV (4096 -> 6144 over TP 2), projection, gated FC1 (2 x 14336 over TP 2), FC2
    assert linears == [(M, 4096, 3072), (M, 2048, 4096), (M, 4096, 14336), (M, 7168, 4096)]


def test_moe_layers_add_each_local_expert_and_the_shared_expert() -> None:
    model = get_model("deepseek-v2-lite")
    layer = next(i for i in range(model.num_layers) if model.is_moe_layer(i))
    linears = layer_linears(model, layer, ParallelConfig.for_world(8, ep=8, mbs=1), tokens=4096)
    moe = model.moe
    assert moe is not None
    assert len(linears) == 1 + 2 * (moe.num_experts // 8) + 2  # MLA's one projection, 2 per expert, shared FC1/FC2
    assert linears[1][0] == pytest.approx(4096 * moe.router_topk * 8 / moe.num_experts)  # tokens per local expert


def test_delayed_saves_and_blockwise_costs_against_the_calibrated_tensorwise() -> None:
    linears = [(M, K, N)]
    gemm_s = 3 * 2 * M * K * N / (0.5 * H100.fp8_dense_tflops * 1e12)  # type: ignore[operator]  # at half peak
    delayed = recipe_delta_s(_training("fp8", "delayed"), H100, linears, gemm_s, microbatches=1)
    blockwise = recipe_delta_s(_training("fp8", "blockwise"), H100, linears, gemm_s, microbatches=1)
    # delayed: two fewer bytes per value of X, dY and W, at 3.35 TB/s
    assert delayed == pytest.approx(-2 * (M * K + M * N + K * N) / 3.35e12)
    # blockwise: the GEMMs at 1/0.9 of their time, casts slightly cheaper (no amax read, a few scale bytes)
    assert blockwise > 0
    assert blockwise == pytest.approx(gemm_s / 9 + H100.hbm_time_s(
        linear_cast_bytes(M, K, N, "fp8-blockwise", "hopper") - linear_cast_bytes(M, K, N, "fp8-tensorwise", "hopper")))
    for calibrated in (_training("bf16"), _training("fp8"), _training("mxfp8")):
        assert recipe_delta_s(calibrated, B200, linears, gemm_s, microbatches=1) == 0


def test_the_step_time_of_a_recipe_moves_the_way_its_costs_do() -> None:
    def step_s(recipe: str) -> float:
        case = build_case(model="llama3.1-8b", gpu="h100", gpus=8, tp=2, gbs=64, seq_len=8192, precision="fp8",
                          fp8_recipe=recipe)
        return step_time(case.model, case.cluster, case.training, case.parallel).step_time_s

    assert step_s("delayed") < step_s("tensorwise") < step_s("blockwise")
