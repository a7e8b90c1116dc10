"""`megapilot suite run --dry-run`: every stage in order and each combo's exact launch, running nothing.

The same rendering as a real run (`megapilot.suite.render.render_cell`, checked by the same flag checks
as `megapilot script`), so what the dry run prints is what the run would launch.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from megapilot.suite.cells import SweepCell
    from megapilot.suite.config import LoadedSuite


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


class DryRunPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stages: list[DryRunStage]
    combos: list[DryRunCombo]


def dry_run_plan(suite: LoadedSuite, *, out_dir: Path, only_stage: str | None = None,
                 only_combo: str | None = None) -> DryRunPlan:
    from megapilot.suite.lifecycle import COMBO_STAGES, EARLY_STAGES

    cells = [c for c in suite.cells if only_combo is None or c.key == only_combo]
    stages = [DryRunStage(name=name) for name in EARLY_STAGES if _selected(name, only_stage)]
    for cell in cells:
        stages += [DryRunStage(name=name, combo=cell.key) for name in COMBO_STAGES if _selected(name, only_stage)]
    stages += [DryRunStage(name="results"), DryRunStage(name="teardown")]
    return DryRunPlan(stages=stages, combos=[_combo(suite, cell, out_dir) for cell in cells])


def _selected(name: str, only_stage: str | None) -> bool:
    from megapilot.suite.lifecycle import COMBO_STAGES

    if only_stage is None or name == "prepare":
        return True
    return name in COMBO_STAGES if only_stage in COMBO_STAGES else name == only_stage


def _combo(suite: LoadedSuite, cell: SweepCell, out_dir: Path) -> DryRunCombo:
    from megapilot.suite.render import render_cell

    key, backend = cell.key, suite.backend
    if cell.skip_reason:
        return DryRunCombo(key=key, backend=backend, skipped=cell.skip_reason, nodes=suite.nodes,
                           gpus_per_node=suite.gpus_per_node)
    # The launch checks the job directory exists (it holds the logs): it is rendered in a throwaway directory,
    # and the launch shown names where a run would put it, `<out>/<run-id>/<slug>`: a dry run writes nothing.
    would_be = str(out_dir / "<run-id>" / cell.slug)
    with tempfile.TemporaryDirectory(prefix="megapilot-dry-run-") as scratch:
        job_dir = Path(scratch) / cell.slug
        job_dir.mkdir()
        launch = render_cell(suite, cell, job_dir=job_dir)
        throwaway = str(job_dir.absolute())
    if launch.error:
        return DryRunCombo(key=key, backend=backend, skipped=f"cannot render: {launch.error}", nodes=suite.nodes,
                           gpus_per_node=suite.gpus_per_node)

    def shown(text: str) -> str:
        return text.replace(throwaway, would_be)

    env = {**_container_env(suite), **{name: shown(value) for name, value in launch.env.items()}}
    args = [shown(arg) for arg in launch.megatron_args]
    return DryRunCombo(key=key, backend=launch.backend, skipped=launch.skipped, nodes=launch.nodes,
                       gpus_per_node=launch.gpus_per_node, megatron_args=args, env=env,
                       command=shown(launch.command) if launch.command else shlex.join(args))


def _container_env(suite: LoadedSuite) -> dict[str, str]:
    container = suite.config.container
    if container is None:
        return {}
    from megapilot.suite.secrets import MASK, is_secret_name

    named = set(suite.config.megapilot.secrets)  # a secret is shown as set, never its value
    return {k: MASK if is_secret_name(k, named) else str(v) for k, v in container.env.items()}


__all__ = ["DryRunCombo", "DryRunPlan", "DryRunStage", "dry_run_plan"]
