"""Catalogs: GPU specs, model presets and Hugging Face config import."""

from megapilot.catalog.gpus import get_gpu, load_gpus
from megapilot.catalog.hf import SUPPORTED_ARCHITECTURES, from_hf_config, load_hf_config
from megapilot.catalog.models import (
    ModelPreset,
    ResolvedModel,
    get_model,
    get_preset,
    list_models,
    load_presets,
    preset_by_unique_prefix,
    preset_of_hub_repo,
    resolve_model,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ModelPreset",
    "ResolvedModel",
    "from_hf_config",
    "get_gpu",
    "get_model",
    "get_preset",
    "list_models",
    "load_gpus",
    "load_hf_config",
    "load_presets",
    "preset_by_unique_prefix",
    "preset_of_hub_repo",
    "resolve_model",
]
