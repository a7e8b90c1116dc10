"""Process helpers for local jobs: a free port, a process group of its own, and a tree that dies whole.

A job is started with `start_new_session=True`, so its launcher leads a new session and process
group (session id = process group id = the launcher's PID). Stopping it sends SIGTERM to that
group, waits a grace period, then SIGKILLs whatever is left.

The group is not enough: torchrun starts every worker in a session of its own, and any process
can call `setsid`. So `ProcessTreeWatch` finds a job's processes three ways: the launcher's
session, every descendant it has seen in a snapshot, and every process whose environment carries
the job's marker variable (inherited by all descendants, even ones started and orphaned between
two snapshots). A zombie counts as gone: it holds no resources but its exit status, and whether
init reaps it is not ours to decide.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from megapilot.execute.interrupt import die_with_parent

# torchrun's default; never handed out, so two jobs (or a stray default run) cannot collide on it.
TORCHRUN_DEFAULT_PORT = 29500


# Ports handed out for rendezvous stores lie below the kernel's ephemeral range: a port there is never given to an
# outgoing connection, so nothing but another listener can take it between the moment it is chosen (when a launch
# script is rendered) and the moment the store binds it (after the job is staged, seconds later on a busy node).
# An ephemeral port chosen by bind(0) can be taken in that window by any connect() on the machine (gloo opens
# hundreds), and both nodes then fail their rendezvous.
_LISTEN_PORTS = (20000, 32768)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody holds right now, outside the ephemeral range, never torchrun's default 29500."""
    low, high = _LISTEN_PORTS
    ephemeral_low = _ephemeral_low()
    high = min(high, ephemeral_low) if ephemeral_low > low else high
    for _ in range(200):
        port = random.randrange(low, high)
        if port != TORCHRUN_DEFAULT_PORT and _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # every port of the range taken: the OS picks
        probe.bind((host, 0))
        return int(probe.getsockname()[1])  # an AF_INET address is (host, port); typeshed types it Any


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def start_process_group(argv: list[str], *, cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start argv as the leader of a new session, stdout and stderr appended to log_path.

    The leader dies with megapilot (PR_SET_PDEATHSIG); the rest of its tree is the watchdog's
    (megapilot.execute.interrupt), since the kernel does not pass that setting on to grandchildren."""
    with open(log_path, "ab", buffering=0) as log:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True, preexec_fn=die_with_parent,
        )


@dataclass(frozen=True)
class ProcessInfo:
    """One process seen in a job's tree (what job.json records)."""

    pid: int
    ppid: int
    name: str
    cmdline: str


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)  # psutil ships no types
    except psutil.NoSuchProcess:
        return False


def _describe(proc: psutil.Process) -> ProcessInfo | None:
    try:
        with proc.oneshot():
            cmdline = " ".join(proc.cmdline())
            return ProcessInfo(pid=proc.pid, ppid=proc.ppid(), name=proc.name(), cmdline=cmdline[:300])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def session_members(session_id: int) -> list[psutil.Process]:
    """Live processes of a session (the job's launcher started it), wherever their parent is now."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == session_id and proc.pid != os.getpid() and _is_alive(proc):
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members


def marked_processes(name: str, value: str, *, inside: bool = False) -> list[psutil.Process]:
    """Live processes (of this user) whose environment has name=value; with `inside`, also those whose
    value is a path under `value` (the jobs of a whole run directory)."""
    marked = []
    for proc in psutil.process_iter():
        try:
            marker = proc.environ().get(name)
            matches = marker == value or (inside and marker is not None and marker.startswith(value + os.sep))
            if matches and proc.pid != os.getpid() and _is_alive(proc):
                marked.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return marked


class ProcessTreeWatch:
    """Remembers every process a job's launcher has started, for the record and for the stop."""

    def __init__(self, root_pid: int, marker: tuple[str, str] | None = None):
        self.root_pid = root_pid
        self.marker = marker
        self._seen: dict[int, psutil.Process] = {}
        self.history: dict[int, ProcessInfo] = {}
        self.snapshot()

    def snapshot(self) -> list[ProcessInfo]:
        """Look at the tree now; returns the processes seen for the first time."""
        try:
            root = psutil.Process(self.root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        new = []
        for proc in tree:
            known = self._seen.get(proc.pid) == proc  # same pid AND create time
            self._seen[proc.pid] = proc
            info = _describe(proc)  # again for known ones: `exec` changes the command line
            if info is not None:
                self.history[proc.pid] = info
                if not known:
                    new.append(info)
        return new

    def alive(self) -> list[psutil.Process]:
        """Every process of the job still running: the session plus any descendant that left it."""
        found = {p.pid: p for p in session_members(self.root_pid)}
        if self.marker is not None:
            found.update((p.pid, p) for p in marked_processes(*self.marker))
        for pid, proc in self._seen.items():
            if pid not in found and _is_alive(proc):
                found[pid] = proc
        return list(found.values())

    def stop(self, grace_s: float) -> list[ProcessInfo]:
        """SIGTERM the whole job, wait up to grace_s, SIGKILL the rest; returns any survivors."""
        self.snapshot()
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.1)
        if self.alive():
            self._signal_all(signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.1)
        return [info for proc in self.alive() if (info := _describe(proc)) is not None]

    def _signal_all(self, signum: int) -> None:
        try:
            os.killpg(self.root_pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in self.alive():
            try:
                proc.send_signal(signum)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
