"""The run-directory layout and job.json."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import pytest

from megapilot.errors import MegapilotError
from megapilot.execute.base import JobSpec, JobState, JobStatus, job_spec_or_error
from megapilot.execute.rundir import (
    JobRecord,
    node_log_path,
    prepare_job_dir,
    read_job_record,
    unstarted_job_dir,
    write_job_record,
    write_launch_script,
)


def test_layout_has_one_log_directory_per_node(tmp_path):
    job = JobSpec(combo="tp2-pp2", run_dir=tmp_path, argv=["true"], nodes=2)
    directory = prepare_job_dir(job)
    assert directory == tmp_path / "tp2-pp2"
    assert node_log_path(directory, 1) == tmp_path / "tp2-pp2" / "out-node1" / "training.log"
    assert (directory / "out-node0").is_dir() and (directory / "out-node1").is_dir()


def test_argv_launch_script_quotes_every_argument(tmp_path):
    job = JobSpec(combo="c", run_dir=tmp_path, argv=[sys.executable, "-c", "print('a b; rm -rf /')"])
    script = write_launch_script(job, prepare_job_dir(job))
    assert "exec " in script.read_text() and "'print('\"'\"'a b; rm -rf /'\"'\"')'" in script.read_text()
    import subprocess

    assert subprocess.run(["bash", str(script)], capture_output=True, text=True).stdout == "a b; rm -rf /\n"


def test_missing_script_is_a_user_error_naming_the_field(tmp_path):
    job = JobSpec(combo="c", run_dir=tmp_path, script=tmp_path / "nope.sh")
    with pytest.raises(MegapilotError) as error:
        write_launch_script(job, prepare_job_dir(job))
    assert error.value.field == "script"


def test_a_job_refused_before_it_started_leaves_none_of_the_folders_it_created(tmp_path):
    job = JobSpec(combo="c", run_dir=tmp_path / "new" / "runs", argv=["true"], nodes=2)
    with pytest.raises(MegapilotError), unstarted_job_dir(job) as directory:
        write_launch_script(job, directory)
        raise MegapilotError("the scheduler refused it", field="script")
    assert list(tmp_path.iterdir()) == []  # not even the new --run-dir and its parent


def test_a_refused_job_keeps_folders_that_were_there_and_a_started_one_keeps_its_own(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(MegapilotError), unstarted_job_dir(JobSpec(combo="c", run_dir=tmp_path, argv=["true"])):
        raise MegapilotError("refused", field="script")
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"
    with unstarted_job_dir(JobSpec(combo="d", run_dir=tmp_path, argv=["true"])) as started:
        pass
    assert (started / "out-node0").is_dir()


def test_a_finished_job_directory_is_not_reused(tmp_path):
    job = JobSpec(combo="c", run_dir=tmp_path, argv=["true"])
    directory = prepare_job_dir(job)
    write_job_record(directory, JobRecord(
        combo="c", executor="local", command=["bash"], cwd=".", nodes=1, gpus_per_node=1,
        submitted_at=datetime.now(timezone.utc), status=JobStatus(state=JobState.COMPLETED)))
    with pytest.raises(MegapilotError) as error:
        prepare_job_dir(job)
    assert error.value.field == "combo" and "--run-dir" in error.value.fix


def test_job_record_round_trips(tmp_path):
    record = JobRecord(combo="c", executor="local", job_id="42", command=["bash", "launch.sh"], cwd="/w",
                       env_names=["HF_TOKEN"], nodes=1, gpus_per_node=2, root_pid=42,
                       submitted_at=datetime.now(timezone.utc),
                       status=JobStatus(state=JobState.FAILED, exit_code=1, reason="rank 1 killed by SIGKILL"))
    write_job_record(tmp_path, record)
    assert read_job_record(tmp_path) == record
    assert not list(tmp_path.glob(".job.*"))  # the temporary file was renamed, not left behind


@pytest.mark.parametrize("combo", ["../escape", "a b", "", "-flag"])
def test_combo_must_be_a_plain_directory_name(tmp_path, combo):
    with pytest.raises(MegapilotError) as error:
        job_spec_or_error(combo=combo, run_dir=tmp_path, argv=["true"])
    assert error.value.field == "job.combo"


def test_exactly_one_of_script_and_argv(tmp_path):
    with pytest.raises(MegapilotError):
        job_spec_or_error(combo="c", run_dir=tmp_path)
    with pytest.raises(MegapilotError):
        job_spec_or_error(combo="c", run_dir=tmp_path, argv=["true"], script=tmp_path / "x.sh")
