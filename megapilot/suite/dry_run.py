"""`megapilot suite run --dry-run`: every stage in order and the exact launch of each job (the smoke job, the
checkpoint stage's, each combo's), running nothing.

The same rendering as a real run (`megapilot.suite.render.render_cell`, checked by the same flag checks
as `megapilot script`), so what the dry run prints is what the run would launch. Every script it shows is
written, with the files it reads, under `<out>/dry-run/<job>/` (the smoke job, the checkpoint stage's save and
resume jobs, and each combo; an sbatch script for SLURM), so `sbatch --test-only` or a reviewer can read exactly
what would be submitted. The checkpoint jobs are the stage's own (`megapilot.suite.render.checkpoint_jobs`); their
checkpoints go under `<out>/dry-run/checkpoints/` (created empty; the save script fills it, the resume script loads it).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from megapilot.suite.predicted import memory_warning
from megapilot.suite.render import checkpoint_cell, checkpoint_jobs, checkpoint_save_dir, render_cell
from megapilot.suite.secrets import MASK, is_secret_name
from megapilot.suite.stages import COMBO_STAGES, EARLY_STAGES

if TYPE_CHECKING:
    from megapilot.suite.cells import SweepCell
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.render import CellLaunch, CheckpointJob


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
    smoke: DryRunCombo | None = Field(
        default=None, description="The smoke stage's job, key 'smoke' (skipped says why it would not run; None: the "
                                  "stage is not selected).")
    checkpoint: list[DryRunCombo] = Field(
        default_factory=list, description="The checkpoint stage's save and resume jobs (empty: the stage would not "
                                          "run them).")
    folder: str = Field(default="", description="Where the scripts were written (<out>/dry-run).")
    scripts: list[str] = Field(default_factory=list, description="Every launch script written, in the order the "
                                                                  "run submits them: smoke, checkpoint, combos.")


def dry_run_plan(suite: LoadedSuite, *, out_dir: Path, only_stage: str | None = None,
                 only_combo: str | None = None) -> DryRunPlan:
    cells = [c for c in suite.cells if only_combo is None or c.key == only_combo]
    stages = [DryRunStage(name=name) for name in EARLY_STAGES if _selected(name, only_stage)]
    for cell in cells:
        stages += [DryRunStage(name=name, combo=cell.key) for name in COMBO_STAGES if _selected(name, only_stage)]
    stages += [DryRunStage(name="results"), DryRunStage(name="teardown")]
    combos = [_combo(suite, cell, out_dir) for cell in cells]
    smoke = _smoke(suite, out_dir) if _selected("smoke", only_stage) else None
    checkpoint = _checkpoint_jobs(suite, out_dir) if _selected("checkpoint", only_stage) else []
    scripts = [c.script for c in ([smoke] if smoke else []) + checkpoint + combos if c.script]
    return DryRunPlan(stages=stages, combos=combos, smoke=smoke, checkpoint=checkpoint,
                      folder=str(out_dir / DRY_RUN_DIR), scripts=scripts)


DRY_RUN_DIR = "dry-run"


def _smoke(suite: LoadedSuite, out_dir: Path) -> DryRunCombo:
    """The smoke stage's job, shown and written like a combo's (or why the stage would not run it)."""
    if not suite.config.smoke.enabled:
        return DryRunCombo(key=suite.smoke.key, backend=suite.backend, skipped="smoke.enabled is false",
                           nodes=suite.nodes, gpus_per_node=suite.gpus_per_node)
    return _combo(suite, suite.smoke, out_dir)


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
    if only_stage is None or name == "prepare":
        return True
    return name in COMBO_STAGES if only_stage in COMBO_STAGES else name == only_stage


def _checkpoint_jobs(suite: LoadedSuite, out_dir: Path) -> list[DryRunCombo]:
    """The checkpoint stage's save and resume jobs, rendered as the stage renders them (none when it is off)."""
    cell = checkpoint_cell(suite)
    if not suite.config.checkpoint.enforce or cell.skip_reason:
        return []
    save_dir = checkpoint_save_dir(suite, out_dir / DRY_RUN_DIR, DRY_RUN_DIR)
    if suite.capabilities.runs_here:  # the launch checks the save folder's parent and the folder to load: the save
        save_dir.mkdir(parents=True, exist_ok=True)  # job would fill it, so running the two scripts in order works
    jobs = checkpoint_jobs(suite, save_dir)
    return [_combo(suite, cell, out_dir, job=job) for job in jobs]


def _combo(suite: LoadedSuite, cell: SweepCell, out_dir: Path, job: CheckpointJob | None = None) -> DryRunCombo:
    """A sweep cell's launch, or (with `job`) one of the checkpoint stage's jobs of that cell."""
    key, backend = cell.key if job is None else job.directory, suite.backend
    if cell.skip_reason:
        return DryRunCombo(key=key, backend=backend, skipped=cell.skip_reason, nodes=suite.nodes,
                           gpus_per_node=suite.gpus_per_node)
    job_dir = out_dir / DRY_RUN_DIR / (cell.slug if job is None else job.directory)
    job_dir.mkdir(parents=True, exist_ok=True)
    if job is None:
        launch = render_cell(suite, cell, job_dir=job_dir)
    else:
        launch = render_cell(suite, cell, job_dir=job_dir, train_iters=job.train_iters, save_dir=job.save_dir,
                             save_interval=job.save_interval, load_dir=job.load_dir, load_step=job.load_step)
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
    named = set(suite.config.megapilot.secrets)  # a secret is shown as set, never its value
    return {k: MASK if is_secret_name(k, named) else str(v) for k, v in container.env.items()}


__all__ = ["DryRunCombo", "DryRunPlan", "DryRunStage", "dry_run_plan"]
