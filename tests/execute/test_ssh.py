"""SshExecutor through the system ssh client and a real sshd (tests/sshd.py).

"Two nodes" are this machine at 127.0.0.1 and 127.0.0.2, one sshd listening on both: every node
is its own ssh session, so staging, the per-node environment, the remote process group, the
stop and the per-node log streams are all the real thing; only the hardware is shared.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.execute.base import HangPolicy, JobSpec, JobState
from megapilot.execute.process import free_port, marked_processes
from megapilot.execute.ssh import ContainerWrapper, SshExecutor, SshNode
from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import ClusterSpec, ParallelConfig, SavedPlan, TrainingSpec

PRINTER = Path(__file__).parent / "programs" / "iteration_printer.py"
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|")
QUICK = dict(stop_grace_s=1.0, hang=HangPolicy(startup_s=60, fixed_window_s=30))


def marked_alive(job_dir: Path) -> list[psutil.Process]:
    """Processes of the job still running anywhere on this machine (every node is this machine)."""
    return marked_processes("MEGAPILOT_JOB_DIR", str(job_dir))


def wait_for_iteration(executor, handle, iteration: int = 1, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while (executor.poll(handle).iteration or 0) < iteration:
        assert time.monotonic() < deadline, f"no iteration {iteration} within {timeout_s} s"
        time.sleep(0.1)


# ---- pure parts -----------------------------------------------------------------------------

def test_ssh_argv_uses_batch_mode_and_the_node_settings():
    node = SshNode(host="gpu-01", user="alice", port=2222, identity_file=Path("/k/id"), options=("ProxyJump=bastion",))
    assert node.ssh_argv() == ["ssh", "-o", "BatchMode=yes", "-T", "-p", "2222", "-i", "/k/id", "-l", "alice",
                               "-o", "ProxyJump=bastion", "gpu-01"]
    assert SshNode(host="gpu-02").ssh_argv() == ["ssh", "-o", "BatchMode=yes", "-T", "gpu-02"]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "a b", ""])
def test_a_host_that_ssh_would_read_as_an_option_is_refused(host):
    with pytest.raises(ValueError):
        SshNode(host=host)


def test_container_wrappers_render_as_quoted_prefixes_passing_env_by_name():
    job_dir = "/runs/it's a dir"
    docker_exec = ContainerWrapper(runtime="docker", mode="exec", target="train")
    assert docker_exec.render(["HF_TOKEN", "NODE_RANK"], job_dir) == "docker exec -e HF_TOKEN -e NODE_RANK train"
    podman_run = ContainerWrapper(runtime="podman", mode="run", target="nvcr.io/nvidia/pytorch:25.01-py3",
                                  extra_args=("--device", "nvidia.com/gpu=all"))
    assert podman_run.render(["NODE_RANK"], job_dir) == (
        "podman run --rm --network=host --ipc=host -v '/runs/it'\"'\"'s a dir:/runs/it'\"'\"'s a dir' "
        "-e NODE_RANK --device nvidia.com/gpu=all nvcr.io/nvidia/pytorch:25.01-py3")
    enroot = ContainerWrapper(runtime="enroot", mode="start", target="pytorch")
    assert enroot.render(["NODE_RANK"], "/runs/a") == "enroot start --mount /runs/a:/runs/a --env NODE_RANK pytorch"
    with pytest.raises(ValueError, match="enroot supports start"):
        ContainerWrapper(runtime="enroot", mode="exec", target="pytorch")
    with pytest.raises(ValueError, match="not a container"):
        ContainerWrapper(runtime="docker", mode="exec", target="--privileged")


def test_the_remote_command_is_one_quoted_string_whatever_the_arguments():
    executor = SshExecutor([SshNode(host="n0")])
    command = executor.remote_command("echo \"$1\"", "label", "$(touch /tmp/x) it's")
    assert command == "exec bash -c 'echo \"$1\"' label '$(touch /tmp/x) it'\"'\"'s'"


def test_more_nodes_than_the_executor_has_and_bad_env_names_are_user_errors(tmp_path):
    executor = SshExecutor([SshNode(host="n0")])
    with pytest.raises(MegapilotError, match="needs 2 nodes"):
        executor.submit(JobSpec(combo="a", run_dir=tmp_path, argv=["true"], nodes=2))
    with pytest.raises(MegapilotError, match="not valid shell names"):
        executor.submit(JobSpec(combo="b", run_dir=tmp_path, argv=["true"], env={"A B": "1"}))


def test_an_unreachable_node_is_a_user_error_naming_it(tmp_path):
    port = free_port()  # nobody listens there
    executor = SshExecutor([SshNode(host="127.0.0.1", port=port, identity_file=tmp_path / "id")], connect_timeout_s=5)
    with pytest.raises(MegapilotError, match=r"cannot copy the job to node 0 \(127\.0\.0\.1\)") as caught:
        executor.submit(JobSpec(combo="a", run_dir=tmp_path, argv=["true"]))
    # the hint is the command to try, with the port and key actually used
    fix = caught.value.fix or ""
    assert f"-p {port} -i {tmp_path / 'id'}" in fix and "127.0.0.1 true" in fix


def test_keepalives_are_on_by_default_and_a_nodes_own_options_override_them(tmp_path):
    executor = SshExecutor([SshNode(host="n0"), SshNode(host="n1", options=("ServerAliveInterval=5",))])
    plain, own = (executor._ssh(node, "true", "label") for node in executor.nodes)
    assert "ServerAliveInterval=15" in plain and "ServerAliveCountMax=4" in plain
    # ssh keeps the first value it reads for an option: the node's comes before the default
    assert own.index("ServerAliveInterval=5") < own.index("ServerAliveInterval=15")


# ---- against the loopback sshd --------------------------------------------------------------

def tiny_two_node_plan(train_iters: int) -> SavedPlan:
    return SavedPlan(
        model=get_model("tiny"),
        cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=2, gpus_per_node=1),
        training=TrainingSpec(seq_length=64, global_batch_size=4, train_iters=train_iters),
        parallel=ParallelConfig.for_world(2, mbs=1, recompute="none"),
    )


@pytest.mark.slow
def test_rendered_torchrun_script_trains_across_two_ssh_nodes(loopback_sshd, tmp_path):
    pytest.importorskip("megatron.core")
    port = free_port()
    launch = render_launch(tiny_two_node_plan(train_iters=6), LaunchOptions(
        mock_data=True, entrypoint="megapilot", cpu=True, python=sys.executable, rendezvous="static",
        master_port=port))
    executor = SshExecutor(loopback_sshd.nodes(2))
    job = JobSpec(combo="tiny", run_dir=tmp_path / "runs", script_text=launch.script, nodes=2,
                  env={"MASTER_PORT": str(port)}, hang=HangPolicy(startup_s=240, fixed_window_s=120),
                  timeout_s=400)
    handle = executor.submit(job)
    result = executor.wait(handle, poll_interval_s=0.5)

    logs = [path.read_text() for path in result.logs]
    assert result.state is JobState.COMPLETED, (result.reason, logs[0][-3000:], logs[1][-3000:])
    assert (result.iterations_reached, result.train_iters) == (6, 6)
    assert [m.groups() for m in ITERATION.finditer("\n".join(logs))][-1] == ("6", "6")
    for node, log in enumerate(logs):
        assert log.startswith(f"megapilot-ssh: node {node} pid "), log[:200]
        assert "[default0]:" in log  # each node ran its own torchrun with one local rank
    record = json.loads((handle.job_dir / "job.json").read_text())
    assert record["master_addr"] == "127.0.0.1" and record["master_port"] == port
    assert [p["name"] for p in record["processes"]] == ["node 0 (127.0.0.1)", "node 1 (127.0.0.2)"]
    assert not list(handle.job_dir.glob(".env-node*")), "the environment files outlived the start"
    assert marked_alive(handle.job_dir) == []


KILL_RANK_ON_NODE_1 = f"""#!/usr/bin/env bash
# Node 1's rank is SIGKILLed after its second iteration; node 0 would run for minutes.
if [ "$NODE_RANK" = 1 ]; then
  {sys.executable} {PRINTER} --iters 1000 --interval-s 0.2 &
  rank=$!
  sleep 0.6
  kill -KILL "$rank"
  wait "$rank"
