"""Signals to the head process: the run's whole tree stops, the run says so, and nothing outlives megapilot.

- `megapilot run`, SIGKILLed while its job runs (no handler can run): the watchdog stops the job's tree;
- `megapilot suite run` on the tiny-local suite, SIGTERM to megapilot alone while it trains: within 30 s no
  process of the run is left, the report, run deck and JUnit are written, the exit code is 143, and the last
  line is the command that resumes the run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.faults.helpers import (
    PRINTER,
    fault_env,
    megapilot_argv,
    tiny_suite,
    wait_for_iteration,
    wait_until_gone,
)
from tests.signals import interruptible


def test_sigkill_to_megapilot_run_leaves_no_process_of_its_job(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {PRINTER} "
                      "--iters 2000 --interval-s 0.1 --spawn-children 2\n")
    head = subprocess.Popen(megapilot_argv("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "k",
                                           "--json"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=interruptible)
    job_dir = tmp_path / "runs" / "k"
    wait_for_iteration(job_dir / "out-node0" / "training.log", within_s=60)
    assert len(list(_alive_under(job_dir))) >= 3  # the launcher, the printer and its children run
    head.kill()  # SIGKILL: no handler of megapilot's runs
    head.wait(timeout=10)
    left = wait_until_gone(job_dir, within_s=15)
    assert left == [], [p.pid for p in left]


def _alive_under(job_dir: Path):
    from tests.faults.helpers import left_of

    return left_of(job_dir.parent)


@pytest.mark.slow
def test_sigterm_to_suite_run_stops_everything_writes_the_report_and_exits_143(tmp_path: Path) -> None:
    config = tiny_suite(tmp_path)
    out = tmp_path / "runs"
    head = subprocess.Popen(megapilot_argv("suite", "run", str(config), "--out", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=fault_env(tmp_path),
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not list(out.glob("*/smoke/out-node0/training.log")) and time.monotonic() < deadline:
        time.sleep(0.1)
    run_dir = next(out.glob("*")).resolve()
    wait_for_iteration(run_dir / "smoke" / "out-node0" / "training.log")
    sent = time.monotonic()
    head.send_signal(signal.SIGTERM)  # to megapilot alone, as `timeout` or systemd do
    _stdout, stderr = head.communicate(timeout=30)
    assert head.returncode == 143, stderr[-2000:]
    assert wait_until_gone(run_dir, within_s=max(0.0, 30 - (time.monotonic() - sent))) == []
    for name in ("report.html", "megatron_run_deck.json", "junit.xml"):
        assert (run_dir / name).is_file(), name
    state = json.loads((run_dir / "suite.json").read_text())
    assert state["finished"] is False and "SIGTERM" in state["reason"]
    assert (state["verdict"], state["stopped_by"]) == ("INTERRUPTED", "SIGTERM")
    # smoke was interrupted: its row says so, with the job it was in
    assert [s["name"] for s in state["stages"]] == ["prepare", "preflight", "collectives", "tokenizer", "smoke"]
    smoke = state["stages"][-1]
    assert smoke["verdict"] == "INTERRUPTED" and smoke["jobs"] and smoke["reason"].startswith("interrupted by SIGTERM")
    assert int(ET.parse(run_dir / "junit.xml").getroot().get("errors")) > 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("resume with: megapilot suite run ") and last.endswith(f"--resume {run_dir.name}"), last


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_stops_megapilot_run_with_128_plus_n(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {PRINTER} --iters 2000 --interval-s 0.1 --spawn-children 1\n")
    head = subprocess.Popen(megapilot_argv("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "s",
                                           "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    job_dir = tmp_path / "runs" / "s"
    wait_for_iteration(job_dir / "out-node0" / "training.log", within_s=60)
    head.send_signal(signum)
    out, err = head.communicate(timeout=30)
    assert head.returncode == 128 + signum, err
    assert json.loads(out)["state"] == "CANCELLED"
    assert wait_until_gone(job_dir.parent, within_s=10) == []


def test_a_second_signal_forces_the_stop_without_the_grace_period(tmp_path: Path) -> None:
    """The job ignores SIGTERM, so a polite stop waits its whole grace period (10 s) before SIGKILL; a second
    SIGINT SIGKILLs it at once."""
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\ntrap '' TERM\n{sys.executable} {PRINTER} --iters 2000 --interval-s 0.1 "
                      "--ignore-sigterm\n")
    head = subprocess.Popen(megapilot_argv("run", str(script), "--run-dir", str(tmp_path / "runs"), "--combo", "f",
                                           "--json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    job_dir = tmp_path / "runs" / "f"
    wait_for_iteration(job_dir / "out-node0" / "training.log", within_s=60)
    sent = time.monotonic()
    head.send_signal(signal.SIGINT)
    time.sleep(1.0)
    head.send_signal(signal.SIGINT)
    _out, err = head.communicate(timeout=30)
    took_s = time.monotonic() - sent
    assert head.returncode == 130, err
    assert took_s < 8.0, f"the forced stop took {took_s:.1f} s"
    assert "SIGINT again" in err
    assert wait_until_gone(job_dir.parent, within_s=5) == []
