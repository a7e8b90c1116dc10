"""`suite init --executor`: a config set to that executor with its settings commented, and the cluster file."""

from __future__ import annotations

import json
from pathlib import Path

from megapilot.suite.config import check_suite, load_suite


def test_init_for_slurm_writes_every_scheduler_setting_with_its_default(cli, tmp_path: Path) -> None:
    config = tmp_path / "s" / "suite.json"
    done = cli("suite", "init", "tiny-local", "-o", str(config), "--executor", "slurm")
    assert done.exit_code == 0, done.stderr
    block = json.loads(config.read_text())["megapilot"]
    assert block["executor"] == "slurm"
    for key in ("partition", "account", "time_limit", "exclusive", "memory_per_node_gib", "sbatch_options",
                "job_lease_s", "python"):
        assert key in block and "default:" in block[f"_{key}"], key
    suite = load_suite(config)
    assert suite.executor == "slurm" and suite.capabilities.allocates_resources
    assert not (tmp_path / "s" / "cluster.json").exists()  # SLURM knows its nodes


def test_init_for_ssh_writes_the_cluster_file_the_check_reads(cli, tmp_path: Path) -> None:
    config = tmp_path / "t" / "suite.json"
    done = cli("suite", "init", "tiny-local", "-o", str(config), "--executor", "ssh", "--nodes", "gpu-01,gpu-02",
               "--ssh-port", "2222", "--ssh-key", "/keys/id", "--ssh-user", "ops", "--ssh-option",
               "StrictHostKeyChecking=accept-new")
    assert done.exit_code == 0, done.stderr
    assert "--cluster" in done.stdout
    block = json.loads(config.read_text())["megapilot"]
    assert block["executor"] == "ssh" and "partition" not in block  # no scheduler settings for ssh
    check = check_suite(config, tmp_path / "t" / "cluster.json")
    assert check.ok, check.problems
    suite = check.suite
    assert suite is not None and suite.nodes == 2
    nodes = suite.cluster.nodes() if suite.cluster else []
    assert [(n.host, n.port, n.user, n.key_file) for n in nodes] == [("gpu-01", 2222, "ops", "/keys/id"),
                                                                     ("gpu-02", 2222, "ops", "/keys/id")]
    assert suite.cluster is not None and suite.cluster.ssh_options == ["StrictHostKeyChecking=accept-new"]


def test_init_with_an_unknown_executor_is_a_user_error(cli, tmp_path: Path) -> None:
    done = cli("suite", "init", "tiny-local", "-o", str(tmp_path / "suite.json"), "--executor", "k8s")
    assert done.exit_code == 2 and "k8s" in done.stderr


def test_predicted_gates_keep_the_executor_and_its_cluster_file(cli, tmp_path: Path) -> None:
    # --gates predicted wrote the template's config as it ships: --executor and the node options were dropped silently
    config = tmp_path / "p" / "suite.json"
    done = cli("suite", "init", "tiny-local", "-o", str(config), "--gates", "predicted", "--executor", "ssh",
               "--nodes", "gpu-01,gpu-02")
    assert done.exit_code == 0, done.stderr
    written = json.loads(config.read_text())
    assert written["megapilot"]["executor"] == "ssh" and written["threshold_json"] == "suite_predicted_threshold.json"
    check = check_suite(config, tmp_path / "p" / "cluster.json")
    assert check.ok, check.problems
    assert check.suite is not None and check.suite.nodes == 2


def test_node_options_without_an_executor_that_takes_nodes_are_a_user_error(cli, tmp_path: Path) -> None:
    for extra in (["--nodes", "a,b"], ["--executor", "slurm", "--ssh-user", "ops"]):
        done = cli("suite", "init", "tiny-local", "-o", str(tmp_path / "suite.json"), *extra)
        assert done.exit_code == 2, extra
        assert "add --executor ssh, or leave them out" in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "suite.json").exists()
