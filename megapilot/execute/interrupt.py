"""Signals to megapilot stop everything it started, and nothing it started outlives it.

`timeout` and systemd send SIGTERM, a closed SSH session SIGHUP, a terminal SIGINT. While
`stop_on_signals()` is active each of them, the first time, raises `Interrupted` (a
KeyboardInterrupt, so every `except KeyboardInterrupt` that stops a job also handles it) in the
main thread: the caller stops its jobs through their executors, writes what it has, and exits
with `128 + N`. A second signal forces the stop: every job registered with `register_force_stop`
is SIGKILLed at once, without its grace period. A third exits on the spot.

A SIGKILL cannot be caught, so a local job is also tied to megapilot's life from the other side:
its launcher gets `PR_SET_PDEATHSIG` (Linux), and a small watchdog process, in a session of its own,
stops the job's whole tree (its process group and every process carrying its marker) as soon as
megapilot is gone (`start_watchdog`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from megapilot.execute.failure import signal_name

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
WATCHDOG_POLL_S = 0.5
WATCHDOG_GRACE_S = 5.0
JOB_CHECK_EVERY = 20  # polls between two looks at the job's processes (a scan of every process)


class Interrupted(KeyboardInterrupt):
    """megapilot was asked to stop by a signal; `exit_code` is the shell's 128 + N."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal_name(signum))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def name(self) -> str:
        return signal_name(self.signum)


def describe_interruption(signum: int) -> str:
    """How the run was stopped, as the result's reason says it."""
    return "interrupted by " + ("Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal_name(signum))


def stop_reason(exc: BaseException, iteration: int | None = None, train_iters: int | None = None) -> str:
    """Why a job its follower stopped was stopped, as its job.json records it: the signal that interrupted
    megapilot and the iteration last seen, or the error that ended the following (a bare "cancelled" said
    neither)."""
    if isinstance(exc, KeyboardInterrupt):
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        # the iteration of the last poll: the log may have gone on a little since (the record's own count says)
        where = (f" at iteration {iteration} of {train_iters or '?'}" if iteration is not None
                 else " before an iteration line was read")
        return f"{describe_interruption(signum)}{where}; the run was stopped"
    said = " ".join(str(exc).split())[:300]
    return f"cancelled: following the job failed ({type(exc).__name__}{f': {said}' if said else ''})"


_force_stops: dict[int, Callable[[], object]] = {}
_received: list[int] = []


def register_force_stop(key: int, kill_now: Callable[[], object]) -> None:
    """`kill_now` SIGKILLs one running job; called on a second signal. Unregister when the job ends."""
    _force_stops[key] = kill_now


def unregister_force_stop(key: int) -> None:
    _force_stops.pop(key, None)


def received_signal() -> int | None:
    """The first stop signal received while `stop_on_signals` was active (None when none was)."""
    return _received[0] if _received else None


def _force_stop_all() -> None:
    for kill_now in list(_force_stops.values()):
        try:
            kill_now()
        except Exception:  # noqa: BLE001 - a forced stop is best effort; a job that is gone is fine
            pass


_raising: list[bool] = [True]


def finishing() -> None:
    """From now on a first signal is only recorded, not raised: the caller is writing its results (report,
    history) and a half-written report helps nobody; a second signal still forces the stop."""
    _raising[0] = False


def _handler(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) == 1:
        if _raising[0]:
            raise Interrupted(signum)
        return
    if len(_received) == 2:
        sys.stderr.write(f"\n{signal_name(signum)} again: stopping every job now (SIGKILL)\n")
        _force_stop_all()
        return
    os._exit(128 + _received[0])


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise `Interrupted` once, then force the stop (see the module's docstring)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    _received.clear()
    _raising[0] = True
    previous = {signum: signal.signal(signum, _handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---- children die with megapilot --------------------------------------------------------------------

def die_with_parent() -> None:
    """`preexec_fn`: the kernel SIGKILLs this child when the thread that started it dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def start_watchdog(job_pgid: int, marker_name: str, marker_value: str) -> subprocess.Popen[bytes] | None:
    """A process that outlives megapilot only to stop this job's tree when megapilot dies (also by SIGKILL).

    It leaves on its own once the job has no process left. It runs in a session of its own so that the
    terminal's Ctrl-C (sent to megapilot's whole process group) does not reach it."""
    argv = [sys.executable, "-m", "megapilot.execute.interrupt", str(os.getpid()), str(job_pgid), marker_name,
            marker_value]
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        return None


def _watch(parent_pid: int, job_pgid: int, marker_name: str, marker_value: str) -> None:
    # cycle: execute.process imports interrupt (die_with_parent)
    from megapilot.execute.process import marked_processes, session_members

    def job_processes() -> list:  # type: ignore[type-arg]  # psutil ships no types
        found = {p.pid: p for p in session_members(job_pgid)}
        found.update((p.pid, p) for p in marked_processes(marker_name, marker_value))
        return list(found.values())

    polls = 0
    while _alive(parent_pid) and os.getppid() == parent_pid:  # cheap: megapilot ends this watchdog with the job
        time.sleep(WATCHDOG_POLL_S)
        polls += 1
        if polls % JOB_CHECK_EVERY == 0 and not job_processes():
            return  # the job ended without megapilot settling it (an executor dropped): nothing to guard
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(job_pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in job_processes():
            try:
                proc.send_signal(signum)
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass
        deadline = time.monotonic() + WATCHDOG_GRACE_S
        while time.monotonic() < deadline and job_processes():
            time.sleep(0.1)
        if not job_processes():
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":  # the watchdog: python -m megapilot.execute.interrupt PARENT PGID NAME VALUE
    _watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])


__all__ = ["STOP_SIGNALS", "Interrupted", "describe_interruption", "die_with_parent", "finishing", "received_signal",
           "register_force_stop", "signal_name", "start_watchdog", "stop_on_signals", "stop_reason",
           "unregister_force_stop"]
