"""What an sbatch script asks SLURM for follows what runs: CPU ranks ask for CPUs and memory, GPUs ask the way
the cluster takes them; --exclusive and more #SBATCH lines are settings."""

from __future__ import annotations

import sys

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, render_launch
from tests.launch.plans import tiny_two_rank_plan


def _sbatch(**options: object) -> list[str]:
    fields: dict[str, object] = dict(launcher="slurm", entrypoint="megapilot", mock_data=True, python=sys.executable,
                                     log_dir="/jobs/x", job_name="mp-smoke", check_paths_exist=False)
    fields.update(options)
    script = render_launch(tiny_two_rank_plan(train_iters=4), LaunchOptions(**fields)).script  # type: ignore[arg-type]
    return script.splitlines()


def test_a_cpu_launch_asks_for_cpus_and_memory_never_gpus() -> None:
    lines = _sbatch(cpu=True, exclusive=False, cpu_memory_gib=2.3)
    assert "#SBATCH --cpus-per-task=2" in lines and "#SBATCH --mem=3G" in lines
    assert not [line for line in lines if "gpu" in line.lower() and line.startswith("#SBATCH")]
    assert "#SBATCH --exclusive" not in lines
    # the header says what runs, not the stand-in GPU a CPU plan carries
    assert "# SLURM sbatch launch: tiny on 1 node(s) x 2 CPU ranks" in lines


@pytest.mark.parametrize(("request_kind", "line"), [("gpus-per-node", "#SBATCH --gpus-per-node=2"),
                                                    ("gres", "#SBATCH --gres=gpu:2")])
def test_a_gpu_launch_asks_the_way_the_cluster_takes_gpus(request_kind: str, line: str) -> None:
    lines = _sbatch(gpu_request=request_kind)
    assert line in lines and "#SBATCH --exclusive" in lines
    assert sum("gpu" in x for x in lines if x.startswith("#SBATCH")) == 1


def test_exclusive_is_a_setting_and_free_form_options_become_sbatch_lines() -> None:
    lines = _sbatch(exclusive=False, sbatch_options=("--qos=high", "--reservation=r1", "--constraint=a100&nvlink"))
    assert "#SBATCH --exclusive" not in lines
    added = [x for x in lines if x.startswith(("#SBATCH --qos", "#SBATCH --reservation", "#SBATCH --constraint"))]
    assert added == ["#SBATCH --qos=high", "#SBATCH --reservation=r1", "#SBATCH --constraint=a100&nvlink"]


@pytest.mark.parametrize("option", ["qos=high", "--qos=high --exclusive", "--comment='x y'", "--qos=$(id)"])
def test_an_option_sbatch_would_misread_is_refused(option: str) -> None:
    with pytest.raises(MegapilotError) as caught:
        _sbatch(sbatch_options=(option,))
    assert caught.value.field == "sbatch_options"
