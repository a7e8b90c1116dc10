"""`megapilot suite run --dry-run`: every stage in order and each combo's exact launch, running nothing.

The same rendering as a real run (`megapilot.suite.render.render_cell`, checked by the same flag checks
as `megapilot script`), so what the dry run prints is what the run would launch. Every script it shows is
written, with the files it reads, under `<out>/dry-run/<job>/` (the smoke job and each combo; an sbatch
script for SLURM), so `sbatch --test-only` or a reviewer can read exactly what would be submitted.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from megapilot.suite.cells import SweepCell
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.render import CellLaunch


class DryRunStage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    combo: str | None = None


class DryRunCombo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    backend: str
    skipped: str | None = Field(description="Why this combo would not run; None when it would.")
    nodes: int
    gpus_per_node: int
    megatron_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="Variables the launch sets (no secrets).")
    command: str = ""
    script: str | None = Field(default=None, description="Where the launch script was written.")
    memory_warning: str | None = Field(
        default=None, description="WARN line when the predicted memory exceeds the GPU's (the combo still runs).")


class DryRunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stages: list[DryRunStage]
    combos: list[DryRunCombo]
    folder: str = Field(default="", description="Where the scripts were written (<out>/dry-run).")
    scripts: list[str] = Field(default_factory=list, description="Every launch script written, smoke first.")


def dry_run_plan(suite: LoadedSuite, *, out_dir: Path, only_stage: str | None = None,
                 only_combo: str | None = None) -> DryRunPlan:
    from megapilot.suite.lifecycle import COMBO_STAGES, EARLY_STAGES

    cells = [c for c in suite.cells if only_combo is None or c.key == only_combo]
    stages = [DryRunStage(name=name) for name in EARLY_STAGES if _selected(name, only_stage)]
    for cell in cells:
        stages += [DryRunStage(name=name, combo=cell.key) for name in COMBO_STAGES if _selected(name, only_stage)]
    stages += [DryRunStage(name="results"), DryRunStage(name="teardown")]
    combos = [_combo(suite, cell, out_dir) for cell in cells]
    smoke = _smoke_script(suite, out_dir) if _selected("smoke", only_stage) else None
    scripts = ([smoke] if smoke else []) + [c.script for c in combos if c.script]
    return DryRunPlan(stages=stages, combos=combos, folder=str(out_dir / DRY_RUN_DIR), scripts=scripts)


DRY_RUN_DIR = "dry-run"


def _smoke_script(suite: LoadedSuite, out_dir: Path) -> str | None:
    from megapilot.suite.render import render_cell

    if not suite.config.smoke.enabled or suite.smoke.skip_reason:
        return None
    job_dir = out_dir / DRY_RUN_DIR / "smoke"
    job_dir.mkdir(parents=True, exist_ok=True)
    launch = render_cell(suite, suite.smoke, job_dir=job_dir)
    return _write(launch, job_dir) if launch.runnable else None


def _write(launch: CellLaunch, job_dir: Path) -> str:
    """The launch script (and the files it reads) where the dry run says it is."""
    script = job_dir / "launch.sh"
    script.write_text(launch.script_text, encoding="utf-8")
    script.chmod(0o755)
    for path, text in launch.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    return str(script)


def _selected(name: str, only_stage: str | None) -> bool:
    from megapilot.suite.lifecycle import COMBO_STAGES

    if only_stage is None or name == "prepare":
        return True
    return name in COMBO_STAGES if only_stage in COMBO_STAGES else name == only_stage


def _combo(suite: LoadedSuite, cell: SweepCell, out_dir: Path) -> DryRunCombo:
    from megapilot.suite.predicted import memory_warning
    from megapilot.suite.render import render_cell

    key, backend = cell.key, suite.backend
    if cell.skip_reason:
        return DryRunCombo(key=key, backend=backend, skipped=cell.skip_reason, nodes=suite.nodes,
                           gpus_per_node=suite.gpus_per_node)
    job_dir = out_dir / DRY_RUN_DIR / cell.slug
    job_dir.mkdir(parents=True, exist_ok=True)
    launch = render_cell(suite, cell, job_dir=job_dir)
    if launch.error:
        return DryRunCombo(key=key, backend=backend, skipped=f"cannot render: {launch.error}", nodes=suite.nodes,
                           gpus_per_node=suite.gpus_per_node)
    env = {**_container_env(suite), **launch.env}
    return DryRunCombo(key=key, backend=launch.backend, skipped=launch.skipped, nodes=launch.nodes,
                       gpus_per_node=launch.gpus_per_node, megatron_args=launch.megatron_args, env=env,
                       command=launch.command or shlex.join(launch.megatron_args),
                       script=_write(launch, job_dir) if launch.runnable else None,
                       memory_warning=memory_warning(key, launch.plan, suite.gpu))


def _container_env(suite: LoadedSuite) -> dict[str, str]:
    container = suite.config.container
    if container is None:
        return {}
    from megapilot.suite.secrets import MASK, is_secret_name

    named = set(suite.config.megapilot.secrets)  # a secret is shown as set, never its value
    return {k: MASK if is_secret_name(k, named) else str(v) for k, v in container.env.items()}


__all__ = ["DryRunCombo", "DryRunPlan", "DryRunStage", "dry_run_plan"]
