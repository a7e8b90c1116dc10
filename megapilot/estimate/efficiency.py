"""How much of the peak a GPU reaches on the work of a training step.

Seven parameters, fitted on published Megatron runs by `bench/calibration/run.py` (results committed
in `bench/calibration/results.json`) and copied here:

- `gemm_peak_fraction_16bit` / `gemm_peak_fraction_8bit`: the fraction of the dense peak a large
  BF16/FP16 (resp. FP8-class) GEMM reaches in Megatron (cuBLAS/TE kernels, clocks under load).
- `ridge_multiplier` (kappa): a GEMM of arithmetic intensity I (FLOPs per byte of its three operands)
  runs at `peak_fraction * I / (I + kappa * ridge)`, with ridge = peak FLOP/s / HBM bytes/s, the
  roofline knee of the GPU. A thin GEMM (small hidden per TP rank, few tokens) falls off smoothly;
  a fat one tends to the peak fraction. One parameter, shared by every GPU.
- `elementwise_passes`: norms, activations, dropout, rotary, residuals, casts and the optimizer-free
  glue move roughly `c` times the bytes a layer stores for backward through HBM per forward+backward;
  this is memory-bound time, priced at the GPU's HBM bandwidth.
- `attention_peak_fraction`: the fused (flash) attention kernels' fraction of the BF16 peak; they
  run in BF16 under FP8 recipes too (Transformer Engine keeps dot-product attention in BF16).
- `grouped_gemm_fraction`: the routed experts' GEMMs reach this fraction of what a dense GEMM of their
  shape reaches (grouped / per-expert kernels, per-expert FP8 scaling, ragged token counts).
- `kernel_overhead_s`: seconds every kernel costs beyond its work on the GPU (latency.py: the launch gap, its
  first wave's ramp-up and its last wave's drain), times the kernels a layer runs (`latency.layer_kernels`).
  The small models of the older file and the Mixtral rows pin it down; a MoE layer with many narrow experts
  runs hundreds of kernels per micro-batch and pays it most.

Collective bandwidth: NCCL reaches about 75 % of the nominal link bandwidth on large messages
(nccl-tests bus bandwidth on NVLink4/NDR systems); a stated constant, not fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from megapilot.spec.hardware import GPUSpec
from megapilot.spec.training import QUANTIZED_PRECISIONS

COLLECTIVE_BW_EFFICIENCY = 0.75
EIGHT_BIT_PRECISIONS = QUANTIZED_PRECISIONS  # FP4 priced as NVFP4 is: the 8-bit fit


@dataclass(frozen=True)
class EfficiencyParams:
    """The fitted parameters of the compute-time model (see module doc)."""

    gemm_peak_fraction_16bit: float
    gemm_peak_fraction_8bit: float
    ridge_multiplier: float
    elementwise_passes: float
    attention_peak_fraction: float
    # Routed experts' GEMMs reach this fraction of what a dense GEMM of the same shape reaches: grouped (or
    # per-expert) kernels, per-expert FP8 scaling, ragged token counts. 1.0 = no loss.
    grouped_gemm_fraction: float = 1.0
    # Seconds each kernel costs beyond its work (latency.py); 0 = none.
    kernel_overhead_s: float = 0.0


# Fitted by bench/calibration/run.py on 45 published Megatron/NeMo runs of the older file (A100 BF16, H100 BF16,
# H100 FP8) and the 16 rows of NeMo 25.02 and 25.04 (B200/GB200 FP8, Mixtral, Megatron-FSDP): median |error| 3.6 %
# in-sample; NeMo 25.07 and Megatron-Bridge 25.09 are judged on them, unseen (8.0 %, 35 rows; 5.6 % on the 21
# printed per-tensor FP8 rows, the rest their MXFP8 and blockwise twins; bench/calibration/results.md,
# release_holdout.md). An overlapped DP / Megatron-FSDP collective is priced with the SMs NCCL's channels take from
# the compute beside it (latency.sm_contended_exposed_s). The 2021-22 A100 rows are priced with their unfused
# attention and the cross-entropy at its kernels' bytes (bench/calibration/physics.md), which leaves the glue and
# the kernel overhead all but free (the loss moves by under 5e-4 for a 5 % step of either) though they still end on
# their upper bounds. The attention fraction sits on its floor, cuDNN's measured H100 rate at 2K tokens (0.43,
# calibration.BOUNDS), held there by the two 64K-token Mixtral 8x22B rows (CP 8) and the README's small models; a
# Blackwell backward pays its shared memory beyond it (attention_bounds.backward_smem_bound).
CALIBRATED = EfficiencyParams(
    gemm_peak_fraction_16bit=0.7229,
    gemm_peak_fraction_8bit=0.4704,
    ridge_multiplier=0.4496,
    elementwise_passes=6.0000,
    attention_peak_fraction=0.4300,
    grouped_gemm_fraction=0.8174,
    kernel_overhead_s=5.000e-6,
)


# Bytes per operand value of the block-scaled formats' GEMMs: the element and its share of the block scale, as
# Transformer Engine allocates them (`bulk_allocate_{mxfp8,nvfp4}_tensors`, pytorch/csrc/extensions/cast.cpp, TE
# 2.8-2.10): MXFP8 one byte plus an E8M0 scale per 32 values; NVFP4 two values per byte (ceil(n / 2)) plus an E4M3
# scale per 16 (its per-tensor FP32 scale is negligible); MXFP4 (OCP) half a byte plus an E8M0 scale per 32. FP8 with
# one scale per tensor (delayed, current scaling: the calibrated recipe) is one byte.
BLOCK_SCALED_OPERAND_BYTES = {"mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32}


def gemm_bytes_per_element(precision: str) -> float:
    """Operand width of the GEMMs: the block-scaled formats at their element and scale bytes (an FP4 operand is
    half an FP8 one, so its intensity doubles with its peak), other 8-bit recipes 1 byte, 16-bit 2."""
    if precision in BLOCK_SCALED_OPERAND_BYTES:
        return BLOCK_SCALED_OPERAND_BYTES[precision]
    return 1.0 if precision in EIGHT_BIT_PRECISIONS else 2.0


# The block-scaled formats' GEMMs against the datasheet. Public figures: Transformer Engine's GEMM profiling guide
# (docs/examples/gemm_profiling, B300; a 5B layer's 12 GEMMs: M = 15,872 tokens, hidden 4096, FFN 16,384), per layer:
#
#                                      BF16    FP8 current scaling   MXFP8    NVFP4
#   GEMMs alone (operands quantised)   13.102  6.812                 7.161    3.764   ms
#   with their quantisation (autocast) 12.758  9.147                 8.984    6.453   ms
#
# The fitted 8-bit fraction is current scaling's GEMMs with its quantisation (the calibration rows ran it; the model
# prices that layer at 9.52 ms), so another format is priced against that.
# - MXFP8: its GEMMs load their block scales and Transformer Engine first swizzles both operands' scales into the
#   tensor cores' layout (two kernels a GEMM, `swizzle_scaling_factors`, TE 2.6-2.10): 6.812 / 7.161 of current
#   scaling's rate at the same peak. Its quantisation is priced as current scaling's: the guide times it cheaper
#   (8.984 against 9.147 ms with it), but in Megatron-Bridge's recipes current scaling's amax rides in the norm
#   kernel for the QKV and FC1 inputs (TE's fused norm + amax), MXFP8's norm runs unfused on B200, and MXFP8
#   gathers its parameters in BF16 and re-quantises each one every step (Megatron-Core 0.13-0.15). The same
#   layouts run both ways in the 25.07 / 25.09 tables net these: MXFP8 at 0.94-0.98x on dense layers
#   (bench/calibration/release_holdout.md).
# - NVFP4: its tensor cores' datasheet peak (2x FP8's on B200, about 3x on B300) is not what its GEMMs reach with
#   their quantisation (the Hadamard transforms, stochastic rounding, 16 x 16 weight blocks, the per-tensor amax):
#   9.147 / 6.453 = 1.42x current scaling's rate, which no calibration row can set. Held at that multiple of the
#   FP8 peak on every GPU (the one NVFP4 figure measured at training shapes).
BLOCK_SCALED_GEMM_RATE = {"mxfp8": 6.812 / 7.161}
NVFP4_OVER_FP8_RATE = 9.147 / 6.453


def gemm_peak_tflops(gpu: GPUSpec, precision: str) -> float:
    """Dense peak the GEMM precision's kernels are priced at (TFLOP/s): the datasheet's; MXFP8's at the share of it
    its GEMMs reach where current scaling's reach the whole (`BLOCK_SCALED_GEMM_RATE`); NVFP4's at the multiple of
    the FP8 peak its GEMMs with their quantisation reach (`NVFP4_OVER_FP8_RATE`), at most its own."""
    if precision == "nvfp4":
        return min(gpu.peak_tflops("nvfp4"), gpu.peak_tflops("fp8") * NVFP4_OVER_FP8_RATE)
    return gpu.peak_tflops(precision) * BLOCK_SCALED_GEMM_RATE.get(precision, 1.0)  # type: ignore[arg-type]


def gemm_efficiency(
    m: float, k: float, n: float, gpu: GPUSpec, precision: str, params: EfficiencyParams = CALIBRATED
) -> float:
    """Fraction of the precision's peak reached by an (m x k) @ (k x n) GEMM.

    Roofline-smoothed (Williams et al. 2009, "Roofline"): intensity I = 2mkn / (bytes x (mk + kn + mn));
    efficiency = peak_fraction x I / (I + kappa x ridge).
    """
    element = gemm_bytes_per_element(precision)
    intensity = 2 * m * k * n / (element * (m * k + k * n + m * n))
    ridge = gemm_peak_tflops(gpu, precision) * 1e12 / (gpu.hbm_bw_tbps * 1e12)
    fraction = params.gemm_peak_fraction_8bit if precision in EIGHT_BIT_PRECISIONS else params.gemm_peak_fraction_16bit
    return fraction * intensity / (intensity + params.ridge_multiplier * ridge)


def gemm_time_s(
    flops: float, m: float, k: float, n: float, gpu: GPUSpec, precision: str, params: EfficiencyParams = CALIBRATED
) -> float:
    """Seconds for `flops` FLOPs of GEMMs shaped (m, k, n)."""
    rate = gemm_peak_tflops(gpu, precision) * 1e12 * gemm_efficiency(m, k, n, gpu, precision, params)
    return flops / rate


def attention_time_s(flops: float, gpu: GPUSpec, params: EfficiencyParams = CALIBRATED) -> float:
    """Seconds for fused attention-core FLOPs (always BF16)."""
    return flops / (gpu.bf16_dense_tflops * 1e12 * params.attention_peak_fraction)


def elementwise_time_s(stored_bytes: float, gpu: GPUSpec, params: EfficiencyParams = CALIBRATED) -> float:
    """Seconds of memory-bound glue for a layer that stores `stored_bytes` for backward."""
    return gpu.hbm_time_s(params.elementwise_passes * stored_bytes)
