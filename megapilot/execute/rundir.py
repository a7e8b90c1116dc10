"""The run directory: where every executor puts a job's files, and what `job.json` holds.

Layout (reports, the validation suite and `megapilot logs` read it; every executor writes it):

    <run_dir>/
      <combo>/                    one directory per job (a combo of a sweep, or a single run)
        launch.sh                 the exact script that was run (a copy of the user's script, a
                                  rendered script, or one that runs the given argv, shell-quoted)
        job.json                  a `JobRecord`: what was run, where, the PIDs seen, start/end time,
                                  exit code, state and reason; rewritten as the job progresses
        megapilot.lease           SLURM: rewritten every few seconds while megapilot follows the job;
                                  the job scancels itself once it goes stale (execute/slurm.py)
        out-node0/training.log    stdout+stderr of node 0: the launcher and all of its ranks
        out-node0/ranks/...       torchrun's own per-rank files: <run id>/attempt_<n>/<local rank>/
                                  {stdout,stderr}.log (local executor, when the launcher is torchrun)
        out-node1/training.log    ...

Rank prefixes: the executor asks torchrun to tee every rank's output with its prefix
(`PET_TEE=3`, i.e. `--tee 3`, unless the script passes its own `--tee`), so each rank's line in
training.log reads `[default<local_rank>]:...`; the launcher's own lines carry no prefix.

Environment values are never written here (they may hold tokens); job.json lists their names.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from megapilot.errors import MegapilotError
from megapilot.execute.base import JobHandle, JobResult, JobSpec, JobStatus
from megapilot.files import atomic_write_text

# Every process of a job carries this variable (its job directory) in its environment, so the job's
# processes can be found even when they left its process tree.
JOB_MARKER_VARIABLE = "MEGAPILOT_JOB_DIR"
JOB_RECORD_VERSION = 1
LAUNCH_SCRIPT_NAME = "launch.sh"
JOB_RECORD_NAME = "job.json"
TRAINING_LOG_NAME = "training.log"


def job_dir(run_dir: Path, combo: str) -> Path:
    return run_dir / combo


def node_log_path(job_directory: Path, node: int) -> Path:
    """`<job_dir>/out-node<N>/training.log`."""
    return job_directory / f"out-node{node}" / TRAINING_LOG_NAME


def launch_script_path(job_directory: Path) -> Path:
    return job_directory / LAUNCH_SCRIPT_NAME


def job_record_path(job_directory: Path) -> Path:
    return job_directory / JOB_RECORD_NAME


class RecordedProcess(BaseModel):
    """A process seen in the job's tree."""

    model_config = ConfigDict(extra="forbid")

    pid: int
    ppid: int
    name: str
    cmdline: str


class JobRecord(BaseModel):
    """The contents of `job.json`."""

    model_config = ConfigDict(extra="forbid")

    version: int = JOB_RECORD_VERSION
    combo: str
    executor: str
    job_id: str | None = None
    command: list[str] = Field(description="The argv the executor started (runs launch.sh).")
    launch_script: str = LAUNCH_SCRIPT_NAME
    source_script: str | None = Field(default=None, description="The user's script launch.sh copies.")
    cwd: str
    env_names: list[str] = Field(default_factory=list, description="Names of the extra environment variables.")
    master_addr: str | None = None
    master_port: int | None = None
    nodes: int
    gpus_per_node: int | None = Field(description="Ranks per node; null where the script's launcher counted them.")
    root_pid: int | None = None
    processes: list[RecordedProcess] = Field(default_factory=list)
    submitted_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    stop_sent_at: datetime | None = Field(
        default=None, description="When megapilot began stopping the job itself (its hang window, its wall-clock "
                                  "limit, a cancel, Ctrl-C or a signal to megapilot: status says which); null when "
                                  "the job ended on its own or something else stopped it.")
    status: JobStatus


def prepare_job_dir(job: JobSpec) -> Path:
    """Create `<run_dir>/<combo>/` and its node log directories; refuse to reuse a finished job's."""
    directory = job.job_dir
    if job_record_path(directory).exists():
        raise MegapilotError(
            f"{directory} already holds a job (job.json exists)", field="combo",
            fix="choose another combo name (--combo) or run directory (--run-dir), or remove that directory",
        )
    try:
        for node in range(job.nodes):
            node_log_path(directory, node).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MegapilotError(f"cannot create {directory}: {exc.strerror}", field="run_dir",
                             fix="pick a writable directory") from None
    return directory


@contextmanager
def unstarted_job_dir(job: JobSpec) -> Iterator[Path]:
    """`prepare_job_dir` for a job not started yet: when the block raises (the scheduler refused the job, its
    process could not start) the folders it created are removed again, so a refused job leaves no empty
    `<run-dir>/<combo>` behind. A folder that was there before is left as it was found."""
    created: Path | None = None  # the outermost folder this job creates (--run-dir itself, when it is new)
    for folder in [job.job_dir, *job.job_dir.parents]:
        if folder.exists():
            break
        created = folder
    directory = prepare_job_dir(job)
    try:
        yield directory
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


def write_launch_script(job: JobSpec, job_directory: Path) -> Path:
    """Write launch.sh: a copy of the user's script, the rendered text, or a script that execs the argv."""
    target = launch_script_path(job_directory)
    if job.script is not None:
        if not job.script.is_file():
            raise MegapilotError(f"{job.script} does not exist or is not a file", field="script",
                                 fix="pass the path of a bash launch script (e.g. one from `megapilot script`)")
        shutil.copyfile(job.script, target)
    elif job.script_text is not None:
        target.write_text(job.script_text)
    else:
        assert job.argv is not None
        target.write_text("#!/usr/bin/env bash\nset -euo pipefail\nexec " + shlex.join(job.argv) + "\n")
    target.chmod(0o755)
    return target


def write_job_record(job_directory: Path, record: JobRecord) -> None:
    """Replace job.json atomically, so a reader never sees half a file."""
    atomic_write_text(job_record_path(job_directory), record.model_dump_json(indent=2) + "\n")


def read_job_record(job_directory: Path) -> JobRecord:
    path = job_record_path(job_directory)
    try:
        return JobRecord.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise MegapilotError(f"{path} not found", field="job_dir", fix="point at a job directory") from None


def result_from_record(record: JobRecord, handle: JobHandle, logs: list[Path]) -> JobResult:
    """The JobResult every executor answers `result` with: the job's record as it stands."""
    status = record.status
    return JobResult(
        combo=record.combo, executor=record.executor, job_id=handle.job_id, state=status.state,
        exit_code=status.exit_code, reason=status.reason, iterations_reached=status.iteration,
        train_iters=status.train_iters, step_time_s=status.step_time_s, started_at=record.started_at,
        ended_at=record.ended_at, duration_s=round(status.elapsed_s, 3), job_dir=handle.job_dir, logs=logs,
    )
