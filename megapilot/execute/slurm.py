"""`SlurmExecutor`: submit a launch script with `sbatch`, follow it with `squeue`/`sacct`, stop it with `scancel`.

How a SLURM job runs:
1. `submit` writes `<job_dir>/launch.sh` (typically the sbatch script `megapilot.launch` renders
   with launcher "slurm": one `srun` torchrun per node) and runs `sbatch --parsable` with
   `--chdir`, `--nodes` (the JobSpec's node count) and `--output` pointing at
   `out-node0/training.log`, in append mode (command-line options win over the script's
   `#SBATCH` lines). Per-node logs come from `srun`: the batch environment carries
   `SLURM_STDOUTMODE=<job_dir>/out-node%n/training.log` (srun's `--output`, `%n` the node's index
   in the job, stderr to the same file), so every step's node N appends to
   `out-node<N>/training.log`; node 0's file also holds the batch script's own lines (srun's
   "task N: Exited with exit code" reports among them).
2. `poll` asks SLURM where the job is (see `SlurmQueue`: one `squeue` for all of this executor's
   jobs per refresh, then `sacct` — accounting, else the job-completion log — or `scontrol`
   once a job has left the queue, with a backoff), reads the new log lines for progress, and
   enforces the hang window and the wall-clock limit with `scancel`.
3. A finished SLURM state maps to a JobState; COMPLETED still needs the final iteration in a log.

The SLURM client commands run with the constructor's environment on top of this process's, so a
caller (or a test) can point them at a cluster with SLURM_CONF.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.errors import MegapilotError
from megapilot.execute.base import (
    JobHandle,
    JobResult,
    JobSpec,
    JobState,
    JobStatus,
    ProgressCallback,
    wait_by_polling,
)
from megapilot.execute.failure import describe_exit_code
from megapilot.execute.remote import NodeLogs, utc_now
from megapilot.execute.rundir import (
    JOB_MARKER_VARIABLE,
    JobRecord,
    node_log_path,
    prepare_job_dir,
    read_job_record,
    result_from_record,
    write_job_record,
    write_launch_script,
)

# SLURM job states, by what they mean for the job here.
_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED",
            "RESIZING"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED"}
# state -> (JobState, reason); COMPLETED and FAILED are decided with the logs (see _verdict).
_ENDED: dict[str, tuple[JobState, str]] = {
    "CANCELLED": (JobState.CANCELLED, "cancelled in SLURM (scancel or an administrator)"),
    "TIMEOUT": (JobState.TIMEOUT, "SLURM time limit reached"),
    "DEADLINE": (JobState.TIMEOUT, "SLURM deadline reached"),
    "NODE_FAIL": (JobState.FAILED, "node failure"),
    "BOOT_FAIL": (JobState.FAILED, "node boot failure"),
    "OUT_OF_MEMORY": (JobState.FAILED, "out of memory (killed by SLURM)"),
    "PREEMPTED": (JobState.FAILED, "preempted by SLURM"),
    "REVOKED": (JobState.FAILED, "revoked by SLURM (federation)"),
    "SPECIAL_EXIT": (JobState.FAILED, "special exit (requeue hold)"),
}
_NODE_NAMED = {"NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"}


@dataclass(frozen=True)
class SlurmJobState:
    """Where SLURM says a job is: its state word, exit code and signal, nodes and reason."""

    state: str
    exit_code: int | None = None
    signal: int | None = None
    nodes: str = ""
    reason: str = ""

    @property
    def base_state(self) -> str:
        # "CANCELLED by 0" (sacct), "CANCELLED+" (truncated): the first word is the state.
        return self.state.split()[0].rstrip("+") if self.state else ""


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """SLURM's `exit:signal` pair ('1:0', '0:15') as numbers."""
    code, _, signal = text.strip().partition(":")
    try:
        return int(code), int(signal or 0)
    except ValueError:
        return None, None


