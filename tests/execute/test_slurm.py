"""SlurmExecutor against a real SLURM cluster on this machine (tests/slurm_cluster.py).

The cluster has two emulated nodes on this machine, named '<host>' and '<host>-n2': the first node's
name (the launch script's MASTER_ADDR) resolves here and reaches the rendezvous, and a rendered
sbatch script really trains across the two nodes (one srun torchrun per node, c10d on loopback).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.execute.base import HangPolicy, JobSpec, JobState
from megapilot.execute.process import free_port
from megapilot.execute.remote import NodeLogs
from megapilot.execute.rundir import read_job_record
from megapilot.execute.slurm import (
    LEASE_EXPIRED_MARK,
    JobLeases,
    SlurmExecutor,
    SlurmJobState,
    lease_expiry_line,
    parse_exit_code,
    parse_scontrol_job,
    slurm_verdict,
    with_lease_watch,
)
from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import ClusterSpec, ParallelConfig, SavedPlan, TrainingSpec

PRINTER = Path(__file__).parent / "programs" / "iteration_printer.py"
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")


def tiny_two_node_plan(train_iters: int) -> SavedPlan:
    """The tiny GPT on 2 nodes x 1 rank (data parallel across the nodes)."""
    return SavedPlan(
        model=get_model("tiny"),
        cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=2, gpus_per_node=1),
        training=TrainingSpec(seq_length=64, global_batch_size=4, train_iters=train_iters),
        parallel=ParallelConfig.for_world(2, mbs=1, recompute="none"),
    )


def printer_job(tmp_path: Path, *flags: str, combo: str = "job", **spec) -> JobSpec:
    spec.setdefault("stop_grace_s", 1.0)
    spec.setdefault("hang", HangPolicy(startup_s=60, fixed_window_s=30))
    return JobSpec(combo=combo, run_dir=tmp_path / "runs", argv=[sys.executable, str(PRINTER), *flags], **spec)


def executor_for(cluster) -> SlurmExecutor:
    return SlurmExecutor(env={"SLURM_CONF": str(cluster.conf)}, refresh_s=0.5, max_lookup_interval_s=2.0)


def empty_logs(tmp_path: Path) -> NodeLogs:
    return NodeLogs(tmp_path, 2, HangPolicy(), 0.0, None)


# ---- pure parts -----------------------------------------------------------------------------

def test_exit_code_pairs_and_scontrol_lines_are_read():
    assert parse_exit_code("1:0") == (1, 0) and parse_exit_code("0:15") == (0, 15)
    assert parse_exit_code("garbage") == (None, None)
    line = ("JobId=7 JobName=a b JobState=NODE_FAIL Reason=NodeDown Dependency=(null) ExitCode=0:9 "
            "NodeList=node[1-2] BatchHost=node1")
    assert parse_scontrol_job(line) == SlurmJobState(state="NODE_FAIL", exit_code=0, signal=9, nodes="node[1-2]",
                                                     reason="NodeDown")
    assert parse_scontrol_job("slurm_load_jobs error: Invalid job id specified") is None


@pytest.mark.parametrize(("word", "state", "needle"), [
    ("NODE_FAIL", JobState.FAILED, "node failure on node2"),
    ("OUT_OF_MEMORY", JobState.FAILED, "out of memory (killed by SLURM) on node2"),
    ("BOOT_FAIL", JobState.FAILED, "boot failure on node2"),
    ("TIMEOUT", JobState.TIMEOUT, "time limit"),
    ("DEADLINE", JobState.TIMEOUT, "deadline"),
    ("PREEMPTED", JobState.FAILED, "preempted"),
    ("CANCELLED by 0", JobState.CANCELLED, "CANCELLED by 0"),
    ("FAILED", JobState.FAILED, "SLURM FAILED: exit code 3"),
])
def test_slurm_end_states_map_to_job_states_with_a_reason(tmp_path, word, state, needle):
    verdict, reason = slurm_verdict(SlurmJobState(state=word, exit_code=3, nodes="node2"), empty_logs(tmp_path))
    assert verdict is state and needle in reason


def test_completed_in_slurm_still_needs_the_final_iteration(tmp_path):
    logs = empty_logs(tmp_path)
    assert slurm_verdict(SlurmJobState("COMPLETED", 0), logs) == (
        JobState.FAILED, "exited with code 0 but printed no iteration line")
    assert slurm_verdict(SlurmJobState("COMPLETED", 0), logs, require_final_iteration=False)[0] is JobState.COMPLETED


def test_a_run_directory_slurm_would_read_as_a_pattern_is_refused(tmp_path):
    executor = SlurmExecutor(env={"SLURM_CONF": str(tmp_path / "none.conf")})
    with pytest.raises(MegapilotError, match="pattern"):
        executor.submit(JobSpec(combo="x", run_dir=tmp_path / "100%", argv=["true"]))


def test_sbatch_without_a_controller_is_refused_naming_the_set_up_and_leaves_no_job_folder(tmp_path):
    # real sbatch with an empty slurm.conf: it never reaches a controller, so no partition or account would help
    (tmp_path / "empty.conf").write_text("")
    executor = SlurmExecutor(env={"SLURM_CONF": str(tmp_path / "empty.conf")})
    with pytest.raises(MegapilotError) as refused:
        executor.submit(JobSpec(combo="x", run_dir=tmp_path / "runs", argv=["true"]))
    assert refused.value.field == "executor" and "cannot reach the SLURM controller" in refused.value.problem
    assert "sinfo" in (refused.value.fix or "") and "partition" not in refused.value.problem
    assert not (tmp_path / "runs").exists()  # the run directory it created is gone with the refused job


def test_a_refused_job_keeps_a_run_directory_that_was_there(tmp_path):
    (tmp_path / "empty.conf").write_text("")
    (tmp_path / "runs" / "earlier").mkdir(parents=True)
    with pytest.raises(MegapilotError):
        SlurmExecutor(env={"SLURM_CONF": str(tmp_path / "empty.conf")}).submit(
            JobSpec(combo="x", run_dir=tmp_path / "runs", argv=["true"]))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["earlier"]


def test_the_lease_watcher_goes_after_the_sbatch_lines_and_keeps_the_script_whole(tmp_path):
    script = "#!/bin/bash\n#SBATCH --nodes=2\n# a comment\n\n#SBATCH --time=01:00:00\nset -euo pipefail\necho hi\n"
    watched = with_lease_watch(script, tmp_path / "a b" / "megapilot.lease", 30)
    head, _, rest = watched.partition("# megapilot: scancel this job")
    # sbatch reads directives up to the first command: both #SBATCH lines stay before the watcher.
    assert head == "#!/bin/bash\n#SBATCH --nodes=2\n# a comment\n\n#SBATCH --time=01:00:00\n"
    assert rest.endswith(") </dev/null &\nset -euo pipefail\necho hi\n")
    assert f"lease='{tmp_path}/a b/megapilot.lease'" in rest and "> 30 ))" in rest
    assert subprocess.run(["bash", "-n"], input=watched, text=True).returncode == 0


def _run_watcher(tmp_path: Path, lease_s: float, renew: bool) -> tuple[float, str]:
    """Run a watched script under bash with a recording stand-in for `scancel` (the real one is in the slow
    test below); the script ends when "scancel" is called. Returns the seconds taken and what it printed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path}/cancelled\n")
    (bin_dir / "scancel").chmod(0o755)
    lease = tmp_path / "megapilot.lease"
    script = with_lease_watch("#!/bin/bash\nwhile [ ! -e " + str(tmp_path / "cancelled") + " ]; do sleep 0.1; done\n",
                              lease, lease_s)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    leases = JobLeases(renew_s=0.5)
    if renew:
        leases.hold(lease)
    started_s = time.monotonic()
    try:
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=lease_s * 2)
    except subprocess.TimeoutExpired:
        return time.monotonic() - started_s, ""
    finally:
        leases.release(lease)
    return time.monotonic() - started_s, done.stdout


