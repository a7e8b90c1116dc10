"""Fixed costs of a MoE layer that do not shrink with a faster GPU or a smaller micro-batch.

The bandwidth and FLOP terms of the step time scale with the work; three MoE costs do not:

- kernel gaps: every kernel the MoE block launches leaves the GPU idle between the end of one kernel and the start
  of the next, even when the host has queued it in advance. NVIDIA measured a 2.9 us kernel at 3.8 us per kernel
  launched back to back on one stream ("Getting Started with CUDA Graphs", NVIDIA Technical Blog, A. Gray, 2019):
  0.9 us per kernel that no faster GPU removes. A MoE layer launches hundreds (per local expert: its GEMMs and the
  FP8 casts of their inputs), a dense MLP a dozen.
- the host sync: Megatron's alltoall dispatcher needs the tokens each rank sends and receives on the host (the
  all-to-all's split sizes are host arguments), so each MoE layer's forward copies them to the host and waits
  (`cuda_sync_point`, megatron/core/transformer/moe/token_dispatcher.py). The queue drains: the kernels after the
  sync run no faster than the host launches them, 3.8 us each at best (same measurement), and the sync itself
  costs the 9.6 - 3.8 = 5.8 us that the blog measured for a stream synchronisation after a kernel. The flex
  dispatcher (`--moe-token-dispatcher-type flex`) is priced without it: HybridEP sizes its buffers statically and
  DeepEP can (`num_worst_tokens`); DeepEP's normal mode still waits on the host for its receive counts, which
  this leaves out (one sync, microseconds, unless the launches after it outlast the GPU's work).
- wave quantisation: a GEMM runs as tiles, one tile per SM at a time; a last, partly filled wave of tiles costs a
  full one. Transformer Engine's GroupedLinear (Megatron's default `--moe-grouped-gemm` path) runs one cuBLAS GEMM
  per local expert, spread over 4 compute streams (`num_streams = 4`, transformer_engine/common/include/
  transformer_engine/gemm.h; `nvte_multi_stream_cublas_gemm`), so up to four experts' tiles share the waves; one
  CUTLASS grouped GEMM (`--moe-use-legacy-grouped-gemm`, the `grouped_gemm` package) tiles every local expert in
  one launch.

Counts of kernels are those of Megatron-Core's MoE layer with fused router (`--moe-router-fusion`) and fused
permutation (`--moe-permute-fusion`), as the NeMo/Bridge performance recipes set them; FP8 current scaling casts
each expert's GEMM input on its own (amax, scale, cast: three kernels per tensor, Transformer Engine's
`split_quantize`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from megapilot.spec.hardware import GPUSpec

KERNEL_GAP_S = 0.9e-6  # GPU idle between back-to-back queued kernels (CUDA Graphs blog: 3.8 - 2.9 us)
HOST_LAUNCH_FLOOR_S = 3.8e-6  # a kernel the host launches while the GPU waits takes at least this (same blog)
HOST_SYNC_S = 5.8e-6  # a stream synchronisation beyond a queued launch (same blog: 9.6 - 3.8 us)
TE_GROUPED_GEMM_STREAMS = 4  # Transformer Engine's multi-stream cuBLAS grouped GEMM
GEMM_TILE = 128  # output tile side of the cuBLAS/CUTLASS kernels (128 x 128 per SM), as step_time pads rows

# Kernels of one MoE layer besides the expert GEMMs and their casts (fused router and permutation):
# forward before the dispatcher's sync: router GEMM, fused top-k/softmax, 3 aux-loss kernels, the per-expert token
# count, 3 for the split sizes (gather over EP, sums), 2 copies to the host, the fused permute;
ROUTER_AND_PREPROCESS_KERNELS = 12
# forward after it: dispatch all-to-all, sort by local expert, the fused SwiGLU, unsort, combine all-to-all, unpermute;
DISPATCH_AND_COMBINE_KERNELS = 6
# backward: the two all-to-alls, four permutation kernels, SwiGLU, router GEMM dgrad + wgrad, top-k/softmax, 2 aux.
BACKWARD_OTHER_KERNELS = 13
FP8_CAST_KERNELS_PER_TENSOR = 3  # amax, scale, cast (current scaling)
EXPERT_GEMMS_FORWARD = 2  # fc1, fc2
EXPERT_GEMMS_BACKWARD = 4  # dgrad and wgrad of each
EXPERT_CASTS_FORWARD = 2  # fc1's and fc2's inputs
EXPERT_CASTS_BACKWARD = 2  # their output gradients

# Streaming multiprocessors (NVIDIA) / compute units (AMD) per GPU, with the vendor's number and source.
SM_COUNTS: dict[str, tuple[int, str]] = {
    "A100-SXM4-80GB": (108, "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs"),
    "H100-SXM5-80GB": (132, "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs (SXM5)"),
    "H200-SXM-141GB": (132, "NVIDIA H200: the GH100 of H100 SXM5 with HBM3e, 132 SMs"),
    "H800-SXM5-80GB": (132, "NVIDIA H800 SXM5: GH100 with 132 SMs (H100 SXM5 compute, reduced NVLink)"),
    "B200": (148, "B200: 148 SMs as the CUDA runtime reports them (multiProcessorCount), two dies of 74"),
    "GB200": (148, "GB200's Blackwell GPU: the B200 die pair, 148 SMs"),
    "B300": (160, "NVIDIA Technical Blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs"),
    "GB300": (160, "NVIDIA Technical Blog 'Inside NVIDIA Blackwell Ultra' (2025): 160 SMs"),
    "MI300X": (304, "AMD CDNA 3 architecture whitepaper (2023): 304 compute units"),
    "MI325X": (304, "AMD Instinct MI325X data sheet: 304 compute units"),
    "MI355X": (256, "AMD CDNA 4 architecture whitepaper (2025): 256 compute units"),
}
# A GPU outside the table (a user's own spec) takes its generation's flagship count.
SM_COUNTS_BY_ARCHITECTURE = {"ampere": 108, "hopper": 132, "blackwell": 148, "cdna3": 304, "cdna4": 256}
DEFAULT_SM_COUNT = 132


def sm_count(gpu: GPUSpec) -> int:
    """SMs (compute units) of `gpu`: by catalog name, else by its architecture's flagship."""
    known = SM_COUNTS.get(gpu.name)
    if known is not None:
        return known[0]
    return SM_COUNTS_BY_ARCHITECTURE.get(gpu.architecture, DEFAULT_SM_COUNT)


