"""The estimate result and the saved plan (`megapilot plan --save plan.json`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from megapilot.spec.cuda_graphs import CudaGraphs
from megapilot.spec.hardware import ClusterSpec
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.training import TrainingSpec

PLAN_FILE_VERSION = 1
# The keys every saved plan holds: what tells its file from another JSON given in its place or it in theirs (a model
# spec, a suite config).
SAVED_PLAN_KEYS = frozenset({"model", "cluster", "training", "parallel"})

# Megatron's flex MoE dispatcher backends (`--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend X`).
FlexDispatcher = Literal["deepep", "hybridep"]


class ParamCounts(BaseModel):
    model_config = ConfigDict(extra="allow")

    total: int
    active: int
    embedding: int


class MemoryGiB(BaseModel):
    """Per-GPU memory of the most-loaded rank, GiB."""

    model_config = ConfigDict(extra="allow")

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    total: float
    capacity: float
    stage: int | None = Field(default=None, description="The pipeline stage these figures are for.")


class EstimateResult(BaseModel):
    """What `megapilot estimate --json` prints; the planner and reports read the same object."""

    model_config = ConfigDict(extra="allow")

    params: ParamCounts
    flops_per_step: float
    memory_gib: MemoryGiB
    fits: bool  # in HBM, and in host memory where activations are offloaded
    host_offload_gib: float | None = Field(
        default=None, description="Host memory per GPU that activation offload holds (GiB); None without offload.")
    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    time_breakdown_s: dict[str, float] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    bubble_fraction: float | None = Field(default=None, description="Pipeline bubble's share of the step.")
    exposed_comm_fraction: float | None = Field(
        default=None, description="Communication not hidden behind compute, as a share of the step.")
    flop_convention: str | None = Field(default=None, description="How flops_per_step and MFU count FLOPs.")
    calibration: str | None = Field(
        default=None, description="The published runs behind this estimate: its calibrated cell (family, GPU, "
        "precision) or the nearest one, with the model's median |error| there; or that none checks it. Calibrated "
        "on a cluster's runs (`--cluster`), that calibration instead.")
    tokens_per_s_per_gpu_p10: float | None = Field(
        default=None, description="Low end of the 80 % interval of tokens/s/GPU: from the model's errors on published "
        "runs of the nearest family/GPU/precision when their family or GPU was held out of the fit, wider outside.")
    tokens_per_s_per_gpu_p90: float | None = Field(default=None, description="High end of the same 80 % interval.")
    interval_basis: str | None = Field(default=None, description="The held-out errors the interval comes from.")


class SavedPlan(BaseModel):
    """A chosen layout with everything needed to write its launch script."""

    model_config = ConfigDict(extra="forbid")

    version: int = PLAN_FILE_VERSION
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    parallel: ParallelConfig
    estimate: EstimateResult | None = None
    reasons: list[str] = Field(default_factory=list)
    moe_flex_dispatcher: FlexDispatcher | None = Field(
        default=None, description="The flex MoE dispatcher the plan was costed with (None: alltoall); the launch "
        "script writes it unless told otherwise.")
    moe_a2a_overlap: bool = Field(
        default=False, description="Whether the plan was costed with the expert all-to-all overlapped "
        "(--overlap-moe-expert-parallel-comm, where Megatron allows it); the launch script writes it.")
    cuda_graphs: CudaGraphs | None = Field(
        default=None, description="The CUDA graphs the plan was costed with (None: eager); the launch script writes "
        "them.")


def looks_like_saved_plan(data: Mapping[str, object]) -> bool:
    """Whether a file's mapping is a saved plan (`SAVED_PLAN_KEYS`, a model inside)."""
    return data.keys() >= SAVED_PLAN_KEYS and isinstance(data.get("model"), dict)
