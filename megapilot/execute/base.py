"""The executor protocol: one typed way to run a training job, wherever it runs.

Every executor (local torchrun, SLURM, SSH to nodes) takes a `JobSpec`, returns a `JobHandle` from
`submit`, answers `poll` with a `JobStatus`, lists the per-node logs, cancels, and `wait`s to a
`JobResult`. A validation sweep drives many combos through the same five calls, so the objects
here are plain serialisable pydantic models: a handle written to disk can be polled again later
(by a SLURM executor in another process, say).

States, and who decides them:

    PENDING ──► RUNNING ──► COMPLETED   exit code 0 AND the final iteration reached
                       ├──► FAILED      non-zero exit, a rank killed, or exit 0 short of train_iters
                       ├──► HUNG        no new iteration line within the hang window (see HangPolicy)
                       ├──► TIMEOUT     the job's wall-clock limit passed
                       └──► CANCELLED   `cancel()` (or Ctrl-C / an error in the caller)

The executor stops the job's whole process tree itself for HUNG, TIMEOUT and CANCELLED, so a
caller never has to clean up after it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from megapilot.compat import StrEnum
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.execute.interrupt import stop_reason

# A combo name becomes a directory name: keep it to characters every filesystem and shell accepts.
# `\Z`, not `$`: `$` also matches before a final newline, which would let "name\n" through.
COMBO_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


# How long a queued job may wait on drained or down nodes: the preflight found them in service, so someone took
# them out since (a bad DIMM, a maintenance), and a validation run should say so, not wait for hours.
DEFAULT_BLOCKED_IN_QUEUE_S = 600.0


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    HUNG = "HUNG"

    @property
    def is_terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


class HangPolicy(BaseModel):
    """When a job that prints no new iteration line counts as hung.

    Before the first iteration line the job has `startup_s` (imports, rendezvous, model build and
    data loading are slow and vary). After it, the window is `factor` × the observed time between
    iteration lines (which already spans one log interval), but never less than `min_window_s`;
    `fixed_window_s`, when set, replaces that adaptive rule with a fixed number of seconds. A
    checkpoint save announced in the log extends the window to at least `checkpoint_allowance_s`
    because saves legitimately take many step times.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    startup_s: float = Field(default=900.0, gt=0, description="Allowance before the first iteration line.")
    factor: float = Field(default=10.0, gt=1, description="k: hung after k x the observed step time.")
    min_window_s: float = Field(default=120.0, gt=0, description="Lower bound of the adaptive window.")
    fixed_window_s: float | None = Field(default=None, gt=0, description="A fixed window instead of k x step.")
    checkpoint_allowance_s: float = Field(default=900.0, gt=0, description="Window after a checkpoint save.")


class JobSpec(BaseModel):
    """What to run: a script (or an argv), where its files go, how many processes, and its limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    combo: str = Field(description="Name of this run inside run_dir (one combo of a sweep).")
    run_dir: Path = Field(description="Parent directory; the job's files go to run_dir/combo/.")
    script: Path | None = Field(default=None, description="A bash launch script to run (copied to launch.sh).")
    argv: list[str] | None = Field(default=None, description="Or a command; launch.sh runs it, shell-quoted.")
    script_text: str | None = Field(default=None, description="Or the text of a rendered script (launch.sh).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment (values never logged).")
    cwd: Path | None = Field(default=None, description="Working directory; default: the job directory.")
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int | None = Field(default=1, ge=1, description="Processes per node (ranks); None where the "
                                      "script's launcher counts them itself (torchrun --nproc-per-node gpu), a count "
                                      "no executor knows: left unset in the environment and the record.")
    train_iters: int | None = Field(default=None, gt=0, description="Expected final iteration; default: "
                                    "the total printed in the iteration line.")
    require_final_iteration: bool = Field(default=True, description="Exit 0 counts as COMPLETED only when "
                                          "the final iteration was logged.")
    hang: HangPolicy = Field(default_factory=HangPolicy)
    timeout_s: float | None = Field(default=None, gt=0, description="Wall-clock limit for the whole job.")
    blocked_in_queue_s: float | None = Field(
        default=DEFAULT_BLOCKED_IN_QUEUE_S, gt=0,
        description="A scheduler's job still waiting this long for nodes that are out of service (drained, down) "
                    "is cancelled and failed, naming them; None = it waits until they come back. A queue that is "
                    "only busy is waited on.")
    stop_grace_s: float = Field(default=10.0, ge=0, description="SIGTERM to SIGKILL grace when stopping.")

    @field_validator("combo")
    @classmethod
    def _combo_is_a_safe_directory_name(cls, combo: str) -> str:
        if not COMBO_NAME_PATTERN.match(combo):
            raise ValueError(f"{combo!r} is not a usable directory name; use letters, digits, '.', '_', '-'")
        return combo

    @model_validator(mode="after")
    def _exactly_one_command(self) -> JobSpec:
        given = [self.script is not None, self.argv is not None, self.script_text is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of script, argv and script_text")
        if self.argv is not None and not self.argv:
            raise ValueError("argv is empty")
        return self

    @property
    def job_dir(self) -> Path:
        return self.run_dir / self.combo


class JobHandle(BaseModel):
    """What `submit` returns: enough to find the job again (a PID locally, a job id under SLURM)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: str
    combo: str
    job_id: str
    job_dir: Path
    submitted_at: datetime


