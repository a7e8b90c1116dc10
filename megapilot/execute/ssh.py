"""`SshExecutor`: run one copy of a launch script on each of N nodes through the system `ssh` client.

Using the user's own OpenSSH client (argv lists, `-o BatchMode=yes`) means their ~/.ssh/config,
agent, jump hosts and known_hosts all apply, and a missing key fails at once instead of prompting.

How a job runs on node N (node 0 is the master: MASTER_ADDR is its address):
1. Stage (one ssh call): the launch script and an environment file go over ssh's stdin into the
   node's job directory (by default the same absolute path as here, as on a shared filesystem).
   The environment file is created 0600 under umask 077 and holds the JobSpec env plus NODE_RANK,
   NNODES, MASTER_ADDR, MASTER_PORT, one `NAME='value'` line each (shell-quoted); values never
   appear in an argv (visible to `ps`) or in a log.
2. Run (one long ssh call per node, its stdout+stderr appended to `out-node<N>/training.log`
   here): the remote side sources and deletes the env file, prints one line
   `megapilot-ssh: node N pid P on HOST`, and runs `bash launch.sh` (optionally inside a
   container) as a child of P. sshd starts P as the leader of a new session, so P is also the
   process group of the job; the exit status of the ssh client is the node's exit code.
3. Stop (one ssh call per node): SIGTERM to the process group and to every process whose
   environment carries the job's token (torchrun starts workers in sessions of their own), a
   grace period, then SIGKILL.

Nothing user-supplied is ever parsed by a shell: the remote command is a fixed bash program
whose arguments (paths, node number) are `shlex.quote`d words, and the script and values travel
as bytes on stdin. One node failing fails the job (naming the node and its exit), and the other
nodes are stopped.
"""

from __future__ import annotations

import atexit
import math
import re
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from megapilot.errors import MegapilotError
from megapilot.execute.base import (
    Capabilities,
    ExecutorSettings,
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    LaunchRequest,
    NodeAddress,
    NodeOutput,
    ProcessesLeft,
    ranks_per_node_variable,
)
from megapilot.execute.container import ContainerWrapper
from megapilot.execute.failure import describe_exit_code
from megapilot.execute.following import FollowedJob, JobFollower
from megapilot.execute.process import free_port
from megapilot.execute.progress import position_text
from megapilot.execute.registry import register_executor
from megapilot.execute.remote import NodeLogs, run_node_script, utc_now
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

JOB_TOKEN_VARIABLE = "MEGAPILOT_JOB_TOKEN"
SSH_FAILURE_EXIT = 255
# A silent network partition is noticed in about a minute (4 unanswered keepalives 15 s apart), not only when
# the hang watchdog fires; a node's own `options` override these.
KEEPALIVE_OPTIONS = ("ServerAliveInterval=15", "ServerAliveCountMax=4")
# What ssh prints when it loses its connection (it then exits 255).
_LOST_CONNECTION = re.compile(r"Connection to \S+ closed by remote host|Timeout, server \S+ not responding|"
                              r"client_loop: send disconnect|Broken pipe|Connection reset by peer|"
                              r"packet_write_wait|Connection timed out during banner exchange")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_PID_LINE = re.compile(r"^megapilot-ssh: node (?P<node>\d+) pid (?P<pid>\d+) on (?P<host>\S*)")

# ---- the fixed programs the remote bash runs (arguments arrive as "$1", "$2", ...) -------------

_STAGE_PROGRAM = r"""set -euo pipefail
umask 077
dir=$1 node=$2 env_bytes=$3
mkdir -p -- "$dir"
head -c "$env_bytes" > "$dir/.env-node$node"
cat > "$dir/.launch-node$node.sh"
chmod 0755 "$dir/.launch-node$node.sh"
mv -f -- "$dir/.launch-node$node.sh" "$dir/launch.sh"
"""

