"""The lifecycle stopped in the middle, without training: jobs are written by a stand-in executor (a log of the
iterations they reached, a job.json), and the stop signal arrives while one is polled, as Ctrl-C does.

The run ends INTERRUPTED in suite.json with the combo (or stage) it stopped in, its iterations and partial log;
what suite.json held while that job ran (what a SIGKILL leaves) says the same once settled; a resume runs the
stopped combo or stage again and keeps the rest. The real signals are sent in tests/faults."""

from __future__ import annotations

import json
import shutil
import signal
from datetime import datetime, timezone
from pathlib import Path

import pytest

from megapilot.execute.base import JobHandle, JobSpec, JobState, JobStatus
from megapilot.execute.interrupt import Interrupted
from megapilot.execute.local import LocalExecutor
from megapilot.execute.rundir import (
    JobRecord,
    node_log_path,
    prepare_job_dir,
    read_job_record,
    result_from_record,
    write_job_record,
)
from megapilot.suite.config import LoadedSuite, load_suite
from megapilot.suite.interruption import settle
from megapilot.suite.lifecycle import RunRequest, run_suite
from megapilot.suite.outcome import RunStatus, run_outcome
from megapilot.suite.results import NOT_RUN_REASON, SuiteResult, Verdict, read_suite_result
from megapilot.suite.templates import template_path
from tests.suite.conftest import falling_steps, iteration_lines

FIRST, SECOND = "MBS=1,GBS=8,PRECISION=BF16", "MBS=2,GBS=8,PRECISION=BF16"
NOW = datetime(2026, 12, 6, 3, 50, tzinfo=timezone.utc)


class StandInExecutor(LocalExecutor):
    """Jobs that log their iterations at once; job number `stop_at` has reached `reached` when the signal comes
    (suite.json as it stood then is copied to `left`), every other one completes."""

    def __init__(self, *, stop_at: int | None = None, reached: int = 10, signum: int = signal.SIGINT,
                 left: Path | None = None, step_ms: float = 100.0):
        super().__init__()
        self.stop_at, self.reached, self.signum, self.left = stop_at, reached, signum, left
        self.step_ms = step_ms
        self.submitted: list[str] = []

    def submit(self, job: JobSpec) -> JobHandle:
        self.submitted.append(job.combo)
        directory = prepare_job_dir(job)
        total = job.train_iters or 20
        stops = len(self.submitted) == self.stop_at
        steps = self.reached if stops else total
        node_log_path(directory, 0).write_text(
            "\n".join(iteration_lines(falling_steps(1, steps, elapsed_ms=self.step_ms), train_iters=total)) + "\n",
            encoding="utf-8")
        state = JobState.RUNNING if stops else JobState.COMPLETED
        write_job_record(directory, JobRecord(
            combo=job.combo, executor="local", job_id=str(len(self.submitted)), command=["bash", "launch.sh"],
            cwd=str(directory), nodes=job.nodes, gpus_per_node=job.gpus_per_node, submitted_at=NOW, started_at=NOW,
            status=JobStatus(state=state, exit_code=None if stops else 0, iteration=steps, train_iters=total,
                             elapsed_s=steps * self.step_ms / 1000)))
        return JobHandle(executor="local", combo=job.combo, job_id=str(len(self.submitted)), job_dir=directory,
                         submitted_at=NOW)

    def poll(self, handle: JobHandle) -> JobStatus:
        status = read_job_record(handle.job_dir).status
        if not status.state.is_terminal:
            if self.left is not None:
                shutil.copyfile(handle.job_dir.parent / "suite.json", self.left)
            raise Interrupted(self.signum)
        return status

    def logs(self, handle: JobHandle) -> list[Path]:
        return [node_log_path(handle.job_dir, 0)]

    def cancel(self, handle: JobHandle, reason: str = "cancelled") -> None:
        record = read_job_record(handle.job_dir)
        if not record.status.state.is_terminal:
            record.status = record.status.model_copy(update={"state": JobState.CANCELLED, "reason": reason})
            write_job_record(handle.job_dir, record)

    def result(self, handle: JobHandle):  # type: ignore[no-untyped-def]  # the base's JobResult
        return result_from_record(read_job_record(handle.job_dir), handle, self.logs(handle))


@pytest.fixture
def suite(tmp_path: Path) -> LoadedSuite:
    config = json.loads(template_path("tiny-local").read_text())
    config["threshold_json"] = str(template_path("tiny-local").with_name("tiny-local_threshold.json"))
    config["smoke"]["iters"] = 5
    (tmp_path / "suite.json").write_text(json.dumps(config))
    return load_suite(tmp_path / "suite.json")


