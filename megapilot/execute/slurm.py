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
4. A job does not outlive megapilot. Signals and a normal exit scancel every job (`close`); a SIGKILL runs
   no cleanup, so each job also holds a lease: megapilot rewrites `<job_dir>/megapilot.lease` every few
   seconds from a thread of its own (`JobLeases`), and the submitted launch.sh carries a watcher, inserted
   after its `#SBATCH` lines (`with_lease_watch`), that runs beside srun in the batch step and scancels
   `$SLURM_JOB_ID` once the lease has not changed for `lease_s` (default 120 s) by the batch node's own
   clock. It compares the file's content, not its mtime, so clock skew between the login and batch nodes
   does not matter, and reading opens the file, which NFS revalidates (close-to-open) instead of trusting
   its attribute cache. A job that starts after megapilot died runs at most `lease_s` before it cancels
   itself. `lease_s` None leaves the script as given: a job that is meant to keep running when its submitter
   is gone.

The SLURM client commands run with the constructor's environment on top of this process's, so a
caller (or a test) can point them at a cluster with SLURM_CONF.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
    SubmissionRefused,
)
from megapilot.execute.failure import describe_exit_code
from megapilot.execute.following import FollowedJob, JobFollower
from megapilot.execute.progress import position_text
from megapilot.execute.registry import register_executor
from megapilot.execute.remote import NODE_COMMAND_TIMEOUT_S, NodeLogs, utc_now
from megapilot.execute.rundir import (
    JOB_MARKER_VARIABLE,
    JobRecord,
    node_log_path,
    read_job_record,
    unstarted_job_dir,
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
# sinfo's node states (%T) that take no new job; a suffix (`*` not responding, `~` powered off) may follow.
_OUT_OF_SERVICE = re.compile(r"(drained|draining|down|fail|failing|maint|inval|future)\W*$")
# sbatch options that choose where a job runs; srun takes them too, so the preflight probe lands where jobs do.
_PLACEMENT_OPTIONS = ("--partition", "-p", "--account", "-A", "--qos", "-q", "--reservation", "--constraint", "-C",
                      "--exclude", "-x", "--nodelist", "-w", "--clusters", "-M")
# How long a SLURM client has to stop after SIGTERM (srun revoking a pending allocation takes well under a second).
CLIENT_STOP_WAIT_S = 10.0
LEASE_FILE_NAME = "megapilot.lease"
DEFAULT_LEASE_S = 120.0
MIN_LEASE_S = 10.0
# The watcher's line in node 0's log when it scancels; the verdict reads it back as the reason.
LEASE_EXPIRED_MARK = "megapilot lease expired:"
REFUSAL_FIX = ("give sbatch what the cluster offers: megapilot.partition, megapilot.account, megapilot.time_limit, "
               "megapilot.exclusive, or megapilot.sbatch_options (--qos=..., --reservation=..., --constraint=...)")


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

    def run(self, *argv: str, extra_env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, **self.env, **(extra_env or {})}
        timeout_s = timeout_s or self.timeout_s
        try:
            process = subprocess.Popen(list(argv), env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise MegapilotError(f"{argv[0]} not found", field="executor",
                                 fix="run on a SLURM login node (sbatch, squeue, sacct and scancel on PATH)") from None
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stdout, stderr = _stop_client(process)
            said = f"{stderr.rstrip()}\n" if stderr.strip() else ""
            return subprocess.CompletedProcess(list(argv), 124, stdout,
                                               f"{said}{argv[0]} timed out after {timeout_s:g} s")
        except BaseException:  # Ctrl-C, SIGTERM: the client must still give back what it holds
            _stop_client(process)
            raise
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)

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


def _stop_client(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop a SLURM client that ran too long, or whose caller was interrupted: SIGTERM first, because an srun still
    waiting for its allocation then revokes it, where SIGKILL would leave that job pending in the queue for ever
    (it runs whenever the nodes come back); SIGKILL only for a client that does not stop. Returns what it said."""
    process.terminate()
    try:
        return process.communicate(timeout=CLIENT_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


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


def lease_renew_interval_s(lease_s: float) -> float:
    """How often the lease is renewed and checked: a quarter of the window, at most every 5 s."""
    return min(5.0, lease_s / 4)


def with_lease_watch(script: str, lease: Path, lease_s: float) -> str:
    """`script` with a watcher that scancels the job once `lease` stops changing for `lease_s`.

    The lines go after the shebang, comments and `#SBATCH` lines (sbatch reads directives only up to the
    first command), so every directive still counts; the script's own commands follow unchanged."""
    window_s = math.ceil(lease_s)
    check_s = f"{lease_renew_interval_s(lease_s):g}"
    block = f"""\
# megapilot: scancel this job when megapilot stops renewing its lease for {window_s} s (megapilot was killed;
# a SIGKILL runs no cleanup). The content is compared, not the mtime: clock skew does not matter.
(
  lease={shlex.quote(str(lease))}; seen=""; renewed_s=$SECONDS
  while kill -0 $$ 2>/dev/null; do
    now=$(cat -- "$lease" 2>/dev/null || true)
    if [ -n "$now" ] && [ "$now" != "$seen" ]; then
      seen=$now; renewed_s=$SECONDS
    elif (( SECONDS - renewed_s > {window_s} )); then
      echo "{LEASE_EXPIRED_MARK} $lease not renewed for {window_s} s (megapilot is gone); scancel $SLURM_JOB_ID"
      scancel "$SLURM_JOB_ID"
      exit 0
    fi
    sleep {check_s}
  done
) </dev/null &
"""
    lines = script.splitlines(keepends=True)
    header = 0
    while header < len(lines) and (not lines[header].strip() or lines[header].lstrip().startswith("#")):
        header += 1
    head = "".join(lines[:header])
    if head and not head.endswith("\n"):
        head += "\n"
    return head + block + "".join(lines[header:])


class JobLeases:
    """Renews the lease file of every job this process follows, from a daemon thread, every `renew_s`.

    A thread, not `poll`: a caller may block for minutes between polls (another stage, a long wait), and
    that must not cost the jobs their lease; the thread stops only with the process."""

    def __init__(self, renew_s: float):
        self.renew_s = renew_s
        self._paths: set[Path] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._count = 0

    def hold(self, path: Path) -> None:
        with self._lock:
            self._paths.add(path)
            self._renew(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="megapilot-slurm-leases", daemon=True)
                self._thread.start()

    def release(self, path: Path) -> None:
        with self._lock:
            self._paths.discard(path)

    def _run(self) -> None:
        while True:
            time.sleep(self.renew_s)
            with self._lock:
                for path in list(self._paths):
                    self._renew(path)

    def _renew(self, path: Path) -> None:
        self._count += 1
        try:
            path.write_text(f"{time.time():.3f} {os.getpid()} {self._count}\n", encoding="utf-8")
        except OSError:  # a full or flaky file system: one renewal missed; the window spans several
            pass


@dataclass
class _SlurmJob(FollowedJob):
    logs: NodeLogs
    submitted_at_s: float
    started_at_s: float | None = None
    last_known_s: float = field(default_factory=time.monotonic)
    stop_cause: tuple[JobState, str] | None = None
    placement_checked_at_s: float | None = None  # when a job blocked on its nodes last had them checked


# squeue's reasons for a job that waits on nodes out of service: ReqNodeNotAvail's own words, its longer form
# (SLURM 21.08 on), a down node or partition. The longer form also covers nodes held for a higher-priority
# partition, which is only a busy queue: the nodes' state decides (`_blocked_reason`).
_NODES_UNAVAILABLE = re.compile(r"ReqNodeNotAvail|Nodes required for job are DOWN|NodeDown|PartitionDown|"
                                r"PartitionInactive")
PLACEMENT_RECHECK_S = 60.0  # at most one sinfo / sbatch --test-only per blocked job per this many seconds


@register_executor
class SlurmExecutor(JobFollower[_SlurmJob]):
    """Runs jobs through a SLURM controller. One instance follows many jobs.

    `env`: extra environment for every SLURM command (e.g. {"SLURM_CONF": ...}); `sbatch_options`:
    more sbatch words (`--partition=gpu`, `--account=...`) put before the script; `refresh_s`:
    at most one squeue per this many seconds; `vanish_grace_s`: how long a job may be known to
    neither squeue nor sacct/scontrol before it counts as lost; `lease_s`: how long a job runs on once
    this process stops renewing its lease (None: the job keeps running when megapilot is gone).
    """

    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[Capabilities] = Capabilities(
        launcher="slurm", runs_here=False, shares_file_system=True, needs_node_list=False, multi_node=True,
        starts_containers=False, allocates_resources=True,
        summary="sbatch one job per run, srun one torchrun per node (from a SLURM login node; shared file system)")

    def __init__(self, *, env: Mapping[str, str] | None = None, sbatch_options: Sequence[str] = (),
                 refresh_s: float = 2.0, max_lookup_interval_s: float = 30.0, vanish_grace_s: float = 120.0,
                 command_timeout_s: float = 60.0, cancel_wait_s: float = 60.0,
                 lease_s: float | None = DEFAULT_LEASE_S):
        if lease_s is not None and not lease_s >= MIN_LEASE_S:
            raise MegapilotError(f"a job lease of {lease_s:g} s is too short to renew over a shared file system",
                                 field="job_lease_s", fix=f"give at least {MIN_LEASE_S:g} s, or 0 for no lease")
        self.lease_s = lease_s
        self.leases = JobLeases(lease_renew_interval_s(lease_s)) if lease_s is not None else None
        self.client = SlurmClient(env, timeout_s=command_timeout_s)
        self.queue = SlurmQueue(self.client, refresh_s, max_lookup_interval_s)
        self.sbatch_options = list(sbatch_options)
        self.vanish_grace_s = vanish_grace_s
        self.cancel_wait_s = cancel_wait_s
        self._jobs: dict[str, _SlurmJob] = {}
        self._requests: dict[bool, LaunchRequest] = {}
        atexit.register(self.close)

    @classmethod
    def from_settings(cls, settings: ExecutorSettings) -> SlurmExecutor:
        lease_s = DEFAULT_LEASE_S if settings.job_lease_s is None else settings.job_lease_s or None
        return cls(sbatch_options=settings.scheduler_options, lease_s=lease_s)

    # -- per node -----------------------------------------------------------------------------

    def run_on_nodes(self, script: str, args: list[str], nodes: int) -> list[NodeOutput]:
        """One task per node with `--label`, so each output line says which node printed it."""
        placement = [o for o in self.sbatch_options if o.split("=", 1)[0] in _PLACEMENT_OPTIONS]
        argv = ["srun", f"--nodes={nodes}", "--ntasks-per-node=1", f"--ntasks={nodes}", "--label",
                "--kill-on-bad-exit=0", *placement, "bash", "-c", script, "probe", *args]
        try:
            done = self.client.run(*argv, timeout_s=NODE_COMMAND_TIMEOUT_S * 5)
        except MegapilotError as exc:  # srun is not installed here
            return [NodeOutput(n, "", exc.problem) for n in range(nodes)]
        per_node: dict[int, list[str]] = {}
        for line in done.stdout.splitlines():
            label, sep, rest = line.partition(": ")
            if sep and label.strip().isdigit():
                per_node.setdefault(int(label), []).append(rest)
        said = done.stderr.strip().splitlines() or [f"srun exit {done.returncode}"]
        error = "" if done.returncode == 0 else said[-1]
        return [NodeOutput(n, "\n".join(per_node.get(n, [])), error if n not in per_node else "") for n in range(nodes)]

    def processes_left(self, directory: Path, *, inside: bool = False, kill: bool = True) -> ProcessesLeft:
        """SLURM owns a job's processes: what counts is whether any job of `directory` is still queued."""
        directory = directory.resolve()
        mine = [job for job in self._jobs.values()
                if job.handle.job_dir == directory or (inside and directory in job.handle.job_dir.parents)]
        queued = self.client.queue([job.handle.job_id for job in mine]) if mine else {}
        if queued is None:
            return ProcessesLeft(None, "squeue did not answer; the jobs' processes could not be checked")
        alive = [f"{job_id} ({state.state})" for job_id, state in queued.items()
                 if state.base_state in _WAITING | _RUNNING]
        if alive and kill:
            for job_id in queued:
                self.client.cancel(job_id)
        if alive:
            done = "scancelled" if kill else "not cancelled yet"
            return ProcessesLeft(len(alive), f"SLURM job(s) {', '.join(alive)} still queued; {done}")
        ended = ", ".join(f"{job.handle.job_id} {job.status.state.value}" for job in mine)
        return ProcessesLeft(0, f"no SLURM job left in the queue (job {ended}); slurmd ends a job's processes"
                             if ended else "no SLURM job of this run")

    def launch_request(self, *, gpus: bool) -> LaunchRequest:
        """CPUs and memory for a CPU run; for GPUs, whichever request the cluster takes, read from its config."""
        if gpus not in self._requests:
            self._requests[gpus] = self._read_request(gpus)
        return self._requests[gpus]

    def _read_request(self, gpus: bool) -> LaunchRequest:
        if not gpus:
            return LaunchRequest(launcher="slurm", gpu_request="none", note="CPU ranks: CPUs and memory, no GPUs")
        config = self.client.run("scontrol", "show", "config")
        select = next((line.split("=", 1)[1].strip() for line in config.stdout.splitlines()
                       if line.split("=", 1)[0].strip() == "SelectType"), "")
        partition = self._partition()
        shown = self.client.run("sinfo", "-h", "-o", "%P %G", *(["-p", partition] if partition else []))
        gres = " ".join(line.split(maxsplit=1)[1] for line in shown.stdout.splitlines() if len(line.split()) > 1)
        where = f"partition {partition}" if partition else "the cluster"
        if shown.returncode == 0 and "gpu" not in gres:
            return LaunchRequest(launcher="slurm", problem=f"{where} declares no GPUs (sinfo %G: {gres or 'none'})",
                                 fix="set gpu_name CPU to run on CPU ranks, or megapilot.partition to a GPU "
                                     "partition")
        # --gpus-per-node needs the cons_tres selector; older clusters (cons_res, linear) take --gres=gpu:N.
        if "cons_tres" in select or config.returncode != 0:
            return LaunchRequest(launcher="slurm", gpu_request="gpus-per-node",
                                 note=f"--gpus-per-node ({select or 'SelectType unknown'}; gres {gres or '?'})")
        return LaunchRequest(launcher="slurm", gpu_request="gres", note=f"--gres=gpu:N ({select}; gres {gres})")

    def _partition(self) -> str | None:
        return next((o.split("=", 1)[1] for o in self.sbatch_options if o.startswith("--partition=")), None)

    def check_submission(self, job: JobSpec) -> str | None:
        """Whether the job's partition exists and has enough nodes in service (what sbatch would only call "not
        available"), then `sbatch --test-only` with the options `submit` would use: sbatch's own words when it
        would refuse. A problem found here names its own fix."""
        unplaceable = self._placement_problem(job.nodes)
        if unplaceable is not None:
            return unplaceable
        with tempfile.TemporaryDirectory(prefix="mp-sbatch-") as folder:
            script = Path(folder) / "launch.sh"
            script.write_text(job.script_text if job.script_text is not None else
                              job.script.read_text(encoding="utf-8") if job.script is not None else "#!/bin/bash\n",
                              encoding="utf-8")
            done = self.client.run("sbatch", "--test-only", f"--nodes={job.nodes}", f"--chdir={folder}",
                                   f"--output={folder}/out", *self.sbatch_options, str(script))
        if done.returncode == 0:
            return None
        fix = refusal_fix(done.stderr)
        return f"sbatch --test-only said: {_sbatch_words(done)}" + (f"; fix: {fix}" if fix else "")

    def _placement_problem(self, nodes: int) -> str | None:
        """A partition that does not exist, or one with fewer than `nodes` nodes in service (drained, down): a job
        there is refused, or waits in the queue until someone returns the nodes. None when neither, or when sinfo
        does not say (then sbatch --test-only still does)."""
        partition = self._partition()
        if partition is not None and "," in partition:
            return None  # a job may start in any of several partitions: sbatch --test-only judges the list
        shown = self.client.run("sinfo", "-h", "-N", "-o", "%N|%P|%T|%E")
        if shown.returncode != 0:
            return None
        rows = [line.split("|", 3) for line in shown.stdout.splitlines() if line.count("|") >= 3]
        listed = list(dict.fromkeys(row[1] for row in rows))  # 'main*': the default partition
        wanted = partition or next((name.rstrip("*") for name in listed if name.endswith("*")), None)
        if wanted is None or not rows:
            return None
        if wanted not in {name.rstrip("*") for name in listed}:
            return (f"megapilot.partition {wanted}: no such partition; this cluster has {', '.join(listed)} (* the "
                    "default); fix: set megapilot.partition to one of them, or null for the default")
        mine = [row for row in rows if row[1].rstrip("*") == wanted]
        out = [row for row in mine if _OUT_OF_SERVICE.match(row[2])]
        if len(mine) - len(out) >= nodes:
            return None
        said = "; ".join(f"{name} {state}" + (f" ({reason})" if reason.strip() not in ("", "none") else "")
                         for name, _, state, reason in out)
        return (f"partition {wanted} has {len(mine) - len(out)} of the {nodes} node(s) a job needs in service: {said}; "
                "fix: return the nodes to service once they are healthy (scontrol update nodename=<node> "
                "state=resume), or set megapilot.partition to a partition with enough nodes up, or megapilot.nodes "
                "lower")

    # -- the protocol -------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobHandle:
        with unstarted_job_dir(job) as created:
            directory = created.resolve()
            _check_slurm_path(directory)
            launch = write_launch_script(job, directory)
            if self.leases is not None and self.lease_s is not None:
                lease = directory / LEASE_FILE_NAME
                self.leases.hold(lease)  # renewed before the job can start: the watcher's first read finds it
                launch.write_text(with_lease_watch(launch.read_text(encoding="utf-8"), lease, self.lease_s),
                                  encoding="utf-8")
            cwd = (job.cwd or directory).resolve()
            argv = ["sbatch", "--parsable", f"--chdir={cwd}", f"--nodes={job.nodes}",
                    f"--output={node_log_path(directory, 0)}", "--open-mode=append", *self.sbatch_options,
                    str(launch)]
            submitted_at = utc_now()
            done = self.client.run(*argv, extra_env=self._job_environment(job, directory))
            if done.returncode != 0:
                self._release_lease(directory)
                raise _refusal(done)
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
            where = position_text(job.logs.iteration, job.logs.leader.tracker.train_iters)
            self._stop(job, JobState.TIMEOUT, f"wall-clock limit of {job.spec.timeout_s:g} s reached {where}")
        elif job.started_at_s is None and (blocked := self._blocked_reason(job, slurm, now_s)) is not None:
            self._stop(job, JobState.FAILED, blocked)
        else:
            state = JobState.RUNNING if job.started_at_s is not None else JobState.PENDING
            reason = slurm.reason if state is JobState.PENDING and slurm and slurm.reason not in ("", "None") else None
            job.record.status = job.logs.status(state, now_s, job.started_at_s or now_s, reason=reason)
            if job.logs.iteration != iteration_before or state is not state_before:
                write_job_record(handle.job_dir, job.record)
        return job.status

    def _cancel_unfollowed(self, handle: JobHandle) -> None:
        self.client.cancel(handle.job_id)  # SLURM knows the job by its id whoever submitted it

    def _blocked_reason(self, job: _SlurmJob, slurm: SlurmJobState | None, now_s: float) -> str | None:
        """Why a job that has waited `blocked_in_queue_s` on nodes out of service gives up, or None: squeue names
        unavailable nodes and the scheduler check the preflight runs (`check_submission`) still finds too few in
        service. A queue that is only busy (the nodes up, held for other jobs) is waited on."""
        window_s = job.spec.blocked_in_queue_s
        if window_s is None or slurm is None or not _NODES_UNAVAILABLE.search(slurm.reason or ""):
            return None
        waited_s = now_s - job.submitted_at_s
        checked_s = job.placement_checked_at_s
        if waited_s < window_s or (checked_s is not None and now_s - checked_s < PLACEMENT_RECHECK_S):
            return None
        job.placement_checked_at_s = now_s
        problem = self.check_submission(job.spec)
        if problem is None:
            return None
        return (f"waited {waited_s:.0f} s in the queue on nodes out of service ({slurm.reason}; "
                f"megapilot.blocked_queue_timeout_s {window_s:g}): {problem}")

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
        """scancel the job for `state` (HUNG, TIMEOUT, CANCELLED; FAILED: blocked in the queue) and wait until it
        left the queue."""
        job.stop_cause = (state, reason)
        job.record.stop_sent_at = utc_now()  # diagnose tells this stop from one by others
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
        self._release_lease(job.handle.job_dir)

    def _release_lease(self, directory: Path) -> None:
        if self.leases is not None:
            self.leases.release(directory / LEASE_FILE_NAME)

    def _verdict(self, job: _SlurmJob, slurm: SlurmJobState | None) -> tuple[JobState, str | None]:
        if job.stop_cause is not None:
            return job.stop_cause
        assert slurm is not None
        state, reason = slurm_verdict(slurm, job.logs, job.spec.require_final_iteration)
        if state is JobState.CANCELLED and (expired := lease_expiry_line(job.handle.job_dir)) is not None:
            reason = f"scancelled by its own lease watcher: {expired}"
        return state, reason


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
    # The first failure in the logs is the reason; what SLURM says is context (srun's "Terminating StepId"
    # is a consequence, never the cause).
    clue = logs.failure_reason(None, None)
    scheduler = f"SLURM {word}: {how}"
    return JobState.FAILED, f"{clue} ({scheduler})" if clue != "failed" else scheduler


def lease_expiry_line(job_dir: Path) -> str | None:
    """The watcher's words in node 0's log when it scancelled the job for a lease megapilot stopped renewing."""
    try:
        with node_log_path(job_dir, 0).open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 65536))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return None
    found = [line for line in tail.splitlines() if line.startswith(LEASE_EXPIRED_MARK)]
    return found[-1][len(LEASE_EXPIRED_MARK):].strip() if found else None


