"""GPUSpec and ClusterSpec: what a GPU can do and how many of them there are."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from megapilot.errors import MegapilotError
from megapilot.limits import MAX_GPUS, MAX_GPUS_REASON
from megapilot.spec.training import Fp8Recipe, Precision

Vendor = Literal["NVIDIA", "AMD", "CPU"]  # CPU: this machine's CPU, measured (catalog/host.py)

# Which low-precision GEMM formats each architecture trains in natively. FP8 (E4M3/E5M2 with per-tensor
# scales) arrived with Ada/Hopper and CDNA3; the block-scaled MXFP8 and NVFP4 need Blackwell's fifth-generation
# tensor cores (Transformer Engine support matrix: MXFP8 and NVFP4 on compute capability 10.x only). CDNA4
# (MI355X) has MXFP8 and MXFP4 but no NVFP4; MXFP4 training exists only in Primus (Primus-Turbo/AITER GEMMs),
# so it is listed for CDNA4 alone although Blackwell's tensor cores could multiply MXFP4 too.
ARCH_PRECISIONS: dict[str, frozenset[str]] = {
    "ampere": frozenset({"bf16", "fp16"}),
    "ada": frozenset({"bf16", "fp16", "fp8"}),
    "hopper": frozenset({"bf16", "fp16", "fp8"}),
    "blackwell": frozenset({"bf16", "fp16", "fp8", "mxfp8", "nvfp4"}),
    "cdna3": frozenset({"bf16", "fp16", "fp8"}),
    "cdna4": frozenset({"bf16", "fp16", "fp8", "mxfp8", "mxfp4"}),
    "cpu": frozenset({"bf16", "fp16"}),  # the embedded trainer computes in fp32 on CPU whatever it is asked
}
# The FP8 scaling recipes each architecture runs. Per-tensor (delayed, current) from compute capability 8.9;
# Float8BlockScaling on Hopper and data-centre Blackwell, not Ada (Transformer Engine support matrix). On
# AMD Instinct, blockwise FP8 runs in Primus-Turbo's GEMM (rocm_arg_validation: tensorwise, blockwise, mxfp8).
ARCH_FP8_RECIPES: dict[str, frozenset[str]] = {
    "ampere": frozenset(),
    "ada": frozenset({"delayed", "tensorwise"}),
    "hopper": frozenset({"delayed", "tensorwise", "blockwise"}),
    "blackwell": frozenset({"delayed", "tensorwise", "blockwise"}),
    "cdna3": frozenset({"delayed", "tensorwise", "blockwise"}),
    "cdna4": frozenset({"delayed", "tensorwise", "blockwise"}),
    "cpu": frozenset(),
}
# What a refused precision needs, and what to use instead where the GPU does not have it.
_PRECISION_NEEDS: dict[str, str] = {
    "fp8": "FP8 tensor cores (Ada, Hopper, Blackwell, CDNA3 or newer)",
    "mxfp8": "block-scaled MXFP8 tensor cores (Blackwell or CDNA4/MI355X)",
    "nvfp4": "Blackwell's NVFP4 tensor cores",
    "mxfp4": "CDNA4 (MI355X) MXFP4 GEMMs through Primus; Megatron-LM has no MXFP4 recipe",
}
_PRECISION_ALTERNATIVE: dict[tuple[str, str], str] = {
    ("mxfp8", "hopper"): "use precision fp8 with fp8_recipe blockwise (Hopper's per-block FP8 recipe)",
    ("mxfp8", "cdna3"): "use precision fp8 with fp8_recipe blockwise (Primus-Turbo) or tensorwise",
    ("nvfp4", "hopper"): "use precision fp8 (fp8_recipe blockwise for per-block scales)",
    ("nvfp4", "cdna4"): "use precision mxfp4 (Primus launcher) or mxfp8",
    ("mxfp4", "blackwell"): "use precision nvfp4, Blackwell's FP4 recipe in Megatron-LM",
}


Architecture = Literal["ampere", "ada", "hopper", "blackwell", "cdna3", "cdna4", "cpu"]


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
    host_link_gbps: float = Field(
        default=64.0, gt=0,
        description="GPU <-> host-memory bandwidth per GPU per direction, GB/s, what activation offloading moves "
                    "over: PCIe Gen5 x16 (64) unless the catalog states the GPU's own link.")
    host_memory_gib: float | None = Field(
        default=None, gt=0,
        description="Host memory per GPU, GiB (the node's DRAM over its GPUs): what activation offloading parks "
                    "activations in; None = unknown (not checked).")
    tdp_w: float | None = Field(
        default=None, gt=0, description="Board power at TDP, W (the budget's energy: GPU-hours x TDP); None = unknown.")
    mma_flops_per_exp: float | None = Field(
        default=None, gt=0,
        description="Dense BF16 tensor-core FLOPs per clock per SM over the special-function unit's exponentials per "
                    "clock per SM: the tensor-core time one softmax exponential costs (None = not priced).")
    mma_flops_per_smem_byte: float | None = Field(
        default=None, gt=0,
        description="Dense BF16 tensor-core FLOPs per clock per SM over the shared memory's bytes per clock per SM: "
                    "the tensor-core time one byte of shared-memory traffic costs (None = not priced).")
    host_op_s: float = Field(
        default=0.0, ge=0,
        description="Seconds each op costs the host thread beyond its work where ops run in line with it (a CPU "
                    "rank: PyTorch's dispatch, autograd, the Python around it); 0 where the host queues kernels "
                    "ahead of the device (a GPU: its per-kernel cost is the fitted kernel overhead).")
    host_element_s: float = Field(
        default=0.0, ge=0,
        description="Seconds each element written by an element-wise op costs the host thread where it runs them "
                    "(a CPU rank: per element, not per byte of memory traffic); 0 where element-wise work is "
                    "memory-bound on the device (a GPU: its HBM bandwidth).")
    host_runtime_gib: float = Field(
        default=0.0, ge=0,
        description="Resident memory of a CPU rank's process before its model (Python, torch, Megatron-Core), "
                    "GiB: its memory overhead in place of a GPU's CUDA context, NCCL buffers and allocator "
                    "fragmentation; 0 on a GPU.")
    source: str = Field(default="", description="Where the numbers come from.")

    @property
    def precisions(self) -> frozenset[str]:
        return ARCH_PRECISIONS[self.architecture]

    @property
    def scaleup_fabric(self) -> str:
        """The links inside its scale-up domain, as reasons and warnings name them: NVLink on NVIDIA GPUs, xGMI
        (Infinity Fabric) on AMD Instinct."""
        return {"NVIDIA": "NVLink", "AMD": "xGMI"}.get(self.vendor, "scale-up")

    def supports(self, precision: Precision) -> bool:
        return precision in self.precisions

    def hbm_time_s(self, moved_bytes: float) -> float:
        """Seconds to move `moved_bytes` through HBM at its peak bandwidth: a memory-bound kernel's roofline."""
        return moved_bytes / (self.hbm_bw_tbps * 1e12)

    def supports_fp8_recipe(self, recipe: Fp8Recipe) -> bool:
        return recipe in ARCH_FP8_RECIPES[self.architecture]

    def check_precision(self, precision: Precision, fp8_recipe: Fp8Recipe | None = None) -> None:
        """Refuse a GEMM precision, or an FP8 scaling recipe (with precision fp8), this GPU generation cannot
        run; the error names the field and what runs here instead."""
        where = f"{self.name} ({self.architecture})"
        if not self.supports(precision):
            alternative = _PRECISION_ALTERNATIVE.get((precision, self.architecture))
            fix = alternative or f"use one of: {', '.join(sorted(self.precisions))}"
            raise MegapilotError(f"{precision} is not supported on {where}: it needs {_PRECISION_NEEDS[precision]}",
                                 field="precision", fix=fix)
        if precision == "fp8" and fp8_recipe is not None and not self.supports_fp8_recipe(fp8_recipe):
            recipes = ", ".join(sorted(ARCH_FP8_RECIPES[self.architecture]))
            raise MegapilotError(f"fp8_recipe {fp8_recipe} does not run on {where}: Transformer Engine's "
                                 "Float8BlockScaling needs Hopper or data-centre Blackwell",
                                 field="fp8_recipe", fix=f"use one of: {recipes}")

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak for the GEMM precision used, TF/s (the MFU denominator): the format's own datasheet
        peak where the catalog has one, else its bit width's (FP8 for MXFP8, FP4 for NVFP4/MXFP4)."""
        if precision in ("bf16", "fp16"):
            return self.bf16_dense_tflops
        fp8 = self.fp8_dense_tflops or self.bf16_dense_tflops
        if precision == "fp8":
            return fp8
        if precision == "mxfp8":
            return self.mxfp8_dense_tflops or fp8
        own = self.nvfp4_dense_tflops if precision == "nvfp4" else self.mxfp4_dense_tflops
        return own or self.fp4_dense_tflops or fp8


