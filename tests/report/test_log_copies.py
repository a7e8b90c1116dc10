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


def test_the_checkpoint_jobs_logs_are_copied_and_linked_from_the_lifecycle_table(tmp_path):
    from megapilot.report import render_report
    from megapilot.report.log_copies import copy_stage_logs
    from megapilot.suite.results import JobSummary

    result = write_run_dir(tmp_path)
    checkpoint = next(s for s in result.stages if s.name == "checkpoint")
    for job in ("checkpoint-save", "checkpoint-resume"):
        log = tmp_path / job / "out-node0" / "training.log"
        log.parent.mkdir(parents=True)
        log.write_text(f"{job} iteration 1\n")
        checkpoint.jobs.append(JobSummary(executor="slurm", job_id="7", state="COMPLETED",
                                          logs=[f"{job}/out-node0/training.log"]))
    links = copy_stage_logs(result, tmp_path)
    assert [link.href for link in links["checkpoint"]] == ["logs/checkpoint-save/node0.log",
                                                           "logs/checkpoint-resume/node0.log"]
    assert (tmp_path / "logs" / "checkpoint-resume" / "node0.log").read_text() == "checkpoint-resume iteration 1\n"
    html = render_report(result, tmp_path).html.read_text()
    assert 'href="logs/checkpoint-save/node0.log"' in html and 'href="logs/checkpoint-resume/node0.log"' in html