_RUN_PROGRAM = r"""dir=$1 node=$2 cwd=$3
shift 3
set -a
. "$dir/.env-node$node" || exit 97
set +a
rm -f -- "$dir/.env-node$node"
cd -- "$cwd" || exit 96
echo "megapilot-ssh: node $node pid $$ on $(hostname)"
"$@" bash "$dir/launch.sh" </dev/null &
job=$!
# megapilot holds this session's stdin open while the job runs: its end means megapilot is gone (killed, even with
# SIGKILL, or its host lost), and the job goes with it: the session's process group, then every process carrying
# the job's token (torchrun starts its workers in sessions of their own).
(
  while IFS= read -r _; do :; done
  kill -s TERM -- "-$$" 2>/dev/null
  for f in $(grep -lzxsF -- "MEGAPILOT_JOB_TOKEN=$MEGAPILOT_JOB_TOKEN" /proc/[0-9]*/environ); do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$BASHPID" ] || kill -s TERM "$p" 2>/dev/null
  done
) <&0 >/dev/null 2>&1 &  # `<&0`: a background list's input is /dev/null unless it names its own
watcher=$!
wait "$job"
status=$?
kill "$watcher" 2>/dev/null
exit "$status"
"""

_STOP_PROGRAM = r"""pgid=$1 token=$2 grace=$3
marked() {
  local f p state
  for f in $(grep -lzxsF -- "MEGAPILOT_JOB_TOKEN=$token" /proc/[0-9]*/environ); do
    p=${f#/proc/}; p=${p%/environ}
    state=$(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
    [ -n "$state" ] && [ "$state" != Z ] && echo "$p"
  done
}
signal_all() {
  [ "$pgid" = - ] || kill -s "$1" -- "-$pgid" 2>/dev/null
  for p in $(marked); do kill -s "$1" "$p" 2>/dev/null; done
  true
}
signal_all TERM
end=$((SECONDS + grace))
while [ -n "$(marked)" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
if [ -n "$(marked)" ]; then signal_all KILL; sleep 0.5; fi
left=$(marked | tr '\n' ' ')
if [ -n "$left" ]; then echo "still alive after SIGKILL: $left"; exit 3; fi
"""


_LEFT_PROGRAM = r"""marker=$1 inside=$2 kill=$3
for f in $(grep -lzsF -- "MEGAPILOT_JOB_DIR=$marker" /proc/[0-9]*/environ 2>/dev/null); do
  p=${f#/proc/}; p=${p%/environ}
  [ "$p" = "$$" ] && continue
  value=$(tr '\0' '\n' < "$f" 2>/dev/null | sed -n 's/^MEGAPILOT_JOB_DIR=//p' | head -n1)
  if [ "$value" = "$marker" ] || { [ "$inside" = 1 ] && [ "${value#"$marker"/}" != "$value" ]; }; then
    state=$(awk '/^State:/ {print $2}' "/proc/$p/status" 2>/dev/null)
    [ -n "$state" ] && [ "$state" != Z ] || continue
    [ "$kill" = 1 ] && kill -s KILL "$p" 2>/dev/null
    echo "$p"
  fi
done
exit 0
"""


