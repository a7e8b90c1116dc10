"""Gates from predictions, for real: a suite whose only gates are `predicted` records its first run (nothing
calibrates the CPU prediction yet), gates a second healthy run against the prediction calibrated on the first, and
FAILs a run slowed by a sleep in the data path, naming the component that departed (Megatron's timers)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_suite_history import FIRST, SLOW_DATA_SITECUSTOMIZE

pytestmark = pytest.mark.slow

MIN_RATIO = 0.6  # 2 busy cores move a healthy run's step by 10-80 %; the slowed run is several times slower
# Each rank reads 4 samples a step through Megatron's 2 loader workers, which overlap with the step: a delay of a
# sample is 2 delays of loading a step. At least 1.5 s, and twice the healthy step as this host runs it now (a host
# busy with other work can stretch the step several times): the data path then takes 4x the step, far past
# MIN_RATIO whatever the load.
MIN_SAMPLE_DELAY_S = 1.5


def _suite(tmp_path: Path) -> Path:
    config = tmp_path / "suite.json"
    done = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "init", "tiny-local", "-o", str(config),
                           "--gates", "predicted"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(config.read_text())
    data["smoke"]["enabled"] = False
    data["checkpoint"]["enforce"] = False
    for overlay in data["sweep"]["combinations"].values():
        overlay["training_iterations"] = "10"
    config.write_text(json.dumps(data, indent=2))
    thresholds = tmp_path / "suite_predicted_threshold.json"
    table = json.loads(thresholds.read_text())
    kinds = {spec["kind"] for key, cell in table.items() if not key.startswith("_") for spec in cell.values()}
    assert kinds == {"predicted"}  # nothing hand-written
    for key, cell in table.items():
        if not key.startswith("_"):
            for spec in cell.values():
                spec["min_ratio"] = min(spec["min_ratio"], MIN_RATIO)
    thresholds.write_text(json.dumps(table, indent=2))
    return config


def _run(config: Path, tmp_path: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--out",
                           str(tmp_path / "runs"), "--combo", FIRST, "--json"], capture_output=True, text=True,
                          timeout=600, env=env, check=False)
    assert done.stdout, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    return json.loads(Path(summary["run_dir"], "suite.json").read_text())  # the full result, predictions included


def _combo(result: dict) -> dict:
    return next(c for c in result["combos"] if c["key"] == FIRST)


def test_predicted_gates_fail_a_run_slowed_in_its_data_path_and_name_the_component(tmp_path: Path) -> None:
    config = _suite(tmp_path)
    env = {**os.environ, "MEGAPILOT_HISTORY": str(tmp_path / "history.sqlite"), "OMP_NUM_THREADS": "1"}

    first = _run(config, tmp_path, env)
    assert first["verdict"] == "PASS", first["reason"]
    predicted = _combo(first)["predicted"]
    assert predicted["device"].startswith("CPU") and predicted["step_time_ms"] > 0  # the CPU is a device
    assert predicted["calibration_runs"] == []
    gated = [m for m in _combo(first)["metrics"] if m["kind"] == "predicted"]
    assert gated and all(m["verdict"] == "RECORD" for m in gated if m["value"] is not None)

    second = _run(config, tmp_path, env)
    combo = _combo(second)
    assert combo["predicted"]["calibration_runs"]  # calibrated on the first run of this cluster (local)
    tokens = next(m for m in combo["metrics"] if m["name"] == "training.tokens_per_gpu")
    assert tokens["verdict"] in ("PASS", "FAIL") and "calibrated prediction" in tokens["reason"]
    # how far a healthy run lands from its calibrated prediction on this host (a log ratio): the noise
    noise = abs(math.log(tokens["value"] / combo["predicted"]["tokens_per_s_per_gpu"]))
    step_s = next(m for m in combo["metrics"] if m["name"] == "training.elapsed_time_per_iteration")["value"] / 1000

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_DATA_SITECUSTOMIZE)
    slowed_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
                  "MEGAPILOT_TEST_SAMPLE_DELAY_S": f"{max(MIN_SAMPLE_DELAY_S, 2 * step_s):.2f}"}
    slowed = _run(config, tmp_path, slowed_env)
    combo = _combo(slowed)
    assert slowed["verdict"] == "FAIL" and combo["verdict"] == "FAIL"
    failed = {m["name"]: m for m in combo["metrics"] if m["verdict"] == "FAIL"}
    slowed_tokens = next(m for m in combo["metrics"] if m["name"] == "training.tokens_per_gpu")
    departure = abs(math.log(slowed_tokens["value"] / combo["predicted"]["tokens_per_s_per_gpu"]))
    assert departure > 2 * noise, (departure, noise)  # the slowdown stands clear of the noise
    assert set(failed) >= {"training.tokens_per_gpu", "training.elapsed_time_per_iteration"}
    assert "slower than predicted; the measured forward-backward time is" in failed["training.tokens_per_gpu"]["reason"]
    report = Path(slowed["run_dir"], "report.html").read_text()
    assert "the measured forward-backward time is" in report
    deck = json.loads(Path(slowed["run_dir"], "megatron_run_deck.json").read_text())
    cell = next(c for c in deck["cells"] if c["cell_id"] == FIRST)
    assert "forward-backward" in cell["predicted"]["departure"]
