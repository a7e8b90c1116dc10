"""Typed specs that cross every boundary. Validation lives here; logic does not."""

from megapilot.spec.hardware import ARCH_PRECISIONS, ClusterSpec, GPUSpec, default_gpus_per_node
from megapilot.spec.model import MLASpec, ModelSpec, MoESpec
from megapilot.spec.parallel import LAYOUT_FIELDS, LayoutPins, ParallelConfig
from megapilot.spec.plan_file import EstimateResult, FlexDispatcher, MemoryGiB, ParamCounts, SavedPlan
from megapilot.spec.prediction import Prediction
from megapilot.spec.training import PRECISIONS, Precision, TrainingSpec
from megapilot.spec.validate import (
    flex_backend_refusal,
    flex_dispatcher_refusal,
    moe_a2a_overlap_refusal,
    validate_layout,
)

__all__ = [
    "ARCH_PRECISIONS",
    "LAYOUT_FIELDS",
    "PRECISIONS",
    "ClusterSpec",
    "EstimateResult",
    "FlexDispatcher",
    "GPUSpec",
    "LayoutPins",
    "MLASpec",
    "MemoryGiB",
    "MoESpec",
    "ModelSpec",
    "ParallelConfig",
    "ParamCounts",
    "Precision",
    "Prediction",
    "SavedPlan",
    "TrainingSpec",
    "default_gpus_per_node",
    "flex_backend_refusal",
    "flex_dispatcher_refusal",
    "moe_a2a_overlap_refusal",
    "validate_layout",
]
