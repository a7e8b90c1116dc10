"""The executor protocol's objects: states, job specs that refuse what cannot run, handles that
survive a round trip through disk, and the shared polling `wait`."""

from __future__ import annotations

import signal
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from megapilot.errors import MegapilotError
from megapilot.execute.base import (
    HangPolicy,
    JobHandle,
    JobResult,
    JobSpec,
    JobState,
    JobStatus,
    job_spec_or_error,
    wait_by_polling,
)
from megapilot.execute.interrupt import Interrupted


def test_only_pending_and_running_are_not_terminal():
    assert {s for s in JobState if not s.is_terminal} == {JobState.PENDING, JobState.RUNNING}


def test_hang_policy_defaults_and_limits():
    policy = HangPolicy()
    assert (policy.startup_s, policy.factor, policy.min_window_s, policy.fixed_window_s) == (900.0, 10.0, 120.0, None)
    with pytest.raises(ValidationError):
        HangPolicy(factor=1.0)  # k x the step time must exceed one step
    with pytest.raises(ValidationError):
        HangPolicy(startup_s=0)
    with pytest.raises(ValidationError):
        HangPolicy(typo_s=5)  # type: ignore[call-arg]  # the typo is the test


def test_job_spec_needs_exactly_one_command(tmp_path: Path):
    assert JobSpec(combo="a", run_dir=tmp_path, argv=["true"]).job_dir == tmp_path / "a"
    with pytest.raises(ValidationError, match="exactly one"):
        JobSpec(combo="a", run_dir=tmp_path)
    with pytest.raises(ValidationError, match="exactly one"):
        JobSpec(combo="a", run_dir=tmp_path, argv=["true"], script_text="true\n")
    with pytest.raises(ValidationError, match="argv is empty"):
        JobSpec(combo="a", run_dir=tmp_path, argv=[])


@pytest.mark.parametrize("combo", ["tp2-pp1", "A.b_c-9", "x" * 128])
def test_combo_names_usable_as_directories_are_accepted(tmp_path: Path, combo: str):
    assert JobSpec(combo=combo, run_dir=tmp_path, argv=["true"]).combo == combo


@pytest.mark.parametrize("combo", ["", "../escape", "a/b", "-rf", ".hidden", "has space", "x" * 129, "é", "tp2\n"])
def test_combo_names_that_are_not_safe_directory_names_are_refused(tmp_path: Path, combo: str):
    with pytest.raises(ValidationError, match="usable directory name"):
        JobSpec(combo=combo, run_dir=tmp_path, argv=["true"])


def test_job_spec_or_error_turns_a_bad_field_into_a_user_error_naming_it(tmp_path: Path):
    with pytest.raises(MegapilotError) as info:
        job_spec_or_error(combo="ok", run_dir=tmp_path, argv=["true"], nodes=0)
    assert info.value.field == "job.nodes"
    assert job_spec_or_error(combo="ok", run_dir=tmp_path, argv=["true"]).nodes == 1


def test_a_handle_and_a_spec_survive_a_json_round_trip(tmp_path: Path):
    handle = JobHandle(executor="local", combo="c", job_id="1234", job_dir=tmp_path / "c",
                       submitted_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    assert JobHandle.model_validate_json(handle.model_dump_json()) == handle
    spec = JobSpec(combo="c", run_dir=tmp_path, argv=["python", "-c", "print(1)"], env={"A": "1"},
                   hang=HangPolicy(fixed_window_s=30))
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec


def _result(state: JobState) -> JobResult:
    return JobResult(combo="c", executor="local", job_id="1", state=state, exit_code=0, reason=None,
                     iterations_reached=None, train_iters=None, step_time_s=None, started_at=None, ended_at=None,
                     duration_s=0.0, job_dir=Path("c"), logs=[])


def test_only_a_completed_job_is_ok():
    assert _result(JobState.COMPLETED).ok
    assert not any(_result(s).ok for s in JobState if s is not JobState.COMPLETED)


class ScriptedExecutor:
    """Answers `poll` from a list of statuses (the polling loop is what is under test, not a job)."""

    name = "scripted"

    def __init__(self, statuses: list[JobStatus]):
        self.statuses = statuses
        self.polls = 0
        self.cancelled = 0
        self.reasons: list[str] = []

    def poll(self, handle: JobHandle) -> JobStatus:
        status = self.statuses[min(self.polls, len(self.statuses) - 1)]
        self.polls += 1
        return status

    def cancel(self, handle: JobHandle, reason: str = "cancelled") -> None:
        self.cancelled += 1
        self.reasons.append(reason)


HANDLE = JobHandle(executor="scripted", combo="c", job_id="1", job_dir=Path("c"), submitted_at=datetime(2026, 1, 1))


def test_wait_reports_each_change_once_and_returns_the_result_at_a_terminal_state():
    executor = ScriptedExecutor([JobStatus(state=JobState.PENDING), JobStatus(state=JobState.RUNNING),
                                 JobStatus(state=JobState.RUNNING, iteration=1), JobStatus(state=JobState.RUNNING,
                                                                                           iteration=1),
                                 JobStatus(state=JobState.RUNNING, iteration=2), JobStatus(state=JobState.COMPLETED,
                                                                                           iteration=2)])
    seen: list[tuple[str, int | None]] = []
    result = wait_by_polling(executor, HANDLE, lambda h: _result(JobState.COMPLETED),  # type: ignore[arg-type]  # a stub executor
                             lambda s: seen.append((s.state.value, s.iteration)), poll_interval_s=0)
    assert result.ok and executor.polls == 6 and executor.cancelled == 0
    assert seen == [("PENDING", None), ("RUNNING", None), ("RUNNING", 1), ("RUNNING", 2), ("COMPLETED", 2)]


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_error_in_the_callback_cancels_the_job_and_propagates(error: type[BaseException]):
    executor = ScriptedExecutor([JobStatus(state=JobState.RUNNING)])

    def explode(_status: JobStatus) -> None:
        raise error()

    with pytest.raises(error):
        wait_by_polling(executor, HANDLE, lambda h: _result(JobState.COMPLETED), explode,
                        poll_interval_s=0)  # type: ignore[arg-type]  # a stub executor
    assert executor.cancelled == 1


@pytest.mark.parametrize(("error", "said"), [
    (Interrupted(signal.SIGTERM), "interrupted by SIGTERM at iteration 7 of 20; the run was stopped"),
    (KeyboardInterrupt(), "interrupted by Ctrl-C (SIGINT) at iteration 7 of 20; the run was stopped"),
    (RuntimeError("progress display  broke"), "cancelled: following the job failed (RuntimeError: progress display "
                                               "broke)"),
])
def test_a_stopped_job_records_what_stopped_it_and_the_iteration_last_seen(error: BaseException, said: str):
    # the job's record says by which signal (and where), not a bare "cancelled" a reader must guess the cause of
    executor = ScriptedExecutor([JobStatus(state=JobState.RUNNING, iteration=7, train_iters=20)])

    def stop(_status: JobStatus) -> None:
        raise error

    with pytest.raises(type(error)):
        wait_by_polling(executor, HANDLE, lambda h: _result(JobState.COMPLETED), stop,
                        poll_interval_s=0)  # type: ignore[arg-type]  # a stub executor
    assert executor.reasons == [said]
