"""A job megapilot stopped itself is said to be stopped by megapilot, with why, not 'from outside'."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megapilot.diagnose import diagnose

HUNG = Path(__file__).resolve().parents[1] / "data" / "logs" / "megapilot_stop" / "hung"
SLURM_CANCELLED = "slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2026-12-07T00:12:06 ***"


def run_dir(tmp_path: Path, **status_or_stop: object) -> Path:
    """The recorded run directory, with its job.json's stop or status changed."""
    copy = tmp_path / "runs" / "h2"
    shutil.copytree(HUNG, copy)
    record = json.loads((copy / "job.json").read_text())
    for key, value in status_or_stop.items():
        if key == "stop_sent_at":
            record[key] = value
        else:
            record["status"][key] = value
    (copy / "job.json").write_text(json.dumps(record))
    return copy


def test_a_job_megapilot_stopped_on_its_hang_window_says_megapilot_and_why():
    result = diagnose([HUNG])
    (lead,) = [f for f in result.findings if f.category == "process_crash"]
    assert "from outside" not in lead.title and "from outside" not in " ".join(result.story)
    assert "stopped by megapilot with SIGTERM (hung: no new iteration for 4.0 s after iteration 5/100" in lead.title
    assert result.story[0].startswith("first failure: stopped by megapilot with SIGTERM (hung:")
    assert "megapilot stopped this job itself" in lead.cause and "hang window" in lead.cause
    assert any(fix.flag.startswith("py-spy dump") for fix in lead.fixes)
    assert not any(fix.flag.startswith("sacct") for fix in lead.fixes)  # no scheduler ended it


def test_its_wall_clock_limit_and_a_ctrl_c_are_said_as_such(tmp_path: Path):
    limit = run_dir(tmp_path / "a", state="TIMEOUT", reason="wall-clock limit of 600 s reached at iteration 5/100")
    (lead,) = [f for f in diagnose([limit]).findings if f.category == "process_crash"]
    assert "stopped by megapilot with SIGTERM (wall-clock limit of 600 s reached" in lead.title
    assert "wall-clock limit" in lead.cause and lead.fixes == []
    ctrl_c = run_dir(tmp_path / "b", state="CANCELLED",
                     reason="interrupted by Ctrl-C (SIGINT) at iteration 5 of 100; the run was stopped")
    (lead,) = [f for f in diagnose([ctrl_c]).findings if f.category == "process_crash"]
    assert "(interrupted by Ctrl-C (SIGINT) at iteration 5 of 100" in lead.title
    assert "cancelled through megapilot" in lead.cause


@pytest.mark.parametrize("broken", ["no stop", "unreadable", "missing"])
def test_without_megapilots_record_of_a_stop_it_stays_a_stop_from_outside(tmp_path: Path, broken: str):
    """A job something else stopped (state FAILED, no stop_sent_at), a job.json cut short, or none at all."""
    directory = run_dir(tmp_path, stop_sent_at=None, state="FAILED", reason="exited with code 1")
    if broken == "unreadable":
        (directory / "job.json").write_text('{"version": 1, "combo": ')
    elif broken == "missing":
        (directory / "job.json").unlink()
    (lead,) = [f for f in diagnose([directory]).findings if f.category == "process_crash"]
    assert "stopped by SIGTERM from outside" in lead.title


def test_a_log_outside_a_run_directory_is_read_alone(tmp_path: Path):
    alone = tmp_path / "training.log"
    shutil.copyfile(HUNG / "out-node0" / "training.log", alone)
    (tmp_path / "job.json").write_text((HUNG / "job.json").read_text())  # not the layout: not its record
    (lead,) = [f for f in diagnose([alone]).findings if f.category == "process_crash"]
    assert "from outside" in lead.title


def test_megapilots_scancel_is_named_in_slurms_cancellation(tmp_path: Path):
    directory = run_dir(tmp_path, state="HUNG")
    log = directory / "out-node0" / "training.log"
    log.write_text("\n".join(log.read_text().splitlines()[:9] + [SLURM_CANCELLED]) + "\n")
    (lead,) = [f for f in diagnose([directory]).findings if f.category == "process_crash"]
    assert lead.title.startswith("megapilot cancelled the job: hung: no new iteration for 4.0 s")
    assert "megapilot cancelled job 4242 itself" in lead.cause
    assert any(fix.flag.startswith("sacct -j 4242") for fix in lead.fixes)
    outside = run_dir(tmp_path / "other", stop_sent_at=None)
    other_log = outside / "out-node0" / "training.log"
    other_log.write_text("\n".join(other_log.read_text().splitlines()[:9] + [SLURM_CANCELLED]) + "\n")
    (lead,) = [f for f in diagnose([outside]).findings if f.category == "process_crash"]
    assert lead.title == "SLURM cancelled the job" and "by scancel (a user" in lead.cause