class SshNode(BaseModel):
    """One node as ssh reaches it. Unset fields fall back to the user's ssh config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="Host name, address or ssh config alias.")
    user: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    identity_file: Path | None = None
    options: tuple[str, ...] = Field(default=(), description="Extra `-o Key=Value` options.")
    address: str | None = Field(default=None, description="Address the other nodes reach it at "
                                                           "(MASTER_ADDR for node 0); default: host.")

    @field_validator("host", "user", "address")
    @classmethod
    def _not_an_option(cls, value: str | None) -> str | None:
        # ssh would read "-oProxyCommand=..." as an option, not a host.
        if value is not None and (not value or value.startswith("-") or any(c.isspace() for c in value)):
            raise ValueError(f"{value!r} is not a host or user name")
        return value

    @property
    def reach_address(self) -> str:
        return self.address or self.host

    def ssh_argv(self, ssh_binary: str = "ssh", extra_options: tuple[str, ...] = ()) -> list[str]:
        """`ssh -o BatchMode=yes -T [-p PORT] [-i KEY] [-l USER] [-o ...] HOST` (the remote command follows)."""
        argv = [ssh_binary, "-o", "BatchMode=yes", "-T"]
        if self.port is not None:
            argv += ["-p", str(self.port)]
        if self.identity_file is not None:
            argv += ["-i", str(self.identity_file)]
        if self.user is not None:
            argv += ["-l", self.user]
        # ssh keeps the first value it reads for an option: the node's own options come first, so they override
        # the executor's defaults (keepalives, connect timeout).
        for option in (*self.options, *extra_options):
            argv += ["-o", option]
        return [*argv, self.host]

    def where(self) -> str:
        """`host port P` (and the key), for messages."""
        port = f" port {self.port}" if self.port is not None else ""
        key = f" with key {self.identity_file}" if self.identity_file is not None else ""
        return f"{self.host}{port}{key}"

    @classmethod
    def of(cls, address: NodeAddress) -> SshNode:
        return cls(host=address.host, user=address.user, port=address.port, identity_file=address.identity_file,
                   options=address.options, address=address.address)


@dataclass
class _NodeRun:
    node: int
    ssh: SshNode
    process: subprocess.Popen[bytes]
    argv: list[str]
    remote_pid: int | None = None
    remote_host: str | None = None


@dataclass
class _SshJob(FollowedJob):
    token: str
    remote_dir: str
    runs: list[_NodeRun]
    logs: NodeLogs
    started_at_s: float = field(default_factory=time.monotonic)
    stop_cause: tuple[JobState, str] | None = None
    failed_node: int | None = None
    lost_nodes: list[int] = field(default_factory=list)


@register_executor
class SshExecutor(JobFollower[_SshJob]):
    """Runs a job on N nodes over ssh (node 0 the master). One instance can run several jobs."""

    name: ClassVar[str] = "ssh"
    capabilities: ClassVar[Capabilities] = Capabilities(
        launcher="torchrun", runs_here=False, shares_file_system=True, needs_node_list=True, multi_node=True,
        starts_containers=True, allocates_resources=False,
        summary="one torchrun per node of the cluster file, over the system ssh client (same paths on every node)")

    def __init__(self, nodes: list[SshNode], *, container: ContainerWrapper | None = None,
                 master_addr: str | None = None, remote_root: str | None = None, ssh_binary: str = "ssh",
                 connect_timeout_s: float = 15.0):
        """`remote_root`: where each node keeps the job's files, `<remote_root>/<combo>-<token>`; None
        uses the job directory's own absolute path (a shared filesystem, or loopback)."""
        if not nodes:
            raise MegapilotError("no nodes given", field="nodes", fix="give at least one ssh node (node 0 is master)")
        self.nodes = list(nodes)
        self.container = container
        self.master_addr = master_addr or self.nodes[0].reach_address
        self.remote_root = remote_root
        self.ssh_binary = ssh_binary
        self._ssh_options = (f"ConnectTimeout={max(1, math.ceil(connect_timeout_s))}", *KEEPALIVE_OPTIONS)
        self._jobs: dict[str, _SshJob] = {}
        atexit.register(self.close)

    @classmethod
    def from_settings(cls, settings: ExecutorSettings) -> SshExecutor:
        if not settings.nodes:
            raise MegapilotError("the ssh executor needs the nodes", field="--cluster",
                                 fix="pass the CVS cluster file (username, priv_key_file, node_dict) with --cluster")
        container = ContainerWrapper.entering(settings.container) if settings.container else None
        return cls([SshNode.of(node) for node in settings.nodes], container=container)

    # -- per node -----------------------------------------------------------------------------

    def run_on_nodes(self, script: str, args: list[str], nodes: int) -> list[NodeOutput]:
        # ssh joins the remote words into one shell line: each argument is quoted to arrive as one word.
        return [replace(run_node_script(index, [*node.ssh_argv(self.ssh_binary, self._ssh_options), "--", "bash",
                                                "-s", "--", *(shlex.quote(a) for a in args)], script), name=node.host)
                for index, node in enumerate(self.nodes[:nodes])]

    def processes_left(self, directory: Path, *, inside: bool = False, kill: bool = True) -> ProcessesLeft:
        """Every node is asked over a new connection; with `kill`, what is found there is killed."""
        marker = str(directory.resolve())
        flags = ["1" if inside else "0", "1" if kill else "0"]
        outputs = self.run_on_nodes(_LEFT_PROGRAM, [marker, *flags], len(self.nodes))
        found = {o.node: o.text.split() for o in outputs if o.text.split()}
        unreachable = [f"node {o.node} ({self.nodes[o.node].host}): {o.error}" for o in outputs if o.error]
        if unreachable:
            return ProcessesLeft(None, "could not check over ssh: " + "; ".join(unreachable))
        if found:
            count = sum(len(pids) for pids in found.values())
            where = ", ".join(f"node {n} pids {pids[:10]}" for n, pids in sorted(found.items()))
            done = "were killed over ssh" if kill else "are alive"
            return ProcessesLeft(count, f"{count} processes outlived the job and {done}: {where}")
        return ProcessesLeft(0, f"no process left on {len(outputs)} node(s), checked over a new ssh connection")

    def launch_request(self, *, gpus: bool) -> LaunchRequest:
        return LaunchRequest(launcher="torchrun", note="torchrun on each node uses what the node has")

    def check_submission(self, job: JobSpec) -> str | None:
        return None

    # -- the protocol -------------------------------------------------------------------------

    def submit(self, job: JobSpec) -> JobHandle:
        nodes = self._nodes_for(job)
        _check_env_names(job.env)
        with unstarted_job_dir(job) as created:
            directory = created.resolve()
            write_launch_script(job, directory)
            token = uuid.uuid4().hex
            remote_dir = (str(directory) if self.remote_root is None
                          else f"{self.remote_root.rstrip('/')}/{job.combo}-{token[:8]}")
            cwd = str(job.cwd) if job.cwd is not None else remote_dir
            master_port = int(job.env.get("MASTER_PORT") or free_port())
            script_bytes = (directory / "launch.sh").read_bytes()
            for index, node in enumerate(nodes):
                env_text = _env_file_text(self._environment(job, index, master_port, remote_dir, token))
                self._stage(index, node, remote_dir, env_text, script_bytes)
        submitted_at = utc_now()
        runs = [self._start_node(index, node, job, remote_dir, cwd, directory) for index, node in enumerate(nodes)]
        handle = JobHandle(executor=self.name, combo=job.combo, job_id=f"ssh-{token[:12]}", job_dir=directory,
                           submitted_at=submitted_at)
        record = JobRecord(
            combo=job.combo, executor=self.name, job_id=handle.job_id, command=list(runs[0].argv),
            source_script=str(job.script.resolve()) if job.script else None, cwd=cwd, env_names=sorted(job.env),
            master_addr=self.master_addr, master_port=master_port, nodes=job.nodes,
            gpus_per_node=job.gpus_per_node, submitted_at=submitted_at, started_at=submitted_at,
            status=JobStatus(state=JobState.RUNNING, train_iters=job.train_iters),
        )
        started_at_s = time.monotonic()
        ssh_job = _SshJob(spec=job, handle=handle, record=record, token=token, remote_dir=remote_dir, runs=runs,
                          logs=NodeLogs(directory, job.nodes, job.hang, started_at_s, job.train_iters),
                          started_at_s=started_at_s)
        self._jobs[handle.job_id] = ssh_job
        write_job_record(directory, record)
        return handle

    def poll(self, handle: JobHandle) -> JobStatus:
        job = self._jobs.get(handle.job_id)
        if job is None:  # started by another executor instance: its job.json is all there is
            return read_job_record(handle.job_dir).status
        if job.status.state.is_terminal:
            return job.status
        now_s = time.monotonic()
        iteration_before = job.logs.iteration
        pids_changed = self._note_remote_pids(job, job.logs.read_new(now_s))
        exit_codes = [run.process.poll() for run in job.runs]
        failed = next((i for i, code in enumerate(exit_codes) if code not in (None, 0)), None)
        if failed is not None:
            code = exit_codes[failed]
            job.failed_node = failed
            self._stop(job, JobState.FAILED, self._node_failure(job, failed, code), exit_code=code)
        elif all(code == 0 for code in exit_codes):
            self._finish(job, exit_code=0)
        elif (hang_reason := job.logs.hang_reason(now_s)) is not None:
            self._stop(job, JobState.HUNG, hang_reason)
        elif job.spec.timeout_s is not None and now_s - job.started_at_s > job.spec.timeout_s:
            where = position_text(job.logs.iteration, job.logs.leader.tracker.train_iters)
            self._stop(job, JobState.TIMEOUT, f"wall-clock limit of {job.spec.timeout_s:g} s reached {where}")
        else:
            job.record.status = job.logs.status(JobState.RUNNING, now_s, job.started_at_s)
            if pids_changed or job.logs.iteration != iteration_before:
                write_job_record(job.handle.job_dir, job.record)
        return job.status


    # -- remote commands ----------------------------------------------------------------------

    def remote_command(self, program: str, label: str, *args: str) -> str:
        """The one string ssh hands to the remote login shell: `exec bash -c PROGRAM label ARGS...`, quoted."""
        return shlex.join(["exec", "bash", "-c", program, label, *args])

    def _ssh(self, node: SshNode, program: str, label: str, *args: str) -> list[str]:
        return [*node.ssh_argv(self.ssh_binary, self._ssh_options), "--",
                self.remote_command(program, label, *args)]

    def _stage(self, index: int, node: SshNode, remote_dir: str, env_text: str, script: bytes) -> None:
        env_bytes = env_text.encode()
        argv = self._ssh(node, _STAGE_PROGRAM, "megapilot-stage", remote_dir, str(index), str(len(env_bytes)))
        try:
            done = subprocess.run(argv, input=env_bytes + script, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise MegapilotError(f"copying the job to node {index} ({node.host}) timed out", field="nodes",
                                 fix="check that the node is reachable with ssh") from None
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace").strip().splitlines()
            raise MegapilotError(
                f"cannot copy the job to node {index} ({node.host}): ssh exit {done.returncode}"
                + (f": {detail[-1]}" if detail else ""), field="nodes",
                fix=f"check that `{shlex.join([*node.ssh_argv(self.ssh_binary), 'true'])}` works without a prompt "
                    "(a new host key: accept it once, or add it to the known_hosts file the options name)")

    def _start_node(self, index: int, node: SshNode, job: JobSpec, remote_dir: str, cwd: str,
                    directory: Path) -> _NodeRun:
        names = sorted(self._environment(job, index, 0, remote_dir, "").keys())
        prefix = self.container.argv_prefix(names, remote_dir) if self.container is not None else []
        argv = self._ssh(node, _RUN_PROGRAM, "megapilot-node", remote_dir, str(index), cwd, *prefix)
        log_path = node_log_path(directory, index)
        with open(log_path, "ab", buffering=0) as log:
            # stdin stays open, unwritten, for the job's life: the remote side stops the job at its end (megapilot gone)
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, close_fds=True)
        return _NodeRun(node=index, ssh=node, process=process, argv=argv)

    def _stop_remote(self, job: _SshJob, runs: list[_NodeRun]) -> list[str]:
        """Run the stop program on the given nodes at once; returns what any node reports left alive."""
        grace = str(max(0, math.ceil(job.spec.stop_grace_s)))
        started = []
        for run in runs:
            # The process group only while its ssh session lives: once it ended, the number may be reused.
            alive = run.remote_pid is not None and run.process.poll() is None
            pgid = str(run.remote_pid) if alive else "-"
            argv = self._ssh(run.ssh, _STOP_PROGRAM, "megapilot-stop", pgid, job.token, grace)
            started.append((run, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT)))
        problems = []
        for run, stopper in started:
            try:
                output, _ = stopper.communicate(timeout=job.spec.stop_grace_s + 60)
            except subprocess.TimeoutExpired:
                stopper.kill()
                output, _ = stopper.communicate()
            if stopper.returncode != 0:
                text = output.decode(errors="replace").strip().replace("\n", " ")[:200]
                problems.append(f"node {run.node} ({run.ssh.host}): stop exit {stopper.returncode} {text}".strip())
        return problems

    # -- ending -------------------------------------------------------------------------------

    def _stop(self, job: _SshJob, state: JobState, reason: str, exit_code: int | None = None) -> None:
        """Stop every node's part of the job for `state`, then settle it."""
        job.stop_cause = (state, reason)
        job.record.stop_sent_at = utc_now()  # diagnose tells this stop from one by others
        self._finish(job, exit_code=exit_code)

    def _finish(self, job: _SshJob, exit_code: int | None) -> None:
        # Always sweep every node: a clean exit can still leave processes behind, and a stop must.
        problems = self._stop_remote(job, job.runs)
        for run in job.runs:
            _end_local_ssh(run.process)
        now_s = time.monotonic()
        self._note_remote_pids(job, job.logs.read_rest(now_s))
        cause: tuple[JobState, str | None] = (
            job.stop_cause if job.stop_cause is not None
            else job.logs.clean_exit_verdict(job.spec.require_final_iteration))
        state, reason = cause
        notes = [reason] if reason else []
        notes += problems
        if job.lost_nodes and not problems:
            lost = ", ".join(f"node {n}" for n in job.lost_nodes)
            notes.append(f"the processes on {lost} were stopped over a new ssh connection")
        job.record.status = job.logs.status(state, now_s, job.started_at_s, exit_code=exit_code,
                                            reason="; ".join(notes) or None)
        job.record.ended_at = utc_now()
        write_job_record(job.handle.job_dir, job.record)

    def _node_failure(self, job: _SshJob, index: int, exit_code: int | None) -> str:
        run = job.runs[index]
        job.logs.read_rest(time.monotonic())
        others = [f"node {r.node}" for r in job.runs if r.node != index and r.process.poll() is None]
        lost = self._lost_connection(job, index, exit_code)
        if lost is not None:
            job.lost_nodes.append(index)
            text = f"lost the connection to node {index} ({run.ssh.where()}): {lost}"
            return text + (f"; stopped {', '.join(others)}" if others else "")
        how = describe_exit_code(exit_code) if exit_code is not None else "an unknown exit"
        clue = job.logs.failure_reason(index, None)
        text = f"node {index} ({run.ssh.host}) failed with {how}"
        if clue and clue != "failed":
            text += f": {clue}"
        if others:
            text += f"; stopped {', '.join(others)}"
        return text

    # -- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _lost_connection(job: _SshJob, index: int, exit_code: int | None) -> str | None:
        """ssh's own words when the node's connection (not its job) ended; None for a job that failed.

        A local ssh client killed by a signal (negative exit) leaves the remote job's fate unknown; exit 255 is
        ssh's own failure unless the job itself exited 255, which ssh's message tells apart."""
        if exit_code is not None and exit_code < 0:
            return f"the ssh client was {describe_exit_code(exit_code)}"
        if exit_code != SSH_FAILURE_EXIT:
            return None
        said = next((line.strip() for line in reversed(_last_lines(job.logs.nodes[index].tail.path))
                     if _LOST_CONNECTION.search(line)), None)
        return f"ssh exited 255: {said}" if said else None

    def _nodes_for(self, job: JobSpec) -> list[SshNode]:
        if job.nodes > len(self.nodes):
            raise MegapilotError(f"the job needs {job.nodes} nodes but the ssh executor has {len(self.nodes)}",
                                 field="nodes", fix="give as many ssh nodes as the job's node count")
        return self.nodes[:job.nodes]

    def _environment(self, job: JobSpec, node: int, master_port: int, remote_dir: str,
                     token: str) -> dict[str, str]:
        rendezvous = {
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(master_port),
            "PET_MASTER_ADDR": self.master_addr, "PET_MASTER_PORT": str(master_port),
            "NNODES": str(job.nodes), "NODE_RANK": str(node), **ranks_per_node_variable(job),
            "PYTHONUNBUFFERED": "1", "PET_TEE": "3",
            JOB_MARKER_VARIABLE: remote_dir, "MEGAPILOT_COMBO": job.combo,
        }
        return {**rendezvous, **job.env, JOB_TOKEN_VARIABLE: token}

    def _note_remote_pids(self, job: _SshJob, lines_by_node: dict[int, list[str]]) -> bool:
        """Pick up the `megapilot-ssh: node N pid P` line each node prints first; True if one is new."""
        changed = False
        for node, lines in lines_by_node.items():
            run = job.runs[node]
            if run.remote_pid is not None:
                continue
            for line in lines[:5]:
                match = _PID_LINE.match(line)
                if match and int(match["node"]) == node:
                    run.remote_pid, run.remote_host = int(match["pid"]), match["host"]
                    changed = True
                    break
        if changed:
            job.record.processes = [
                RecordedProcess(pid=run.remote_pid, ppid=0, name=f"node {run.node} ({run.ssh.host})",
                                cmdline=f"bash {job.remote_dir}/launch.sh (process group {run.remote_pid} "
                                        f"on {run.remote_host})")
                for run in job.runs if run.remote_pid is not None
            ]
        return changed


def _last_lines(path: Path, size_bytes: int = 4096) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - size_bytes))
            return handle.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _check_env_names(env: dict[str, str]) -> None:
    bad = [name for name in env if not _ENV_NAME.match(name)]
    if bad:
        raise MegapilotError(f"environment variable names {bad!r} are not valid shell names", field="env",
                             fix="use letters, digits and '_' (not starting with a digit)")


def _env_file_text(env: dict[str, str]) -> str:
    """`NAME='value'` lines a bash `set -a; . file` reads back unchanged (values shell-quoted)."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items())


def _end_local_ssh(process: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """The remote side has been stopped: its ssh client should exit; end it if it lingers."""
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
