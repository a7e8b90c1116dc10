"""End to end: real torchrun jobs (2 gloo ranks) under LocalExecutor — completion, a killed rank, a hang.

Each test starts a torchrun launcher and two workers that import torch (~3 s each on this
machine), so they are marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from megapilot.execute.base import HangPolicy, JobSpec, JobState
from megapilot.execute.local import LocalExecutor
from megapilot.execute.process import session_members

pytestmark = pytest.mark.slow

LOOP = Path(__file__).parents[1] / "execute" / "programs" / "allreduce_loop.py"
# torchrun without --master-port: the executor's free port reaches it as PET_MASTER_PORT.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]


def torchrun_job(tmp_path: Path, combo: str, *flags: str, **spec) -> JobSpec:
    spec.setdefault("hang", HangPolicy(startup_s=120, factor=10, min_window_s=30))
    return JobSpec(combo=combo, run_dir=tmp_path, argv=[*TORCHRUN, str(LOOP), *flags], gpus_per_node=2,
                   env={"OMP_NUM_THREADS": "1"}, stop_grace_s=3.0, **spec)


def assert_nothing_survives(job_dir: Path, root_pid: int) -> None:
    record = json.loads((job_dir / "job.json").read_text())
    assert len(record["processes"]) >= 3  # launcher + 2 ranks were seen
    for entry in record["processes"]:
        try:
            proc = psutil.Process(entry["pid"])
            assert proc.status() == psutil.STATUS_ZOMBIE, f"{entry['cmdline']} survived"
        except psutil.NoSuchProcess:
            pass
    assert session_members(root_pid) == []


def rank_pid(root_pid: int, rank: int) -> int | None:
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_two_rank_torchrun_job_completes_with_rank_prefixed_log(tmp_path):
    executor = LocalExecutor()
    handle = executor.submit(torchrun_job(tmp_path, "ok", "--iters", "6"))
    result = executor.wait(handle, poll_interval_s=0.2)

    assert result.state is JobState.COMPLETED, result.reason
    assert (result.iterations_reached, result.train_iters) == (6, 6)
    assert 0.15 < result.step_time_s < 2.0  # the loop's own clock: 0.2 s sleep + an all-reduce
    log = result.logs[0].read_text()
    assert "[default1]: [" in log and "] iteration        6/       6 |" in log
    record = json.loads((handle.job_dir / "job.json").read_text())
    assert f"MASTER_PORT={record['master_port']}" in log and record["master_port"] != 29500
    assert list((handle.job_dir / "out-node0" / "ranks").rglob("stdout.log"))  # torchrun's per-rank files
    assert_nothing_survives(handle.job_dir, int(handle.job_id))


def test_sigkilled_rank_fails_the_run_within_seconds_without_orphans(tmp_path):
    executor = LocalExecutor()
    handle = executor.submit(torchrun_job(tmp_path, "kill", "--iters", "200"))
    killed_at: list[float] = []

    def kill_rank_one(status):
        if not killed_at and status.iteration and status.iteration >= 3:
            pid = rank_pid(int(handle.job_id), rank=1)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed_at.append(time.monotonic())

    result = executor.wait(handle, on_progress=kill_rank_one, poll_interval_s=0.2)

    assert killed_at, "the run ended before rank 1 could be killed"
    assert time.monotonic() - killed_at[0] < 10
    assert result.state is JobState.FAILED and result.exit_code != 0
    assert "rank 1" in result.reason and "SIGKILL" in result.reason
    assert result.iterations_reached < 200
    assert_nothing_survives(handle.job_dir, int(handle.job_id))


def test_stalled_rank_is_detected_as_a_hang_and_the_job_stopped(tmp_path):
    executor = LocalExecutor()
    job = torchrun_job(tmp_path, "hang", "--iters", "200", "--stall-rank", "0", "--stall-after", "3",
                       hang=HangPolicy(startup_s=120, fixed_window_s=3))
    handle = executor.submit(job)
    result = executor.wait(handle, poll_interval_s=0.2)

    assert result.state is JobState.HUNG and result.iterations_reached == 3
    assert "no new iteration for" in result.reason
    assert_nothing_survives(handle.job_dir, int(handle.job_id))


def test_megapilot_run_trains_a_saved_plan_with_the_embedded_trainer(cli, tmp_path, monkeypatch):
    """`megapilot run --plan`: a tiny GPT, TP=2 over 2 CPU ranks, rendered by megapilot.launch for the
    embedded Megatron-Core trainer on Megatron's mock data, to its final iteration; recorded in the history
    beside its prediction, it calibrates the next prediction of this machine."""
    pytest.importorskip("megatron.core")
    from megapilot.store.history import HISTORY_ENV, open_history

    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "history.sqlite"))
    from megapilot.catalog.gpus import get_gpu
    from megapilot.logs import parse_logs
    from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec

    model = ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                      vocab_size=1024, max_position_embeddings=128)
    plan = SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=2),
                     training=TrainingSpec(seq_length=64, global_batch_size=4, train_iters=4),
                     parallel=ParallelConfig.for_world(2, tp=2, mbs=1, recompute="none"))
    (tmp_path / "plan.json").write_text(plan.model_dump_json())

    result = cli("run", "--plan", str(tmp_path / "plan.json"), "--run-dir", str(tmp_path), "--combo", "plan",
                 "--startup-timeout-s", "300", "--json")

    payload = result.json()
    assert result.exit_code == 0, payload["reason"]
    assert payload["state"] == "COMPLETED" and payload["iterations_reached"] == payload["train_iters"] == 4
    # predicted before it started, on this machine's CPU (measured), and said where the run departs from it
    assert payload["predicted"]["device"].startswith("CPU") and payload["predicted"]["step_time_ms"] > 0
    assert payload["prediction_departure"].startswith("step ")
    assert payload["model"] == {"name": "tiny", "requested": str(tmp_path / "plan.json"), "source": "plan file"}
    assert "-m megapilot.trainer" in (tmp_path / "plan" / "launch.sh").read_text()
    parsed = parse_logs([Path(payload["logs"][0])])
    assert [r.iteration for r in parsed.iterations] == [1, 2, 3, 4]
    assert all(r.lm_loss is not None and r.lm_loss > 0 for r in parsed.iterations)
    assert_nothing_survives(tmp_path / "plan", int(payload["job_id"]))
    # the run is a measured run of this machine's cluster, its prediction beside its measured step
    assert payload["history"]["cluster"] == "local" and payload["history"]["id"].startswith("run/plan@")
    with open_history() as history:
        [row] = history.measured("local")
    assert row.origin == "run" and row.calibrates and row.mbs == 1 and row.tp == 2
    assert row.measured_step_time_s == pytest.approx(payload["step_time_s"])
    assert row.predicted_step_time_s == pytest.approx(payload["predicted"]["uncalibrated_step_time_ms"] / 1000)
    # so `estimate --cluster local` and the next run's prediction calibrate on it; --no-history does neither
    plan_again = cli("run", "--plan", str(tmp_path / "plan.json"), "--run-dir", str(tmp_path), "--combo", "again",
                     "--startup-timeout-s", "300", "--json")
    again = plan_again.json()
    assert plan_again.exit_code == 0, again["reason"]
    assert again["predicted"]["calibration_runs"] == [payload["history"]["id"]]
    skipped = cli("run", "--plan", str(tmp_path / "plan.json"), "--run-dir", str(tmp_path), "--combo", "none",
                  "--startup-timeout-s", "300", "--no-history", "--json").json()
    assert skipped["history"] is None and skipped["predicted"]["calibration_runs"] == []
    with open_history() as history:
        assert len(history.measured("local")) == 2
