"""The suite and its history, for real: a run interrupted with Ctrl-C and resumed re-runs only what did
not finish; a third run slowed on purpose (a sleep in the data path) is flagged as a regression."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.signals import interruptible

pytestmark = pytest.mark.slow

FIRST, SECOND = "MBS=1,GBS=8,PRECISION=BF16", "MBS=2,GBS=8,PRECISION=BF16"

# Loaded by every Python started with this folder on PYTHONPATH: once Megatron's GPT dataset module is
# imported, each sample read sleeps MEGAPILOT_TEST_SAMPLE_DELAY_S first.
SLOW_DATA_SITECUSTOMIZE = '''
import importlib.abc, importlib.util, os, sys, time

DELAY_S = float(os.environ.get("MEGAPILOT_TEST_SAMPLE_DELAY_S", "0"))


class _SlowSamples(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "megatron.core.datasets.gpt_dataset" or DELAY_S <= 0:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            read = module.GPTDataset.__getitem__

            def slow_read(self, index):
                time.sleep(DELAY_S)
                return read(self, index)

            module.GPTDataset.__getitem__ = slow_read

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _SlowSamples())
'''


def _suite(tmp_path: Path, iterations: int) -> Path:
    done = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "init", "tiny-local", "-o",
                           str(tmp_path / "suite.json")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "suite.json").read_text())
    config["smoke"]["enabled"] = False
    config["checkpoint"]["enforce"] = False
    for overlay in config["sweep"]["combinations"].values():
        overlay["training_iterations"] = str(iterations)
    (tmp_path / "suite.json").write_text(json.dumps(config, indent=2))
    return tmp_path / "suite.json"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "MEGAPILOT_HISTORY": str(tmp_path / "history.sqlite"), "OMP_NUM_THREADS": "1", **extra}


def _suite_run(config: Path, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--out",
                           str(tmp_path / "runs"), "--json", *args], capture_output=True, text=True, timeout=600,
                          env=env or _env(tmp_path), check=False)


def test_an_interrupted_run_resumed_reruns_only_the_unfinished_combo(tmp_path: Path) -> None:
    config = _suite(tmp_path, iterations=10)
    # A fresh run of both combos, interrupted while the second trains.
    _set_iterations(config, {FIRST: 10, SECOND: 40})
    process = subprocess.Popen([sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--out",
                                str(tmp_path / "runs2"), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_env(tmp_path), preexec_fn=interruptible)
    log = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        logs = list((tmp_path / "runs2").glob("*/MBS2_GBS8_BF16/out-node0/training.log"))
        if logs and " iteration " in logs[0].read_text(errors="replace"):
            log = logs[0]
            break
        time.sleep(0.3)
    assert log is not None, "the second combo never started"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    interrupted = json.loads(stdout)
    assert interrupted["finished"] is False and interrupted["verdict"] == "INTERRUPTED"
    assert interrupted["gates_verdict"] == "PASS" and interrupted["exit_code"] == 130  # what finished passed
    # the finished combo is kept, the one it stopped in is there with the iterations it reached
    assert [(c["key"], c["verdict"]) for c in interrupted["combos"]] == [(FIRST, "PASS"), (SECOND, "INTERRUPTED")]
    assert interrupted["combos"][1]["job"]["iterations_reached"] >= 1
    assert Path(interrupted["run_dir"], "report.html").is_file()

    resumed = _suite_run(config, tmp_path, "--resume", interrupted["run_id"])  # found through the history
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout)
    assert result["run_id"] == interrupted["run_id"] and result["finished"] is True
    stages = [(s["name"], s["combo"], s["verdict"], s["duration_s"]) for s in result["stages"] if s["combo"]]
    kept = [(s["name"], s["combo"], s["verdict"], s["duration_s"]) for s in interrupted["stages"]
            if s["combo"] == FIRST]
    assert [s for s in stages if s[1] == FIRST] == kept  # the finished combo's rows as they were, not re-run
    assert any(name == "train" and combo == SECOND and verdict == "PASS" for name, combo, verdict, _ in stages)
    second_job = next(c for c in result["combos"] if c["key"] == SECOND)["job"]
    assert second_job["iterations_reached"] == 40  # it ran again, from scratch
    history = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "history", "show", result["run_id"], "--json"],
                             capture_output=True, text=True, env=_env(tmp_path), check=False)
    assert json.loads(history.stdout)["run"]["verdict"] == "PASS"


def _set_iterations(config: Path, iterations: dict[str, int]) -> None:
    data = json.loads(config.read_text())
    for key, count in iterations.items():
        data["sweep"]["combinations"][key]["training_iterations"] = str(count)
    config.write_text(json.dumps(data, indent=2))


def _log_ratio(change_pct: float) -> float:
    """|ln(new / old)| of a change in percent: a halving and a doubling are the same distance."""
    return abs(math.log1p(change_pct / 100))


def test_a_run_slowed_in_its_data_path_is_flagged_as_a_regression(tmp_path: Path) -> None:
    config = _suite(tmp_path, iterations=16)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_DATA_SITECUSTOMIZE)
    # run-to-run noise of healthy runs, as a log ratio of tokens/s: 2 busy cores can move them by 10 % and, on a
    # loaded host, by 40 % or more
    control_noise = [0.0]
    for _ in range(2):
        done = _suite_run(config, tmp_path, "--combo", FIRST)
        assert done.returncode == 0, done.stderr[-2000:]
        control_noise += [_log_ratio(r["change_pct"]) for r in json.loads(done.stdout)["regressions"]
                          if r["metric"] == "training.tokens_per_gpu"]
    # Each rank reads 4 samples a step: a delay of half the healthy step this host gives now (at least 0.3 s) triples
    # the step, however much other work stretches it.
    combo = next(c for c in json.loads(Path(json.loads(done.stdout)["run_dir"], "suite.json").read_text())["combos"]
                 if c["key"] == FIRST)
    step_s = next(m for m in combo["metrics"] if m["name"] == "training.elapsed_time_per_iteration")["value"] / 1000
    slowed_env = _env(tmp_path, PYTHONPATH=str(site), MEGAPILOT_TEST_SAMPLE_DELAY_S=f"{max(0.3, step_s / 2):.2f}")
    done = _suite_run(config, tmp_path, "--combo", FIRST, "--enforce-regressions", env=slowed_env)
    result = json.loads(done.stdout)
    # an enforced regression fails the run whatever its gates said: exit 1, never green
    assert done.returncode == 1 and (result["verdict"], result["exit_code"]) == ("FAIL", 1), result["reason"]
    assert result["gates_verdict"] != "PASS" or "regressed beyond its band" in result["reason"]
    regression = next(r for r in result["regressions"] if r["metric"] == "training.tokens_per_gpu")
    assert regression["worse"] and regression["change_pct"] < -20 and regression["runs_compared"] == 2
    assert _log_ratio(regression["change_pct"]) > 2 * max(control_noise)  # the slowdown stands clear of the noise
    assert "tokens/s" in regression["message"] and "last 2 runs" in regression["message"]
    report = Path(result["run_dir"], "report.html").read_text()
    assert regression["message"].split(" vs ")[0].replace("−", "-")[:10] in report.replace("−", "-")
    # what is stored says what the run said: suite.json and the history row, not the gates' PASS
    assert json.loads(Path(result["run_dir"], "suite.json").read_text())["verdict"] == "FAIL"
    listed = subprocess.run([sys.executable, "-m", "megapilot.cli.app", "history", "list", "--json"],
                            capture_output=True, text=True, env=_env(tmp_path), check=False)
    rows = json.loads(listed.stdout)
    assert [r["verdict"] for r in rows][:1] == ["FAIL"] and rows[0]["run_id"] == result["run_id"], listed.stderr
    assert all(r["verdict"] in ("PASS", "WARN") for r in rows[1:])  # the two healthy runs, a noisy one warned
