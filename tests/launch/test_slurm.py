"""launch.slurm: the #SBATCH lines a job asks with, and the srun line that starts one torchrun per node."""

from __future__ import annotations

import sys

import pytest

from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.slurm import sbatch_directives
from tests.launch.plans import tiny_two_rank_plan


def _options(**fields: object) -> LaunchOptions:
    base: dict[str, object] = dict(launcher="slurm", entrypoint="megapilot", mock_data=True, python=sys.executable,
                                   log_dir="/jobs/x", job_name="mp-smoke", check_paths_exist=False)
    return LaunchOptions(**(base | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(("request_kind", "line"), [("gpus-per-node", "#SBATCH --gpus-per-node=8"),
                                                    ("gres", "#SBATCH --gres=gpu:8")])
def test_gpus_are_asked_the_way_the_cluster_takes_them(request_kind, line):
    lines = sbatch_directives(2, 8, _options(gpu_request=request_kind), "/logs")
    assert lines[:3] == ["#SBATCH --job-name=mp-smoke", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"]
    assert lines[3] == line and "#SBATCH --exclusive" in lines


def test_cpu_ranks_ask_for_cpus_and_whole_gibibytes_never_gpus():
    lines = sbatch_directives(1, 4, _options(cpu=True, cpu_memory_gib=2.2, exclusive=False), "/logs")
    assert "#SBATCH --cpus-per-task=4" in lines and "#SBATCH --mem=3G" in lines
    assert not any("gpu" in line or "gres" in line or "exclusive" in line for line in lines)


def test_placement_and_extra_options_come_last_in_order():
    lines = sbatch_directives(1, 8, _options(partition="gpu", account="proj7", time_limit="01:00:00",
                                             sbatch_options=("--qos=high", "--constraint=a100")), "/logs")
    assert lines[-6:] == ["#SBATCH --time=01:00:00", "#SBATCH --output=/logs/%x-%j.out", "#SBATCH --partition=gpu",
                          "#SBATCH --account=proj7", "#SBATCH --qos=high", "#SBATCH --constraint=a100"]


def test_the_script_puts_every_directive_before_the_first_command_and_srun_last():
    script = render_launch(tiny_two_rank_plan(train_iters=4), _options(
        container_image="nvcr.io/nvidia/pytorch:25.01-py3", container_mounts=("/data:/data",))).script
    lines = script.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    assert lines[0].startswith("#!") and all(not line.startswith("#SBATCH") for line in lines[first_command:])
    assert lines[-1].startswith('srun "${SRUN_ARGS[@]}" ') and '"${TORCHRUN_ARGS[@]}"' in lines[-1]
    srun = script[script.index("SRUN_ARGS=("):]
    assert "--kill-on-bad-exit=1" in srun and "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in srun
    assert "--container-mounts=/data:/data" in srun
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
