"""The op probe runs the trainer's own model and times its ops: a real process, as `catalog.host` starts it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from megapilot.catalog import get_model
from megapilot.estimate import host_ops


def test_the_probe_runs_the_trainers_layers_and_reports_their_rate():
    """Its two layers of the tiny GPT's kind run about the ops the trainer's step counts for them (the trainer's
    schedule adds a few a micro-batch the probe's bare forward and backward do not run), at a rate any CPU that
    trains at all reaches (a count of 0 or a pass that did no work would fall outside)."""
    done = subprocess.run([sys.executable, "-m", "megapilot.trainer.op_probe"], capture_output=True, text=True,
                          env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    gpt = get_model("tiny")
    counted = 2 * host_ops.layer_ops(gpt, 0) + host_ops.micro_batch_ops(gpt)
    assert 0.8 * counted < report["ops_per_micro_batch"] <= counted
    assert 1e3 < report["ops_per_s"] < 1e7
    assert 1e7 < report["elements_per_s"] < 5e10  # below the probe's cap (1e11): a timing, not the cap
    assert 0.1 < report["runtime_gib"] < 4  # Python, torch and Megatron-Core resident: hundreds of MiB
