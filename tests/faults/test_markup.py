"""Nothing megapilot prints is read as terminal markup: paths and reasons holding `[/...]` or `[bold]` print as
they are (such a path once crashed the table with a MarkupError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.faults.helpers import PRINTER, fault_env, megapilot_argv, tiny_suite

ODD = "[bold]odd[/bold][/x]"


def test_megapilot_run_prints_an_odd_run_dir_literally(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/bash\n{sys.executable} {PRINTER} --iters 2\n")
    run_dir = tmp_path / ODD
    done = subprocess.run(megapilot_argv("run", str(script), "--run-dir", str(run_dir), "--combo", "m"),
                          capture_output=True, text=True, timeout=120, env={**fault_env(tmp_path), "COLUMNS": "400"},
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stdout + done.stderr
    assert ODD in done.stdout and ODD in done.stderr


def test_suite_run_prints_an_odd_run_directory_literally(tmp_path: Path) -> None:
    config = tiny_suite(tmp_path)
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(tmp_path / ODD), "--stage",
                                         "preflight", "--no-history"), capture_output=True, text=True, timeout=300,
                          env=fault_env(tmp_path), check=False)
    output = done.stdout + done.stderr
    assert done.returncode in (0, 1), output[-3000:]
    assert "internal error" not in output and "MarkupError" not in output
    assert f"run directory {tmp_path / ODD}" in done.stderr  # the prepare stage's line, as it is