class JobStatus(BaseModel):
    """One `poll` answer."""

    model_config = ConfigDict(extra="forbid")

    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    iteration: int | None = Field(default=None, description="Last iteration seen in the log.")
    train_iters: int | None = Field(default=None, description="Final iteration expected.")
    step_time_s: float | None = Field(default=None, description="Observed wall time per iteration.")
    loss: float | None = Field(default=None, description="Last training loss logged, for progress displays.")
    elapsed_s: float = 0.0


class JobResult(BaseModel):
    """How a job ended: what `wait` returns and `megapilot run --json` prints."""

    model_config = ConfigDict(extra="forbid")

    combo: str
    executor: str
    job_id: str
    state: JobState
    exit_code: int | None
    reason: str | None
    iterations_reached: int | None
    train_iters: int | None
    step_time_s: float | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_s: float
    job_dir: Path
    logs: list[Path]

    @property
    def ok(self) -> bool:
        return self.state is JobState.COMPLETED


ProgressCallback = Callable[[JobStatus], None]


Launcher = Literal["torchrun", "slurm"]
GpuRequest = Literal["gpus-per-node", "gres", "none"]


@dataclass(frozen=True)
class Capabilities:
    """What an executor can do, asked by the suite instead of comparing executor names.

    A new executor states these once, in its own module, and every stage follows them.
    """

    #: The launch script it runs: a torchrun script, or an sbatch script (one srun torchrun per node).
    launcher: Launcher
    #: Jobs run on this machine: inputs are checked and the tokenizer fetched here, leftover processes seen here.
    runs_here: bool
    #: Every node sees this machine's paths (one file system): the same interpreter, run directory and checkpoints.
    shares_file_system: bool
    #: The nodes come from the cluster file (the executor reaches each one itself).
    needs_node_list: bool
    #: More than one node per job.
    multi_node: bool
    #: The suite starts a container on every node (`prepare`) and jobs enter it; False: the launch script's
    #: launcher starts it (pyxis/enroot `--container-image` under SLURM).
    starts_containers: bool
    #: A scheduler allocates CPUs, GPUs and memory for each job (what to ask is in `LaunchRequest`).
    allocates_resources: bool
    #: One line for `--help` and the README.
    summary: str


class NodeAddress(BaseModel):
    """How to reach one node of a cluster file (host, user, port, key); executors that need nodes take these."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    user: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    identity_file: Path | None = None
    options: tuple[str, ...] = Field(default=(), description="Extra `-o Key=Value` ssh options.")
    address: str | None = Field(default=None, description="Address the other nodes reach it at; default: host.")


class ContainerEntry(BaseModel):
    """A container every job enters on its node: `<runtime> exec NAME` (docker, podman) or `enroot start NAME`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: Literal["docker", "podman", "enroot"]
    name: str


class ExecutorSettings(BaseModel):
    """What a user configures about where jobs run, for any executor (each reads the parts it needs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: tuple[NodeAddress, ...] = Field(default=(), description="The cluster file's nodes, node 0 first.")
    container: ContainerEntry | None = None
    scheduler_options: tuple[str, ...] = Field(
        default=(), description="Scheduler words for every job and probe (--partition=..., --qos=..., ...).")
    job_lease_s: float | None = Field(
        default=None, ge=0, description="A scheduler's job scancels itself once megapilot has not renewed its "
                                        "lease for this long (megapilot was killed); None = the executor's "
                                        "default, 0 = no lease (the job keeps running when megapilot is gone).")


@dataclass(frozen=True)
class NodeOutput:
    """What a small command printed on one node, or why the node could not be reached."""

    node: int
    text: str
    error: str = ""
    name: str = ""  # what a scheduler or a host list calls the node (ssh: its host); "" = its own hostname


@dataclass(frozen=True)
class ProcessesLeft:
    """After a job (or a whole run): how many of its processes are still alive, and what was done about them.

    `count` None: nothing can be counted from here; `reason` then says who ended the processes."""

    count: int | None
    reason: str


@dataclass(frozen=True)
class LaunchRequest:
    """What the launch script asks the executor's scheduler for, decided by the executor from the cluster."""

    launcher: Launcher
    gpu_request: GpuRequest = "none"
    #: Why this request (the scheduler's own words: what it offers), for the report.
    note: str = ""
    #: A problem that stops any job from being accepted (no GPUs on a cluster for a GPU suite), with its fix.
    problem: str | None = None
    fix: str | None = None


