"""Running commands on every node and the node lists: the probe and the NIC snapshot run for real on this machine
through the local executor, and the passing/failing lists written, extended and kept across checks."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from megapilot.execute.local import LocalExecutor
from megapilot.suite.config import LoadedSuite, load_suite
from megapilot.suite.config_schema import ContainerSpec
from megapilot.suite.nodes import (
    add_failing,
    close_node_lists,
    env_exports,
    expectations,
    probe_nodes,
    run_on_nodes,
    write_node_lists,
)
from megapilot.suite.preflight import PROBE_SCRIPT, parse_probe
from megapilot.suite.results import ComboResult, MetricRow, Verdict
from megapilot.suite.templates import template_path

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


@pytest.fixture(scope="module")
def tiny() -> LoadedSuite:
    """The packaged CPU suite: one node (this machine), two ranks, the local executor."""
    return load_suite(template_path("tiny-local"))


def _fail(node: int | None, check: str, reason: str) -> MetricRow:
    name = check if node is None else f"node{node}.{check}"
    return MetricRow(name=name, node=node, verdict=Verdict.FAIL, reason=reason)


def test_run_on_nodes_runs_the_script_with_its_arguments_on_this_machine(tiny: LoadedSuite) -> None:
    [output] = run_on_nodes(tiny, LocalExecutor(), 'echo "args=$*"; echo "host=$(hostname)"', ["a b", "c"])
    assert output.node == 0 and output.error == ""
    assert output.text.splitlines() == ["args=a b c", f"host={socket.gethostname()}"]


def test_a_failing_script_reports_its_last_error_line(tiny: LoadedSuite) -> None:
    [output] = run_on_nodes(tiny, LocalExecutor(), "echo partial; echo 'no such device' >&2; exit 3", [])
    assert output.text == "partial\n" and output.error == "no such device"


def test_probe_nodes_keeps_the_readings_judges_them_and_lists_this_machine_as_passing(tiny: LoadedSuite,
                                                                                      tmp_path: Path) -> None:
    rows = {row.name: row for row in probe_nodes(tiny, LocalExecutor(), tmp_path)}
    reading = (tmp_path / "preflight" / "node0.txt").read_text()
    assert f"host={socket.gethostname()}" in reading
    assert f"disk_free_kib:{tmp_path}=" in reading  # the run directory's disk is probed
    assert (tmp_path / "nic_counters" / "before-node0.txt").is_file()  # the snapshot the run's end compares to
    assert rows["gpus.visible"].verdict is Verdict.SKIPPED  # a CPU suite wants no GPU
    failed = [row for row in rows.values() if row.verdict is Verdict.FAIL]
    listed = (tmp_path / "failing_nodes.txt").read_text()
    assert (listed == "") == (failed == [])  # the lists follow the verdicts
    if not failed:
        assert (tmp_path / "passing_nodes.txt").read_text() == f"{socket.gethostname()}\n"


def test_node_lists_name_each_failed_check_without_its_node_prefix(tmp_path: Path) -> None:
    rows = [_fail(1, "kernel.faults", "Xid 79"), _fail(1, "shm.size_gib", "8 GiB"),
            MetricRow(name="node0.kernel.faults", node=0, verdict=Verdict.PASS),
            MetricRow(name="node2.memlock", node=2, verdict=Verdict.RECORD, reason="limited"),
            _fail(None, "python.interpreter", "no python3")]  # about the run, not a node: fails none
    lists = write_node_lists(tmp_path, ["a", "b", "c"], rows)
    assert lists.failing == {"b": ["kernel.faults: Xid 79", "shm.size_gib: 8 GiB"]}
    assert (tmp_path / "passing_nodes.txt").read_text() == "a\nc\n"
    assert (tmp_path / "failing_nodes.txt").read_text() == "b\n"
    assert json.loads((tmp_path / "failing_nodes.json").read_text()) == lists.failing


def test_add_failing_keeps_the_earlier_reasons_and_adds_the_new_node(tmp_path: Path) -> None:
    write_node_lists(tmp_path, ["a", "b", "c"], [_fail(0, "kernel.faults", "Xid 79")])
    lists = add_failing(tmp_path, ["a", "b", "c"], [_fail(2, "nic.counters", "symbol_error +12")])
    assert lists.failing == {"a": ["kernel.faults: Xid 79"], "c": ["nic.counters: symbol_error +12"]}
    assert (tmp_path / "failing_nodes.txt").read_text() == "a\nc\n"
    assert (tmp_path / "passing_nodes.txt").read_text() == "b\n"


def test_add_failing_keeps_a_node_failed_under_a_name_not_seen_now(tmp_path: Path) -> None:
    write_node_lists(tmp_path, ["old-host", "b"], [_fail(0, "shm.size_gib", "8 GiB")])
    lists = add_failing(tmp_path, ["a", "b"], [])
    assert lists.failing == {"old-host": ["shm.size_gib: 8 GiB"]}
    assert (tmp_path / "failing_nodes.txt").read_text() == "old-host\n"
    assert json.loads((tmp_path / "failing_nodes.json").read_text()) == {"old-host": ["shm.size_gib: 8 GiB"]}


def test_add_failing_without_earlier_lists_starts_them(tmp_path: Path) -> None:
    lists = add_failing(tmp_path, ["a", "b"], [_fail(1, "nic.counters", "link_downed +1")])
    assert lists.failing == {"b": ["nic.counters: link_downed +1"]}
    assert (tmp_path / "passing_nodes.txt").read_text() == "a\n"


def _combo(*rows: MetricRow) -> ComboResult:
    return ComboResult(key="MBS=1,GBS=8,PRECISION=BF16", directory="combo", verdict=Verdict.PASS,
                       backend="megapilot", metrics=list(rows))


def test_close_node_lists_compares_the_counters_and_keeps_a_clean_run_passing(tiny: LoadedSuite,
                                                                              tmp_path: Path) -> None:
    executor = LocalExecutor()
    probe_nodes(tiny, executor, tmp_path)
    failing_before = (tmp_path / "failing_nodes.txt").read_text()
    [row] = close_node_lists(tiny, executor, tmp_path, [_combo()])
    assert row.name == "nic.counters" and row.verdict is not Verdict.SKIPPED  # both snapshots were taken
    assert (tmp_path / "nic_counters" / "after-node0.txt").is_file()
    if row.verdict is not Verdict.FAIL:
        assert (tmp_path / "failing_nodes.txt").read_text() == failing_before


def test_close_node_lists_fails_the_node_of_a_gated_straggler_row(tiny: LoadedSuite, tmp_path: Path) -> None:
    executor = LocalExecutor()
    write_node_lists(tmp_path, [socket.gethostname()], [])
    slow = MetricRow(name="straggler.node0", node=0, verdict=Verdict.FAIL, reason="1.4x the median compute time")
    ungated = MetricRow(name="straggler.node0", node=0, verdict=Verdict.RECORD, reason="CPU run")
    close_node_lists(tiny, executor, tmp_path, [_combo(ungated)])
    assert (tmp_path / "failing_nodes.txt").read_text() == ""
    close_node_lists(tiny, executor, tmp_path, [_combo(slow)])
    failing = json.loads((tmp_path / "failing_nodes.json").read_text())
    assert failing == {socket.gethostname(): ["straggler.node0: 1.4x the median compute time"]}


def test_expectations_come_from_the_suite_and_its_container_env(tiny: LoadedSuite) -> None:
    plain = expectations(tiny)
    assert (plain.gpus_per_node, plain.device, plain.expected_nic_gbps, plain.socket_interface) == (2, "cpu", None,
                                                                                                   None)
    config = tiny.config.model_copy(update={
        "megapilot": tiny.config.megapilot.model_copy(update={"expected_nic_gbps": 400.0}),
        "container": ContainerSpec(name="c", image="rocm/megatron-lm:v25.9", env={"NCCL_SOCKET_IFNAME": "ens1"})})
    wired = expectations(tiny.model_copy(update={"config": config}))
    assert (wired.expected_nic_gbps, wired.socket_interface) == (400.0, "ens1")


def test_the_probe_runs_the_dmesg_the_jobs_path_finds(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dmesg").write_text(f"#!/bin/sh\ncat {DATA / 'fake_dmesg_xid79.txt'}\n")  # a named fake
    (bin_dir / "dmesg").chmod(0o755)
    exports = env_exports({"PATH": f"{bin_dir}:/usr/bin:/bin", "QUOTED": "a 'b' $(touch pwned)", "bad-name": "x"})
    assert "bad-name" not in exports
    out = subprocess.run(["bash", "-s"], input=exports + 'printf "quoted=%s\\n" "$QUOTED"\n' + PROBE_SCRIPT,
                         text=True, capture_output=True, check=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin"}).stdout
    assert "quoted=a 'b' $(touch pwned)" in out and not (tmp_path / "pwned").exists()  # values arrive, unexpanded
    probe = parse_probe(1, out)
    assert probe.kernel_readable and any("Xid" in line and "79" in line for line in probe.kernel_lines)
