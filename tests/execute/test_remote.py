"""execute.remote: N node logs followed as one job, answered for by the node that got furthest."""

from __future__ import annotations

import sys

from megapilot.execute.base import HangPolicy, JobState
from megapilot.execute.remote import NodeLogs, run_node_script


def _line(iteration: int, total: int, step_ms: float = 100.0) -> str:
    return (f" [2026-01-01 00:00:00] iteration {iteration:8d}/{total:8d} | "
            f"elapsed time per iteration (ms): {step_ms:.1f} |\n")


def _logs(tmp_path, nodes: int = 2, train_iters: int = 4) -> NodeLogs:
    return NodeLogs(tmp_path, nodes, HangPolicy(startup_s=60, fixed_window_s=5), 0.0, train_iters)


def _write(tmp_path, node: int, text: str) -> None:
    path = tmp_path / f"out-node{node}" / "training.log"
    path.parent.mkdir(exist_ok=True)
    with path.open("a") as log:
        log.write(text)


def test_the_node_that_prints_the_iterations_leads_even_when_node0_prints_none(tmp_path):
    logs = _logs(tmp_path)
    _write(tmp_path, 0, "rendezvous done\n")
    _write(tmp_path, 1, _line(1, 4) + _line(2, 4) + _line(3, 4, 250.0))
    seen = logs.read_new(10.0)
    assert seen[0] == ["rendezvous done"] and len(seen[1]) == 3
    assert logs.leader.node == 1 and logs.iteration == 3
    status = logs.status(JobState.RUNNING, 12.0, 2.0)
    assert (status.iteration, status.train_iters, status.step_time_s, status.elapsed_s) == (3, 4, 0.25, 10.0)
    # the leader's hang window runs from its last iteration, not node 0's silence
    assert logs.hang_reason(14.0) is None and "after iteration 3/4" in (logs.hang_reason(16.0) or "")


def test_a_clean_exit_completes_only_with_the_final_iteration(tmp_path):
    logs = _logs(tmp_path)
    assert logs.clean_exit_verdict(True) == (JobState.FAILED, "exited with code 0 but printed no iteration line")
    _write(tmp_path, 1, _line(2, 4))
    logs.read_new(1.0)
    assert logs.clean_exit_verdict(True) == (
        JobState.FAILED, "exited with code 0 at iteration 2/4, before the final iteration")
    assert logs.clean_exit_verdict(False) == (JobState.COMPLETED, None)
    _write(tmp_path, 1, _line(4, 4) + "unterminated last wor")
    logs.read_rest(2.0)
    assert logs.clean_exit_verdict(True) == (JobState.COMPLETED, None) and logs.reached_final_iteration()


def test_the_failure_reason_is_the_first_node_with_a_clue(tmp_path):
    logs = _logs(tmp_path, nodes=3)
    _write(tmp_path, 0, "all fine here\n")
    _write(tmp_path, 2, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    logs.read_new(1.0)
    reason = logs.failure_reason(None, 1)
    assert reason.startswith("node 2: ") and "out of memory" in reason.lower()
    assert logs.paths() == [tmp_path / f"out-node{n}" / "training.log" for n in range(3)]


def test_a_node_script_answers_with_its_output_or_why_not():
    done = run_node_script(3, ["bash", "-s"], "echo hello; echo oops >&2; exit 0")
    assert (done.node, done.text, done.error) == (3, "hello\n", "")
    failed = run_node_script(0, ["bash", "-s"], "echo first >&2; echo last words >&2; exit 7")
    assert failed.error == "last words"
    assert run_node_script(0, ["no-such-binary-here"], "").error == "no-such-binary-here is not installed here"
    slow = run_node_script(0, [sys.executable, "-c", "import time; time.sleep(5)"], "", timeout_s=0.3)
    assert slow.error == "no answer within 0.3 s"
