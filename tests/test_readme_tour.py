"""The README's tour is what a user pastes: run as written, top to bottom, in an empty directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"

pytestmark = pytest.mark.slow


def tour_block() -> str:
    """The first ```bash block after the `## A tour` heading."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## A tour"):]
    match = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert match, "the tour has no bash block"
    return match.group(1)


def test_the_tour_names_only_files_it_makes():
    block = tour_block()
    assert "-o train.sh" in block and "megapilot run train.sh" in block  # the script it runs is the one it wrote
    assert "--save plan.json" in block and "--plan plan.json" in block
    assert "> docs.jsonl" in block and "data prepare docs.jsonl" in block
    assert "--combo tour" in block and block.count("runs/tour/out-node0/training.log") == 3


@pytest.mark.skipif(sys.platform != "linux", reason="the tour trains with torchrun on this machine")
def test_the_tour_runs_top_to_bottom_on_the_tiny_model(tmp_path: Path):
    pytest.importorskip("megatron.core")
    import megapilot.cli.run_cmd as run_cmd

    if run_cmd.gpu_present():
        pytest.skip("a GPU is present: the tour's --cpu script would still run, but this test pins the CPU path")
    bin_dir = str(Path(sys.executable).parent)  # `megapilot` and `python3` as the user's installation has them
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           "MEGAPILOT_PROFILE": str(tmp_path / "profile.toml"), "MEGAPILOT_HISTORY": str(tmp_path / "h.sqlite")}
    env.pop("COLUMNS", None)
    script = "set -euo pipefail\n" + tour_block()
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for made in ("docs.jsonl", "docs.bin", "docs.idx", "plan.json", "train.sh", "runs/tour/job.json",
                 "runs/tour/out-node0/training.log", "records.json"):
        assert (tmp_path / made).is_file(), made
    import json

    records = json.loads((tmp_path / "records.json").read_text())
    assert len(records["iterations"]) == 10
    assert "COMPLETED" in done.stdout and "10 / 10" in done.stdout
