"""Suite templates: CVS-schema Megatron configs (with `<changeme>` where CVS has them) and their threshold
examples, plus `tiny-local`, a suite that really runs on CPUs with the embedded trainer.

Each template is `<name>.json` with its threshold files beside it: `<name>.<gpu>_threshold.json` (one per
GPU, example values marked uncalibrated) or, for tiny-local, `tiny-local_threshold.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from megapilot.errors import MegapilotError


@dataclass(frozen=True)
class SuiteTemplate:
    """One packaged template."""

    name: str
    description: str
    model: str
    gpu: str
    calibrated: bool = False


TEMPLATES: tuple[SuiteTemplate, ...] = (
    SuiteTemplate("llama3.1-8b-single", "Llama 3.1 8B on one node, BF16/FP8/MXFP8 cells", "llama3.1-8b",
                  "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("llama3.3-70b-distributed", "Llama 3.3 70B across nodes, TP8, BF16/FP8 cells", "llama3.3-70b",
                  "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("deepseek-v2-lite-single", "DeepSeek-V2-Lite (MoE, MLA) on one node, BF16/FP8 cells",
                  "deepseek-v2-lite", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("mixtral-8x7b-distributed", "Mixtral 8x7B (MoE) across nodes, TP8, BF16/FP8 cells",
                  "mixtral-8x7b", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("llama3.1-405b-distributed", "Llama 3.1 405B on 9 nodes, TP8 PP9, full recompute",
                  "llama3.1-405b", "H100, H200, B200, MI300X, MI325X, MI355X"),
    SuiteTemplate("tiny-local", "Tiny GPT on 2 CPU processes with the embedded trainer: runs anywhere", "tiny",
                  "CPU"),
)


def list_templates() -> list[SuiteTemplate]:
    """Every packaged template, in a fixed order."""
    return list(TEMPLATES)


def _folder() -> Path:
    return Path(str(resources.files("megapilot.suite.templates")))


def template_path(name: str) -> Path:
    """The packaged config file of template `name`."""
    known = {t.name for t in TEMPLATES}
    if name not in known:
        raise MegapilotError(f"no suite template {name!r}", field="template",
                             fix="use one of: " + ", ".join(t.name for t in TEMPLATES))
    return _folder() / f"{name}.json"


def threshold_paths(name: str) -> list[Path]:
    """The threshold files that come with template `name`."""
    template_path(name)
    return sorted(_folder().glob(f"{name}[._]*threshold.json"))


__all__ = ["TEMPLATES", "SuiteTemplate", "list_templates", "template_path", "threshold_paths"]
