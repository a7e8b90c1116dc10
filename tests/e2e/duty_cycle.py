"""A slowed node for the end-to-end tests: its worker processes stopped and continued on a fixed cycle (SIGSTOP /
SIGCONT), what a throttled GPU or a noisy neighbour does to a node. Who the workers are is the caller's: the
descendants of a node's launcher, or the processes an executor started for one node rank."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.queues
import multiprocessing.synchronize
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil


class Finder(Protocol):
    """Who the workers are now (called again on every rescan). A picklable object: the cycle's own process gets it."""

    def __call__(self) -> list[psutil.Process]: ...


@dataclass(frozen=True)
class descendants_of:  # lower case: read as a function at the call sites, `descendants_of(pid)`
    """Every process below `pid` (a node's torchrun and its ranks)."""

    pid: int

    def __call__(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


@dataclass(frozen=True)
class ranks_of_node:  # lower case: read as a function at the call sites
    """The worker ranks (not their torchrun) whose command line holds `command`, whose executor gave them
    NODE_RANK=`node_rank` and who run in a folder below `under` (the test's own jobs: the machine may be running
    another test's ranks of the same command at the same time)."""

    node_rank: int
    command: str
    under: Path

    def __call__(self) -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                line = " ".join(process.info["cmdline"] or [])
                # a process torchrun forked shows torchrun's command line until it execs: not a worker yet
                if self.command not in line or "torch.distributed.run" in line or "torchrun" in line:
                    continue
                env = process.environ()
                if not process.cwd().startswith(str(self.under)):
                    continue
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("NODE_RANK") == str(self.node_rank) and "LOCAL_RANK" in env:
                found.append(process)
        return found


STARTUP_TIMEOUT_S = 120.0


class DutyCycle:
    """Stops and continues what `find` returns on a fixed cycle until closed. `rescan_s` > 0 looks the workers up
    again only that often (reading every process's environment takes long on a busy machine).

    The cycle runs in a process of its own, started fresh (not forked from the test's threads, whose locks a fork
    can leave held), at a raised priority where the machine allows it: in a thread of the test's process, on a
    machine busy with other tests, its wake-ups came late (the GIL, the scheduler) and the "stopped" node ran most
    of the time, as fast as the other."""

    def __init__(self, find: Finder, stopped_s: float, running_s: float, rescan_s: float = 0.0):
        self.find = find
        self.seen: set[int] = set()
        context = multiprocessing.get_context("spawn")
        self.done, cycling = context.Event(), context.Event()
        self.report: multiprocessing.queues.SimpleQueue[set[int]] = context.SimpleQueue()
        self.process = context.Process(target=_cycle, args=(find, stopped_s, running_s, rescan_s, self.done,
                                                             cycling, self.report), daemon=True)
        self.process.start()
        # a fresh interpreter takes seconds to start on a busy machine: returned before it cycles, a node started
        # next ran its first steps unslowed, and the straggler's median over a short run was once no slower
        cycling.wait(timeout=STARTUP_TIMEOUT_S)

    def close(self) -> None:
        self.done.set()
        self.process.join(timeout=60)
        if self.process.exitcode == 0:
            self.seen = self.report.get()
        _signal(self.find(), signal.SIGCONT)


def _signal(workers: list[psutil.Process], sig: signal.Signals) -> None:
    for worker in workers:
        try:
            worker.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _cycle(find: Finder, stopped_s: float, running_s: float, rescan_s: float,
           done: multiprocessing.synchronize.Event, cycling: multiprocessing.synchronize.Event,
           report: multiprocessing.queues.SimpleQueue[set[int]]) -> None:
    with contextlib.suppress(OSError):  # not permitted: the cycle still runs, at the usual priority
        os.setpriority(os.PRIO_PROCESS, 0, -15)
    cycling.set()
    workers: list[psutil.Process] = []
    seen: set[int] = set()
    looked_at = 0.0
    while not done.is_set():
        if not workers or time.monotonic() - looked_at >= rescan_s:
            workers, looked_at = find(), time.monotonic()
            seen |= {w.pid for w in workers}
        _signal(workers, signal.SIGSTOP)
        time.sleep(stopped_s)
        _signal(workers, signal.SIGCONT)
        time.sleep(running_s)
    report.put(seen)