@runtime_checkable
class Executor(Protocol):
    """Runs jobs somewhere. Implementations register themselves (`megapilot.execute.registry`).

    Class attributes: `name` (what `megapilot.executor` says) and `capabilities`; `from_settings`
    builds one from the user's settings. The rest is per job (submit, poll, logs, cancel, wait,
    result) and per node (run a small command on every node, count the processes left).
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]

    @classmethod
    def from_settings(cls, settings: ExecutorSettings) -> Executor:
        """An executor for these settings; MegapilotError naming the missing setting when it cannot be built."""
        ...

    def submit(self, job: JobSpec) -> JobHandle:
        """Start the job (or queue it) and return at once; `SubmissionRefused` when the scheduler refuses it."""
        ...

    def poll(self, handle: JobHandle) -> JobStatus:
        """Current state; also where hang and wall-clock limits are enforced."""
        ...

    def logs(self, handle: JobHandle) -> list[Path]:
        """The per-node training logs, node 0 first."""
        ...

    def cancel(self, handle: JobHandle, reason: str = "cancelled") -> None:
        """Stop the job and every process it started, recording `reason` as why; idempotent."""
        ...

    def wait(self, handle: JobHandle, on_progress: ProgressCallback | None = None,
             poll_interval_s: float = 0.5) -> JobResult:
        """Block until the job ends; cancels it if the caller is interrupted."""
        ...

    def result(self, handle: JobHandle) -> JobResult:
        """How the job ended (its status so far if it has not), without waiting."""
        ...

    def run_on_nodes(self, script: str, args: list[str], nodes: int) -> list[NodeOutput]:
        """`bash -s ARGS <<< script` on each of the first `nodes` nodes the jobs get; node 0 first."""
        ...

    def processes_left(self, directory: Path, *, inside: bool = False, kill: bool = True) -> ProcessesLeft:
        """Processes of the job in `directory` (with `inside`: of every job under it) still alive; with `kill`
        they are killed, and the answer says so."""
        ...

    def launch_request(self, *, gpus: bool) -> LaunchRequest:
        """What a launch script for this executor asks for (GPUs or CPUs), read from the cluster when it has one."""
        ...

    def check_submission(self, job: JobSpec) -> str | None:
        """Would the scheduler accept this job? None when it would (or there is no scheduler), else its words."""
        ...


class SubmissionRefused(MegapilotError):
    """The scheduler refused a job (its own words in the message)."""


class Pollable(Protocol):
    """What the shared `wait` needs of an executor: a job's state now, and a way to stop it."""

    def poll(self, handle: JobHandle) -> JobStatus: ...

    def cancel(self, handle: JobHandle, reason: str = "cancelled") -> None: ...


def wait_by_polling(executor: Pollable, handle: JobHandle, result_of: Callable[[JobHandle], JobResult],
                    on_progress: ProgressCallback | None, poll_interval_s: float) -> JobResult:
    """The `wait` every polling executor shares.

    Calls `on_progress` whenever the iteration or the state changes. Any exception on the way
    (KeyboardInterrupt included, or one raised by the callback) cancels the job before it
    propagates, so an interrupted caller never leaves a training job running.
    """
    last_seen: tuple[JobState, int | None] | None = None
    status = JobStatus(state=JobState.PENDING)  # what is known of the job before its first poll
    try:
        while True:
            status = executor.poll(handle)
            if on_progress is not None and (status.state, status.iteration) != last_seen:
                last_seen = (status.state, status.iteration)
                on_progress(status)
            if status.state.is_terminal:
                return result_of(handle)
            time.sleep(poll_interval_s)
    except BaseException as exc:
        executor.cancel(handle, stop_reason(exc, status.iteration, status.train_iters))
        raise


def ranks_per_node_variable(job: JobSpec) -> dict[str, str]:
    """`NPROC_PER_NODE` for the job's environment; none where the script's launcher counts the ranks itself."""
    return {} if job.gpus_per_node is None else {"NPROC_PER_NODE": str(job.gpus_per_node)}


def job_spec_or_error(**fields: object) -> JobSpec:
    """Build a JobSpec from user input, turning validation errors into a MegapilotError."""

    try:
        return JobSpec(**fields)  # type: ignore[arg-type]  # JobSpec's fields by name; pydantic checks them
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="job") from None


__all__ = [
    "COMBO_NAME_PATTERN",
    "Capabilities",
    "ContainerEntry",
    "Executor",
    "ExecutorSettings",
    "GpuRequest",
    "HangPolicy",
    "JobHandle",
    "JobResult",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LaunchRequest",
    "Launcher",
    "NodeAddress",
    "NodeOutput",
    "Pollable",
    "ProcessesLeft",
    "ProgressCallback",
    "SubmissionRefused",
    "job_spec_or_error",
    "ranks_per_node_variable",
    "wait_by_polling",
]
