"""The chain a user runs, end to end on this CPU machine, through the real CLI:

`megapilot plan --save plan.json` -> `megapilot run --plan plan.json` (real Megatron-Core training of
the tiny preset on the shipped corpus, rendered for CPU because no GPU is here) -> `megapilot logs
parse` -> `megapilot script --plan plan.json -o train.sh` -> `megapilot diagnose LOG --script train.sh`
and `megapilot optimize --script train.sh` read back the plan's model and layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow

PLAN = ["--model", "tiny", "--gpu", "h100", "--gpus", "2", "--seq-len", "128", "--gbs", "16"]


@pytest.fixture(autouse=True)
def no_user_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGAPILOT_PROFILE", str(tmp_path / "no-profile.toml"))


def test_saved_plan_trains_through_run_and_its_script_reads_back(cli, tmp_path: Path, monkeypatch) -> None:
    import megapilot.cli.run_cmd as run_cmd
    from megapilot.trainer.corpus import default_dataset_prefix
    from tests.e2e.test_local_run import assert_nothing_survives

    if run_cmd.gpu_present():
        pytest.skip("a GPU is present: run --plan would render for it")
    plan_path = tmp_path / "plan.json"
    planned = cli("plan", *PLAN, "--save", str(plan_path))
    assert planned.exit_code == 0, planned.stderr
    plan = json.loads(plan_path.read_text())

    corpus = default_dataset_prefix(tmp_path / "corpus")
    ran = cli("run", "--plan", str(plan_path), "--data-path", corpus, "--train-iters", "20",
              "--run-dir", str(tmp_path / "runs"), "--combo", "tiny", "--startup-timeout-s", "120",
              "--timeout-s", "120", "--no-history", "--json")
    result = ran.json()
    assert ran.exit_code == 0, (result["reason"], Path(result["logs"][0]).read_text()[-3000:])
    assert result["state"] == "COMPLETED" and result["iterations_reached"] == result["train_iters"] == 20
    assert_nothing_survives(tmp_path / "runs" / "tiny", int(result["job_id"]))
    launch_text = (tmp_path / "runs" / "tiny" / "launch.sh").read_text()
    assert "--distributed-backend gloo" in launch_text and f"--data-path {corpus}" in launch_text

    log = result["logs"][0]
    parsed = cli("logs", "parse", log, "--json").json()
    losses = [r["lm_loss"] for r in parsed["iterations"]]
    assert len(losses) == 20 and losses[-1] < losses[0]  # it learned something from the bytes

    script = tmp_path / "train.sh"
    written = cli("script", "--plan", str(plan_path), "--cpu", "--entrypoint", "megapilot",
                  "--data-path", corpus, "--tokenizer-type", "ByteTokenizer", "-o", str(script))
    assert written.exit_code == 0, written.stderr

    diagnosed = cli("diagnose", log, "--script", str(script), "--json")
    assert diagnosed.exit_code == 0, diagnosed.stderr
    notes = " ".join(diagnosed.json()["notes"])
    assert "model shape incomplete" not in notes and "GPU count not given" not in notes

    optimized = cli("optimize", "--script", str(script), "--gpu", "h100", "--log", log, "--json")
    assert optimized.exit_code == 0, optimized.stderr
    report = optimized.json()
    layout, current = plan["parallel"], report["current"]
    assert f"TP{layout['tp']} PP{layout['pp']}" in current["layout"] and f"DP{layout['dp']}" in current["layout"]
    # a CPU run calibrates no H100 prediction and gets no GPU change
    assert current["measured_step_time_s"] is None and report["changes"] == []
    assert any("trained on CPU" in note for note in report["notes"])
