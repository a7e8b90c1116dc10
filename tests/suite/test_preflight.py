"""Preflight: the probe runs on a real bash here, its readings are parsed and judged."""

from __future__ import annotations

import subprocess
from pathlib import Path

from megapilot.suite.preflight import PROBE_SCRIPT, NicPort, NodeProbe, PreflightExpectations, judge, parse_probe
from megapilot.suite.results import MetricRow, Verdict

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def _rows(probes, **expect):
    return {r.name: r for r in judge(probes, PreflightExpectations(**expect))}


def test_the_probe_runs_here_and_reads_shm_memlock_and_disk(tmp_path):
    out = subprocess.run(["bash", "-s", "--", str(tmp_path / "not" / "yet")], input=PROBE_SCRIPT, text=True,
                         capture_output=True, check=True).stdout
    probe = parse_probe(0, out)
    assert probe.host and probe.gpu_vendor in ("none", "nvidia", "amd")
    assert probe.shm_gib is not None and probe.shm_gib > 0
    assert probe.memlock_unlimited is not None
    assert list(probe.disk_free_gib) == [str(tmp_path / "not" / "yet")]  # a missing folder: its parent is read
    rows = _rows([probe], gpus_per_node=2, device="cpu")
    assert rows["gpus.visible"].verdict is Verdict.SKIPPED and "CPU run" in rows["gpus.visible"].reason


def test_gpu_count_driver_shm_and_disk_are_judged():
    probe = parse_probe(0, "host=n1\ngpu_vendor=nvidia\ngpu_count=7\ngpu_driver=550.54\nshm_kib=65536\n"
                           "memlock=unlimited\ndisk_free_kib:/logs=524288\n")
    rows = _rows([probe], gpus_per_node=8, device="gpu")
    assert rows["gpus.visible"].verdict is Verdict.FAIL and "7 nvidia GPUs visible on n1, 8 expected" in \
        rows["gpus.visible"].reason
    assert rows["gpu.driver"].verdict is Verdict.PASS
    assert rows["shm.size_gib"].verdict is Verdict.FAIL and "--shm-size" in rows["shm.size_gib"].reason
    assert rows["memlock"].verdict is Verdict.PASS
    assert rows["disk.free_gib[/logs]"].verdict is Verdict.FAIL and rows["disk.free_gib[/logs]"].value == 0.5
    # Under a GiB the free space reads in MiB (not "0.5 GiB", nor "0.0 GiB" for 17 MiB), beside what it needs.
    assert rows["disk.free_gib[/logs]"].reason == "512.0 MiB free for /logs; needs 1 GiB for its logs and checkpoints"


def test_memlock_matters_only_with_rdma_ports():
    limited = "memlock=65536\n"
    without_ib = _rows([parse_probe(0, limited)], gpus_per_node=1, device="gpu")
    with_ib = _rows([parse_probe(0, limited + "ib:mlx5_0/ports/1=4:ACTIVE 400 Gb/sec (4X NDR)\n")],
                    gpus_per_node=1, device="gpu")
    assert without_ib["memlock"].verdict is Verdict.RECORD
    assert with_ib["memlock"].verdict is Verdict.FAIL and "unlimited" in with_ib["memlock"].reason


def test_nic_speed_against_the_expected_one():
    text = ("ib:mlx5_0/ports/1=4:ACTIVE 400 Gb/sec (4X NDR)\nib:mlx5_1/ports/1=4:ACTIVE 200 Gb/sec (4X HDR)\n"
            "ib:mlx5_2/ports/1=1:DOWN 400 Gb/sec (4X NDR)\nnet:ens1=up 100000\n")
    rows = _rows([parse_probe(0, text)], gpus_per_node=1, device="gpu", expected_nic_gbps=400,
                 socket_interface="ens1")
    assert rows["nic.link_gbps[mlx5_0/ports/1]"].verdict is Verdict.PASS
    assert rows["nic.link_gbps[mlx5_1/ports/1]"].verdict is Verdict.FAIL
    assert "nic.link_gbps[mlx5_2/ports/1]" not in rows  # a down port is not one NCCL would use
    assert rows["nic.link_gbps[ens1]"].verdict is Verdict.FAIL and rows["nic.link_gbps[ens1]"].value == 100.0
    no_expectation = _rows([parse_probe(0, text)], gpus_per_node=1, device="gpu")
    assert no_expectation["nic.link_gbps"].verdict is Verdict.SKIPPED


