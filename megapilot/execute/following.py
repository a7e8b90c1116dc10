"""What every executor that follows the jobs it started does the same way.

An executor keeps each job it started (`FollowedJob`: the spec, the handle and the job.json record it keeps
current) and knows how to stop one (`_stop`: its process tree, an scancel, its nodes' processes). The rest of
the protocol's job half is the same for all of them and lives here once: the per-node logs, `cancel` with the
reason the record keeps, the polling `wait`, `result` from the record, and `close` at exit. A job another
instance started (a resumed suite, `megapilot run` in another shell) is known by its job.json alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from megapilot.execute.base import JobHandle, JobResult, JobSpec, JobState, JobStatus, ProgressCallback, wait_by_polling
from megapilot.execute.rundir import JobRecord, node_log_path, read_job_record, result_from_record

EXITED_WHILE_RUNNING = "cancelled: megapilot exited while the job ran"


@dataclass
class FollowedJob:
    """One job an executor started and follows: what it asked for, its handle, and its record (job.json)."""

    spec: JobSpec
    handle: JobHandle
    record: JobRecord

    @property
    def status(self) -> JobStatus:
        return self.record.status


Job = TypeVar("Job", bound=FollowedJob)


class JobFollower(Generic[Job]):
    """logs, cancel, wait, result and close over the jobs in `_jobs`, each stopped by the executor's `_stop`."""

    _jobs: dict[str, Job]

    def _stop(self, job: Job, state: JobState, reason: str) -> None:
        """Stop the job for `state` (CANCELLED, HUNG, TIMEOUT) and settle its record with `reason`."""
        raise NotImplementedError

    def poll(self, handle: JobHandle) -> JobStatus:
        """The job's state now (each executor asks its own processes, scheduler or nodes)."""
        raise NotImplementedError

    def _cancel_unfollowed(self, handle: JobHandle) -> None:
        """Cancel a job this instance did not start; nothing by default (its processes are another's to stop)."""

    def logs(self, handle: JobHandle) -> list[Path]:
        """The per-node training logs, node 0 first."""
        job = self._jobs.get(handle.job_id)
        nodes = job.spec.nodes if job is not None else read_job_record(handle.job_dir).nodes
        return [node_log_path(handle.job_dir, node) for node in range(nodes)]

    def cancel(self, handle: JobHandle, reason: str = "cancelled") -> None:
        """Stop the job and every process it started, recording `reason` as why; idempotent."""
        job = self._jobs.get(handle.job_id)
        if job is None:
            self._cancel_unfollowed(handle)
        elif not job.status.state.is_terminal:
            self._stop(job, JobState.CANCELLED, reason)

    def wait(self, handle: JobHandle, on_progress: ProgressCallback | None = None,
             poll_interval_s: float = 0.5) -> JobResult:
        """Block until the job ends; cancels it, saying why, if the caller is interrupted."""
        return wait_by_polling(self, handle, self.result, on_progress, poll_interval_s)

    def result(self, handle: JobHandle) -> JobResult:
        """How the job ended (its status so far if it has not), without waiting."""
        job = self._jobs.get(handle.job_id)
        record = job.record if job is not None else read_job_record(handle.job_dir)
        return result_from_record(record, handle, self.logs(handle))

    def close(self) -> None:
        """Stop every job still queued or running (also run at interpreter exit): megapilot leaves none behind."""
        for job in list(self._jobs.values()):
            if not job.status.state.is_terminal:
                try:
                    self._stop(job, JobState.CANCELLED, EXITED_WHILE_RUNNING)
                except OSError:  # stopped, only its job.json unwritten (a full disk): the next job is still stopped
                    pass


__all__ = ["EXITED_WHILE_RUNNING", "FollowedJob", "JobFollower"]
