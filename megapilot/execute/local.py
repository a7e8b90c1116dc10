"""`LocalExecutor`: run a launch script (typically torchrun) on this machine.

How a local job runs:
1. `submit` writes `<run_dir>/<combo>/launch.sh` and starts `bash launch.sh` as the leader of a new
   session, with `MASTER_ADDR`/`MASTER_PORT` set to a free loopback port (torchrun also reads them
   as `PET_MASTER_ADDR`/`PET_MASTER_PORT`, so a script that does not pass `--master-port` still
   avoids 29500) and stdout+stderr going to `out-node0/training.log`.
2. `poll` reads the new log lines (progress, failure clues), records the process tree, and
   enforces the hang window and the wall-clock limit by stopping the job.
3. When the launcher exits, whatever it left running is stopped, and the state is decided:
   COMPLETED needs exit code 0 AND the final iteration in the log; otherwise FAILED with the
   reason (torchrun's root cause: which rank, which signal).

Stopping is always the same: SIGTERM to the job's process group and every process seen in its
tree, a grace period, then SIGKILL (see `megapilot.execute.process`). Jobs still running when the
interpreter exits are stopped too.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from megapilot.errors import MegapilotError
from megapilot.execute.base import (
    Capabilities,
    ExecutorSettings,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    LaunchRequest,
    NodeOutput,
    ProcessesLeft,
    ranks_per_node_variable,
)
from megapilot.execute.container import ContainerWrapper
from megapilot.execute.failure import FailureClues
from megapilot.execute.following import FollowedJob, JobFollower
from megapilot.execute.interrupt import register_force_stop, start_watchdog, unregister_force_stop
from megapilot.execute.process import ProcessTreeWatch, free_port, marked_processes, start_process_group
from megapilot.execute.progress import ProgressTracker, position_text
from megapilot.execute.registry import register_executor
from megapilot.execute.remote import run_node_script, utc_now
from megapilot.execute.rundir import (
    JOB_MARKER_VARIABLE,
    JobRecord,
    RecordedProcess,
    node_log_path,
    read_job_record,
    unstarted_job_dir,
    write_job_record,
    write_launch_script,
)
from megapilot.execute.tail import LogTail

LOOPBACK = "127.0.0.1"
MAX_RECORDED_PROCESSES = 256


@dataclass
class _LocalJob(FollowedJob):
    """Everything the executor tracks about one running job."""

    process: subprocess.Popen[bytes]
    watch: ProcessTreeWatch
    tail: LogTail
    tracker: ProgressTracker
    clues: FailureClues = field(default_factory=FailureClues)
    started_at_s: float = field(default_factory=time.monotonic)
    last_snapshot_s: float = 0.0
    stop_cause: tuple[JobState, str] | None = None
    watchdog: subprocess.Popen[bytes] | None = None


@register_executor
class LocalExecutor(JobFollower[_LocalJob]):
    """Runs jobs as local process trees. One instance can run several jobs at once."""

    name: ClassVar[str] = "local"
    capabilities: ClassVar[Capabilities] = Capabilities(
        launcher="torchrun", runs_here=True, shares_file_system=True, needs_node_list=False, multi_node=False,
        starts_containers=True, allocates_resources=False,
        summary="torchrun on this machine (one node)")

    def __init__(self, *, snapshot_interval_s: float = 1.0, master_addr: str = LOOPBACK,
                 container: ContainerWrapper | None = None):
        self.snapshot_interval_s = snapshot_interval_s
        self.master_addr = master_addr
        self.container = container
        self._jobs: dict[str, _LocalJob] = {}
        atexit.register(self.close)

    @classmethod
    def from_settings(cls, settings: ExecutorSettings) -> LocalExecutor:
        return cls(container=ContainerWrapper.entering(settings.container) if settings.container else None)

    # -- per node -----------------------------------------------------------------------------

    def run_on_nodes(self, script: str, args: list[str], nodes: int) -> list[NodeOutput]:
        return [run_node_script(0, ["bash", "-s", "--", *args], script)]

    def processes_left(self, directory: Path, *, inside: bool = False, kill: bool = True) -> ProcessesLeft:
        left = marked_processes(JOB_MARKER_VARIABLE, str(directory.resolve()), inside=inside)
        if not kill:
            return ProcessesLeft(len(left), f"{len(left)} processes alive: pids {[p.pid for p in left][:10]}")
        for proc in left:
            try:
                proc.kill()
            except Exception:  # noqa: BLE001 - it may have exited meanwhile
                pass
        if left:
            return ProcessesLeft(len(left), f"{len(left)} processes outlived the job and were killed: pids "
                                            f"{[p.pid for p in left][:10]}")
        return ProcessesLeft(0, "no process outlived the job")

    def launch_request(self, *, gpus: bool) -> LaunchRequest:
        return LaunchRequest(launcher="torchrun", note="torchrun uses what this machine has")

    def check_submission(self, job: JobSpec) -> str | None:
        return None

    # -- the protocol -------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobHandle:
        if job.nodes != 1:
            raise MegapilotError(f"the local executor runs on one node, not {job.nodes}", field="nodes",
                                 fix="use nodes=1 locally, or the slurm/ssh executor for several nodes")
        with unstarted_job_dir(job) as created:
            directory = created.resolve()  # absolute: the handle must work from any directory
            launch_script = write_launch_script(job, directory)
            log_path = node_log_path(directory, 0)
            master_port = int(job.env.get("MASTER_PORT") or free_port(self.master_addr))
            env = self._environment(job, master_port)
            # Inside a container the job's own variables pass by name (`-e NAME`); the host's environment stays out.
            names = sorted(name for name in env if os.environ.get(name) != env[name])
            prefix = self.container.argv_prefix(names, str(directory)) if self.container is not None else []
            argv = [*prefix, "bash", str(launch_script.resolve())]
            cwd = (job.cwd or Path.cwd()).resolve()
            submitted_at = utc_now()
            try:
                process = start_process_group(argv, cwd=cwd, env=env, log_path=log_path)
            except OSError as exc:
                raise MegapilotError(f"cannot start the job: {exc}", field="cwd",
                                     fix="check the working directory") from None
        handle = JobHandle(executor=self.name, combo=job.combo, job_id=str(process.pid), job_dir=directory,
                           submitted_at=submitted_at)
        record = JobRecord(
            combo=job.combo, executor=self.name, job_id=handle.job_id, command=argv,
            source_script=str(job.script.resolve()) if job.script else None, cwd=str(cwd),
            env_names=sorted(job.env), master_addr=self.master_addr, master_port=master_port,
            nodes=job.nodes, gpus_per_node=job.gpus_per_node, root_pid=process.pid,
            submitted_at=submitted_at, started_at=submitted_at,
            status=JobStatus(state=JobState.RUNNING, train_iters=job.train_iters),
        )
        started_at_s = time.monotonic()
        local_job = _LocalJob(
            spec=job, handle=handle, record=record, process=process,
            watch=ProcessTreeWatch(process.pid, marker=(JOB_MARKER_VARIABLE, env[JOB_MARKER_VARIABLE])),
            tail=LogTail(log_path), tracker=ProgressTracker(job.hang, started_at_s, job.train_iters),
            started_at_s=started_at_s,
        )
        self._jobs[handle.job_id] = local_job
        local_job.watchdog = start_watchdog(process.pid, JOB_MARKER_VARIABLE, env[JOB_MARKER_VARIABLE])
        register_force_stop(process.pid, lambda: local_job.watch.stop(0.0))
        try:
            self._save_record(local_job)
        except BaseException:  # no job.json (a full disk): the job is not left running where nothing records it
            self._jobs.pop(handle.job_id)
            local_job.watch.stop(job.stop_grace_s)
            self._end_watchdog(local_job)
            raise
        return handle

    def poll(self, handle: JobHandle) -> JobStatus:
        job = self._jobs.get(handle.job_id)
        if job is None:  # started by another executor instance: its job.json is all there is
            return read_job_record(handle.job_dir).status
        if job.status.state.is_terminal:
            return job.status
        now_s = time.monotonic()
        iteration_before = job.tracker.iteration
        self._read_log(job, job.tail.read_new_lines(), now_s)
        processes_changed = False
        if now_s - job.last_snapshot_s >= self.snapshot_interval_s:
            job.last_snapshot_s = now_s
            # New processes, or start-up, when command lines still change (bash exec's the launcher).
            processes_changed = bool(job.watch.snapshot()) or job.tracker.iteration is None
            if processes_changed:
                self._record_processes(job)
        exit_code = job.process.poll()
        if exit_code is not None:
            self._finish(job, exit_code)
        elif (hang_reason := job.tracker.hang_reason(now_s)) is not None:
            self._stop(job, JobState.HUNG, hang_reason)
        elif job.spec.timeout_s is not None and now_s - job.started_at_s > job.spec.timeout_s:
            self._stop(job, JobState.TIMEOUT, f"wall-clock limit of {job.spec.timeout_s:g} s reached "
                                              f"{position_text(job.tracker.iteration, job.tracker.train_iters)}")
        else:
            self._update_status(job, JobState.RUNNING, now_s)
            if processes_changed or job.tracker.iteration != iteration_before:
                self._save_record(job)
        return job.status

    # -- internals ----------------------------------------------------------------------------

    def _environment(self, job: JobSpec, master_port: int) -> dict[str, str]:
        rendezvous = {
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(master_port),
            # torchrun reads any of its flags from PET_<FLAG>: a script without --master-port gets ours.
            "PET_MASTER_ADDR": self.master_addr, "PET_MASTER_PORT": str(master_port),
            "NNODES": str(job.nodes), "NODE_RANK": "0", **ranks_per_node_variable(job),
            "PYTHONUNBUFFERED": "1",  # lines reach the log as they are printed, not when a buffer fills
            # torchrun prefixes each rank's lines ([default<local rank>]:) and keeps per-rank files here.
            "PET_TEE": "3", "PET_LOG_DIR": str((node_log_path(job.job_dir, 0).parent / "ranks").resolve()),
            # Inherited by every process of the job: how the stop finds even orphaned, re-sessioned ones.
            JOB_MARKER_VARIABLE: str(job.job_dir.resolve()), "MEGAPILOT_COMBO": job.combo,
        }
        return {**os.environ, **rendezvous, **job.env}

    def _read_log(self, job: _LocalJob, lines: list[str], now_s: float) -> None:
        for line in lines:
            job.clues.feed(line, job.tracker.feed(line, now_s))

    def _update_status(self, job: _LocalJob, state: JobState, now_s: float, *, exit_code: int | None = None,
                       reason: str | None = None) -> None:
        job.record.status = JobStatus(
            state=state, exit_code=exit_code, reason=reason, iteration=job.tracker.iteration,
            train_iters=job.tracker.train_iters,
            step_time_s=round(job.tracker.step_time_s, 4) if job.tracker.step_time_s is not None else None,
            loss=job.tracker.loss, elapsed_s=round(now_s - job.started_at_s, 3),
        )

    def _stop(self, job: _LocalJob, state: JobState, reason: str) -> None:
        """Stop the job's whole tree for `state` (HUNG, TIMEOUT, CANCELLED), then settle it."""
        job.stop_cause = (state, reason)
        job.record.stop_sent_at = utc_now()  # diagnose tells this stop from one by others
        job.watch.stop(job.spec.stop_grace_s)
        try:
            exit_code = job.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # unkillable (uninterruptible sleep); _finish reports it
            exit_code = job.process.returncode
        self._finish(job, exit_code)

    def _finish(self, job: _LocalJob, exit_code: int | None) -> None:
        """The launcher has exited: stop what it left behind, read the last lines, decide the state."""
        left_behind = [p for p in job.watch.alive() if p.pid != job.process.pid]
        survivors = job.watch.stop(job.spec.stop_grace_s) if left_behind else []
        now_s = time.monotonic()
        self._read_log(job, job.tail.read_rest(), now_s)
        state, reason = self._verdict(job, exit_code)
        notes = [reason] if reason else []
        if left_behind and job.stop_cause is None:
            notes.append(f"stopped {len(left_behind)} process(es) the launcher left running")
        if survivors:
            notes.append("still alive after SIGKILL: " + ", ".join(f"pid {p.pid} ({p.name})" for p in survivors))
        self._update_status(job, state, now_s, exit_code=exit_code, reason="; ".join(notes) or None)
        job.record.ended_at = utc_now()
        self._record_processes(job)
        try:
            self._save_record(job)
        finally:  # even when job.json cannot be written (a full disk), the job is settled
            self._end_watchdog(job)

    @staticmethod
    def _end_watchdog(job: _LocalJob) -> None:
        """The job is settled: its watchdog has nothing left to guard."""
        unregister_force_stop(job.process.pid)
        if job.watchdog is not None and job.watchdog.poll() is None:
            job.watchdog.kill()
            job.watchdog.wait(timeout=5.0)

    def _verdict(self, job: _LocalJob, exit_code: int | None) -> tuple[JobState, str | None]:
        if job.stop_cause is not None:
            return job.stop_cause
        if exit_code is None or exit_code != 0:
            return JobState.FAILED, job.clues.reason(exit_code)
        if not job.spec.require_final_iteration or job.tracker.reached_final_iteration():
            return JobState.COMPLETED, None
        if job.tracker.iteration is None:
            return JobState.FAILED, "exited with code 0 but printed no iteration line"
        return JobState.FAILED, (f"exited with code 0 at iteration {job.tracker.iteration}/"
                                 f"{job.tracker.train_iters}, before the final iteration")

    def _record_processes(self, job: _LocalJob) -> None:
        # The first ones seen are the launcher and its ranks; helpers started later (data loader
        # workers, checkpoint writers) can be many, so job.json keeps a bounded list.
        seen = list(job.watch.history.values())[:MAX_RECORDED_PROCESSES]
        job.record.processes = [RecordedProcess(**vars(info)) for info in seen]

    def _save_record(self, job: _LocalJob) -> None:
        write_job_record(job.handle.job_dir, job.record)
