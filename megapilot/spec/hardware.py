"""GPUSpec and ClusterSpec: what a GPU can do and how many of them there are."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from megapilot.spec.training import Precision

Vendor = Literal["NVIDIA", "AMD"]

# Which low-precision GEMM formats each architecture runs natively. FP8 (E4M3/E5M2 with delayed
# or current scaling) arrived with Hopper/Ada and CDNA3; block-scaled MXFP8 and NVFP4 with
# Blackwell (MXFP8/MXFP4 on CDNA4).
ARCH_PRECISIONS: dict[str, frozenset[str]] = {
    "ampere": frozenset({"bf16", "fp16"}),
    "ada": frozenset({"bf16", "fp16", "fp8"}),
    "hopper": frozenset({"bf16", "fp16", "fp8"}),
    "blackwell": frozenset({"bf16", "fp16", "fp8", "mxfp8", "nvfp4"}),
    "cdna3": frozenset({"bf16", "fp16", "fp8"}),
    "cdna4": frozenset({"bf16", "fp16", "fp8", "mxfp8"}),
}
Architecture = Literal["ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4"]


class GPUSpec(BaseModel):
    """One accelerator model. Peaks are dense (no 2:4 sparsity), per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Full name as in the hardware catalog, e.g. H100-SXM5-80GB.")
    alias: str = Field(description="Short lowercase alias, e.g. h100.")
    vendor: Vendor
    architecture: Architecture
    bf16_dense_tflops: float = Field(gt=0, description="Dense BF16/FP16 tensor peak, TFLOP/s.")
    fp8_dense_tflops: float | None = Field(default=None, gt=0, description="Dense FP8 peak; None = no FP8.")
    fp4_dense_tflops: float | None = Field(default=None, gt=0, description="Dense FP4 peak; None = no FP4.")
    mxfp8_dense_tflops: float | None = Field(
        default=None, gt=0,
        description="Dense MXFP8 peak (OCP FP8 with one E8M0 scale per 32 values), TFLOP/s; None = no MXFP8.",
    )
    nvfp4_dense_tflops: float | None = Field(
        default=None, gt=0,
        description="Dense NVFP4 peak (NVIDIA's E2M1 with one FP8 scale per 16 values), TFLOP/s; None = no NVFP4.",
    )
    mxfp4_dense_tflops: float | None = Field(
        default=None, gt=0,
        description="Dense MXFP4 peak (OCP E2M1 with one E8M0 scale per 32 values), TFLOP/s; None = no MXFP4.",
    )
    hbm_gib: float = Field(gt=0, description="HBM capacity, GiB.")
    hbm_bw_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s.")
    scaleup_domain_gpus: int = Field(gt=0, description="GPUs in one NVLink / Infinity Fabric domain.")
    gpus_per_node: int = Field(
        default=8, gt=0,
        description="GPUs in one node (one host): 8 on HGX / OAM baseboards, 4 on a GB200/GB300 compute tray.",
    )
    scaleup_bw_gbps: float = Field(gt=0, description="Scale-up bandwidth per GPU per direction, GB/s.")
    scaleout_bw_gbps: float = Field(gt=0, description="Scale-out (IB/RoCE) bandwidth per GPU per direction, GB/s.")
    source: str = Field(default="", description="Where the numbers come from.")

    @property
    def precisions(self) -> frozenset[str]:
        return ARCH_PRECISIONS[self.architecture]

    def supports(self, precision: Precision) -> bool:
        return precision in self.precisions

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak for the GEMM precision used, TF/s (the MFU denominator)."""
        if precision in ("bf16", "fp16"):
            return self.bf16_dense_tflops
        if precision in ("fp8", "mxfp8"):
            return self.fp8_dense_tflops or self.bf16_dense_tflops
        return self.fp4_dense_tflops or self.fp8_dense_tflops or self.bf16_dense_tflops


class ClusterSpec(BaseModel):
    """A homogeneous cluster: nodes x GPUs per node of one GPU type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GPUSpec
    num_nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @classmethod
    def from_gpu_count(cls, gpu: GPUSpec, gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
        """Build a cluster from a total GPU count; the default node size is 8 (4 on GB200/GB300 trays)."""
        from megapilot.errors import MegapilotError

        per_node = gpus_per_node or default_gpus_per_node(gpu)
        if gpus <= 0:
            raise MegapilotError(f"must be positive, got {gpus}", field="gpus", fix="pass --gpus N with N >= 1")
        if gpus < per_node:
            per_node = gpus
        if gpus % per_node:
            raise MegapilotError(
                f"{gpus} GPUs do not fill whole nodes of {per_node}",
                field="gpus",
                fix=f"use a multiple of {per_node} or set --gpus-per-node",
            )
        return cls(gpu=gpu, num_nodes=gpus // per_node, gpus_per_node=per_node)


def default_gpus_per_node(gpu: GPUSpec) -> int:
    """GPUs per node when not given: the GPU's own node size (4 on GB200/GB300 compute trays, else 8)."""
    return gpu.gpus_per_node