def parse_scontrol_job(text: str) -> SlurmJobState | None:
    """`scontrol show job -o ID`: Key=Value words on one line."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if "JobState" not in fields:
        return None
    exit_code, signal = parse_exit_code(fields.get("ExitCode", ""))
    return SlurmJobState(state=fields["JobState"], exit_code=exit_code, signal=signal,
                         nodes=fields.get("NodeList", ""), reason=fields.get("Reason", ""))


class SlurmClient:
    """The SLURM commands, run as argv lists with a fixed extra environment (SLURM_CONF...)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 60.0):
        self.env = dict(env or {})
        self.timeout_s = timeout_s

    def run(self, *argv: str, extra_env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, **self.env, **(extra_env or {})}
        try:
            return subprocess.run(list(argv), env=environment, capture_output=True, text=True,
                                  timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise MegapilotError(f"{argv[0]} not found", field="executor",
                                 fix="run on a SLURM login node (sbatch, squeue, sacct and scancel on PATH)") from None
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} timed out after {self.timeout_s:g} s")

    def queue(self, job_ids: Sequence[str]) -> dict[str, SlurmJobState] | None:
        """Jobs still in the queue (pending or running); None when squeue could not answer."""
        done = self.run("squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N")
        if done.returncode != 0:
            # Every id already purged: squeue calls that an error; it only means "none queued".
            return {} if "Invalid job id" in done.stderr else None
        states = {}
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 4:
                states[parts[0]] = SlurmJobState(state=parts[1], reason=parts[2], nodes=parts[3])
        return states

    def finished(self, job_id: str) -> SlurmJobState | None:
        """A job that left the queue: sacct (accounting, else the completion log), else scontrol."""
        for completion in (False, True):
            argv = ["sacct", *(["-c"] if completion else ["-X"]), "-j", job_id, "-n", "-P",
                    "-o", "JobID,State,ExitCode,NodeList"]
            done = self.run(*argv)
            if done.returncode == 0:
                for line in done.stdout.splitlines():
                    parts = line.split("|")
                    if len(parts) == 4 and parts[0] == job_id and parts[1]:
                        exit_code, signal = parse_exit_code(parts[2])
                        return SlurmJobState(state=parts[1], exit_code=exit_code, signal=signal, nodes=parts[3])
        done = self.run("scontrol", "show", "job", "-o", job_id)
        return parse_scontrol_job(done.stdout) if done.returncode == 0 else None

    def cancel(self, job_id: str) -> None:
        self.run("scancel", job_id)


class SlurmQueue:
    """Batches and spaces out the questions to SLURM, so following 64 jobs stays cheap.

    One `squeue` answers for every job still followed, at most every `refresh_s`. A job that
    has left the queue is looked up in `sacct`/`scontrol`; until one of them knows it (accounting
    lags) the lookups back off from `refresh_s` doubling up to `max_interval_s`.
    """

    def __init__(self, client: SlurmClient, refresh_s: float, max_interval_s: float):
        self.client = client
        self.refresh_s = refresh_s
        self.max_interval_s = max_interval_s
        self._queued: dict[str, SlurmJobState] = {}
        self._queried_at_s: float | None = None
        self._lookup_after_s: dict[str, float] = {}
        self._lookup_gap_s: dict[str, float] = {}
        self.squeue_calls = 0

    def state(self, job_id: str, followed: Sequence[str], now_s: float, *, fresh: bool = False) -> SlurmJobState | None:
        """SLURM's word on the job; None when nothing knows it (yet)."""
        if fresh or self._queried_at_s is None or now_s - self._queried_at_s >= self.refresh_s:
            answer = self.client.queue(sorted(set(followed) | {job_id}))
            self.squeue_calls += 1
            if answer is None:  # squeue failed (controller busy): keep the last answer
                return self._queued.get(job_id)
            self._queued, self._queried_at_s = answer, now_s
        if job_id in self._queued:
            return self._queued[job_id]
        if not fresh and now_s < self._lookup_after_s.get(job_id, 0.0):
            return None
        found = self.client.finished(job_id)
        if found is None:
            gap_s = min(self.max_interval_s, self._lookup_gap_s.get(job_id, self.refresh_s / 2) * 2)
            self._lookup_gap_s[job_id] = gap_s
            self._lookup_after_s[job_id] = now_s + gap_s
        return found


@dataclass
class _SlurmJob:
    spec: JobSpec
    handle: JobHandle
    record: JobRecord
    logs: NodeLogs
    submitted_at_s: float
    started_at_s: float | None = None
    last_known_s: float = field(default_factory=time.monotonic)
    stop_cause: tuple[JobState, str] | None = None

    @property
    def status(self) -> JobStatus:
        return self.record.status


