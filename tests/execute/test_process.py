"""Free ports and stopping a whole process tree, with real processes."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import psutil

from megapilot.execute.process import TORCHRUN_DEFAULT_PORT, ProcessTreeWatch, free_port, start_process_group

# A parent that ignores SIGTERM and starts two children: one stays in the group, one leaves it.
STUBBORN_TREE = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
print("ready", flush=True)
time.sleep(600)
"""


def wait_for_line(path, text, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


def test_free_port_is_bindable_and_not_torchrun_default():
    port = free_port()
    assert port != TORCHRUN_DEFAULT_PORT
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_lies_below_the_ephemeral_range_so_no_outgoing_connection_takes_it():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(port < low for port in ports)
    assert len(ports) > 40  # chosen at random: two suites rendering at once do not pick the same one


def test_stop_kills_whole_tree_even_detached_and_sigterm_ignoring(tmp_path):
    log = tmp_path / "out.log"
    process = start_process_group([sys.executable, "-c", STUBBORN_TREE], cwd=tmp_path, env={}, log_path=log)
    wait_for_line(log, "ready")
    watch = ProcessTreeWatch(process.pid)
    time.sleep(0.3)  # let the detached child call setsid
    watch.snapshot()
    seen = [psutil.Process(pid) for pid in watch.history]
    assert len(seen) == 3

    started = time.monotonic()
    survivors = watch.stop(grace_s=0.5)
    process.wait(timeout=5)

    assert survivors == []
    assert time.monotonic() - started < 5
    for proc in seen:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