# sbatch's words when it never reached a controller: no slurm.conf (or configless DNS record), or slurmctld down.
# Then no partition or account would help, and the fix is the host's SLURM set-up.
_NO_CONTROLLER = re.compile(r"unable to contact slurm controller|fetch_config|_establish_config_source|"
                            r"could not establish a configuration source|s_p_parse_file|"
                            r"unable to process configuration file|"
                            r"zero bytes were transmitted or received|socket timed out", re.IGNORECASE)
NO_CONTROLLER_FIX = ("run where SLURM's controller answers: `sinfo` must list the partitions (slurmctld running, and "
                     "this host's slurm.conf or SLURM_CONF naming it)")


def _refusal(done: subprocess.CompletedProcess[str]) -> SubmissionRefused:
    """sbatch's refusal, with the fix for what it said: the controller unreachable, else the job's request."""
    words = _sbatch_words(done)
    if _NO_CONTROLLER.search(done.stderr):
        return SubmissionRefused(f"sbatch cannot reach the SLURM controller: {words}", field="executor",
                                 fix=NO_CONTROLLER_FIX)
    return SubmissionRefused(f"sbatch refused the job: {words}", field="script",
                             fix=refusal_fix(done.stderr) or REFUSAL_FIX)


# What sbatch's refusal names -> the setting to change (a function of the matched words); the first match wins.
_REFUSALS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"unrecognized option '([^']+)'|invalid option -- '(.)'"),
     lambda m: f"remove or correct {m.group(1) or '-' + m.group(2)} in megapilot.sbatch_options: sbatch does not "
               "take it (sbatch --help lists what it does)"),
    (re.compile(r"Invalid (--[\w-]+) specification"),
     lambda m: f"correct {m.group(1)}: in megapilot.sbatch_options, or the megapilot setting that writes it "
               "(megapilot.exclusive, megapilot.time_limit, megapilot.memory_per_node_gib)"),
    (re.compile(r"Invalid feature specification"),
     lambda m: "--constraint in megapilot.sbatch_options: name features the nodes have (sinfo -o '%P %f')"),
    (re.compile(r"Requested reservation is invalid|Invalid reservation"),
     lambda m: "--reservation in megapilot.sbatch_options: name one that exists and admits you "
               "(scontrol show reservation)"),
    (re.compile(r"Invalid node name specified"),
     lambda m: "--nodelist or --exclude in megapilot.sbatch_options: name nodes that exist (sinfo -N)"),
    (re.compile(r"Invalid qos", re.IGNORECASE),
     lambda m: "--qos in megapilot.sbatch_options: name one you may use (sacctmgr show assoc user=$USER "
               "format=account,qos)"),
    (re.compile(r"Invalid account", re.IGNORECASE),
     lambda m: "megapilot.account: name one you belong to (sacctmgr show assoc user=$USER format=account,partition)"),
    (re.compile(r"time limit", re.IGNORECASE),
     lambda m: "megapilot.time_limit: within the partition's limit (sinfo -o '%P %l')"),
    (re.compile(r"Requested node configuration is not available"),
     lambda m: "ask for no more than one node has (sinfo -N -o '%N %c %m %G'): megapilot.memory_per_node_gib, "
               "megapilot.gpus_per_node, or the options in megapilot.sbatch_options"),
)


def refusal_fix(said: str) -> str | None:
    """The setting to change for what sbatch said, when its words name one; None otherwise."""
    for pattern, fix in _REFUSALS:
        if (found := pattern.search(said)) is not None:
            return fix(found)
    return None


def _sbatch_words(done: subprocess.CompletedProcess[str]) -> str:
    """sbatch's error lines, as it said them (the last few), or its exit code."""
    lines = [line.strip() for line in done.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    return " / ".join(errors[-3:]) if errors else f"exit {done.returncode}"


def _check_slurm_path(directory: Path) -> None:
    # sbatch/srun read % and \ in --output as filename patterns and escapes.
    if "%" in str(directory) or "\\" in str(directory):
        raise MegapilotError(f"{directory} holds '%' or '\\', which SLURM reads as a filename pattern",
                             field="run_dir", fix="choose a run directory without '%' and '\\'")
