"""Catalogs: GPU specs, model presets and Hugging Face config import."""

from megapilot.catalog.gpus import get_gpu, load_gpus

__all__ = ["get_gpu", "load_gpus"]
