"""A suite config with a token budget, end to end: real Megatron-Core training through `megapilot suite run`, and
the run's measured step and checkpoint times projected onto the budget in suite.json, the run deck and the page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _megapilot(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", *args], capture_output=True, text=True,
                          timeout=900, env=env, check=False)


def test_the_report_projects_the_measured_run_onto_the_budget(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    env = {**os.environ, "MEGAPILOT_HISTORY": str(tmp_path / "history.sqlite"), "OMP_NUM_THREADS": "1"}
    config = tmp_path / "suite.json"
    assert _megapilot("suite", "init", "tiny-local", "-o", str(config), env=env).returncode == 0
    data = json.loads(config.read_text())
    data["budget"] = {"tokens": "10M", "cost_per_gpu_hour": 1.5, "phases": [{"tokens": "2M", "gbs": 16}],
                      "rampup_batch_size": [4, 4, 64]}
    config.write_text(json.dumps(data))
    done = _megapilot("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--json", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    budget = json.loads((run_dir / "suite.json").read_text())["budget"]
    assert budget["days"] > 0 and budget["step_time_s"] > 0 and budget["combo"]
    assert budget["checkpoint_source"].startswith("measured by the checkpoint stage")
    assert budget["checkpoint_save_s"] > 0 and budget["energy_mwh"] is None  # a CPU run: no TDP
    assert budget["cost"] == pytest.approx(budget["gpu_hours"] * 1.5, rel=1e-6)
    pieces = {piece["name"]: piece for piece in budget["segments"]}
    assert list(pieces) == ["batch warm-up 4", "main", "phase 1: gbs 16"]
    assert pieces["main"]["step_time_s"] == pytest.approx(budget["step_time_s"])  # the measured step
    assert pieces["phase 1: gbs 16"]["tokens"] == pytest.approx(2e6)
    deck = json.loads((run_dir / "megatron_run_deck.json").read_text())
    assert deck["budget"]["days"] == pytest.approx(budget["days"])
    assert 'id="budget"' in (run_dir / "report.html").read_text(encoding="utf-8")
