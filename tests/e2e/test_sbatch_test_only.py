"""Rendered sbatch scripts against a real SLURM controller: `sbatch --test-only` accepts what fits.

The cluster (tests/slurm_cluster.py) has two nodes with 8 GPUs each, so a 2-node x 8-GPU script
must be accepted and a 3-node one refused (EnforcePartLimits=ALL) — the refusal shows that the
acceptance is a real verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, MIXTRAL_8X7B, make_plan
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def _sbatch_script(tmp_path: Path, nodes: int, model=LLAMA31_8B, **layout: object) -> Path:
    plan = make_plan(model, "h100", nodes, TrainingSpec(seq_length=4096, global_batch_size=64 * nodes), **layout)
    options = LaunchOptions(
        launcher="slurm", mock_data=True, megatron_path="/opt/Megatron-LM", save=str(tmp_path / "ckpt dir"),
        log_dir=str(tmp_path), job_name=f"mp-test-{nodes}", time_limit="00:10:00", partition="main",
    )
    path = tmp_path / f"train-{nodes}.sbatch"
    path.write_text(render_launch(plan, options).script)
    return path


@pytest.mark.parametrize("model", [LLAMA31_8B, MIXTRAL_8X7B], ids=["dense", "moe"])
def test_two_node_script_is_accepted_by_sbatch_test_only(slurm_cluster, tmp_path: Path, model) -> None:  # noqa: F811
    layout = {"tp": 2, "ep": 4, "etp": 1} if model.moe else {"tp": 4, "pp": 2}
    script = _sbatch_script(tmp_path, nodes=2, model=model, **layout)
    result = slurm_cluster.run("sbatch", "--test-only", str(script))
    assert result.returncode == 0, result.stderr + slurm_cluster.log_tail()
    assert "to start at" in result.stderr and "node[1-2]" in result.stderr


def test_script_needing_more_nodes_than_exist_is_refused(slurm_cluster, tmp_path: Path) -> None:  # noqa: F811
    script = _sbatch_script(tmp_path, nodes=3, tp=8)
    result = slurm_cluster.run("sbatch", "--test-only", str(script))
    assert result.returncode != 0
    assert "node" in result.stderr.lower()
