"""The suite on "two nodes" for real: a SLURM cluster with two emulated nodes and a loopback sshd.

Each runs a 2-combo sweep of the tiny GPT trained across both nodes (one torchrun per node, one rank
each) through `megapilot suite run`; under SLURM a combo cancelled with `scancel` fails while the
other passes; over ssh, a path with spaces, quotes and `$(...)` reaches the jobs unharmed and unexecuted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CELLS = ("MBS=1,GBS=4,PRECISION=BF16", "MBS=2,GBS=4,PRECISION=BF16")


def _suite(directory: Path, executor: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "gpu_name": "CPU",
        "enforce_thresholds": False,
        "paths": {"hf_token_file": "hf_token", "log_dir": "logs", "scripts_dir": "scripts", "data_cache_dir": "cache"},
        "train_params": {"model_name": "tiny", "sequence_length": "128", "recompute": "0", "fsdp": "0",
                         "tensor_parallelism": "1", "pipeline_parallelism": "1", "training_iterations": "8"},
        "smoke": {"enabled": False},
        "loss_curve": {"sample_every": 2, "milestone_steps": [], "max_slope": 0.0, "enforce": True},
        "checkpoint": {"enforce": False},
        "sweep": {"combinations": {key: {} for key in CELLS}, "runs": list(CELLS)},
        "megapilot": {"model": "tiny", "executor": executor, "backend": "megapilot", "device": "cpu", "nodes": 2,
                      "gpus_per_node": 1, "startup_timeout_s": 240, "time_limit": "00:10:00",
                      "python": sys.executable},  # the nodes are this machine: same interpreter
    }
    path = directory / "suite.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _run(config: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--out", str(out),
                           "--json", "--no-history", *extra], capture_output=True, text=True, timeout=900, env=env,
                          check=False)


def _reasons(stdout: str) -> str:
    """What failed, for an assertion message."""
    try:
        result = json.loads(stdout)
    except ValueError:
        return stdout[-2000:]
    return "\n".join(f"{s['name']} {s['combo']}: {s['verdict']} {s['reason']}" for s in result["stages"]
                     if s["verdict"] == "FAIL")


def _check_two_node_training(combo: dict, run_dir: Path) -> None:
    assert combo["verdict"] == "PASS", combo["reason"]
    assert len(combo["job"]["logs"]) == 2  # one log per node
    logs = [(run_dir / log).read_text() for log in combo["job"]["logs"]]
    assert all("[default0]:" in log for log in logs)  # one rank on each node
    assert "iteration        8/       8" in "".join(logs)
    rows = {r["name"]: r for r in combo["metrics"]}
    assert rows["gate.loss_slope"]["verdict"] == "PASS"


def test_slurm_two_node_sweep_and_a_scancelled_combo(slurm_two_runnable_nodes, tmp_path):
    config = _suite(tmp_path / "suite", "slurm")
    env = {**slurm_two_runnable_nodes.env, "OMP_NUM_THREADS": "1"}
    done = _run(config, tmp_path / "runs", env)
    assert done.returncode == 0, done.stderr[-3000:] + _reasons(done.stdout)
    result = json.loads(done.stdout)
    run_dir = Path(result["run_dir"])
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    assert preflight["verdict"] == "PASS" and any(r["name"].startswith("node1.") for r in preflight["rows"])
    for combo in result["combos"]:
        assert combo["job"]["executor"] == "slurm" and combo["job"]["job_id"].isdigit()
        _check_two_node_training(combo, run_dir)

    # scancel the first combo's job from outside while it trains: it fails, the second still passes. The
    # first combo trains long enough this time (8 iterations can be over before anyone could scancel them).
    data = json.loads(config.read_text())
    data["sweep"]["combinations"][CELLS[0]] = {"training_iterations": "2000"}
    config.write_text(json.dumps(data, indent=2))
    stop = threading.Event()
    cancelled: list[str] = []

    def cancel_first_job() -> None:
        while not stop.is_set() and not cancelled:
            for record in (tmp_path / "runs2").glob("*/MBS1_GBS4_BF16/job.json"):
                job = json.loads(record.read_text())
                # the rank that prints iterations may sit on either node: SLURM decides which node is rank 0
                logs = record.parent.glob("out-node*/training.log")
                if job.get("job_id") and any(" iteration " in log.read_text(errors="replace") for log in logs):
                    subprocess.run(["scancel", job["job_id"]], env=env, check=False)
                    cancelled.append(job["job_id"])
            time.sleep(0.3)

    watcher = threading.Thread(target=cancel_first_job, daemon=True)
    watcher.start()
    try:
        done = _run(config, tmp_path / "runs2", env)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert cancelled and done.returncode == 1, done.stderr[-3000:]
    combos = {c["key"]: c for c in json.loads(done.stdout)["combos"]}
    first, second = combos[CELLS[0]], combos[CELLS[1]]
    assert first["verdict"] == "FAIL" and first["job"]["state"] == "CANCELLED", first["reason"]
    assert "cancelled" in first["reason"].lower()
    assert second["verdict"] == "PASS", second["reason"]
    queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=False)
    assert queue.stdout.strip() == ""  # nothing left in the queue


def test_ssh_two_node_sweep_with_a_hostile_path(loopback_sshd, tmp_path):
    hostile = tmp_path / "a b 'q' $(touch pwned) `touch pwned2`"
    config = _suite(hostile / "suite", "ssh")
    cluster_file = loopback_sshd.cluster_file(hostile / "cluster.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = _run(config, hostile / "runs", env, "--cluster", str(cluster_file))
    assert done.returncode == 0, done.stderr[-3000:] + _reasons(done.stdout)
    result = json.loads(done.stdout)
    run_dir = Path(result["run_dir"])
    assert str(run_dir).startswith(str(hostile))
    for combo in result["combos"]:
        assert combo["job"]["executor"] == "ssh"
        _check_two_node_training(combo, run_dir)
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    assert preflight["verdict"] == "PASS", preflight["reason"]
    for cwd in (Path.cwd(), tmp_path, hostile, Path.home(), Path("/root")):
        assert not (cwd / "pwned").exists() and not (cwd / "pwned2").exists()
