"""The rendered torchrun script runs as-is here: tiny model, embedded trainer, 2 CPU ranks over gloo."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from megapilot.launch import LaunchOptions, render_launch
from tests.e2e.process_tree import run_tree
from tests.launch.plans import tiny_two_rank_plan

pytestmark = pytest.mark.slow
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")


def test_rendered_script_trains_and_saves_into_a_path_with_space_and_dollar(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    plan = tiny_two_rank_plan(train_iters=3)
    checkpoints = tmp_path / "ckpt dir $HOME"
    launch = render_launch(plan, LaunchOptions(
        mock_data=True, entrypoint="megapilot", cpu=True, python=sys.executable, save=str(checkpoints),
        script_path=str(tmp_path / "train.sh"),
    ))
    script = tmp_path / "train.sh"
    script.write_text(launch.script)
    log_path = tmp_path / "train.log"
    returncode = run_tree(["bash", str(script)], log_path=log_path, cwd=tmp_path, env=dict(os.environ),
                          timeout_s=240)
    output = log_path.read_text()
    assert returncode == 0, output[-3000:]
    assert [m.groups() for m in ITERATION.finditer(output)][-1] == ("3", "3")
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
