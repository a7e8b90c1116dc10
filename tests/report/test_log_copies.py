"""Copies of the combo logs next to the report; paths that leave the run directory are not followed."""

from __future__ import annotations

from megapilot.report.log_copies import copy_combo_logs
from tests.report.factory import FAILING, PASSING, suite_result, write_run_dir


def test_logs_listed_in_the_result_are_copied_flat(tmp_path):
    result = write_run_dir(tmp_path)
    links = copy_combo_logs(result, tmp_path)
    assert [link.href for link in links[PASSING]] == ["logs/MBS=1,GBS=8,PRECISION=BF16/node0.log"]
    source = tmp_path / result.combos[0].job.logs[0]
    assert (tmp_path / links[PASSING][0].href).read_bytes() == source.read_bytes()


def test_node_logs_are_found_by_layout_when_the_result_lists_none(tmp_path):
    result = write_run_dir(tmp_path)
    combo = result.combo(FAILING)
    combo.job = None
    second = tmp_path / combo.directory / "out-node1" / "training.log"
    second.parent.mkdir()
    second.write_text("node 1\n")
    links = copy_combo_logs(result, tmp_path)[FAILING]
    assert [(link.node, link.href) for link in links] == [
        (0, "logs/MBS=2,GBS=16,PRECISION=FP8/node0.log"), (1, "logs/MBS=2,GBS=16,PRECISION=FP8/node1.log")]


def test_a_path_outside_the_run_directory_is_not_copied(tmp_path):
    run_dir = tmp_path / "run"
    result = write_run_dir(run_dir)
    (tmp_path / "secret.txt").write_text("not a log\n")
    result.combos[0].job.logs = ["../secret.txt", "/etc/hostname"]
    assert copy_combo_logs(result, run_dir)[PASSING] == []


def test_missing_logs_give_no_links(tmp_path):
    result = suite_result(tmp_path)  # nothing written
    assert copy_combo_logs(result, tmp_path) == {PASSING: [], FAILING: []}
