"""A slowed node for the end-to-end tests: its worker processes stopped and continued on a fixed cycle (SIGSTOP /
SIGCONT), what a throttled GPU or a noisy neighbour does to a node. Who the workers are is the caller's: the
descendants of a node's launcher, or the processes an executor started for one node rank."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

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


def ranks_of_node(node_rank: int, command: str) -> Finder:
    """The worker ranks (not their torchrun) whose command line holds `command` and whose executor gave them
    NODE_RANK=`node_rank`."""
    def find() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if command not in " ".join(process.info["cmdline"] or []):
                    continue
                env = process.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("NODE_RANK") == str(node_rank) and "LOCAL_RANK" in env:
                found.append(process)
        return found
    return find


class DutyCycle:
    """Stops and continues what `find` returns on a fixed cycle until closed. `rescan_s` > 0 looks the workers up
    again only that often (reading every process's environment takes long on a busy machine)."""

    def __init__(self, find: Finder, stopped_s: float, running_s: float, rescan_s: float = 0.0):
        self.find, self.stopped_s, self.running_s, self.rescan_s = find, stopped_s, running_s, rescan_s
        self.seen: set[int] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._cycle, daemon=True)
        self.thread.start()

    @staticmethod
    def _signal(workers: list[psutil.Process], sig: signal.Signals) -> None:
        for worker in workers:
            try:
                worker.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def _cycle(self) -> None:
        workers: list[psutil.Process] = []
        looked_at = 0.0
        while not self.done.is_set():
            if not workers or time.monotonic() - looked_at >= self.rescan_s:
                workers, looked_at = self.find(), time.monotonic()
                self.seen |= {w.pid for w in workers}
            self._signal(workers, signal.SIGSTOP)
            time.sleep(self.stopped_s)
            self._signal(workers, signal.SIGCONT)
            time.sleep(self.running_s)

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self._signal(self.find(), signal.SIGCONT)