def test_a_job_whose_lease_stops_changing_is_scancelled_after_the_window(tmp_path):
    (tmp_path / "megapilot.lease").write_text("written once, never renewed\n")
    took_s, said = _run_watcher(tmp_path, lease_s=2, renew=False)
    assert (tmp_path / "cancelled").read_text() == "4242\n"
    assert 2 <= took_s < 6, took_s
    assert said.startswith(f"{LEASE_EXPIRED_MARK} {tmp_path}/megapilot.lease not renewed for 2 s")


def test_a_renewed_lease_keeps_the_job_running(tmp_path):
    took_s, said = _run_watcher(tmp_path, lease_s=2, renew=True)
    assert not (tmp_path / "cancelled").exists() and said == "" and took_s >= 4


def test_leases_are_renewed_by_their_own_thread_until_released(tmp_path):
    leases = JobLeases(renew_s=0.05)
    lease = tmp_path / "megapilot.lease"
    leases.hold(lease)
    seen = {lease.read_text()}
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        seen.add(lease.read_text())
        time.sleep(0.01)
    assert len(seen) >= 3  # renewed without anyone polling
    leases.release(lease)
    time.sleep(0.2)
    last = lease.read_text()
    time.sleep(0.3)
    assert lease.read_text() == last


def test_a_lease_too_short_to_renew_is_refused_and_zero_turns_it_off():
    from megapilot.execute.base import ExecutorSettings

    with pytest.raises(MegapilotError, match="job_lease_s"):
        SlurmExecutor(lease_s=3)
    assert SlurmExecutor.from_settings(ExecutorSettings(job_lease_s=0)).leases is None
    assert SlurmExecutor.from_settings(ExecutorSettings()).lease_s == 120


