"""A slowed node for the end-to-end tests: its worker processes stopped and continued on a fixed cycle (SIGSTOP /
SIGCONT), what a throttled GPU or a noisy neighbour does to a node. Who the workers are is the caller's: the
descendants of a node's launcher, or the processes an executor started for one node rank."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.queues
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

Finder = Callable[[], list[psutil.Process]]


def descendants_of(pid: int) -> Finder:
    """Every process below `pid` (a node's torchrun and its ranks)."""
    def find() -> list[psutil.Process]:
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
    return find


def ranks_of_node(node_rank: int, command: str, under: Path) -> Finder:
    """The worker ranks (not their torchrun) whose command line holds `command`, whose executor gave them
    NODE_RANK=`node_rank` and who run in a folder below `under` (the test's own jobs: the machine may be running
    another test's ranks of the same command at the same time)."""
    def find() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                line = " ".join(process.info["cmdline"] or [])
                # a process torchrun forked shows torchrun's command line until it execs: not a worker yet
                if command not in line or "torch.distributed.run" in line or "torchrun" in line:
                    continue
                env = process.environ()
                if not process.cwd().startswith(str(under)):
                    continue
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("NODE_RANK") == str(node_rank) and "LOCAL_RANK" in env:
                found.append(process)
        return found
    return find


class DutyCycle:
    """Stops and continues what `find` returns on a fixed cycle until closed. `rescan_s` > 0 looks the workers up
    again only that often (reading every process's environment takes long on a busy machine).

    The cycle runs in a process of its own, at a raised priority where the machine allows it: in a thread of the
    test's process, on a machine busy with other tests, its wake-ups came late (the GIL, the scheduler) and the
    "stopped" node ran most of the time, as fast as the other."""

    def __init__(self, find: Finder, stopped_s: float, running_s: float, rescan_s: float = 0.0):
        self.find, self.stopped_s, self.running_s, self.rescan_s = find, stopped_s, running_s, rescan_s
        self.seen: set[int] = set()
        context = multiprocessing.get_context("fork")  # `find` is a closure: the child gets it by fork, not pickle
        self.done = context.Event()
        self.report: multiprocessing.queues.SimpleQueue[set[int]] = context.SimpleQueue()
        self.process = context.Process(target=self._cycle, daemon=True)
        self.process.start()

    @staticmethod
    def _signal(workers: list[psutil.Process], sig: signal.Signals) -> None:
        for worker in workers:
            try:
                worker.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def _cycle(self) -> None:
        with contextlib.suppress(OSError):  # not permitted: the cycle still runs, at the usual priority
            os.setpriority(os.PRIO_PROCESS, 0, -15)
        workers: list[psutil.Process] = []
        seen: set[int] = set()
        looked_at = 0.0
        while not self.done.is_set():
            if not workers or time.monotonic() - looked_at >= self.rescan_s:
                workers, looked_at = self.find(), time.monotonic()
                seen |= {w.pid for w in workers}
            self._signal(workers, signal.SIGSTOP)
            time.sleep(self.stopped_s)
            self._signal(workers, signal.SIGCONT)
            time.sleep(self.running_s)
        self.report.put(seen)

    def close(self) -> None:
        self.done.set()
        self.process.join(timeout=60)
        if self.process.exitcode == 0:
            self.seen = self.report.get()
        self._signal(self.find(), signal.SIGCONT)