def test_ctrl_c_in_the_first_combo_leaves_it_interrupted_with_its_iterations_and_log(suite, tmp_path):
    left = tmp_path / "left-by-a-kill.json"
    result = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="train"),
                       StandInExecutor(stop_at=1, reached=10, left=left))
    assert not result.finished and result.verdict is Verdict.INTERRUPTED and result.stopped_by == "SIGINT"
    combo = result.interrupted_combo()
    assert combo is not None and combo.key == FIRST and [c.key for c in result.combos] == [FIRST]
    assert combo.job is not None and (combo.job.iterations_reached, combo.job.train_iters) == (10, 20)
    assert combo.job.state == "CANCELLED" and combo.job.logs == ["MBS1_GBS8_BF16/out-node0/training.log"]
    assert combo.reason == "interrupted at iteration 10 of 20 by SIGINT"
    assert combo.log_tail and " iteration       10/      20 |" in combo.log_tail[-1]
    record = read_job_record(Path(result.run_dir) / "MBS1_GBS8_BF16")
    # the signal came in the job's first poll: no iteration was read yet (the record's own count says 10)
    assert record.status.reason == ("interrupted by Ctrl-C (SIGINT) before an iteration line was read; the run was "
                                    "stopped") and record.status.iteration == 10
    rows = [(s.name, s.verdict, s.reason) for s in result.stages if s.combo == FIRST]
    assert rows == [("train", Verdict.INTERRUPTED, combo.reason), ("metrics", Verdict.SKIPPED, NOT_RUN_REASON),
                    ("loss_curve", Verdict.SKIPPED, NOT_RUN_REASON)]
    assert result.not_started() == [SECOND]
    outcome = run_outcome(result)
    assert (outcome.status, outcome.exit_code) == (RunStatus.INTERRUPTED, 130)
    assert outcome.summary == result.reason == (
        f"stopped by SIGINT during combo 1 of 2 ({FIRST}: train, iteration 10 of 20); what finished: all PASS; "
        "not started: 1 combo")
    stored = json.loads((Path(result.run_dir) / "suite.json").read_text())
    assert (stored["verdict"], stored["finished"], stored["stopped_by"]) == ("INTERRUPTED", False, "SIGINT")

    # what a SIGKILL at that moment leaves: the combo running, its job just submitted; settled, it says the same
    killed = SuiteResult.model_validate_json(left.read_text())
    assert killed.verdict is Verdict.INTERRUPTED and killed.stopped_by is None
    assert killed.interrupted_combo() is not None and killed.interrupted_combo().job.state == "RUNNING"  # type: ignore[union-attr]
    settle(killed, Path(result.run_dir))
    assert killed.interrupted_combo().job.iterations_reached == 10  # type: ignore[union-attr]
    assert run_outcome(killed).summary.startswith(
        f"stopped (no signal seen: killed outright, or still running) during combo 1 of 2 ({FIRST}: train, "
        "iteration 10 of 20); what finished: all PASS")


def test_sigterm_in_the_second_combo_keeps_the_first_and_a_resume_runs_only_the_second_again(suite, tmp_path):
    stopped = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="train"),
                        StandInExecutor(stop_at=2, reached=3, signum=signal.SIGTERM))
    assert [(c.key, c.verdict) for c in stopped.combos] == [(FIRST, stopped.combos[0].verdict),
                                                            (SECOND, Verdict.INTERRUPTED)]
    assert stopped.combos[0].verdict is not Verdict.INTERRUPTED and stopped.not_started() == []
    assert run_outcome(stopped).exit_code == 143 and "during combo 2 of 2" in stopped.reason
    first_job = stopped.combos[0].job

    again = StandInExecutor()
    resumed = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="train",
                                          resume_from=read_suite_result(Path(stopped.run_dir))), again)
    assert resumed.finished and resumed.verdict is not Verdict.INTERRUPTED and resumed.stopped_by is None
    assert again.submitted == ["MBS2_GBS8_BF16"]  # the stopped combo alone ran again
    assert [c.key for c in resumed.combos] == [FIRST, SECOND] and resumed.combos[0].job == first_job
    assert resumed.combos[1].job is not None and resumed.combos[1].job.iterations_reached == 20
    assert not [s for s in resumed.stages if s.verdict is Verdict.INTERRUPTED]
    assert [s.name for s in resumed.stages if s.combo == SECOND] == ["train", "metrics", "loss_curve"]


def test_a_stop_in_the_smoke_stage_is_that_stage_interrupted_and_a_resume_runs_it_again(suite, tmp_path):
    stopped = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="smoke"),
                        StandInExecutor(stop_at=1, reached=3))
    smoke = stopped.interrupted_stage()
    assert smoke is not None and smoke.name == "smoke" and stopped.interrupted_combo() is None
    assert smoke.jobs and smoke.jobs[0].iterations_reached == 3
    assert smoke.reason == "interrupted by SIGINT (job smoke, at iteration 3 of 5)"
    assert "during stage smoke (iteration 3 of 5)" in stopped.reason
    assert [s.name for s in stopped.stages][-1] == "smoke"  # checkpoint, results and teardown never began

    again = StandInExecutor()
    resumed = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="smoke",
                                          resume_from=read_suite_result(Path(stopped.run_dir))), again)
    assert resumed.finished and again.submitted == ["smoke"]
    assert next(s for s in resumed.stages if s.name == "smoke").verdict is not Verdict.INTERRUPTED


class FatalLineExecutor(StandInExecutor):
    """The first job prints an out-of-memory error at iteration 3 and runs on: the suite's watch must stop it."""

    def submit(self, job: JobSpec) -> JobHandle:
        handle = super().submit(job)
        if len(self.submitted) == 1:
            with node_log_path(handle.job_dir, 0).open("a", encoding="utf-8") as log:
                log.write("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        return handle

    def poll(self, handle: JobHandle) -> JobStatus:
        return read_job_record(handle.job_dir).status  # never a signal: the job runs until it is stopped


def test_a_job_stopped_at_its_fatal_line_records_that_line_as_why(suite, tmp_path):
    executor = FatalLineExecutor(stop_at=1, reached=3)
    result = run_suite(suite, RunRequest(out_dir=tmp_path / "runs", only_stage="train"), executor)
    assert result.finished and executor.submitted == ["MBS1_GBS8_BF16", "MBS2_GBS8_BF16"]
    record = read_job_record(Path(result.run_dir) / "MBS1_GBS8_BF16")
    assert record.status.state is JobState.CANCELLED
    assert record.status.reason is not None and record.status.reason.startswith("stopped at a fatal error: ")
    assert "out of memory" in record.status.reason.lower()
