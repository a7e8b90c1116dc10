"""End to end: a real two-node run of the embedded trainer loses a rank to SIGKILL; `megapilot diagnose` on the
run directory names the killed rank first and tells the other node's errors as its consequences.

Two torchrun agents (`--nnodes 2`, one rank each, static rendezvous on 127.0.0.1) stand for two nodes, each
writing its own `out-node<i>/training.log`, as the executors lay a run directory out. Rank 1 (node 1) is killed
once training prints iteration 3; rank 0 then fails in its next gloo collective ("Connection reset by peer") and
both launchers print their failure summaries.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("megatron.core")

from megapilot.execute.process import free_port
from megapilot.trainer.corpus import default_dataset_prefix
from tests.e2e.process_tree import started_tree

pytestmark = pytest.mark.slow

TINY_GPT = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2", "--lr", "3e-3",
            "--train-iters", "100000", "--eval-iters", "0", "--log-interval", "1"]


def _node_argv(node_rank: int, port: int, prefix: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "-m", "megapilot.trainer", *TINY_GPT, "--data-path", prefix]


def _trainer_of(launcher_pid: int, rank: int) -> int | None:
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "megapilot.trainer" in " ".join(child.cmdline()) and child.environ().get("RANK") == str(rank):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _run_two_nodes_and_kill_rank_one(run_dir: Path) -> None:
    prefix = default_dataset_prefix(run_dir / "corpus")
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    logs = [run_dir / f"out-node{node}" / "training.log" for node in (0, 1)]
    for log in logs:
        log.parent.mkdir(parents=True)
    with started_tree(_node_argv(0, port, prefix), log_path=logs[0], cwd=run_dir, env=env) as node0, \
            started_tree(_node_argv(1, port, prefix), log_path=logs[1], cwd=run_dir, env=env) as node1:
        deadline = time.monotonic() + 90
        while not any("iteration        3/" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, logs[0].read_text()[-2000:]
            assert node0.poll() is None and node1.poll() is None, logs[1].read_text()[-2000:]
            time.sleep(0.2)
        pid = _trainer_of(node1.pid, rank=1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for node in (node0, node1):
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass  # stopped by started_tree; the diagnosis below still reads what was written


def test_diagnose_names_the_killed_rank_first_and_the_other_node_as_consequence(cli, tmp_path: Path):
    _run_two_nodes_and_kill_rank_one(tmp_path)

    result = cli("diagnose", str(tmp_path), "--json")

    assert result.exit_code == 0, result.stderr
    payload = result.json()
    assert payload["files"] == [str(tmp_path / "out-node0" / "training.log"),
                                str(tmp_path / "out-node1" / "training.log")]
    first = payload["findings"][0]
    assert first["severity"] == "critical" and first["title"].startswith("First failure: rank 1 killed by SIGKILL")
    assert first["evidence"][0]["file"].endswith("out-node1/training.log")
    story = payload["story"]
    assert story[0].startswith("first failure: rank 1 killed by SIGKILL") and "out-node1/training.log" in story[0]
    assert any(line.startswith("then: rank 0") and "out-node0/training.log" in line for line in story[1:]), story
    assert "consequences" in first["cause"] and "rank 0" in first["cause"]