def test_the_watchers_log_line_becomes_the_reason(tmp_path):
    log = tmp_path / "out-node0" / "training.log"
    log.parent.mkdir()
    log.write_text("iteration 3/9 |\n" + f"{LEASE_EXPIRED_MARK} /x/megapilot.lease not renewed for 120 s\n")
    assert lease_expiry_line(tmp_path) == "/x/megapilot.lease not renewed for 120 s"
    log.write_text("iteration 3/9 |\n")
    assert lease_expiry_line(tmp_path) is None and lease_expiry_line(tmp_path / "none") is None


# ---- against the real cluster ---------------------------------------------------------------

@pytest.mark.slow
def test_rendered_sbatch_script_trains_across_two_nodes(slurm_two_runnable_nodes, tmp_path):
    pytest.importorskip("megatron.core")
    options = LaunchOptions(
        launcher="slurm", mock_data=True, entrypoint="megapilot", cpu=True, python=sys.executable,
        log_dir=str(tmp_path), job_name="mp-two-node", time_limit="00:10:00", master_port=free_port(),
    )
    launch = render_launch(tiny_two_node_plan(train_iters=6), options)
    executor = executor_for(slurm_two_runnable_nodes)
    job = JobSpec(combo="tiny", run_dir=tmp_path / "runs", script_text=launch.script, nodes=2,
                  hang=HangPolicy(startup_s=240, fixed_window_s=120), timeout_s=400)
    handle = executor.submit(job)
    seen = []
    result = executor.wait(handle, on_progress=seen.append, poll_interval_s=0.5)

    logs = [path.read_text() for path in result.logs]
    assert result.state is JobState.COMPLETED, (result.reason, logs[0][-3000:], logs[1][-3000:])
    assert result.job_id == handle.job_id and result.job_id.isdigit()
    assert result.logs == [handle.job_dir / "out-node0" / "training.log", handle.job_dir / "out-node1" / "training.log"]
    # One torchrun per node: each log holds its node's own rank; Megatron prints iterations from the last rank.
    assert [m.groups() for m in ITERATION.finditer("\n".join(logs))][-1] == ("6", "6")
    assert all("[default0]:" in log for log in logs)
    assert (result.iterations_reached, result.train_iters) == (6, 6)
    assert seen[0].state in (JobState.PENDING, JobState.RUNNING) and seen[-1].state is JobState.COMPLETED
    record = (handle.job_dir / "job.json").read_text()
    assert '"state": "COMPLETED"' in record
    # launch.sh is the rendered script with the lease watcher after its #SBATCH lines, nothing else changed.
    lease = handle.job_dir / "megapilot.lease"
    assert (handle.job_dir / "launch.sh").read_text() == with_lease_watch(launch.script, lease, 120)


