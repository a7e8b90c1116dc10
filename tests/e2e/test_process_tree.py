"""The test helper that runs torchrun jobs stops every process, also those in sessions of their own."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.process_tree import run_tree, started_tree

# A parent that starts a child in a new session (as torchrun does with each worker), then both sleep.
ESCAPING_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def _child_pid(log_path: Path) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = log_path.read_text().strip()
        if text:
            return int(text.splitlines()[0])
        time.sleep(0.05)
    raise AssertionError("the child never reported its pid")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_failing_block_leaves_no_process_behind_even_in_another_session(tmp_path: Path) -> None:
    log_path = tmp_path / "out.log"
    with (pytest.raises(RuntimeError, match="test failed"),
          started_tree([sys.executable, "-c", ESCAPING_CHILD], log_path=log_path, cwd=tmp_path,
                       env=dict(os.environ)) as process):
            child = _child_pid(log_path)
            deadline = time.monotonic() + 20
            while os.getsid(child) == os.getsid(process.pid) and time.monotonic() < deadline:
                time.sleep(0.05)  # the child has not called setsid yet
            assert os.getsid(child) != os.getsid(process.pid)  # out of reach of killpg
            raise RuntimeError("test failed")
    assert _gone(process.pid) and _gone(child)


def test_a_timeout_returns_minus_nine_and_stops_the_tree(tmp_path: Path) -> None:
    log_path = tmp_path / "out.log"
    assert run_tree([sys.executable, "-c", ESCAPING_CHILD], log_path=log_path, cwd=tmp_path,
                    env=dict(os.environ), timeout_s=1.5) == -9
    assert _gone(_child_pid(log_path))
