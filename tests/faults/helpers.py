"""What the fault tests share: the packaged tiny-local suite made as small as it can be, megapilot as a process,
and the processes a run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from megapilot.execute.process import marked_processes
from megapilot.execute.rundir import JOB_MARKER_VARIABLE

PRINTER = Path(__file__).parents[1] / "execute" / "programs" / "iteration_printer.py"


def megapilot_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "megapilot.cli.app", *args]


def fault_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MEGAPILOT_HISTORY": str(tmp_path / "history.sqlite"), "OMP_NUM_THREADS": "1"}


def tiny_suite(tmp_path: Path) -> Path:
    """The packaged tiny-local suite with smoke and checkpoint on, at the fewest iterations its gates allow."""
    done = subprocess.run(megapilot_argv("suite", "init", "tiny-local", "-o", str(tmp_path / "suite.json")),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    config = tmp_path / "suite.json"
    data = json.loads(config.read_text())
    data["train_params"]["training_iterations"] = "8"
    for overlay in data["sweep"]["combinations"].values():
        overlay["training_iterations"] = "8"
    data["smoke"]["iters"] = 4
    data["loss_curve"]["milestone_steps"] = [4, 8]
    data["checkpoint"].update({"save_interval": 4, "save_iters": 5, "resume_iters": 7})
    config.write_text(json.dumps(data, indent=2))
    return config


def left_of(run_dir: Path) -> list[psutil.Process]:
    """Live processes of any job under run_dir (every job's processes carry its directory in their environment)."""
    return marked_processes(JOB_MARKER_VARIABLE, str(Path(run_dir).resolve()), inside=True)


def wait_until_gone(run_dir: Path, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while (left := left_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def wait_for_iteration(log: Path, within_s: float = 300.0) -> None:
    """Until the log shows a training iteration: the job is really training."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if log.is_file() and " iteration " in log.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"no iteration in {log} after {within_s} s")