@pytest.mark.slow
def test_nonzero_exit_fails_with_the_code_and_polling_many_jobs_shares_squeue(slurm_two_runnable_nodes,
                                                                            tmp_path):
    executor = executor_for(slurm_two_runnable_nodes)
    handles = [executor.submit(printer_job(tmp_path, "--iters", "5", "--exit-after", "2", "--exit-code", "3",
                                           combo=f"fail{i}")) for i in range(3)]
    polls = 0
    while not all(executor.poll(h).state.is_terminal for h in handles):
        polls += len(handles)
        time.sleep(0.1)
    for handle in handles:
        result = executor.result(handle)
        assert result.state is JobState.FAILED and result.exit_code == 3, result
        assert "exit code 3" in result.reason and result.iterations_reached == 2
    # One squeue answers for all three jobs, at most every refresh_s.
    assert executor.queue.squeue_calls < polls / 2


@pytest.mark.slow
def test_scancel_from_outside_is_cancelled_with_its_reason(slurm_two_runnable_nodes, tmp_path):
    executor = executor_for(slurm_two_runnable_nodes)
    handle = executor.submit(printer_job(tmp_path, "--iters", "1000", "--interval-s", "0.2"))
    deadline = time.monotonic() + 60
    while (executor.poll(handle).iteration or 0) < 1:
        assert time.monotonic() < deadline, "the job never printed an iteration"
        time.sleep(0.2)
    slurm_two_runnable_nodes.run("scancel", handle.job_id, check=True)
    result = executor.wait(handle, poll_interval_s=0.2)
    assert result.state is JobState.CANCELLED
    assert "cancelled in SLURM" in result.reason
    assert read_job_record(handle.job_dir).stop_sent_at is None  # not megapilot's stop: diagnose says so


@pytest.mark.slow
def test_a_job_that_stops_printing_iterations_is_hung_and_scancelled(slurm_two_runnable_nodes, tmp_path):
    executor = executor_for(slurm_two_runnable_nodes)
    job = printer_job(tmp_path, "--iters", "5", "--stall-after", "1",
                      hang=HangPolicy(startup_s=60, fixed_window_s=3))
    handle = executor.submit(job)
    result = executor.wait(handle, poll_interval_s=0.2)
    assert result.state is JobState.HUNG and "after iteration 1/5 (fixed window 3 s)" in result.reason
    assert result.iterations_reached == 1
    queue = slurm_two_runnable_nodes.run("squeue", "-h", "-j", handle.job_id, "-o", "%T").stdout.strip()
    assert queue == "", f"job still queued as {queue}"
    assert slurm_two_runnable_nodes.final_state(handle.job_id) == "CANCELLED"
    assert read_job_record(handle.job_dir).stop_sent_at is not None  # megapilot's own scancel, recorded


@pytest.mark.slow
def test_cancel_scancels_and_waits_for_the_job_to_leave_the_queue(slurm_two_runnable_nodes, tmp_path):
    executor = executor_for(slurm_two_runnable_nodes)
    handle = executor.submit(printer_job(tmp_path, "--iters", "1000", "--interval-s", "0.2", combo="cancel"))
    executor.cancel(handle)
    assert executor.poll(handle).state is JobState.CANCELLED and executor.result(handle).reason == "cancelled"
    assert slurm_two_runnable_nodes.run("squeue", "-h", "-j", handle.job_id, "-o", "%T").stdout.strip() == ""


_HOLDER = """
import sys, time
from pathlib import Path
from megapilot.execute.base import HangPolicy, JobSpec
from megapilot.execute.slurm import SlurmExecutor
executor = SlurmExecutor(env={"SLURM_CONF": sys.argv[1]}, lease_s=float(sys.argv[2]))
job = JobSpec(combo="orphan", run_dir=Path(sys.argv[3]), stop_grace_s=1.0,
              hang=HangPolicy(startup_s=60, fixed_window_s=30), argv=sys.argv[4:])
handle = executor.submit(job)
print(handle.job_id, handle.job_dir, flush=True)
time.sleep(600)  # holds the job without polling: only the lease thread runs
"""


