"""The README's "Run on your cluster" commands, run as written against a real SLURM cluster that declares no
GPUs and a real sshd on loopback (two node addresses, a non-default port, key authentication).

Only the values the README asks the user to set for their own nodes (NODES, SSH_USER, SSH_PORT, SSH_KEY,
SSH_OPTION) come from the test; every command is the README's, verbatim.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"

pytestmark = pytest.mark.slow


def cluster_blocks() -> list[str]:
    """The ```bash blocks of the `## Run on your cluster` section: SLURM's, then SSH's."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Run on your cluster"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)


def _run(block: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)  # `megapilot` as the user's installation has it
    env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "MEGAPILOT_HISTORY": str(cwd / "history.sqlite")}
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=1500, check=False)


def _only_run(cwd: Path) -> Path:
    [run_dir] = [p for p in (cwd / "runs" / "suite").iterdir() if (p / "suite.json").is_file()]
    return run_dir


def test_the_section_has_a_slurm_and_an_ssh_block() -> None:
    slurm, ssh = cluster_blocks()
    assert "--executor slurm" in slurm and "--dry-run" in slurm and "suite run slurm-suite/suite.json\n" in slurm
    assert "--executor ssh" in ssh and "--cluster ssh-suite/cluster.json" in ssh


def test_the_slurm_commands_run_on_a_cluster_without_gpus(slurm_cpu_node, tmp_path: Path) -> None:
    slurm, _ = cluster_blocks()
    done = _run(slurm, tmp_path, slurm_cpu_node.env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dry = tmp_path / "runs" / "suite" / "dry-run"
    assert sorted(p.parent.name for p in dry.glob("*/launch.sh")) == [
        "MBS1_GBS8_BF16", "MBS2_GBS8_BF16", "checkpoint-resume", "checkpoint-save", "smoke"]
    assert str(dry) in done.stdout  # the dry run names the folder it wrote
    run_dir = _only_run(tmp_path)
    result = json.loads((run_dir / "suite.json").read_text())
    assert result["verdict"] == "PASS", result.get("reason")
    for job in ("smoke", "checkpoint-save", "checkpoint-resume", "MBS1_GBS8_BF16", "MBS2_GBS8_BF16"):
        script = (run_dir / job / "launch.sh").read_text()
        assert f"#SBATCH --job-name=mp-{job}\n" in script
        assert "#SBATCH --cpus-per-task=2\n" in script and "#SBATCH --mem=" in script
        assert "gpus-per-node" not in script and "--gres" not in script and "--exclusive" not in script
        assert "on 1 node(s) x 2 CPU ranks\n" in script
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    rows = {r["name"]: r for r in preflight["checks"]}
    # the interpreter `megapilot` runs under (the installation's), with what the jobs import
    python = rows["python"]["reason"]
    assert rows["python"]["verdict"] == "PASS" and ".venv/bin/python" in python
    assert "torch 2" in python and "megatron.core 0" in python
    assert rows["scheduler.submission"]["verdict"] == "PASS"
    for combo in result["combos"]:
        assert combo["job"]["executor"] == "slurm" and combo["job"]["job_id"].isdigit()
        left = next(m for m in combo["metrics"] if m["name"] == "gate.processes_left")
        assert "stopped" not in left["reason"] and "no SLURM job left in the queue" in left["reason"]
    assert (run_dir / "report.html").is_file()


def test_the_ssh_commands_run_against_two_loopback_nodes(loopback_sshd, tmp_path: Path) -> None:
    _, ssh = cluster_blocks()
    node = loopback_sshd.nodes(1)[0]
    env = {**os.environ, "NODES": "127.0.0.1,127.0.0.2", "SSH_USER": node.user or "root",
           "SSH_PORT": str(loopback_sshd.port), "SSH_KEY": str(loopback_sshd.client_key),
           "SSH_OPTION": f"UserKnownHostsFile={loopback_sshd.known_hosts}"}
    done = _run(ssh, tmp_path, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((_only_run(tmp_path) / "suite.json").read_text())
    assert result["verdict"] == "PASS", result.get("reason")
    for combo in result["combos"]:
        assert combo["job"]["executor"] == "ssh" and len(combo["job"]["logs"]) == 2
    teardown = next(s for s in result["stages"] if s["name"] == "teardown")
    assert "checked over a new ssh connection" in json.dumps(teardown)
