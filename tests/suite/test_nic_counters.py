"""NIC fault counters before and after a run, per node: the snapshot script run for real on fake sysfs trees (no IB
NIC here) and on this machine's own /sys/class/net, the grown counters named on the node's own row."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from megapilot.suite.nic_counters import COUNTERS_SCRIPT, FOLDER, counter_rows, parse_counter_lines
from megapilot.suite.nodes import add_failing, write_node_lists
from megapilot.suite.results import MetricRow, Verdict

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def _snapshot(root: Path | str) -> str:
    return subprocess.run(["bash", "-s", str(root)], input=COUNTERS_SCRIPT, text=True, capture_output=True,
                          check=True).stdout


def _run_dir(tmp_path: Path) -> Path:
    """node0 healthy (the same tree before and after), node1's port gathering symbol errors and a link down."""
    folder = tmp_path / FOLDER
    folder.mkdir()
    for node, after in ((0, "fake_sysfs_before"), (1, "fake_sysfs_after")):
        (folder / f"before-node{node}.txt").write_text(_snapshot(DATA / "fake_sysfs_before"))
        (folder / f"after-node{node}.txt").write_text(_snapshot(DATA / after))
    return tmp_path


def test_the_counters_that_grew_fail_that_node_only(tmp_path):
    rows = {r.name: r for r in counter_rows(_run_dir(tmp_path), 2, cpu=False)}
    sick, healthy = rows["node1.nic.counters"], rows["node0.nic.counters"]
    assert sick.verdict is Verdict.FAIL and sick.node == 1 and sick.value == 13
    assert "mlx5_0 port 1 symbol_error +12" in sick.reason and "mlx5_0 port 1 link_downed +1" in sick.reason
    assert "port_rcv_errors" not in sick.reason and "port_xmit_data" not in sick.reason  # unchanged; traffic
    assert "lo " not in sick.reason  # loopback is no NIC
    assert healthy.verdict is Verdict.PASS and healthy.value == 0
    on_cpu = {r.name: r for r in counter_rows(tmp_path, 2, cpu=True)}["node1.nic.counters"]
    assert on_cpu.verdict is Verdict.RECORD and on_cpu.reason.startswith("CPU run: recorded, not gated (would FAIL)")


def test_a_node_with_nic_errors_joins_the_preflights_failing_nodes(tmp_path):
    preflight = [MetricRow(name="node0.kernel.faults", node=0, verdict=Verdict.FAIL, reason="Xid 79"),
                 MetricRow(name="node1.kernel.faults", node=1, verdict=Verdict.PASS)]
    write_node_lists(tmp_path, ["a", "b", "c"], preflight)
    lists = add_failing(tmp_path, ["a", "b", "c"], counter_rows(_run_dir(tmp_path), 2, cpu=False))
    assert (tmp_path / "failing_nodes.txt").read_text() == "a\nb\n"
    assert lists.failing["a"] == ["kernel.faults: Xid 79"] and "symbol_error +12" in lists.failing["b"][0]


def test_a_missing_snapshot_is_skipped_not_failed(tmp_path):
    [row] = counter_rows(tmp_path, 1, cpu=False)
    assert row.name == "nic.counters" and row.verdict is Verdict.SKIPPED and "before-node0.txt" in row.reason


@pytest.mark.skipif(not any(Path("/sys/class/net").glob("*/statistics/rx_errors")), reason="no /sys/class/net here")
def test_this_machines_own_interface_counters_are_read():
    counters = parse_counter_lines(_snapshot("/sys"))
    assert any(name.startswith("net:") and name.endswith("/statistics/rx_errors") for name in counters)
    assert not any(name.startswith("net:lo/") for name in counters)
