"""Rendered sbatch scripts against a real SLURM controller.

`sbatch --test-only` on a two-node cluster with 8 GPUs per node (tests/slurm_cluster.py): a 2-node x
8-GPU script must be accepted and a 3-node one refused (EnforcePartLimits=ALL) — the refusal shows
that the acceptance is a real verdict. Then a rendered script really runs: tiny model, embedded
trainer on CPU, through sbatch -> srun -> torchrun with the c10d rendezvous on the first node.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, MIXTRAL_8X7B, make_plan, tiny_two_rank_plan

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
def test_two_node_script_is_accepted_by_sbatch_test_only(slurm_cluster, tmp_path: Path, model) -> None:
    # Megatron-Core refuses MoE with TP>1 and EP>1 unless sequence parallelism is on
    layout = {"tp": 2, "ep": 4, "etp": 1, "sequence_parallel": True} if model.moe else {"tp": 4, "pp": 2}
    script = _sbatch_script(tmp_path, nodes=2, model=model, **layout)
    result = slurm_cluster.run("sbatch", "--test-only", str(script))
    assert result.returncode == 0, result.stderr + slurm_cluster.log_tail()
    assert "to start at" in result.stderr and "node[1-2]" in result.stderr


def test_script_needing_more_nodes_than_exist_is_refused(slurm_cluster, tmp_path: Path) -> None:
    script = _sbatch_script(tmp_path, nodes=3, tp=8)
    result = slurm_cluster.run("sbatch", "--test-only", str(script))
    assert result.returncode != 0
    assert "node" in result.stderr.lower()


def test_rendered_sbatch_script_really_trains_through_slurm(slurm_host_node, tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    plan = tiny_two_rank_plan(train_iters=2)
    checkpoints = tmp_path / "ckpt $dir"
    options = LaunchOptions(
        launcher="slurm", mock_data=True, entrypoint="megapilot", cpu=True, python=sys.executable,
        save=str(checkpoints), log_dir=str(tmp_path), job_name="mp-tiny", time_limit="00:10:00",
        master_port=29613,
    )
    script = tmp_path / "tiny.sbatch"
    script.write_text(render_launch(plan, options).script)
    job_id = slurm_host_node.submit(script, f"--chdir={tmp_path}")
    state = slurm_host_node.wait(job_id, timeout_s=420)
    output = (tmp_path / f"mp-tiny-{job_id}.out").read_text()
    assert state == "COMPLETED", output[-3000:] + slurm_host_node.log_tail()
    iterations = re.findall(r"iteration\s+(\d+)/\s*(\d+) \|", output)
    assert iterations[-1] == ("2", "2")
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
