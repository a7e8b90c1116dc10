"""The collectives probe's launch scripts: torchrun or sbatch around the torch probe or nccl-tests, valid bash."""

from __future__ import annotations

import subprocess

import pytest

from megapilot.launch.options import LaunchOptions
from megapilot.launch.probe import ProbeSweep, probe_argv, render_probe_script

SWEEP = ProbeSweep(("all_reduce", "alltoall"), 1024, 2**20, 10)


@pytest.mark.parametrize(("launcher", "nodes", "nccl_tests", "expected"), [
    ("torchrun", 1, False, "--standalone"),
    ("torchrun", 2, False, 'NODE_RANK:?'),
    ("torchrun", 1, True, "alltoall_perf -b 1024 -e 1048576 -f 2 -g 8"),
    ("slurm", 2, False, "--rdzv-backend c10d"),
    ("slurm", 2, True, "sendrecv_perf"),
])
def test_the_probe_scripts_are_valid_bash(tmp_path, launcher, nodes, nccl_tests, expected):
    options = LaunchOptions(launcher=launcher, python="/usr/bin/python3", master_port=29999,
                            job_name="mp-collectives", log_dir=str(tmp_path), time_limit="00:10:00")
    script = render_probe_script(options, nodes, 8, SWEEP, nccl_tests=nccl_tests)
    assert expected in script
    assert ("megapilot.trainer.collectives" in script) is not nccl_tests
    assert ("#SBATCH --nodes=2" in script) is (launcher == "slurm")
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stderr


def test_the_probe_argv_carries_the_sweep():
    assert probe_argv(SWEEP) == ["-m", "megapilot.trainer.collectives", "--collectives", "all_reduce,alltoall",
                                 "-b", "1024", "-e", "1048576", "-f", "2", "-n", "10", "-w", "5"]