@pytest.mark.slow
def test_a_sigkilled_megapilot_leaves_no_slurm_job_behind(slurm_two_runnable_nodes, tmp_path):
    """SIGKILL runs no handler and no atexit: the job's own watcher scancels it once the lease goes stale."""
    cluster, lease_s = slurm_two_runnable_nodes, 10.0
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(cluster.conf), str(lease_s), str(tmp_path),
                               sys.executable, str(PRINTER), "--iters", "100000", "--interval-s", "0.2"],
                              stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        job_id, job_dir = holder.stdout.readline().split()  # type: ignore[union-attr]  # stdout is a pipe
        log = Path(job_dir) / "out-node0" / "training.log"

        def queued() -> str:
            return cluster.run("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip()

        deadline = time.monotonic() + 60
        while not (log.is_file() and ITERATION.search(log.read_text())):
            assert time.monotonic() < deadline, f"the job never printed an iteration ({queued()})"
            time.sleep(0.2)
        # Alive but not polling for longer than the window: the lease thread keeps the job.
        time.sleep(lease_s * 1.5)
        assert queued() == "RUNNING"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        killed_s = time.monotonic()
        while queued() and time.monotonic() - killed_s < lease_s * 3:
            time.sleep(0.5)
        gone_s = time.monotonic() - killed_s
        print(f"job {job_id} left the queue {gone_s:.1f} s after megapilot was SIGKILLed (lease {lease_s:g} s)")
        assert queued() == "", f"job {job_id} outlived megapilot by {gone_s:.0f} s"
        assert gone_s < lease_s + 10, gone_s
        assert cluster.final_state(job_id) == "CANCELLED"
        assert f"{LEASE_EXPIRED_MARK} {job_dir}/megapilot.lease not renewed for 10 s" in log.read_text()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_an_srun_that_waits_too_long_gives_its_pending_allocation_back(slurm_two_runnable_nodes):
    """A probe srun still waiting in the queue (a drained node, a held job) is stopped at its timeout; killed
    outright it would leave its allocation pending, to run whenever the nodes come back."""
    executor = executor_for(slurm_two_runnable_nodes)
    executor.client.timeout_s = 3.0
    done = executor.client.run("srun", "--begin=now+3600", "--job-name=mp-pending-probe", "true")
    assert done.returncode == 124 and "srun timed out after 3 s" in done.stderr
    assert "queued and waiting for resources" in done.stderr  # srun's own words are kept
    queued = slurm_two_runnable_nodes.run("squeue", "-h", "-n", "mp-pending-probe", "-o", "%i %T").stdout.strip()
    assert queued == "", f"left in the queue: {queued}"


def _in_service_again(cluster, node: str) -> None:
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=True)
    deadline = time.monotonic() + 30
    while cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip() != "idle":
        assert time.monotonic() < deadline, "the node did not come back"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_drained_node_or_an_unknown_partition_is_refused_naming_the_fix(slurm_two_runnable_nodes, tmp_path):
    """sbatch would only call either 'not available' (or wait for ever): the check names the nodes and the fix."""
    cluster = slurm_two_runnable_nodes
    second = cluster.node_names[1]
    job = printer_job(tmp_path, "--iters", "1", nodes=2)
    cluster.run("scontrol", "update", f"nodename={second}", "state=drain", "reason=bad dimm", check=True)
    try:
        said = executor_for(cluster).check_submission(job)
        assert said is not None and said.startswith("partition main has 1 of the 2 node(s) a job needs in service: "
                                                    f"{second} drained (bad dimm); fix: ")
        assert "state=resume" in said
        assert executor_for(cluster).check_submission(printer_job(tmp_path, "--iters", "1")) is None  # 1 is enough
    finally:
        _in_service_again(cluster, second)
    assert executor_for(cluster).check_submission(job) is None
    elsewhere = SlurmExecutor(env={"SLURM_CONF": str(cluster.conf)}, sbatch_options=["--partition=gpuz"])
    said = elsewhere.check_submission(job)
    assert said == ("megapilot.partition gpuz: no such partition; this cluster has main* (* the default); fix: set "
                    "megapilot.partition to one of them, or null for the default")


