"""`python -m megapilot.trainer`: runs the trainer only as the main program, and refuses bad flags in one line."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys


def test_a_spawned_helper_re_importing_the_module_does_not_start_training():
    # multiprocessing's spawn runs the parent's main module under the name __mp_main__.
    namespace = runpy.run_module("megapilot.trainer", run_name="__mp_main__")
    assert "main" not in namespace  # the guard kept train.main from being imported, let alone run


def test_bad_flags_exit_2_with_one_line_naming_the_flag_and_no_traceback():
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "5", "--seq-length", "16",
             "--train-iters", "1", "--lr", "1e-3", "--micro-batch-size", "1", "--global-batch-size", "1",
             "--mock-data"]
    env = {**os.environ, "WORLD_SIZE": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "megapilot.trainer", *flags], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--num-attention-heads" in errors[0]
    assert "Traceback" not in done.stderr
