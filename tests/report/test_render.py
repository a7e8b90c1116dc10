"""report.render: one call writes the report, deck, JUnit and log copies; a re-render from the run directory
alone gives the same files."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from megapilot.execute.base import JobState, JobStatus
from megapilot.execute.rundir import JobRecord, write_job_record
from megapilot.report.render import render_report, render_run_dir
from megapilot.suite.results import Verdict, read_suite_result
from tests.report.factory import STOPPED, STOPPED_DIR, write_interrupted_run_dir, write_run_dir

WHEN = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)


def test_every_file_is_written_inside_the_run_directory_and_named_in_the_json(tmp_path):
    result = write_run_dir(tmp_path)
    files = render_report(result, tmp_path, generated_at=WHEN)
    assert (files.html.name, files.run_deck.name, files.junit.name) == ("report.html", "megatron_run_deck.json",
                                                                         "junit.xml")
    assert files.log_files and all(path.is_file() and files.logs_dir in path.parents for path in files.log_files)
    listed = files.as_json()
    assert listed["html"] == str(files.html) and listed["log_files"] == [str(p) for p in files.log_files]
    assert json.loads(files.run_deck.read_text())["run_id"] == result.run_id
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then moved into place


def test_a_re_render_from_suite_json_alone_gives_the_same_deck_and_junit(tmp_path):
    write_run_dir(tmp_path)
    first = render_report(read_suite_result(tmp_path), tmp_path, generated_at=WHEN)
    deck, junit = first.run_deck.read_text(), first.junit.read_text()
    again = render_run_dir(tmp_path)
    assert again.junit.read_text() == junit
    strip = lambda text: {k: v for k, v in json.loads(text).items() if k != "generated_at"}  # noqa: E731
    assert strip(again.run_deck.read_text()) == strip(deck)


def test_a_missing_run_directory_is_created(tmp_path):
    files = render_report(write_run_dir(tmp_path / "src"), tmp_path / "new" / "place", generated_at=WHEN)
    assert files.html.parent == (tmp_path / "new" / "place").resolve() and files.html.is_file()


def test_a_killed_run_is_re_rendered_with_the_combo_it_stopped_in_as_its_job_left_it(tmp_path):
    """SIGKILL: suite.json holds the combo as the lifecycle wrote it when its job started (RUNNING, no iteration
    yet); job.json, rewritten as the job ran, says where it was. suite.json itself is not rewritten."""
    result = write_interrupted_run_dir(tmp_path)
    stopped = result.combos[1]
    assert stopped.job is not None
    stopped.job = stopped.job.model_copy(update={"state": "RUNNING", "iterations_reached": None, "reason": None})
    stopped.log_tail, stopped.reason = [], "started; the suite stopped before it ended"
    result.stopped_by = None
    result.write(tmp_path)
    write_job_record(tmp_path / STOPPED_DIR, JobRecord(
        combo=STOPPED_DIR, executor="local", job_id="4713", command=["bash", "launch.sh"], cwd=str(tmp_path), nodes=1,
        gpus_per_node=2, submitted_at=WHEN, status=JobStatus(state=JobState.RUNNING, iteration=11, train_iters=80,
                                                             elapsed_s=9.5)))
    before = (tmp_path / "suite.json").read_bytes()
    files = render_run_dir(tmp_path)
    assert (tmp_path / "suite.json").read_bytes() == before
    assert len(files.log_files) == 2  # the finished combo's log and the stopped one's partial log
    cell = next(c for c in json.loads(files.run_deck.read_text())["cells"] if c["cell_id"] == STOPPED)
    assert (cell["status"], cell["job"]["iterations_reached"], cell["job"]["state"]) == ("interrupted", 11, "RUNNING")
    assert cell["reason"] == "interrupted at iteration 11 of 80 (no signal seen: killed outright, or still running)"
    assert cell["log_files"] == [f"logs/{STOPPED_DIR}/node0.log"] and cell["log_tail"]
    assert read_suite_result(tmp_path).combos[1].verdict is Verdict.INTERRUPTED