@pytest.mark.parametrize(("reason", "blocked"), [
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", True),
    ("ReqNodeNotAvail, UnavailableNodes:vm-n2", True),  # SLURM 22.05's words for a job pinned to a drained node
    ("PartitionDown", True),
    ("Resources", False), ("Priority", False), ("BeginTime", False), ("JobHeldUser", False),
    ("QOSMaxJobsPerUserLimit", False),
])
def test_only_a_queue_reason_naming_nodes_out_of_service_can_give_a_job_up(reason, blocked):
    from megapilot.execute.slurm import _NODES_UNAVAILABLE

    assert bool(_NODES_UNAVAILABLE.search(reason)) is blocked


@pytest.mark.slow
def test_a_job_queued_on_a_node_drained_since_the_preflight_fails_naming_it_and_a_busy_queue_waits(
        slurm_two_runnable_nodes, tmp_path):
    """A node drained after the preflight: the two-node job would wait in the queue for as long as the node stays
    out; after `blocked_in_queue_s` it is scancelled and failed with the node and the fix, so the suite's other
    combos run. A job that waits only for its start time is not given up."""
    cluster = slurm_two_runnable_nodes
    second = cluster.node_names[1]
    executor = executor_for(cluster)
    cluster.run("scontrol", "update", f"nodename={second}", "state=drain", "reason=bad dimm", check=True)
    try:
        blocked = executor.submit(printer_job(tmp_path, "--iters", "1", nodes=2, combo="blocked",
                                              blocked_in_queue_s=2.0))
        later = SlurmExecutor(env={"SLURM_CONF": str(cluster.conf)}, refresh_s=0.5,
                              sbatch_options=["--begin=now+3600"])
        waiting = later.submit(printer_job(tmp_path, "--iters", "1", combo="later", blocked_in_queue_s=2.0))
        result = executor.wait(blocked, poll_interval_s=0.5)
        assert result.state is JobState.FAILED, result
        assert "waited" in result.reason and "in the queue on nodes out of service" in result.reason
        assert f"{second} drained (bad dimm)" in result.reason and "state=resume" in result.reason
        assert cluster.run("squeue", "-h", "-j", blocked.job_id, "-o", "%T").stdout.strip() == ""
        time.sleep(3.0)
        assert later.poll(waiting).state is JobState.PENDING  # BeginTime: only waiting, never given up
        later.cancel(waiting)
    finally:
        _in_service_again(cluster, second)


@pytest.mark.slow
def test_an_option_sbatch_refuses_is_named_with_the_setting_to_change(slurm_two_runnable_nodes, tmp_path):
    def said(option: str) -> str | None:
        executor = SlurmExecutor(env={"SLURM_CONF": str(slurm_two_runnable_nodes.conf)}, sbatch_options=[option])
        return executor.check_submission(printer_job(tmp_path, "--iters", "1"))

    assert said("--frobnicate=1") == ("sbatch --test-only said: sbatch: unrecognized option '--frobnicate=1' / Try "
                                      "\"sbatch --help\" for more information; fix: remove or correct --frobnicate=1 "
                                      "in megapilot.sbatch_options: sbatch does not take it (sbatch --help lists what "
                                      "it does)")
    assert (said("--reservation=nope") or "").endswith(
        "Requested reservation is invalid; fix: --reservation in megapilot.sbatch_options: name one that exists and "
        "admits you (scontrol show reservation)")
    assert (said("--exclusive=bogus") or "").endswith(
        "Invalid --exclusive specification; fix: correct --exclusive: in megapilot.sbatch_options, or the megapilot "
        "setting that writes it (megapilot.exclusive, megapilot.time_limit, megapilot.memory_per_node_gib)")
