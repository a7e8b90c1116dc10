"""Per-node verdicts: stragglers against their peers, health checks, collectives, and the node lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.diagnose.nodes import (
    DEFAULT_MAX_STRAGGLER_RATIO,
    HealthCheck,
    blame_links,
    check_collective,
    check_gpus,
    check_kernel,
    check_nic,
    check_stragglers,
    check_versions,
    node_lists,
    stragglers_from_node_steps,
    stragglers_from_rank_times,
    stragglers_from_reports,
)
from megapilot.logs.collectives import (
    CollectiveRun,
    CollectiveSample,
    format_average,
    format_header,
    format_row,
    parse_collectives,
)
from megapilot.logs.health import kernel_faults, parse_gpu_query, parse_ibstat
from megapilot.logs.records import Evidence
from megapilot.logs.stragglers import RankTimes, read_straggler_lines

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"
EVIDENCE = Evidence("node1.log", 7, "compute time before collectives ...")


def _interval(*ms: float, nodes=(0, 0, 1, 1)) -> RankTimes:
    return RankTimes(tuple(ms), tuple(nodes), EVIDENCE)


def test_a_node_whose_ranks_compute_30_percent_longer_is_named_and_no_other():
    lines = [_interval(200, 210, 400, 390)] + [_interval(100, 101, 131, 129) for _ in range(4)]
    verdict = stragglers_from_rank_times(lines)
    assert [n.name for n in verdict.slow_nodes] == ["node1"]
    assert verdict.nodes[0].ratio == pytest.approx(130 / 100.5, rel=0.01)
    assert {r.name for r in verdict.slow_ranks} == {"rank2", "rank3"}
    assert verdict.nodes[0].evidence == (EVIDENCE,)


def test_ranks_within_noise_name_no_straggler():
    lines = [_interval(100, 103, 98, 101) for _ in range(5)]
    verdict = stragglers_from_rank_times(lines)
    assert verdict.slow_nodes == [] and verdict.slow_ranks == []
    assert verdict.worst_ratio < DEFAULT_MAX_STRAGGLER_RATIO


def test_one_rank_has_no_peers():
    assert stragglers_from_rank_times([RankTimes((5.0,), (0,), EVIDENCE)]) is None


def test_megatron_reports_name_the_rank_slowest_most_often_and_its_node():
    found = read_straggler_lines("train.log", (DATA / "fake_log_straggler.log").read_text().splitlines())
    verdict = stragglers_from_reports(found.reports, ranks_per_node=4)
    [rank] = verdict.ranks
    assert rank.name == "rank5" and rank.ratio == pytest.approx(((1502.77 / 1180.2) + (1498.02 / 1178.9)) / 2)
    assert [n.name for n in verdict.slow_nodes] == ["node1"]


def test_node_step_times_compared_leave_one_out():
    verdict = stragglers_from_node_steps({"node0": [900, 100, 101, 99], "node1": [950, 125, 124, 126]})
    assert [n.name for n in verdict.slow_nodes] == ["node1"] and verdict.nodes[0].ratio == pytest.approx(1.25)
    assert stragglers_from_node_steps({"node0": [1.0]}) is None


def test_straggler_rows_fail_only_the_slow_node():
    verdict = stragglers_from_rank_times([_interval(100, 100, 140, 140)])
    rows = {c.node: c for c in check_stragglers(verdict, ["node0", "node1", "node2"])}
    assert rows["node1"].status == "FAIL" and "1.40x" in rows["node1"].reason
    assert rows["node0"].status == "PASS" and rows["node2"].status == "SKIPPED"


def test_gpu_check_names_a_hot_gpu_with_ecc_errors_and_a_missing_one():
    gpus = parse_gpu_query((DATA / "fake_nvidia_smi.csv").read_text())
    check = check_gpus("node3", gpus, expected_count=8)
    assert check.status == "FAIL" and "GPU 2 at 92 C" in check.reason and "GPU 2 has 3 uncorrected" in check.reason
    assert "7 GPU(s) visible, 8 expected" in check_gpus("node3", gpus[:7], 8).reason
    assert check_gpus("node3", None, 8).status == "SKIPPED"
    assert check_gpus("node3", [g for g in gpus if g.index != 2], 7).status == "PASS"


def test_xid_79_fails_the_node_but_an_application_xid_13_does_not():
    fell_off = kernel_faults("dmesg", (DATA / "fake_dmesg_xid79.txt").read_text().splitlines())
    check = check_kernel("node1", fell_off)
    assert check.status == "FAIL" and "Xid 79 (GPU has fallen off the bus)" in check.reason and check.evidence
    app = kernel_faults("dmesg", (DATA / "fake_dmesg_xid13.txt").read_text().splitlines())
    assert check_kernel("node2", app).status == "PASS"
    assert check_kernel("node2", None).status == "SKIPPED"


def test_the_node_whose_driver_differs_from_the_majority_fails():
    checks = {c.node: c for c in check_versions({
        "a": {"driver": "550.90.07", "torch": "2.13.0"}, "b": {"driver": "550.90.07", "torch": "2.13.0"},
        "c": {"driver": "535.104.05", "torch": "2.13.0"}})}
    assert checks["c"].status == "FAIL" and "driver 535.104.05 (others 550.90.07)" in checks["c"].reason
    assert checks["a"].status == checks["b"].status == "PASS"


def test_nic_check_names_a_down_port_a_slow_port_and_grown_counters():
    ports = parse_ibstat((DATA / "fake_ibstat.txt").read_text())
    check = check_nic("node1", ports, {"symbol_error": 12}, expected_rate_gbps=400)
    assert check.status == "FAIL"
    assert "mlx5_1 port 1 is Down" in check.reason and "mlx5_2 port 1 at 200 Gb/s" in check.reason
    assert "symbol_error +12" in check.reason
    assert check_nic("node1", None, None).status == "SKIPPED"
    assert check_nic("node1", ports[:1], {}, expected_rate_gbps=400).status == "PASS"


def _run(scope: str, busbw: float) -> CollectiveRun:
    sample = CollectiveSample("all_reduce", 1 << 20, 10.0, busbw, busbw, 0, 2, 1)
    return CollectiveRun("all_reduce", 2, 1, (sample,), busbw, scope)


def test_collective_gate_against_the_links_and_recorded_without_an_expectation():
    run = parse_collectives((DATA / "fake_all_reduce_perf.txt").read_text().splitlines(), "all_reduce")[0]
    assert check_collective(run, 200.0, 0.8, 1 << 30).status == "PASS"
    short = check_collective(run, 300.0, 0.8, 1 << 30)
    assert short.status == "FAIL" and "vs >= 240.0 GB/s" in short.reason
    assert check_collective(run, None, 0.8, 1 << 30).status == "PASS"
    assert check_collective(run, 200.0, 0.8, 1 << 40).status == "SKIPPED"


def test_the_node_whose_own_group_and_pairs_are_slow_is_blamed():
    runs = [_run("node0", 10.0), _run("node1", 4.0), _run("node2", 9.5),
            _run("node0-node1", 3.0), _run("node0-node2", 8.0), _run("node1-node2", 3.1)]
    blamed = blame_links(runs)
    assert blamed[0].name == "node1" and blamed[0].ratio > 2
    assert all(b.ratio < 1 for b in blamed[1:])


def test_a_slow_nic_is_blamed_by_its_pairs_not_by_comparing_pairs_with_groups():
    # four nodes, every node's own group healthy (NVLink, ~380), every pair with node2 at half the others' (NIC)
    runs = [_run(f"node{k}", 380.0 + k) for k in range(4)]
    runs += [_run(f"node{i}-node{j}", 22.0 if 2 in (i, j) else 48.0) for i in range(4) for j in range(i + 1, 4)]
    blamed = blame_links(runs)
    assert blamed[0].name == "node2" and blamed[0].ratio == pytest.approx(48.0 / 22.0)
    assert all(b.ratio < 1.15 for b in blamed[1:]), blamed


def test_probe_output_blames_through_the_parser():
    sample = CollectiveSample("all_reduce", 4096, 1.0, 1.0, 1.0, 0, 2, 0)
    slow = CollectiveSample("all_reduce", 4096, 3.0, 0.3, 0.3, 0, 2, 0)
    text = [*format_header("all_reduce", 2, 1, "node0"), format_row(sample, 1024), format_average(1.0),
            *format_header("all_reduce", 2, 1, "node1"), format_row(slow, 1024), format_average(0.3)]
    assert blame_links(parse_collectives(text))[0].name == "node1"


def test_node_lists_fail_a_node_on_any_failed_check_and_write_names_only():
    checks = [HealthCheck("n1", "kernel", "FAIL", "Xid 79"), HealthCheck("n1", "gpus", "FAIL", "hot"),
              HealthCheck("n2", "kernel", "SKIPPED", "no dmesg"), HealthCheck("n3", "gpus", "PASS", "ok")]
    lists = node_lists(["n1", "n2", "n3"], checks)
    assert lists.passing == ["n2", "n3"] and lists.failing == {"n1": ["kernel: Xid 79", "gpus: hot"]}
    assert lists.failing_text() == "n1\n" and lists.passing_text() == "n2\nn3\n"
