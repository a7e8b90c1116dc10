"""Helpers for tests that start from the real CVS configs in tests/data/cvs (copied into tmp_path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CVS_DIR = Path(__file__).resolve().parents[1] / "data" / "cvs"
SINGLE_8B = "mi3xx_megatron_llama-3.1-8b_single.json"
DISTRIBUTED_70B = "mi3xx_megatron_llama-3.3-70b_distributed.json"
THRESHOLDS = {SINGLE_8B: "mi325x_megatron_llama-3.1-8b_single_threshold.json",
              DISTRIBUTED_70B: "mi325x_megatron_llama-3.3-70b_distributed_threshold.json"}


def raw_cvs(name: str) -> dict:
    return json.loads((CVS_DIR / name).read_text())


def filled_in(raw: dict, *, gpu: str = "MI325X", threshold: str = "t_threshold.json") -> dict:
    """What an operator does to a CVS template: every `<changeme>` replaced with a real value."""
    raw["gpu_name"] = gpu
    raw["threshold_json"] = threshold
    raw["container"]["image"] = "rocm/megatron-lm:v25.9"
    raw["train_params"]["training_iterations"] = "20"
    raw["container"]["env"] = {k: v.replace(" <changeme>", "").replace("<changeme>", "10.0.0.1")
                               for k, v in raw["container"]["env"].items()}
    return raw


def write_suite(tmp_path: Path, raw: dict, name: str, *, config_name: str = "suite.json") -> Path:
    """The config and its CVS threshold file (as `t_threshold.json`) in tmp_path; returns the config path."""
    shutil.copyfile(CVS_DIR / THRESHOLDS[name], tmp_path / "t_threshold.json")
    path = tmp_path / config_name
    path.write_text(json.dumps(raw))
    return path