def test_several_nodes_are_named_and_an_unreachable_one_fails():
    good = NodeProbe(node=0, host="a", gpu_vendor="amd", gpu_count=8, gpu_driver="6.8", shm_gib=64.0,
                     memlock_unlimited=True, ib_ports=[NicPort("rdma0", True, 400.0)])
    bad = NodeProbe(node=1, error="ssh: connect to host b port 22: Connection refused")
    rows = _rows([good, bad], gpus_per_node=8, device="gpu")
    assert rows["node0.gpus.visible"].verdict is Verdict.PASS
    assert rows["node1.probe"].verdict is Verdict.FAIL and "Connection refused" in rows["node1.probe"].reason


def _fake_tool(directory, name: str, output_file) -> None:
    """A named fake of a node tool (no GPU and no kernel Xid can exist here): prints a fixture file."""
    tool = directory / name
    tool.write_text(f"#!/bin/sh\ncat {output_file}\n")
    tool.chmod(0o755)


def test_a_fake_dmesg_with_xid_79_fails_that_nodes_kernel_row_and_lists_it_as_failing(tmp_path):
    from megapilot.suite.nodes import write_node_lists

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "dmesg", DATA / "fake_dmesg_xid79.txt")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    sick = subprocess.run(["bash", "-s"], input=PROBE_SCRIPT, text=True, capture_output=True, check=True,
                          env=env).stdout
    # the same node without its fault lines
    healthy = "\n".join(line for line in sick.splitlines() if "Xid" not in line and "fallen off" not in line)
    probes = [parse_probe(0, healthy), parse_probe(1, sick)]
    assert probes[1].kernel_readable and any("Xid" in line for line in probes[1].kernel_lines)
    rows = _rows(probes, gpus_per_node=1, device="cpu")
    assert rows["node1.kernel.faults"].verdict is Verdict.FAIL
    assert "Xid 79 (GPU has fallen off the bus)" in rows["node1.kernel.faults"].reason
    assert rows["node0.kernel.faults"].verdict is Verdict.PASS
    lists = write_node_lists(tmp_path, ["n1", "n2"], list(rows.values()))
    assert (tmp_path / "failing_nodes.txt").read_text() == "n2\n"
    assert (tmp_path / "passing_nodes.txt").read_text() == "n1\n"
    assert any("Xid 79" in reason for reason in lists.failing["n2"])
    assert rows["node1.kernel.faults"].node == 1 and rows["node0.kernel.faults"].node == 0
    # a failed row about the whole run (the interpreter, the submission) names no node and fails none
    whole_run = MetricRow(name="python.interpreter", verdict=Verdict.FAIL, reason="no python3")
    assert write_node_lists(tmp_path, ["n1", "n2"], [whole_run]).failing == {}


def test_an_unreadable_kernel_log_is_skipped_not_failed():
    rows = _rows([parse_probe(0, "kernel_log=unreadable\n")], gpus_per_node=1, device="cpu")
    assert rows["kernel.faults"].verdict is Verdict.SKIPPED


def test_gpu_health_and_versions_are_judged_per_node():
    query = "".join(f"gpu_query={line}\n" for line in (DATA / "fake_nvidia_smi.csv").read_text().splitlines())
    common = "gpu_vendor=nvidia\ngpu_count=8\nkernel_release=6.1.0\nkernel_log=readable\n"
    probes = [parse_probe(k, common + query + f"gpu_driver={driver}\ngpu_runtime=cuda 12.4\n")
              for k, driver in enumerate(["550.90.07", "550.90.07", "535.104.05"])]
    rows = _rows(probes, gpus_per_node=8, device="gpu")
    assert rows["node0.gpus.health"].verdict is Verdict.FAIL and "GPU 2 at 92 C" in rows["node0.gpus.health"].reason
    assert rows["node2.versions"].verdict is Verdict.FAIL and "GPU driver 535.104.05" in rows["node2.versions"].reason
    assert rows["node0.versions"].verdict is Verdict.PASS
