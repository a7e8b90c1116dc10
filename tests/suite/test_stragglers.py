"""The per-node straggler gate read from real log formats: the trainer's rank line and Megatron's reports."""

from __future__ import annotations

import shutil
from pathlib import Path

from megapilot.logs import parse_logs
from megapilot.logs.stragglers import StragglerLines
from megapilot.suite.results import Verdict
from megapilot.suite.stragglers import straggler_rows as rows_of
from megapilot.trainer import logfmt

DATA = Path(__file__).resolve().parents[1] / "data" / "nodes"


def straggler_rows(logs: list[Path], **gate) -> list:
    """The rows from what the log parser records of each node's log (the measure step's one reading)."""
    lines = StragglerLines([], [])
    for path in logs:
        if path.is_file():
            parsed = parse_logs([path])
            lines.rank_times += parsed.rank_times
            lines.reports += parsed.straggler_reports
    return rows_of(lines, **gate)


def _log(tmp_path: Path, node: str, *lines: str) -> Path:
    path = tmp_path / f"out-{node}" / "training.log"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_slow_node_fails_its_own_row_and_the_other_passes(tmp_path):
    intervals = [logfmt.rank_compute_line([100.0, 102.0, 131.0, 129.0], [0, 0, 1, 1]) for _ in range(4)]
    logs = [_log(tmp_path, "node0", "iteration lines only"), _log(tmp_path, "node1", *intervals)]
    rows = {r.name: r for r in straggler_rows(logs, max_ratio=1.15, enforce=True)}
    assert rows["straggler.node1"].verdict is Verdict.FAIL and rows["straggler.node1"].value == 1.287
    assert rows["straggler.node1"].node == 1 and rows["straggler.node0"].node == 0  # for failing_nodes.txt
    assert "rank2" in rows["straggler.node1"].reason and "out-node1/training.log:4" in rows["straggler.node1"].reason
    assert rows["straggler.node0"].verdict is Verdict.PASS and rows["straggler.node0"].threshold == "<= 1.15"
    recorded = straggler_rows(logs, max_ratio=1.15, enforce=False)
    assert {r.verdict for r in recorded} == {Verdict.RECORD}
    on_cpu = {r.name: r for r in straggler_rows(logs, max_ratio=1.15, enforce=True, cpu=True)}
    assert on_cpu["straggler.node1"].verdict is Verdict.RECORD and not on_cpu["straggler.node1"].enforced
    assert on_cpu["straggler.node1"].reason.startswith("CPU run: recorded, not gated (would FAIL)")


def test_one_node_has_no_peers_and_passes(tmp_path):
    logs = [_log(tmp_path, "node0", logfmt.rank_compute_line([100.0, 140.0], [0, 0]))]
    [row] = straggler_rows(logs, max_ratio=1.15, enforce=True)
    assert row.name == "straggler.node0" and row.verdict is Verdict.PASS and "no peers" in row.reason


def test_megatron_reports_name_the_node_of_the_slowest_rank(tmp_path):
    path = tmp_path / "out-node0" / "training.log"
    path.parent.mkdir()
    shutil.copy(DATA / "fake_log_straggler.log", path)
    [row] = straggler_rows([path], max_ratio=1.15, enforce=True, ranks_per_node=4)
    assert row.name == "straggler.node1" and row.verdict is Verdict.FAIL and "--log-straggler" in row.reason
    assert row.node == 1


def test_logs_without_per_rank_timing_skip_the_gate(tmp_path):
    [row] = straggler_rows([_log(tmp_path, "node0", "nothing"), tmp_path / "missing.log"], max_ratio=1.15,
                           enforce=True)
    assert row.verdict is Verdict.SKIPPED and not row.enforced
