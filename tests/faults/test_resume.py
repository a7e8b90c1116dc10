"""Resume after an interruption at each point of the tiny-local suite (smoke and checkpoint on).

One uninterrupted reference run, then one chain: interrupted with a real SIGINT to this process during smoke,
resumed and interrupted during checkpoint, then during each combo, then at results, then resumed to the end.
The final run has the reference's stages and verdicts, each stage finished once (a kept stage keeps its start
time through every later resume), no process outlives an interruption, and resuming the finished run is
"nothing to do" with its verdict's exit code (0: it PASSed) and the run left as it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from megapilot.execute.interrupt import stop_on_signals
from megapilot.execute.local import LocalExecutor
from megapilot.report import render_report
from megapilot.suite.config import load_suite
from megapilot.suite.lifecycle import RunRequest, run_suite
from megapilot.suite.results import NOT_RUN_REASON, SuiteResult, Verdict
from tests.faults.helpers import fault_env, left_of, megapilot_argv, tiny_suite, wait_for_iteration


def _run(config: Path, out: Path, previous: SuiteResult | None = None, *, stop_in: str | None = None) -> SuiteResult:
    """The suite, in this process, with SIGINT sent to it while the job of `stop_in` trains (a job directory),
    or as the stage `stop_in` starts ("results")."""
    suite = load_suite(config)
    fired: list[str] = []

    def interrupt_when_training(run_dir: Path) -> None:
        wait_for_iteration(run_dir / stop_in / "out-node0" / "training.log")  # type: ignore[operator]
        fired.append(stop_in or "")
        os.kill(os.getpid(), signal.SIGINT)

    def on_event(event: str) -> None:
        if stop_in is None or fired:
            return
        message = re.sub(r"^\[\d+/\d+\] ", "", event)  # the step counter ("[3/9] stage smoke") is not the name
        if stop_in in _TRAINS_AFTER:
            if message == _TRAINS_AFTER[stop_in]:
                run_dir = out / (previous.run_id if previous else sorted(os.listdir(out))[-1])
                threading.Thread(target=interrupt_when_training, args=(run_dir,), daemon=True).start()
        elif message == f"stage {stop_in}":
            fired.append(stop_in)
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises here, as the stage starts

    with stop_on_signals():
        result = run_suite(suite, RunRequest(out_dir=out, resume_from=previous), LocalExecutor(), on_event)
    if stop_in is not None:
        assert fired == [stop_in] and not result.finished, (stop_in, result.reason)
        assert left_of(Path(result.run_dir)) == []
    return result


COMBOS = ("MBS=1,GBS=8,PRECISION=BF16", "MBS=2,GBS=8,PRECISION=BF16")
# job directory -> the event after which it trains (combo directories added from the suite's cells)
_TRAINS_AFTER = {"smoke": "stage smoke", "checkpoint-save": "stage checkpoint"}


def _outline(result: SuiteResult) -> list[tuple[str, str | None, str]]:
    return [(s.name, s.combo, s.verdict.value) for s in result.stages] + \
        [("combo", c.key, c.verdict.value) for c in result.combos]


def _deck_outline(result: SuiteResult) -> tuple[object, ...]:
    """What the run deck rendered from `result` says of its stages and verdicts (not its times)."""
    deck = json.loads(render_report(result, Path(result.run_dir)).run_deck.read_text())
    return (deck["overall_status"], deck["verdict"], deck["exit_code"],
            [(s["label"], s["status"]) for s in deck["lifecycle_stages"]],
            [(c["cell_id"], c["status"], [(m["metric"], m["status"]) for m in c["metrics"]]) for c in deck["cells"]])


@pytest.mark.slow
def test_interrupted_at_every_point_and_resumed_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    config = tiny_suite(tmp_path)
    reference = _run(config, tmp_path / "reference")
    assert reference.finished and reference.verdict.value == "PASS", reference.reason

    out = tmp_path / "runs"
    out.mkdir()
    slugs = {c.key: c.slug for c in load_suite(config).cells}
    points = ["smoke", "checkpoint-save", slugs[COMBOS[0]], slugs[COMBOS[1]], "results"]
    _TRAINS_AFTER.update({slugs[k]: f"combo {k}" for k in COMBOS})
    first_seen: dict[tuple[str, str | None], object] = {}
    result: SuiteResult | None = None
    for point in [*points, None]:
        result = _run(config, out, result, stop_in=point)
        for stage in result.stages:
            key = (stage.name, stage.combo)
            if stage.name in ("results", "teardown") or stage.verdict is Verdict.INTERRUPTED \
                    or stage.reason == NOT_RUN_REASON:
                continue  # summed up again, or the rows of what was stopped: they never finished
            # finished once: a stage kept from an earlier attempt still has that attempt's start time
            assert first_seen.setdefault(key, stage.started_at) == stage.started_at, key
    assert result is not None and result.finished
    assert _outline(result) == _outline(reference)
    assert result.verdict == reference.verdict
    assert _deck_outline(result) == _deck_outline(reference)  # the rendered run decks say the same

    state = Path(result.run_dir, "suite.json").read_bytes()
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(out), "--resume", "latest",
                                         "--no-history"), capture_output=True, text=True, env=fault_env(tmp_path),
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "nothing to do" in done.stderr
    assert Path(result.run_dir, "suite.json").read_bytes() == state


@pytest.mark.slow  # sbatch takes about a minute to give up looking for a configuration
def test_a_refused_job_fails_its_stage_and_resuming_the_run_touches_nothing(tmp_path: Path) -> None:
    """sbatch without a SLURM configuration refuses every job: smoke FAILs quoting sbatch and the run ends (it once
    ended unfinished, and a resume rewrote it as a finished PASS with no combos); resuming it changes nothing."""
    config = tiny_suite(tmp_path)
    data = json.loads(config.read_text())
    data["megapilot"]["executor"] = "slurm"
    config.write_text(json.dumps(data))
    env = {**fault_env(tmp_path), "SLURM_CONF": str(tmp_path / "no-slurm.conf")}
    out = tmp_path / "runs"
    first = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(out), "--no-history", "--stage",
                                          "smoke"),
                           capture_output=True, text=True, env=env, timeout=120, check=False)
    assert first.returncode == 1 and "sbatch cannot reach the SLURM controller" in first.stderr, first.stderr
    (run_dir,) = out.iterdir()
    before = (run_dir / "suite.json").read_bytes()
    state = json.loads(before)
    smoke = next(s for s in state["stages"] if s["name"] == "smoke")
    assert state["verdict"] == "FAIL" and smoke["verdict"] == "FAIL" and "sbatch" in smoke["reason"]
    assert all(c["verdict"] == "SKIPPED" for c in state["combos"] if c["key"] != "smoke")
    again = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(out), "--no-history", "--stage",
                                          "smoke", "--resume", "latest"), capture_output=True, text=True, env=env,
                           timeout=120, check=False)
    assert again.returncode == 1 and "nothing to do" in again.stderr, again.stderr  # still the FAIL it was
    assert (run_dir / "suite.json").read_bytes() == before


def test_a_resume_with_another_config_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    config = tiny_suite(tmp_path)
    out = tmp_path / "runs"
    run = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(out), "--no-history", "--stage",
                                        "preflight"), capture_output=True, text=True, env=fault_env(tmp_path),
                         timeout=300, check=False)
    (run_dir,) = out.iterdir()
    state = json.loads((run_dir / "suite.json").read_text())
    state["finished"] = False  # as a run interrupted after preflight would be
    (run_dir / "suite.json").write_text(json.dumps(state))
    before = (run_dir / "suite.json").read_bytes()
    data = json.loads(config.read_text())
    data["megapilot"]["hang_factor"] = 30
    config.write_text(json.dumps(data))
    again = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(out), "--no-history",
                                          "--resume", run_dir.name), capture_output=True, text=True,
                           env=fault_env(tmp_path), timeout=120, check=False)
    assert run.returncode in (0, 1), run.stderr
    assert again.returncode == 2 and "another config" in again.stderr, again.stderr
    assert (run_dir / "suite.json").read_bytes() == before