class SlurmExecutor:
    """Runs jobs through a SLURM controller. One instance follows many jobs.

    `env`: extra environment for every SLURM command (e.g. {"SLURM_CONF": ...}); `sbatch_options`:
    more sbatch words (`--partition=gpu`, `--account=...`) put before the script; `refresh_s`:
    at most one squeue per this many seconds; `vanish_grace_s`: how long a job may be known to
    neither squeue nor sacct/scontrol before it counts as lost.
    """

    name = "slurm"

    def __init__(self, *, env: Mapping[str, str] | None = None, sbatch_options: Sequence[str] = (),
                 refresh_s: float = 2.0, max_lookup_interval_s: float = 30.0, vanish_grace_s: float = 120.0,
                 command_timeout_s: float = 60.0, cancel_wait_s: float = 60.0):
        self.client = SlurmClient(env, timeout_s=command_timeout_s)
        self.queue = SlurmQueue(self.client, refresh_s, max_lookup_interval_s)
        self.sbatch_options = list(sbatch_options)
        self.vanish_grace_s = vanish_grace_s
        self.cancel_wait_s = cancel_wait_s
        self._jobs: dict[str, _SlurmJob] = {}

    # -- the protocol -------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobHandle:
        directory = prepare_job_dir(job).resolve()
        _check_slurm_path(directory)
        launch = write_launch_script(job, directory)
        cwd = (job.cwd or directory).resolve()
        argv = ["sbatch", "--parsable", f"--chdir={cwd}", f"--nodes={job.nodes}",
                f"--output={node_log_path(directory, 0)}", "--open-mode=append", *self.sbatch_options, str(launch)]
        submitted_at = utc_now()
        done = self.client.run(*argv, extra_env=self._job_environment(job, directory))
        if done.returncode != 0:
            message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            raise MegapilotError(f"sbatch refused the job: {message}", field="script",
                                 fix="check the #SBATCH lines (partition, nodes, time) against the cluster")
        job_id = done.stdout.strip().split(";")[0]
        handle = JobHandle(executor=self.name, combo=job.combo, job_id=job_id, job_dir=directory,
                           submitted_at=submitted_at)
        record = JobRecord(
            combo=job.combo, executor=self.name, job_id=job_id, command=argv,
            source_script=str(job.script.resolve()) if job.script else None, cwd=str(cwd),
            env_names=sorted(job.env), nodes=job.nodes, gpus_per_node=job.gpus_per_node,
            submitted_at=submitted_at, status=JobStatus(state=JobState.PENDING, train_iters=job.train_iters),
        )
        now_s = time.monotonic()
        self._jobs[job_id] = _SlurmJob(spec=job, handle=handle, record=record, submitted_at_s=now_s,
                                       logs=NodeLogs(directory, job.nodes, job.hang, now_s, job.train_iters))
        write_job_record(directory, record)
        return handle

    def poll(self, handle: JobHandle) -> JobStatus:
        job = self._jobs.get(handle.job_id)
        if job is None:  # submitted by another executor instance: its job.json is all there is
            return read_job_record(handle.job_dir).status
        if job.status.state.is_terminal:
            return job.status
        now_s = time.monotonic()
        iteration_before, state_before = job.logs.iteration, job.status.state
        slurm = self.queue.state(handle.job_id, self._followed(), now_s)
        if slurm is not None:
            job.last_known_s = now_s
        if slurm is not None and slurm.base_state in _RUNNING and job.started_at_s is None:
            self._mark_started(job, now_s)
        job.logs.read_new(now_s)
        if slurm is not None and slurm.base_state not in _WAITING | _RUNNING:
            self._finish(job, slurm)
        elif slurm is None and now_s - job.last_known_s > self.vanish_grace_s:
            self._settle(job, JobState.FAILED, f"SLURM job {handle.job_id} left the queue and neither sacct nor "
                                               f"scontrol knows how it ended", now_s)
        elif job.started_at_s is not None and (hang := job.logs.hang_reason(now_s)) is not None:
            self._stop(job, JobState.HUNG, hang)
        elif (job.spec.timeout_s is not None and job.started_at_s is not None
              and now_s - job.started_at_s > job.spec.timeout_s):
            self._stop(job, JobState.TIMEOUT, f"wall-clock limit of {job.spec.timeout_s:g} s reached at "
                                              f"iteration {job.logs.iteration}/{job.logs.leader.tracker.train_iters}")
        else:
            state = JobState.RUNNING if job.started_at_s is not None else JobState.PENDING
            reason = slurm.reason if state is JobState.PENDING and slurm and slurm.reason not in ("", "None") else None
            job.record.status = job.logs.status(state, now_s, job.started_at_s or now_s, reason=reason)
            if job.logs.iteration != iteration_before or state is not state_before:
                write_job_record(handle.job_dir, job.record)
        return job.status

    def logs(self, handle: JobHandle) -> list[Path]:
        job = self._jobs.get(handle.job_id)
        nodes = job.spec.nodes if job is not None else read_job_record(handle.job_dir).nodes
        return [node_log_path(handle.job_dir, node) for node in range(nodes)]

    def cancel(self, handle: JobHandle) -> None:
        job = self._jobs.get(handle.job_id)
        if job is None:
            self.client.cancel(handle.job_id)
        elif not job.status.state.is_terminal:
            self._stop(job, JobState.CANCELLED, "cancelled")

    def wait(self, handle: JobHandle, on_progress: ProgressCallback | None = None,
             poll_interval_s: float = 0.5) -> JobResult:
        return wait_by_polling(self, handle, self.result, on_progress, poll_interval_s)

    def result(self, handle: JobHandle) -> JobResult:
        job = self._jobs.get(handle.job_id)
        record = job.record if job is not None else read_job_record(handle.job_dir)
        return result_from_record(record, handle, self.logs(handle))

    # -- internals ----------------------------------------------------------------------------

    def _job_environment(self, job: JobSpec, directory: Path) -> dict[str, str]:
        """What sbatch exports into the batch script (its default --export=ALL) and so into srun."""
        return {
            "SLURM_STDOUTMODE": str(directory / "out-node%n" / "training.log"),
            "SLURM_OPEN_MODE": "append",
            "PYTHONUNBUFFERED": "1", "PET_TEE": "3",
            JOB_MARKER_VARIABLE: str(directory), "MEGAPILOT_COMBO": job.combo,
            **job.env,
        }

    def _followed(self) -> list[str]:
        return [job_id for job_id, job in self._jobs.items() if not job.status.state.is_terminal]

    def _mark_started(self, job: _SlurmJob, now_s: float) -> None:
        job.started_at_s = now_s
        job.record.started_at = utc_now()
        # The hang clock starts when the job starts running, not while it waits in the queue.
        for node in job.logs.nodes:
            node.tracker.started_at_s = now_s

    def _stop(self, job: _SlurmJob, state: JobState, reason: str) -> None:
        """scancel the job for `state` (HUNG, TIMEOUT, CANCELLED) and wait until it left the queue."""
        job.stop_cause = (state, reason)
        self.client.cancel(job.handle.job_id)
        deadline_s = time.monotonic() + self.cancel_wait_s
        slurm = None
        while time.monotonic() < deadline_s:
            slurm = self.queue.state(job.handle.job_id, self._followed(), time.monotonic(), fresh=True)
            if slurm is not None and slurm.base_state not in _WAITING | _RUNNING:
                break
            time.sleep(0.5)
        else:
            reason += f"; still in the SLURM queue {self.cancel_wait_s:g} s after scancel"
            job.stop_cause = (state, reason)
        self._finish(job, slurm)

    def _finish(self, job: _SlurmJob, slurm: SlurmJobState | None) -> None:
        now_s = time.monotonic()
        job.logs.read_rest(now_s)
        state, reason = self._verdict(job, slurm)
        exit_code = slurm.exit_code if slurm is not None else None
        self._settle(job, state, reason, now_s, exit_code=exit_code)

    def _settle(self, job: _SlurmJob, state: JobState, reason: str | None, now_s: float,
                exit_code: int | None = None) -> None:
        job.record.status = job.logs.status(state, now_s, job.started_at_s or now_s, exit_code=exit_code,
                                            reason=reason)
        job.record.ended_at = utc_now()
        write_job_record(job.handle.job_dir, job.record)

    def _verdict(self, job: _SlurmJob, slurm: SlurmJobState | None) -> tuple[JobState, str | None]:
        if job.stop_cause is not None:
            return job.stop_cause
        assert slurm is not None
        return slurm_verdict(slurm, job.logs, job.spec.require_final_iteration)


