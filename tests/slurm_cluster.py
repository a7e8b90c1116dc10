"""A real SLURM cluster on this machine, for tests: munged, slurmctld and N slurmd daemons.

    # tests/conftest.py registers this module as a plugin: name the fixture and it starts

    def test_x(slurm_cluster):
        slurm_cluster.run("sbatch", "--test-only", "job.sh")

    def test_y(slurm_host_node):          # one node named after this host: jobs really run
        job = slurm_host_node.submit(script)
        assert slurm_host_node.wait(job) == "COMPLETED"

Everything lives under one short temporary root (config, state, spool, logs, munge socket and key);
nothing in /etc is touched. Nodes `node1..nodeN` share this host (Debian's slurmd is built with
MULTIPLE_SLURMD: one `NodeName` line per node with its own port), each with `Gres=gpu:G` backed by
/dev/tty0..7 so `--gpus-per-node` is schedulable; with `gpus_per_node=0` the nodes declare no GPU gres
at all, as a CPU cluster does (a job asking for GPUs is refused). Every node declares this machine's
CPUs and memory. Settings follow what was measured on this kind of
machine: linuxproc tracking, no task plugin, `batch_sched_delay=0` (no 3 s hold per batch job),
`EnforcePartLimits=ALL` (an impossible request fails instead of pending forever).

Needs root (slurmd starts jobs as their users) and the Debian packages slurmctld, slurmd,
slurm-client and munge (scripts/apt-packages.txt); otherwise `unavailable_reason()` says why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from megapilot.execute.process import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel", "srun")
START_TIMEOUT_S = 30.0


def unavailable_reason() -> str | None:
    """Why a local cluster cannot start here, or None if it can."""
    missing = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"SLURM/munge binaries missing: {', '.join(missing)} (scripts/setup.sh installs them)"
    if os.geteuid() != 0:
        return "a local SLURM cluster needs root (slurmd launches jobs as their users)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class LocalSlurmCluster:
    """A running one-machine cluster; `run` invokes SLURM clients against it."""

    nodes: int = 2
    gpus_per_node: int = 8
    #: Name the single node after this machine, so a job's `scontrol show hostnames` resolves (real runs).
    host_named: bool = False
    #: Explicit node names (as many as `nodes`), e.g. names this machine resolves to itself.
    names: tuple[str, ...] | None = None
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mpslurm-", dir="/tmp")))
    _processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for SLURM clients: points them at this cluster's config."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def node_names(self) -> list[str]:
        if self.host_named:
            return [socket.gethostname()]
        if self.names:
            return list(self.names)
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> LocalSlurmCluster:
        """Start every daemon; if one fails, stop the ones already started before raising."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LocalSlurmCluster:
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        self._start_munge()
        self._write_config()
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [_binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)])
        self._wait_until_idle()
        return self

    def stop(self) -> None:
        for proc in reversed(self._processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self._processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __post_init__(self) -> None:
        if self.host_named and self.nodes != 1:
            raise ValueError("host_named clusters have exactly one node")
        if self.names is not None and len(self.names) != self.nodes:
            raise ValueError("give one name per node")

    def __enter__(self) -> LocalSlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- clients ---------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = False, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
        """Run a SLURM client (sbatch, squeue, ...) against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout_s)

    def submit(self, script: Path, *extra: str) -> str:
        """sbatch a script; returns the job id."""
        result = self.run("sbatch", "--parsable", *extra, str(script))
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr}\n{self.log_tail()}")
        return result.stdout.strip().split(";")[0]

    def wait(self, job_id: str, timeout_s: float = 300.0) -> str:
        """Wait until the job has left the queue; return its final state (COMPLETED, FAILED, ...)."""
        deadline = time.monotonic() + timeout_s
        while self.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip():
            if time.monotonic() > deadline:
                self.run("scancel", job_id)
                raise TimeoutError(f"job {job_id} still queued or running after {timeout_s} s")
            time.sleep(0.5)
        return self.final_state(job_id)

    def final_state(self, job_id: str) -> str:
        """The job's end state from the job-completion log (no accounting daemon needed)."""
        completions = self.root / "log" / "jobcomp.txt"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for line in completions.read_text().splitlines() if completions.exists() else []:
                fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
                if fields.get("JobId") == job_id:
                    return fields.get("JobState", "UNKNOWN")
            time.sleep(0.2)
        return "UNKNOWN"

    def log_tail(self, lines: int = 20) -> str:
        """The end of every daemon log, for failure messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    # ---- internals -------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 (lives as long as the daemon)
        self._processes.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True))

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        subprocess.run([_binary("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        os.chmod(key, 0o600)
        self._spawn("munged", [
            _binary("munged"), "-F", "--force", f"--socket={munge / 'munge.sock'}", f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (munge / "munge.sock").exists():
            if time.monotonic() > deadline or self._processes[-1].poll() is not None:
                raise RuntimeError(f"munged did not start\n{self.log_tail()}")
            time.sleep(0.05)

    def _write_config(self) -> None:
        r = self.root
        host = socket.gethostname()
        lines = [
            "ClusterName=megapilot",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'munge.sock'}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=batch_sched_delay=0",
            "EnforcePartLimits=ALL",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "GresTypes=gpu",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'log' / 'jobcomp.txt'}",
            "MpiDefault=none",
        ]
        cpus = os.cpu_count() or 1
        memory_mb = _memory_mb()
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        for name in self.node_names:
            # With explicit names one node may be called like this host, and then no other node
            # may claim this host as its NodeHostname; the others' need not resolve (NodeAddr does).
            node_host = name if self.names else host
            lines.append(f"NodeName={name} NodeHostname={node_host} NodeAddr=127.0.0.1 Port={free_port()} "
                         f"CPUs={cpus} RealMemory={memory_mb}{gres} State=UNKNOWN")
        lines.append(f"PartitionName=main Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        if self.gpus_per_node:
            last_tty = self.gpus_per_node - 1
            (r / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File=/dev/tty[0-{last_tty}]\n")

    def _wait_until_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self._processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"daemon exited: {dead}\n{self.log_tail()}")
            states = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
            if states and states[1::2] == ["idle"] * self.nodes:
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after {START_TIMEOUT_S} s\n{self.log_tail()}")


def _memory_mb() -> int:
    """This machine's memory in MB, as slurmd reads it, less 5 % (a node may not declare more than it has)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 95 // 100 // 1024  # a little under: slurmd refuses a node that overstates
    return 1000


@pytest.fixture(scope="session")
def slurm_cpu_node():
    """A started one-node cluster named after this host that declares no GPUs: a CPU cluster, jobs really run."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurmCluster(nodes=1, gpus_per_node=0, host_named=True).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_host_node():
    """A started one-node cluster whose node is this machine's hostname: jobs can really run here."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurmCluster(nodes=1, gpus_per_node=8, host_named=True).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster():
    """A started two-node cluster (8 fake GPUs per node) for the whole session; skipped if impossible."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurmCluster(nodes=2, gpus_per_node=8).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def runnable_node_names() -> tuple[str, str] | None:
    """Two node names for a cluster that really runs multi-node jobs: this host's name, then '<host>-n2'.

    Launch scripts take MASTER_ADDR from the job's first node name, so that one must resolve here;
    SLURM lists nodes sorted, and '<host>' sorts before '<host>-n2'. ('localhost' will not do:
    SLURM replaces that node name by the host's name.)
    """
    host = socket.gethostname()
    try:
        socket.gethostbyname(host)
    except OSError:
        return None
    return host, f"{host}-n2"


@pytest.fixture(scope="session")
def slurm_two_runnable_nodes():
    """A started two-node cluster whose first node is this host's name: multi-node jobs really run."""
    reason = unavailable_reason()
    names = runnable_node_names()
    if reason or names is None:
        pytest.skip(reason or "this machine's host name does not resolve")
    cluster = LocalSlurmCluster(nodes=2, gpus_per_node=8, names=names).start()
    try:
        yield cluster
    finally:
        cluster.stop()
