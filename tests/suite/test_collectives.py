"""The collectives stage's gate and bisection, on named fakes of nccl-tests output (no GPU or NIC here), its launch
scripts, and its config block."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from megapilot.catalog.gpus import get_gpu
from megapilot.logs.collectives import parse_collectives
from megapilot.suite.collectives import curves, judge, links_for
from megapilot.suite.config import CollectivesConfig, load_suite
from megapilot.suite.nodes import write_node_lists
from megapilot.suite.results import MetricRow, Verdict

DATA = Path(__file__).resolve().parents[1] / "data" / "collectives"
H100 = get_gpu("h100")


def _rows(name: str, nodes: int, settings: CollectivesConfig | None = None, *, gpu=H100) -> dict[str, MetricRow]:
    runs = parse_collectives((DATA / name).read_text().splitlines())
    rows = judge(runs, settings or CollectivesConfig(), gpu, nodes=nodes, ranks_per_node=8, source="nccl-tests")
    return {row.name: row for row in rows}


def _node_lists(tmp_path: Path, rows: dict[str, MetricRow], names: list[str]) -> tuple[str, str]:
    write_node_lists(tmp_path, names, [row for name, row in rows.items() if name.startswith("node")])
    return (tmp_path / "failing_nodes.txt").read_text(), (tmp_path / "passing_nodes.txt").read_text()


def test_the_catalog_links_bound_each_collective():
    assert links_for(H100, "all_reduce", nodes=1, ranks_per_node=8).busbw_gbps == 450  # NVLink
    ring = links_for(H100, "all_gather", nodes=2, ranks_per_node=8)
    assert ring.busbw_gbps == 400 and "8 NICs" in ring.name  # a ring channel per NIC leaves the node
    assert links_for(H100, "alltoall", nodes=2, ranks_per_node=8).busbw_gbps == pytest.approx(50 * 15 / 8)
    assert links_for(H100, "sendrecv", nodes=2, ranks_per_node=1).busbw_gbps == 50  # one NIC
    assert links_for(get_gpu("gb200"), "all_reduce", nodes=2, ranks_per_node=4).busbw_gbps == 900  # one NVL72
    assert "xGMI" in links_for(get_gpu("mi300x"), "all_reduce", nodes=1, ranks_per_node=8).name
    assert links_for(None, "all_reduce", nodes=2, ranks_per_node=2).busbw_gbps is None


def test_a_healthy_pair_of_nodes_passes_every_gate(tmp_path):
    rows = _rows("fake_nccl_tests_h100_2nodes_healthy.txt", nodes=2)
    assert set(rows) == {"collectives.all_reduce", "collectives.all_gather", "collectives.reduce_scatter",
                         "collectives.alltoall", "node0.collectives", "node1.collectives",
                         "collectives.link.node0-node1"}
    assert all(row.verdict is Verdict.PASS for row in rows.values()), rows
    assert rows["collectives.all_reduce"].threshold == ">= 280"  # 70 % of 8 NICs x 50 GB/s
    assert rows["collectives.all_reduce"].value == pytest.approx(359.19)  # the peak, at 1 GiB
    assert _node_lists(tmp_path, rows, ["gpu-a", "gpu-b"]) == ("", "gpu-a\ngpu-b\n")


def test_a_node_with_a_slow_nvlink_is_named_and_listed_as_failing(tmp_path):
    rows = _rows("fake_nccl_tests_h100_2nodes_node1_nvlink_slow.txt", nodes=2)
    assert rows["collectives.all_reduce"].verdict is Verdict.FAIL
    assert rows["collectives.alltoall"].verdict is Verdict.FAIL  # 60 GB/s < 70 % of 50 x 15/8
    node1 = rows["node1.collectives"]
    assert node1.verdict is Verdict.FAIL and "the bisection names node1" in node1.reason
    assert rows["node0.collectives"].verdict is Verdict.PASS, rows["node0.collectives"].reason
    assert rows["collectives.link.node0-node1"].verdict is Verdict.PASS  # the NICs are fine
    assert _node_lists(tmp_path, rows, ["gpu-a", "gpu-b"]) == ("gpu-b\n", "gpu-a\n")


def test_the_node_in_every_slow_pair_is_named_among_four(tmp_path):
    rows = _rows("fake_nccl_tests_h100_4nodes_node2_nic_slow.txt", nodes=4)
    failed = sorted(name for name, row in rows.items() if row.verdict is Verdict.FAIL)
    assert failed == ["collectives.all_gather", "collectives.all_reduce", "collectives.alltoall",
                      "collectives.link.node0-node2", "collectives.link.node1-node2", "collectives.link.node2-node3",
                      "collectives.reduce_scatter", "node2.collectives"]
    assert "the bisection names node2" in rows["node2.collectives"].reason
    assert "not named by the bisection" in rows["node0.collectives"].reason
    failing, _ = _node_lists(tmp_path, rows, ["gpu-a", "gpu-b", "gpu-c", "gpu-d"])
    assert failing == "gpu-c\n"


def test_the_gate_follows_the_config():
    loose = _rows("fake_nccl_tests_h100_2nodes_node1_nvlink_slow.txt", nodes=2, settings=CollectivesConfig(
        min_fraction=0.3))
    assert all(row.verdict is Verdict.PASS for row in loose.values())  # 139 GB/s >= 30 % of 450
    floor = _rows("fake_nccl_tests_h100_2nodes_healthy.txt", nodes=2, settings=CollectivesConfig(
        min_busbw_gbps=370))
    assert floor["collectives.all_reduce"].verdict is Verdict.FAIL and floor["collectives.all_reduce"].threshold == \
        ">= 370"
    recorded = _rows("fake_nccl_tests_h100_2nodes_node1_nvlink_slow.txt", nodes=2, settings=CollectivesConfig(
        enforce=False))
    assert all(row.verdict is Verdict.RECORD and not row.enforced for row in recorded.values())
    assert "would FAIL" in recorded["node1.collectives"].reason


def test_a_cpu_run_is_recorded_not_gated_but_still_names_the_slow_node():
    # gloo on shared cores: no catalog figure, and a floor the user sets is reported as what it would have done
    rows = _rows("fake_nccl_tests_h100_2nodes_node1_nvlink_slow.txt", nodes=2, gpu=None,
                 settings=CollectivesConfig(min_busbw_gbps=200))
    assert all(row.verdict is Verdict.RECORD for row in rows.values())
    assert "would FAIL" in rows["collectives.all_reduce"].reason
    assert "the bisection names node1" in rows["node1.collectives"].reason
    unset = _rows("fake_nccl_tests_h100_2nodes_healthy.txt", nodes=2, gpu=None)
    assert "no catalog figure" in unset["collectives.all_reduce"].reason


def test_the_chart_curves_are_the_whole_jobs_measured_points():
    runs = parse_collectives((DATA / "fake_nccl_tests_h100_2nodes_healthy.txt").read_text().splitlines())
    series = {curve.name: curve for curve in curves(runs)}
    assert set(series) == {"all_reduce", "all_gather", "reduce_scatter", "alltoall"}  # no node or pair scope
    assert series["all_reduce"].points[0] == (1024, 0.04) and series["all_reduce"].points[-1] == (1073741824, 359.19)


def test_the_config_block_defaults_and_refusals():
    settings = CollectivesConfig()
    assert settings.runs_on("gpu") and not settings.runs_on("cpu")  # auto: a GPU suite only
    assert CollectivesConfig(enabled="true").runs_on("cpu") and not CollectivesConfig(enabled=False).runs_on("gpu")
    assert settings.largest_bytes("gpu") == 2**30 and settings.largest_bytes("cpu") == 4 * 2**20
    with pytest.raises(ValidationError, match="max_bytes"):
        CollectivesConfig(min_bytes=4096, max_bytes=1024)
    with pytest.raises(ValidationError):
        CollectivesConfig(ops=["broadcast"])


FAKE_PERF = DATA / "fake_nccl_tests_perf.sh"


def _gpu_suite(tmp_path: Path) -> Path:
    config = {
        "gpu_name": "H100", "enforce_thresholds": False,
        "paths": {"hf_token_file": "hf_token", "log_dir": "logs", "scripts_dir": "scripts", "data_cache_dir": "cache"},
        "train_params": {"model_name": "tiny", "sequence_length": "128", "recompute": "0", "fsdp": "0",
                         "tensor_parallelism": "1", "pipeline_parallelism": "1", "training_iterations": "4"},
        "smoke": {"enabled": False},
        "collectives": {"min_bytes": 1024, "max_bytes": 2**30},
        "megapilot": {"model": "tiny", "executor": "local", "backend": "megapilot", "device": "gpu", "nodes": 1,
                      "gpus_per_node": 8},
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("peak_gbps", "verdict"), [(380, Verdict.PASS), (200, Verdict.FAIL)])
def test_a_gpu_suite_runs_the_nodes_nccl_tests_through_its_executor(tmp_path, monkeypatch, peak_gbps, verdict):
    """The stage end to end on a GPU suite (on by default there) with the fake nccl-tests binaries on PATH: found
    by the detection, run by the local executor, read, gated against NVLink, and the node listed when short."""
    from megapilot.suite.executors import make_executor
    from megapilot.suite.lifecycle import RunRequest, run_suite

    binaries = tmp_path / "bin"
    binaries.mkdir()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        (binaries / f"{op}_perf").symlink_to(FAKE_PERF)
    monkeypatch.setenv("PATH", f"{binaries}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PEAK_BUSBW_GBPS", str(peak_gbps))
    suite = load_suite(_gpu_suite(tmp_path))
    result = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="collectives"), make_executor(suite))
    stage = next(s for s in result.stages if s.name == "collectives")
    assert stage.verdict is verdict, stage.reason
    rows = {row.name: row for row in stage.checks}
    all_reduce = rows["collectives.all_reduce"]
    assert all_reduce.threshold == ">= 315" and "nccl-tests" in all_reduce.reason
    assert [curve.name for curve in stage.curves] == ["all_reduce", "all_gather", "reduce_scatter", "alltoall"]
    assert len(stage.curves[0].points) == 21  # 1 KiB .. 1 GiB, doubling
    run_dir = Path(result.run_dir)
    assert "all_reduce_perf -b 1024 -e 1073741824 -f 2 -g 8" in (run_dir / "collectives" / "launch.sh").read_text()
    failing = (run_dir / "failing_nodes.txt").read_text()
    if verdict is Verdict.FAIL:
        assert rows["node0.collectives"].verdict is Verdict.FAIL
        assert "the job ran on it alone" in rows["node0.collectives"].reason
        assert stage.reason.startswith("below the gate: all_reduce 199.") and "failing node(s): node0" in stage.reason
        assert failing.strip() and failing.count("\n") == 1  # this machine, by its hostname
    else:
        assert failing == ""


def test_a_probe_job_that_dies_fails_the_stage_with_its_reason(tmp_path, monkeypatch):
    from megapilot.suite.executors import make_executor
    from megapilot.suite.lifecycle import RunRequest, run_suite

    binaries = tmp_path / "bin"
    binaries.mkdir()
    for op in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        (binaries / f"{op}_perf").symlink_to(FAKE_PERF)
    monkeypatch.setenv("PATH", f"{binaries}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCCL_FAILURE", "1")
    suite = load_suite(_gpu_suite(tmp_path))
    result = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="collectives"), make_executor(suite))
    stage = next(s for s in result.stages if s.name == "collectives")
    assert stage.verdict is Verdict.FAIL and stage.reason.startswith("the probe job "), stage.reason
    assert "stopped at a fatal line: nccl_error" in stage.reason and "Connection closed" in stage.reason
    assert stage.jobs and stage.jobs[0].logs
    assert result.verdict is Verdict.FAIL
