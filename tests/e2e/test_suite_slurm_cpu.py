"""The packaged suite through SLURM on a cluster that declares no GPUs, as a cluster engineer would run it.

A real one-node SLURM cluster (tests/slurm_cluster.py, `gpus_per_node=0`: no gres at all, this machine's
CPUs and memory): the tiny-local template with nothing changed but `executor: slurm` passes every stage,
and every job asks SLURM for CPUs and memory, is named after its stage, and runs this interpreter. A GPU
suite on the same cluster, and a job sbatch refuses, each fail preflight with SLURM's words and the fix,
exit 1, and the report is still written.
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


def test_tiny_local_passes_through_slurm_on_a_cluster_without_gpus(slurm_cpu_node, tmp_path: Path) -> None:
    env = _env(slurm_cpu_node)
    config = _suite(tmp_path, env, lambda data: data["megapilot"].update(executor="slurm"))
    done = _megapilot("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--json", "--no-history",
                      env=env)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    result = json.loads(done.stdout)
    run_dir = Path(result["run_dir"])
    preflight = _rows(result, "preflight")
    assert preflight["python"]["verdict"] == "PASS" and sys.executable in preflight["python"]["reason"]
    assert "torch" in preflight["python"]["reason"] and "megatron.core" in preflight["python"]["reason"]
    assert preflight["scheduler.submission"]["verdict"] == "PASS"
    for job in ("smoke", "checkpoint-save", "checkpoint-resume", *(c["directory"] for c in result["combos"])):
        script = (run_dir / job / "launch.sh").read_text()
        assert f"#SBATCH --job-name=mp-{job}\n" in script
        assert "#SBATCH --cpus-per-task=2\n" in script and "#SBATCH --mem=" in script
        assert "gpus-per-node" not in script and "--gres" not in script and "--exclusive" not in script
        assert "on 1 node(s) x 2 CPU ranks\n" in script
        assert sys.executable in script
    for combo in result["combos"]:
        assert combo["job"]["executor"] == "slurm" and combo["job"]["job_id"].isdigit()
        assert combo["verdict"] == "PASS", combo["reason"]
        left = {r["name"]: r for r in combo["metrics"]}["gate.processes_left"]
        assert "stopped" not in left["reason"] and "no SLURM job left in the queue" in left["reason"]


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
    assert row["verdict"] == "FAIL" and "sbatch: error:" in row["reason"], row
    assert "megapilot.sbatch_options" in row["reason"]
    assert (Path(result["run_dir"]) / "report.html").is_file()
    queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=False)
    assert queue.stdout.strip() == ""
