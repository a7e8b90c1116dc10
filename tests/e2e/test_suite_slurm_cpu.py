"""What SLURM refuses, on a cluster that declares no GPUs, is a preflight FAIL in SLURM's words.

A real one-node SLURM cluster (tests/slurm_cluster.py, `gpus_per_node=0`: no gres at all, this machine's
CPUs and memory). A GPU suite on it, and a job sbatch refuses (a constraint no node has), each fail
preflight with SLURM's words and the setting to change, exit 1 (not 2: the config is valid), and the report
is still written. (The tiny-local suite passing on this cluster is tests/e2e/test_readme_cluster.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _megapilot(*args: str, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def _suite(tmp_path: Path, env: dict[str, str], change) -> Path:
    config = tmp_path / "suite" / "suite.json"
    done = _megapilot("suite", "init", "tiny-local", "-o", str(config), env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(config.read_text())
    change(data)
    config.write_text(json.dumps(data, indent=2))
    return config


def _rows(result: dict, stage: str) -> dict[str, dict]:
    found = next(s for s in result["stages"] if s["name"] == stage)
    return {row["name"]: row for row in found["rows"]}


def _env(cluster) -> dict[str, str]:
    return {**cluster.env, "OMP_NUM_THREADS": "1"}


def test_a_gpu_suite_and_a_refused_job_fail_preflight_with_slurms_words(slurm_cpu_node, tmp_path: Path) -> None:
    env = _env(slurm_cpu_node)

    def gpu_suite(data: dict) -> None:
        data.update(gpu_name="H100")
        data["megapilot"].update(executor="slurm", device="gpu", gpus_per_node=1)

    done = _megapilot("suite", "run", str(_suite(tmp_path / "gpu", env, gpu_suite)), "--out",
                      str(tmp_path / "gpu" / "runs"), "--json", "--no-history", env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout)
    row = _rows(result, "preflight")["scheduler.resources"]
    assert row["verdict"] == "FAIL" and "declares no GPUs" in row["reason"] and "gpu_name CPU" in row["reason"]
    assert (Path(result["run_dir"]) / "report.html").is_file()

    def constrained(data: dict) -> None:
        data["megapilot"].update(executor="slurm", sbatch_options=["--constraint=nvlink"])

    done = _megapilot("suite", "run", str(_suite(tmp_path / "refused", env, constrained)), "--out",
                      str(tmp_path / "refused" / "runs"), "--json", "--no-history", env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout)
    row = _rows(result, "preflight")["scheduler.submission"]
    assert row["verdict"] == "FAIL", row
    assert "sbatch --test-only said: allocation failure: Invalid feature specification" in row["reason"]
    assert "megapilot.sbatch_options" in row["reason"]
    assert (Path(result["run_dir"]) / "report.html").is_file()
    queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=False)
    assert queue.stdout.strip() == ""


def test_a_drained_node_fails_preflight_at_once_and_leaves_nothing_queued(slurm_cpu_node, tmp_path: Path) -> None:
    """The probes would wait in the queue for the drained node (up to their timeout, then leave a pending job):
    the scheduler check comes first, names the node and the fix, and the probes are not run."""
    env = _env(slurm_cpu_node)
    node = slurm_cpu_node.node_names[0]
    config = _suite(tmp_path, env, lambda data: data["megapilot"].update(executor="slurm"))
    slurm_cpu_node.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=bad dimm", check=True)
    try:
        done = _megapilot("suite", "run", str(config), "--stage", "preflight", "--out", str(tmp_path / "runs"),
                          "--json", "--no-history", env=env, timeout=120)
        queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=False)
    finally:
        slurm_cpu_node.run("scontrol", "update", f"nodename={node}", "state=resume", check=True)
    assert done.returncode == 1, done.stderr[-3000:]
    rows = _rows(json.loads(done.stdout), "preflight")
    reason = rows["scheduler.submission"]["reason"]
    assert f"partition main has 0 of the 1 node(s) a job needs in service: {node} drained (bad dimm)" in reason
    assert "scontrol update nodename=<node> state=resume" in reason
    assert rows["probe"]["verdict"] == "SKIPPED"
    assert queue.stdout.strip() == ""
