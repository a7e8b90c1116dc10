"""The job half every following executor shares: cancel with its reason, a job another instance started known by
its job.json, and close stopping every job even when one's record cannot be written."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from megapilot.execute.base import JobHandle, JobSpec, JobState, JobStatus
from megapilot.execute.following import EXITED_WHILE_RUNNING, FollowedJob, JobFollower
from megapilot.execute.rundir import JobRecord, prepare_job_dir, write_job_record

NOW = datetime(2026, 12, 6, tzinfo=timezone.utc)


class Follower(JobFollower[FollowedJob]):
    """Stops a job by settling its record; the first `full_disks` stops fail to write it."""

    def __init__(self, full_disks: int = 0):
        self._jobs = {}
        self.full_disks = full_disks
        self.unfollowed: list[str] = []

    def start(self, tmp_path: Path, combo: str, nodes: int = 1) -> JobHandle:
        spec = JobSpec(combo=combo, run_dir=tmp_path, argv=["true"], nodes=nodes)
        handle = JobHandle(executor="follower", combo=combo, job_id=combo, job_dir=prepare_job_dir(spec),
                           submitted_at=NOW)
        record = JobRecord(combo=combo, executor="follower", command=["true"], cwd=".", nodes=nodes, gpus_per_node=1,
                           submitted_at=NOW, status=JobStatus(state=JobState.RUNNING))
        write_job_record(handle.job_dir, record)
        self._jobs[combo] = FollowedJob(spec=spec, handle=handle, record=record)
        return handle

    def _stop(self, job: FollowedJob, state: JobState, reason: str) -> None:
        job.record.status = JobStatus(state=state, reason=reason)
        if self.full_disks:
            self.full_disks -= 1
            raise OSError(28, "No space left on device")
        write_job_record(job.handle.job_dir, job.record)

    def _cancel_unfollowed(self, handle: JobHandle) -> None:
        self.unfollowed.append(handle.job_id)


def test_cancel_records_its_reason_once_and_a_job_of_another_instance_goes_to_its_own_hook(tmp_path):
    follower = Follower()
    handle = follower.start(tmp_path, "a")
    follower.cancel(handle, "interrupted by SIGTERM at iteration 3 of 20; the run was stopped")
    follower.cancel(handle, "a later reason")  # idempotent: the first stop's reason stands
    assert follower.result(handle).reason == "interrupted by SIGTERM at iteration 3 of 20; the run was stopped"
    other = handle.model_copy(update={"job_id": "started-elsewhere"})
    follower.cancel(other)
    assert follower.unfollowed == ["started-elsewhere"]


def test_a_job_another_instance_started_is_read_from_its_job_json(tmp_path):
    handle = Follower().start(tmp_path, "two-nodes", nodes=2)
    fresh = Follower()  # knows nothing of the job but its directory
    assert fresh.logs(handle) == [handle.job_dir / "out-node0" / "training.log",
                                  handle.job_dir / "out-node1" / "training.log"]
    assert fresh.result(handle).state == JobState.RUNNING


def test_close_stops_every_job_even_when_one_record_cannot_be_written(tmp_path):
    follower = Follower(full_disks=1)
    first, second = follower.start(tmp_path, "a"), follower.start(tmp_path, "b")
    follower.close()
    assert [follower.result(h).state for h in (first, second)] == [JobState.CANCELLED, JobState.CANCELLED]
    assert follower.result(second).reason == EXITED_WHILE_RUNNING