def wave_efficiency(rows: float, cols: float, sms: int, concurrent: int = 1) -> float:
    """Fraction of the SM-waves a GEMM's output tiles fill: `concurrent` equal GEMMs share the waves."""
    tiles = math.ceil(rows / GEMM_TILE) * math.ceil(cols / GEMM_TILE) * max(1, concurrent)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


@lru_cache(maxsize=4096)  # the planner prices thousands of layouts that share a few expert shapes
def expert_wave_slowdown(tokens: float, hidden: float, width: float, sms: int, concurrent: int) -> float:
    """Mean factor (>= 1) by which wave quantisation slows an expert linear's three GEMMs: fprop writes
    tokens x width, dgrad tokens x hidden, wgrad hidden x width (equal FLOPs, so equal weights)."""
    outputs = ((tokens, width), (tokens, hidden), (hidden, width))
    return sum(1 / wave_efficiency(r, c, sms, concurrent) for r, c in outputs) / len(outputs)


@dataclass(frozen=True)
class MoeKernels:
    """Kernels of one MoE layer per micro-batch, split where the dispatcher's host sync falls. `*_serial` count
    what runs one after another on the GPU (the expert GEMMs once per round of streams); the host launches every
    GEMM on its own (`forward_after_sync_launches`)."""

    forward_before_sync: int
    forward_after_sync_serial: int
    forward_after_sync_launches: int
    backward_serial: int

    @property
    def serial(self) -> int:
        return self.forward_before_sync + self.forward_after_sync_serial + self.backward_serial


@lru_cache(maxsize=256)
def moe_kernels(local_experts: int, *, per_expert_gemms: bool, fp8_casts: bool) -> MoeKernels:
    """Kernels of one MoE layer: one GEMM per local expert when Transformer Engine runs them (spread over its
    streams, so they follow one another once per round of streams), else one grouped GEMM per kind."""
    gemm_rounds = math.ceil(local_experts / TE_GROUPED_GEMM_STREAMS) if per_expert_gemms else 1
    gemm_launches = local_experts if per_expert_gemms else 1
    casts = FP8_CAST_KERNELS_PER_TENSOR * local_experts if fp8_casts else 0
    forward_other = DISPATCH_AND_COMBINE_KERNELS + EXPERT_CASTS_FORWARD * casts
    return MoeKernels(
        forward_before_sync=ROUTER_AND_PREPROCESS_KERNELS,
        forward_after_sync_serial=forward_other + EXPERT_GEMMS_FORWARD * gemm_rounds,
        forward_after_sync_launches=forward_other + EXPERT_GEMMS_FORWARD * gemm_launches,
        backward_serial=BACKWARD_OTHER_KERNELS + EXPERT_CASTS_BACKWARD * casts + EXPERT_GEMMS_BACKWARD * gemm_rounds,
    )


def moe_fixed_latency_s(kernels: MoeKernels, *, host_sync: bool, forward_after_sync_gpu_s: float) -> float:
    """Seconds per micro-batch one MoE layer spends beyond its work: a gap after each kernel and, with a host
    sync, the sync itself and whatever the host's launches after it (the queue is empty) take beyond the GPU's
    work and gaps over the same kernels."""
    gaps = kernels.serial * KERNEL_GAP_S
    if not host_sync:
        return gaps
    host_paced = kernels.forward_after_sync_launches * HOST_LAUNCH_FLOOR_S
    gpu_paced = forward_after_sync_gpu_s + kernels.forward_after_sync_serial * KERNEL_GAP_S
    return gaps + HOST_SYNC_S + max(0.0, host_paced - gpu_paced)