class ClusterSpec(BaseModel):
    """A homogeneous cluster: nodes x GPUs per node of one GPU type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GPUSpec
    num_nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)

    @model_validator(mode="after")
    def _size_within_reason(self) -> ClusterSpec:
        if self.world_size > MAX_GPUS:
            raise ValueError(f"{self.num_nodes:,} nodes x {self.gpus_per_node:,} GPUs is {self.world_size:,} GPUs, "
                             f"above {MAX_GPUS:,} ({MAX_GPUS_REASON}); check the values for extra digits")
        return self

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def scaleup_domain_gpus(self) -> int:
        """GPUs that share NVLink/xGMI: the node, or the whole rack on NVL72-class systems.

        A domain wider than the GPU's standard node (GB200's 72 over 4-GPU trays) spans nodes; any
        other domain is one baseboard, so it stops at the node when nodes hold fewer GPUs.
        """
        domain = self.gpu.scaleup_domain_gpus
        spans_nodes = domain > default_gpus_per_node(self.gpu)
        return domain if spans_nodes else min(domain, self.gpus_per_node)

    @classmethod
    def from_gpu_count(cls, gpu: GPUSpec, gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
        """Build a cluster from a total GPU count; the default node size is 8 (4 on GB200/GB300 trays)."""
        per_node = gpus_per_node or default_gpus_per_node(gpu)
        if gpus <= 0:
            raise MegapilotError(f"must be positive, got {gpus}", field="gpus", fix="pass --gpus N with N >= 1")
        if gpus > MAX_GPUS:
            raise MegapilotError(f"{gpus:,} GPUs is above {MAX_GPUS:,} ({MAX_GPUS_REASON})", field="gpus",
                                 fix=f"check --gpus for extra digits (at most {MAX_GPUS:,})")
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
