"""`suite run --exclude-failing`: an earlier run's failing nodes left out of the next (the SSH host list, SLURM's
`--exclude`), with the reasons in the run's notes, and a clear refusal when too few nodes are left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.suite.config import load_suite
from megapilot.suite.exclude import exclude_nodes, failing_run_dir, read_failing
from megapilot.suite.executors import executor_settings
from megapilot.suite.nodes import write_node_lists
from megapilot.suite.results import MetricRow, Verdict

HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def _suite(tmp_path: Path, executor: str, nodes: int | None) -> Path:
    config = {
        "gpu_name": "CPU", "enforce_thresholds": False,
        "paths": {"hf_token_file": "hf_token", "log_dir": "logs", "scripts_dir": "s", "data_cache_dir": "c"},
        "train_params": {"model_name": "tiny", "sequence_length": "128", "training_iterations": "4"},
        "smoke": {"enabled": False},
        "megapilot": {"model": "tiny", "executor": executor, "backend": "megapilot", "device": "cpu",
                      "nodes": nodes, "gpus_per_node": 1},
    }
    if nodes is None:
        del config["megapilot"]["nodes"]
    (tmp_path / "suite.json").write_text(json.dumps(config))
    cluster = {"username": "u", "head_node_dict": {"mgmt_ip": HOSTS[0]},
               "node_dict": {h: {"bmc_ip": "NA", "vpc_ip": h} for h in HOSTS}}
    (tmp_path / "cluster.json").write_text(json.dumps(cluster))
    return tmp_path / "suite.json"


def _failed_run(out: Path, failing: int) -> Path:
    """A run directory whose preflight failed node `failing` (its kernel log held an Xid 79)."""
    run_dir = out / "20261205-060000-abcd"
    run_dir.mkdir(parents=True)
    rows = [MetricRow(name=f"node{k}.kernel.faults", node=k, verdict=Verdict.FAIL if k == failing else Verdict.PASS,
                      reason="Xid 79 (GPU has fallen off the bus)" if k == failing else "no GPU fault")
            for k in range(len(HOSTS))]
    write_node_lists(run_dir, list(HOSTS), rows)
    return run_dir


def test_ssh_leaves_the_failing_host_out_of_the_node_list_and_says_why(tmp_path):
    config = _suite(tmp_path, "ssh", nodes=2)
    run_dir = _failed_run(tmp_path / "runs", failing=0)
    assert failing_run_dir("latest", tmp_path / "runs") == run_dir
    excluded = read_failing(run_dir)
    suite = exclude_nodes(load_suite(config, tmp_path / "cluster.json"), excluded)
    assert [n.host for n in executor_settings(suite).nodes] == ["10.0.0.2", "10.0.0.3"]  # the master moved too
    [note] = excluded.notes()
    assert "10.0.0.1" in note and "Xid 79" in note and run_dir.name in note


def test_slurm_gets_exclude_in_every_sbatch(tmp_path):
    config = _suite(tmp_path, "slurm", nodes=2)
    suite = exclude_nodes(load_suite(config, tmp_path / "cluster.json"), read_failing(_failed_run(tmp_path, 1)))
    assert "--exclude=10.0.0.2" in executor_settings(suite).scheduler_options


def test_too_few_nodes_left_is_a_user_error_naming_the_option(tmp_path):
    config = _suite(tmp_path, "ssh", nodes=3)
    with pytest.raises(MegapilotError, match=r"2 node\(s\) left of 3") as raised:
        exclude_nodes(load_suite(config, tmp_path / "cluster.json"), read_failing(_failed_run(tmp_path, 2)))
    assert raised.value.field == "--exclude-failing"


def test_the_cli_refuses_with_exit_2_and_one_line(tmp_path):
    config = _suite(tmp_path, "ssh", nodes=3)
    _failed_run(tmp_path / "runs", failing=1)
    done = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--cluster",
                           str(tmp_path / "cluster.json"), "--out", str(tmp_path / "runs"), "--no-history",
                           "--exclude-failing", "latest"], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--exclude-failing" in done.stderr and "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) <= 3


def test_without_a_node_count_the_job_spans_the_nodes_left(tmp_path):
    config = _suite(tmp_path, "ssh", nodes=None)
    loaded = load_suite(config, tmp_path / "cluster.json")
    assert loaded.nodes == 3
    suite = exclude_nodes(loaded, read_failing(_failed_run(tmp_path, 2)))
    assert suite.nodes == 2 and [n.host for n in executor_settings(suite).nodes] == ["10.0.0.1", "10.0.0.2"]


def _config_naming(config: Path, run: str) -> Path:
    raw = json.loads(config.read_text())
    raw["megapilot"]["exclude_failing"] = run
    config.write_text(json.dumps(raw))
    return config


@pytest.mark.parametrize(("executor", "nodes", "run", "fix"), [
    ("ssh", 3, "latest", "add healthy nodes"),  # too few nodes left
    ("ssh", 2, "nowhere", "set megapilot.exclude_failing in {config} to 'latest', a run directory or a run id"),
    ("local", 1, "latest", "or remove megapilot.exclude_failing from {config}"),
])
def test_an_error_from_the_configs_key_names_the_key_and_its_file_not_the_option(tmp_path, executor, nodes, run, fix):
    from megapilot.cli.suite_check_cmd import suite_as_run

    config = _config_naming(_suite(tmp_path, executor, nodes=nodes), run)
    _failed_run(tmp_path / "runs", failing=1)
    suite = load_suite(config, tmp_path / "cluster.json" if executor != "local" else None)
    with pytest.raises(MegapilotError) as raised:
        suite_as_run(suite, megatron_version=None, exclude_failing=None, out=tmp_path / "runs")
    assert raised.value.field == "megapilot.exclude_failing"
    assert fix.format(config=config.absolute()) in (raised.value.fix or "")
    assert str(config.absolute()) in str(raised.value) and "--exclude-failing" not in str(raised.value)
    with pytest.raises(MegapilotError) as given:  # the option, where the user gave it, is still named as such
        suite_as_run(suite, megatron_version=None, exclude_failing=run, out=tmp_path / "runs")
    assert given.value.field == "--exclude-failing" and "megapilot.exclude_failing" not in str(given.value)


def test_the_cli_names_the_configs_key_when_it_excluded_the_nodes(tmp_path):
    config = _config_naming(_suite(tmp_path, "ssh", nodes=3), "latest")
    _failed_run(tmp_path / "runs", failing=1)
    done = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--cluster",
                           str(tmp_path / "cluster.json"), "--out", str(tmp_path / "runs"), "--no-history"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 2, done.stderr
    text = " ".join(done.stderr.split())
    assert "megapilot.exclude_failing" in text and str(config.absolute()) in text
    assert "--exclude-failing" not in text and "Traceback" not in text