else
  {sys.executable} {PRINTER} --iters 1000 --interval-s 0.2 --spawn-children 1 --detach-children
fi
"""


@pytest.mark.slow
def test_a_killed_rank_fails_the_job_naming_its_node_and_nothing_is_left(loopback_sshd, tmp_path):
    executor = SshExecutor(loopback_sshd.nodes(2))
    handle = executor.submit(JobSpec(combo="killed", run_dir=tmp_path, script_text=KILL_RANK_ON_NODE_1, nodes=2,
                                     **QUICK))
    result = executor.wait(handle, poll_interval_s=0.1)
    assert result.state is JobState.FAILED and result.exit_code == 137
    assert result.reason.startswith("node 1 (127.0.0.2) failed with exit code 137 (SIGKILL)"), result.reason
    assert "stopped node 0" in result.reason
    assert marked_alive(handle.job_dir) == []


@pytest.mark.slow
def test_a_lost_connection_is_reported_as_lost_and_the_node_is_cleaned_over_a_new_one(loopback_sshd, tmp_path):
    executor = SshExecutor(loopback_sshd.nodes(2))
    job = JobSpec(combo="lost", run_dir=tmp_path, nodes=2, **QUICK,
                  argv=[sys.executable, str(PRINTER), "--iters", "1000", "--interval-s", "0.1"])
    handle = executor.submit(job)
    wait_for_iteration(executor, handle)
    executor._jobs[handle.job_id].runs[1].process.kill()  # the ssh client to node 1 dies; its job does not
    result = executor.wait(handle, poll_interval_s=0.1)
    assert result.state is JobState.FAILED
    node = loopback_sshd.nodes(2)[1]
    assert result.reason.startswith(f"lost the connection to node 1 (127.0.0.2 port {node.port} with key "
                                    f"{node.identity_file}): the ssh client was killed by SIGKILL"), result.reason
    assert "processes on node 1 were stopped over a new ssh connection" in result.reason
    assert marked_alive(handle.job_dir) == []
    assert executor.processes_left(handle.job_dir).count == 0


@pytest.mark.slow
def test_cancel_stops_the_remote_trees_even_detached_children(loopback_sshd, tmp_path):
    executor = SshExecutor(loopback_sshd.nodes(2))
    job = JobSpec(combo="cancel", run_dir=tmp_path, nodes=2, **QUICK,
                  argv=[sys.executable, str(PRINTER), "--iters", "1000", "--interval-s", "0.1",
                        "--spawn-children", "2", "--detach-children"])
    handle = executor.submit(job)
    wait_for_iteration(executor, handle)
    deadline = time.monotonic() + 30
    while len(running := marked_alive(handle.job_dir)) < 6:  # per node: the printer and its two setsid'd children
        assert time.monotonic() < deadline, f"only {len(running)} of the job's 6 processes started"
        time.sleep(0.1)
    executor.cancel(handle)
    result = executor.result(handle)
    assert result.state is JobState.CANCELLED and result.reason == "cancelled"
    assert marked_alive(handle.job_dir) == []
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in running)


@pytest.mark.slow
def test_a_silent_job_is_hung_and_stopped_on_every_node(loopback_sshd, tmp_path):
    executor = SshExecutor(loopback_sshd.nodes(2))
    job = JobSpec(combo="hang", run_dir=tmp_path, nodes=2, stop_grace_s=1.0,
                  hang=HangPolicy(startup_s=60, fixed_window_s=2),
                  argv=[sys.executable, str(PRINTER), "--iters", "5", "--stall-after", "1"])
    handle = executor.submit(job)
    result = executor.wait(handle, poll_interval_s=0.1)
    assert result.state is JobState.HUNG and "after iteration 1/5" in result.reason
    assert marked_alive(handle.job_dir) == []
    assert json.loads((handle.job_dir / "job.json").read_text())["stop_sent_at"] is not None


ECHO_ARGS = "import os, sys; print('ARGS', sys.argv[1:]); print('VALUE', repr(os.environ['TRICKY']))"


@pytest.mark.slow
def test_hostile_paths_names_and_values_pass_through_and_nothing_is_executed(loopback_sshd, tmp_path):
    pwned = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    hostile = f"it's a \"dir\" $(touch {pwned}) `touch {pwned}` ; touch {pwned}"
    run_dir = tmp_path / hostile
    value = f"secret $(touch {pwned}) 'q' \"dq\" \\ $HOME\nsecond line"
    executor = SshExecutor(loopback_sshd.nodes(2))
    job = JobSpec(combo="hostile", run_dir=run_dir, nodes=2, require_final_iteration=False, cwd=run_dir,
                  env={"TRICKY": value}, argv=[sys.executable, "-c", ECHO_ARGS, hostile, "$(id)"])
    handle = executor.submit(job)
    result = executor.wait(handle, poll_interval_s=0.1)

    assert result.state is JobState.COMPLETED, result
    for log in result.logs:
        text = log.read_text()
        assert f"ARGS {[hostile, '$(id)']!r}" in text and f"VALUE {value!r}" in text
    assert not pwned.exists()
    # The value never reached an argv or a file of the job.
    record = (handle.job_dir / "job.json").read_text()
    assert "secret" not in record and "secret" not in " ".join(json.loads(record)["command"])
    assert not list(handle.job_dir.glob(".env-node*"))


_HOLDER = """
import json, sys, time
from pathlib import Path
from megapilot.execute.base import HangPolicy, JobSpec
from megapilot.execute.ssh import SshExecutor, SshNode
nodes = [SshNode.model_validate(n) for n in json.loads(sys.argv[1])]
job = JobSpec(combo="orphan", run_dir=Path(sys.argv[2]), nodes=2, stop_grace_s=1.0,
              hang=HangPolicy(startup_s=60, fixed_window_s=30), argv=sys.argv[3:])
handle = SshExecutor(nodes).submit(job)
print(handle.job_dir, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_sigkilled_megapilot_leaves_no_remote_job_behind(loopback_sshd, tmp_path):
    """SIGKILL runs no handler and no atexit: the remote side sees the ssh session's input end and stops the job."""
    import os
    import signal
    import subprocess

    nodes = json.dumps([n.model_dump(mode="json") for n in loopback_sshd.nodes(2)])
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, nodes, str(tmp_path), sys.executable, str(PRINTER),
                               "--iters", "100000", "--interval-s", "0.1"], stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    job_dir = Path(holder.stdout.readline().strip())  # type: ignore[union-attr]  # stdout is a pipe
    deadline = time.monotonic() + 60
    while len(marked_alive(job_dir)) < 2:  # a printer on each node
        assert time.monotonic() < deadline, "the job did not start on both nodes"
        time.sleep(0.2)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    deadline = time.monotonic() + 30
    while (alive := marked_alive(job_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == [], f"outlived megapilot: {alive}"