def slurm_verdict(slurm: SlurmJobState, logs: NodeLogs, require_final_iteration: bool = True,
                  ) -> tuple[JobState, str | None]:
    """The JobState and reason of a job SLURM reports ended; COMPLETED also needs the final iteration."""
    word = slurm.base_state
    if word == "COMPLETED":
        return logs.clean_exit_verdict(require_final_iteration)
    if word in _ENDED:
        state, reason = _ENDED[word]
        if word in _NODE_NAMED and slurm.nodes:
            reason += f" on {slurm.nodes}"
        return state, f"{reason} ({slurm.state})" if slurm.state != word else reason
    how = describe_exit_code(slurm.exit_code) if slurm.exit_code is not None else "an unknown exit"
    if slurm.signal:
        how += f", signal {slurm.signal}"
    clue = logs.failure_reason(None, None)
    return JobState.FAILED, f"SLURM {word}: {how}" + (f"; {clue}" if clue != "failed" else "")


def _check_slurm_path(directory: Path) -> None:
    # sbatch/srun read % and \ in --output as filename patterns and escapes.
    if "%" in str(directory) or "\\" in str(directory):
        raise MegapilotError(f"{directory} holds '%' or '\\', which SLURM reads as a filename pattern",
                             field="run_dir", fix="choose a run directory without '%' and '\\'")
