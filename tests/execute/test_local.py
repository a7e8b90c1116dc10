"""LocalExecutor with real processes: completion, early exit, failure, hang, timeout, cancel, clean-up."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from megapilot.errors import MegapilotError
from megapilot.execute.base import HangPolicy, JobSpec, JobState
from megapilot.execute.local import LocalExecutor

PRINTER = Path(__file__).parent / "programs" / "iteration_printer.py"
QUICK_HANG = HangPolicy(startup_s=10, factor=5, min_window_s=1)


def printer_job(tmp_path: Path, *flags: str, combo: str = "job", **spec) -> JobSpec:
    spec.setdefault("hang", QUICK_HANG)
    spec.setdefault("stop_grace_s", 1.0)
    return JobSpec(combo=combo, run_dir=tmp_path / "runs", argv=[sys.executable, str(PRINTER), *flags], **spec)


def run(job: JobSpec, on_progress=None):
    executor = LocalExecutor(snapshot_interval_s=0.1)
    handle = executor.submit(job)
    return executor, handle, executor.wait(handle, on_progress=on_progress, poll_interval_s=0.05)


def recorded_pids(job_dir: Path) -> list[int]:
    return [p["pid"] for p in json.loads((job_dir / "job.json").read_text())["processes"]]


def assert_all_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            assert proc.status() == psutil.STATUS_ZOMBIE, f"pid {pid} ({proc.cmdline()}) outlived the job"
        except psutil.NoSuchProcess:
            pass


def test_job_reaching_final_iteration_completes_with_its_files(tmp_path):
    updates = []
    _, handle, result = run(printer_job(tmp_path, "--iters", "5"), on_progress=updates.append)

    assert result.state is JobState.COMPLETED and result.exit_code == 0 and result.reason is None
    assert (result.iterations_reached, result.train_iters) == (5, 5)
    log = (handle.job_dir / "out-node0" / "training.log").read_text()
    assert log.count("] iteration ") == 5
    assert result.logs == [handle.job_dir / "out-node0" / "training.log"]
    record = json.loads((handle.job_dir / "job.json").read_text())
    assert record["status"]["state"] == "COMPLETED" and record["ended_at"] is not None
    assert record["stop_sent_at"] is None  # it ended on its own: nothing of megapilot's stopped it
    assert (handle.job_dir / "launch.sh").exists()
    port = int(log.split("MASTER_PORT=")[1].split()[0])
    assert port == record["master_port"] and port != 29500
    iterations = [u.iteration for u in updates if u.iteration is not None]
    assert iterations == sorted(iterations) and updates[-1].state is JobState.COMPLETED


def test_exit_zero_before_final_iteration_is_a_failure(tmp_path):
    _, _, result = run(printer_job(tmp_path, "--iters", "5", "--exit-after", "3"))
    assert result.state is JobState.FAILED and result.exit_code == 0
    assert result.reason == "exited with code 0 at iteration 3/5, before the final iteration"


def test_exit_zero_without_any_iteration_line_is_a_failure_unless_not_required(tmp_path):
    quiet = dict(argv=[sys.executable, "-c", "print('hello')"], run_dir=tmp_path)
    _, _, strict = run(JobSpec(combo="strict", **quiet))
    _, _, relaxed = run(JobSpec(combo="relaxed", require_final_iteration=False, **quiet))
    assert strict.state is JobState.FAILED and "no iteration line" in strict.reason
    assert relaxed.state is JobState.COMPLETED


def test_nonzero_exit_fails_with_the_code(tmp_path):
    _, _, result = run(printer_job(tmp_path, "--iters", "5", "--exit-after", "2", "--exit-code", "3"))
    assert result.state is JobState.FAILED and result.exit_code == 3
    assert result.iterations_reached == 2 and "exit code 3" in result.reason


def test_user_script_is_copied_and_run_from_the_callers_directory(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(f'#!/bin/bash\necho "cwd=$PWD"\nexec "{sys.executable}" "{PRINTER}" --iters 2\n')
    job = JobSpec(combo="script", run_dir=tmp_path / "runs", script=script, cwd=tmp_path)
    _, handle, result = run(job)
    assert result.state is JobState.COMPLETED
    assert (handle.job_dir / "launch.sh").read_text() == script.read_text()
    assert f"cwd={tmp_path}" in result.logs[0].read_text()


@pytest.mark.parametrize(("ranks", "seen"), [(4, "4"), (None, "unset")])
def test_ranks_per_node_reach_the_environment_and_job_json_only_when_known(tmp_path, ranks, seen):
    """A script whose torchrun counts its own ranks (`--nproc-per-node gpu`) gives the executor no count: none is
    exported and job.json says null, not a default 1."""
    script = tmp_path / "train.sh"
    script.write_text(f'#!/bin/bash\necho "ranks=${{NPROC_PER_NODE:-unset}}"\nexec "{sys.executable}" "{PRINTER}" '
                      "--iters 2\n")
    job = JobSpec(combo="ranks", run_dir=tmp_path / "runs", script=script, gpus_per_node=ranks)
    _, handle, result = run(job)
    assert result.state is JobState.COMPLETED
    assert f"ranks={seen}\n" in result.logs[0].read_text()
    assert json.loads((handle.job_dir / "job.json").read_text())["gpus_per_node"] == ranks


def test_silent_job_is_hung_and_its_whole_tree_stopped(tmp_path):
    job = printer_job(tmp_path, "--iters", "50", "--stall-after", "3", "--spawn-children", "2",
                      "--detach-children", "--ignore-sigterm", "--interval-s", "0.1")
    started = time.monotonic()
    _, handle, result = run(job)
    assert result.state is JobState.HUNG and result.iterations_reached == 3
    assert result.reason.startswith("hung: no new iteration for")
    assert time.monotonic() - started < 8  # 3 x 0.1 s of steps + a 1 s window + a 1 s grace
    pids = recorded_pids(handle.job_dir)
    assert len(pids) == 3  # the printer and both children were seen
    assert_all_gone(pids)
    # megapilot's own stop is recorded, so that diagnose tells it from a SIGTERM sent by others
    assert json.loads((handle.job_dir / "job.json").read_text())["stop_sent_at"] is not None


def test_no_iteration_within_startup_allowance_is_a_hang(tmp_path):
    job = printer_job(tmp_path, "--iters", "5", "--interval-s", "30", hang=HangPolicy(startup_s=0.5))
    _, _, result = run(job)
    assert result.state is JobState.HUNG and "start-up allowance" in result.reason


def test_checkpoint_save_is_not_taken_for_a_hang(tmp_path):
    policy = HangPolicy(startup_s=10, fixed_window_s=0.5, checkpoint_allowance_s=10)
    job = printer_job(tmp_path, "--iters", "3", "--checkpoint-at", "1", "--checkpoint-s", "1.2", hang=policy)
    _, _, result = run(job)
    assert result.state is JobState.COMPLETED


def test_wall_clock_limit_ends_in_timeout(tmp_path):
    job = printer_job(tmp_path, "--iters", "100", "--interval-s", "0.1", timeout_s=0.6,
                      hang=HangPolicy(startup_s=30))
    _, handle, result = run(job)
    assert result.state is JobState.TIMEOUT and "wall-clock limit of 0.6 s" in result.reason
    assert_all_gone(recorded_pids(handle.job_dir))
    assert json.loads((handle.job_dir / "job.json").read_text())["stop_sent_at"] is not None


def test_cancel_stops_the_job(tmp_path):
    executor = LocalExecutor(snapshot_interval_s=0.1)
    handle = executor.submit(printer_job(tmp_path, "--iters", "100", "--interval-s", "0.1"))
    time.sleep(0.3)
    executor.cancel(handle)
    executor.cancel(handle)  # idempotent
    assert executor.poll(handle).state is JobState.CANCELLED
    assert executor.result(handle).state is JobState.CANCELLED
    assert_all_gone(recorded_pids(handle.job_dir))


def test_processes_left_behind_by_a_finished_launcher_are_stopped(tmp_path):
    _, handle, result = run(printer_job(tmp_path, "--iters", "3", "--spawn-children", "1", "--interval-s", "0.2"))
    assert result.state is JobState.COMPLETED
    assert "stopped 1 process(es) the launcher left running" in result.reason
    assert_all_gone(recorded_pids(handle.job_dir))


def test_detached_child_of_a_launcher_killed_before_any_snapshot_is_still_stopped(tmp_path):
    # Snapshots are 60 s apart: only the job's environment marker can find the orphaned child.
    executor = LocalExecutor(snapshot_interval_s=60)
    handle = executor.submit(printer_job(tmp_path, "--spawn-children", "1", "--detach-children", "--die-at-start"))
    result = executor.wait(handle, poll_interval_s=0.05)

    assert result.state is JobState.FAILED and result.exit_code == -9
    assert "stopped 1 process(es) the launcher left running" in result.reason
    child_pid = int(result.logs[0].read_text().split("child pid ")[1].split()[0])
    assert_all_gone([child_pid])


@pytest.mark.parametrize("error", [RuntimeError("progress display broke"), KeyboardInterrupt()])
def test_an_interrupted_wait_cancels_the_job(tmp_path, error):
    def on_progress(status):
        if status.iteration and status.iteration >= 2:
            raise error

    executor = LocalExecutor(snapshot_interval_s=0.1)
    handle = executor.submit(printer_job(tmp_path, "--iters", "100", "--interval-s", "0.1", "--spawn-children", "1"))
    with pytest.raises(type(error)):
        executor.wait(handle, on_progress=on_progress, poll_interval_s=0.05)
    assert executor.poll(handle).state is JobState.CANCELLED
    assert_all_gone(recorded_pids(handle.job_dir))


def test_another_executor_reads_the_outcome_from_job_json(tmp_path):
    _, handle, result = run(printer_job(tmp_path, "--iters", "2"))
    fresh = LocalExecutor()
    assert fresh.poll(handle).state is JobState.COMPLETED
    assert fresh.result(handle).iterations_reached == result.iterations_reached == 2


def test_local_executor_refuses_several_nodes(tmp_path):
    with pytest.raises(MegapilotError) as error:
        LocalExecutor().submit(printer_job(tmp_path, nodes=2))
    assert error.value.field == "nodes"


def test_local_executor_satisfies_the_executor_protocol():
    from megapilot.execute.base import Executor

    assert isinstance(LocalExecutor(), Executor)


def test_a_job_whose_record_cannot_be_written_is_not_left_running(tmp_path, monkeypatch):
    from megapilot.execute import local
    from megapilot.files import DiskFullError

    def full_disk(directory, record):
        raise DiskFullError(directory / "job.json", 2048)

    monkeypatch.setattr(local, "write_job_record", full_disk)
    executor = LocalExecutor(snapshot_interval_s=0.1)
    job = printer_job(tmp_path, "--iters", "100", "--interval-s", "0.1", "--spawn-children", "1")
    with pytest.raises(DiskFullError):
        executor.submit(job)
    marker = str(job.job_dir.resolve())
    left = [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("MEGAPILOT_JOB_DIR") == marker]
    assert_all_gone([p.pid for p in left])
    executor.close()  # nothing left to stop, nothing raised (it also runs at interpreter exit)


def test_a_job_that_cannot_start_is_refused_and_leaves_no_job_folder(tmp_path):
    job = printer_job(tmp_path, "--iters", "1", cwd=tmp_path / "no-such-folder")
    with pytest.raises(MegapilotError) as refused:
        LocalExecutor().submit(job)
    assert refused.value.field == "cwd" and "cannot start the job" in refused.value.problem
    assert not (tmp_path / "runs").exists()


def test_a_wall_clock_limit_before_the_first_iteration_says_so_not_iteration_none(tmp_path):
    job = printer_job(tmp_path, "--iters", "100", "--interval-s", "30", timeout_s=0.6,
                      hang=HangPolicy(startup_s=30))
    _, handle, result = run(job)
    assert result.state is JobState.TIMEOUT
    assert result.reason.endswith("reached before its first iteration") and "None" not in result.reason
    assert_all_gone(recorded_pids(handle.job_dir))
