"""A node with a GPU fault is found, listed and left out, over SSH for real: two "nodes" on a loopback sshd
(127.0.0.1 and 127.0.0.2), each job's PATH led by a named fake `dmesg` (tests/data/nodes/fake_dmesg_by_node.sh)
whose kernel log holds an Xid 79 on 127.0.0.2 only.

Run 1: preflight fails node 1's kernel row and no other, and the run writes 127.0.0.2 to `failing_nodes.txt`.
Run 2: `suite run --exclude-failing latest` re-forms the job on 127.0.0.1 alone, trains it, and says in its notes
(report and run deck) which node it left out and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from tests.e2e.test_suite_remote import _run as run_suite  # the suite CLI over a cluster, in JSON, no history

pytestmark = pytest.mark.slow

CELL = "MBS=1,GBS=4,PRECISION=BF16"
FAKE_DMESG = Path(__file__).resolve().parents[1] / "data" / "nodes" / "fake_dmesg_by_node.sh"
SICK, HEALTHY = "127.0.0.2", "127.0.0.1"


def _suite(directory: Path) -> Path:
    config = {
        "gpu_name": "CPU",
        "enforce_thresholds": False,
        "paths": {"hf_token_file": "hf_token", "log_dir": "logs", "scripts_dir": "scripts", "data_cache_dir": "cache"},
        "train_params": {"model_name": "tiny", "sequence_length": "128", "recompute": "0", "fsdp": "0",
                         "tensor_parallelism": "1", "pipeline_parallelism": "1", "training_iterations": "8"},
        "smoke": {"enabled": False},
        "checkpoint": {"enforce": False},
        "sweep": {"combinations": {CELL: {}}, "runs": [CELL]},
        # no megapilot.nodes: the job spans the cluster file's hosts, those left after an exclusion
        "megapilot": {"model": "tiny", "executor": "ssh", "backend": "megapilot", "device": "cpu",
                      "gpus_per_node": 1, "startup_timeout_s": 240, "python": sys.executable},
    }
    path = directory / "suite.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _cluster(directory: Path, sshd, fake_bin: Path) -> Path:
    # what the jobs (and so the preflight probe) run on every node: the fake dmesg first
    return sshd.cluster_file(directory / "cluster.json", (HEALTHY, SICK),
                             env_vars={"PATH": f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"})


def _run(config: Path, cluster: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--cluster",
                           str(cluster), "--out", str(out), "--json", "--no-history", *extra], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)


def test_an_xid_79_node_fails_its_own_row_is_listed_and_left_out_of_the_next_run(loopback_sshd, tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "dmesg").symlink_to(FAKE_DMESG)
    config, cluster, out = _suite(tmp_path), _cluster(tmp_path, loopback_sshd, fake_bin), tmp_path / "runs"

    first = _run(config, cluster, out)
    assert first.returncode == 1, first.stderr[-3000:]
    result = json.loads(first.stdout)
    run_dir = Path(result["run_dir"])
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    rows = {r["name"]: r for r in preflight["rows"]}
    assert preflight["verdict"] == "FAIL"
    sick, healthy = rows["node1.kernel.faults"], rows["node0.kernel.faults"]
    assert sick["verdict"] == "FAIL" and "Xid 79" in sick["reason"], sick
    assert healthy["verdict"] == "PASS", healthy
    # the kernel row is the only one that fails, and only on node 1
    assert [name for name, row in rows.items() if row["verdict"] == "FAIL"] == ["node1.kernel.faults"]
    assert (run_dir / "failing_nodes.txt").read_text() == f"{SICK}\n"
    assert (run_dir / "passing_nodes.txt").read_text() == f"{HEALTHY}\n"
    assert any("Xid 79" in why for why in json.loads((run_dir / "failing_nodes.json").read_text())[SICK])

    second = _run(config, cluster, out, "--exclude-failing", "latest")
    assert second.returncode == 0, second.stderr[-3000:] + second.stdout[-3000:]
    result = json.loads(second.stdout)
    again = Path(result["run_dir"])
    assert again != run_dir
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    assert preflight["verdict"] == "PASS", preflight["reason"]
    assert not any(r["name"].startswith("node1.") for r in preflight["rows"])  # one node probed: the healthy one
    [combo] = result["combos"]
    assert combo["verdict"] == "PASS", combo["reason"]
    [log] = combo["job"]["logs"]  # one node now
    assert "iteration        8/       8" in (again / log).read_text()
    assert (again / "passing_nodes.txt").read_text() == f"{HEALTHY}\n"
    assert (again / "failing_nodes.txt").read_text().strip() == ""
    deck = json.loads((again / "megatron_run_deck.json").read_text())
    [note] = [n for n in deck["run_card_notes"] if n.startswith("excluded node")]
    assert SICK in note and "Xid 79" in note and run_dir.name in note
    report = (again / "report.html").read_text()
    assert SICK in report and "Xid 79" in report


# ---- the same on a real SLURM cluster: `--exclude` in every sbatch ------------------------------------------------

def _slurm_suite(directory: Path, nodes: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = _suite(directory)
    config = json.loads(path.read_text())
    config["megapilot"].update(executor="slurm", nodes=nodes, time_limit="00:10:00")
    path.write_text(json.dumps(config, indent=2))
    return path


def test_slurm_lists_the_xid_79_node_by_its_slurm_name_and_excludes_it_next_run(slurm_two_runnable_nodes, tmp_path):
    """Two SLURM nodes on this machine (this host's name, then `<host>-n2`); the fake dmesg gives `<host>-n2` (by
    SLURMD_NODENAME) an Xid 79. Run 1 probes both with srun and lists `<host>-n2` in failing_nodes.txt; run 2, on
    one node with `--exclude-failing latest`, asks sbatch for `--exclude=<host>-n2` and trains on the healthy one."""
    healthy, sick = slurm_two_runnable_nodes.node_names
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "dmesg").symlink_to(FAKE_DMESG)
    # sbatch and srun export the submitter's environment (--export=ALL): the probe on each node finds the fake first
    env = {**slurm_two_runnable_nodes.env, "OMP_NUM_THREADS": "1", "FAKE_XID_SLURM_NODE": sick,
           "PATH": f"{fake_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    out = tmp_path / "runs"

    first = run_suite(_slurm_suite(tmp_path / "two", nodes=2), out, env)
    assert first.returncode == 1, first.stderr[-3000:]
    result = json.loads(first.stdout)
    run_dir = Path(result["run_dir"])
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    failed = [r for r in preflight["rows"] if r["verdict"] == "FAIL"]
    assert [r["name"] for r in failed] == ["node1.kernel.faults"] and "Xid 79" in failed[0]["reason"], failed
    assert (run_dir / "failing_nodes.txt").read_text() == f"{sick}\n"  # SLURM's node name: what --exclude takes
    assert (run_dir / "passing_nodes.txt").read_text() == f"{healthy}\n"

    second = run_suite(_slurm_suite(tmp_path / "one", nodes=1), out, env, "--exclude-failing", "latest")
    assert second.returncode == 0, second.stderr[-3000:] + second.stdout[-3000:]
    result = json.loads(second.stdout)
    again = Path(result["run_dir"])
    [combo] = result["combos"]
    assert combo["verdict"] == "PASS" and combo["job"]["executor"] == "slurm", combo["reason"]
    scripts = [p.read_text() for p in again.rglob("*") if p.is_file() and p.suffix in (".sh", ".sbatch")]
    assert any(f"--exclude={sick}" in text for text in scripts), "no sbatch script asks SLURM to leave the node out"
    preflight = next(s for s in result["stages"] if s["name"] == "preflight")
    assert preflight["verdict"] == "PASS", preflight["reason"]
    assert (again / "passing_nodes.txt").read_text() == f"{healthy}\n"  # the probe ran on the healthy node only
    deck = json.loads((again / "megatron_run_deck.json").read_text())
    [note] = [n for n in deck["run_card_notes"] if n.startswith("excluded node")]
    assert sick in note and "Xid 79" in note and run_dir.name in note
