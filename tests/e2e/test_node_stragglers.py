"""A node really slowed names itself: two torchrun nodes on this machine, one of them stopped and continued on a
duty cycle (SIGSTOP/SIGCONT to its ranks, what a throttled GPU or a noisy neighbour does to a node's compute), then
the per-rank compute line of a real Megatron-Core run and the collectives probe are read by the verdicts."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("megatron.core")

from megapilot.diagnose.nodes import blame_links, stragglers_from_rank_times
from megapilot.execute.process import free_port
from megapilot.logs.collectives import parse_collectives
from megapilot.logs.stragglers import read_straggler_lines
from megapilot.trainer.corpus import default_dataset_prefix
from tests.e2e.duty_cycle import DutyCycle, descendants_of
from tests.e2e.process_tree import started_tree
from tests.e2e.test_train_layouts import TINY_GPT

pytestmark = pytest.mark.slow


def run_two_nodes(tmp_path: Path, nproc_per_node: int, module_argv: list[str], slow_node: int = 1,
                  stopped_s: float = 0.04, running_s: float = 0.04, timeout_s: float = 300) -> list[Path]:
    """Both nodes' torchrun to completion with `slow_node`'s workers stopped `stopped_s` and running `running_s` in
    turn (50 % by default); each node's log."""
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    logs = [tmp_path / f"node{k}.log" for k in range(2)]
    def node(k: int) -> Any:
        return stack.enter_context(started_tree(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
             "--nproc-per-node", str(nproc_per_node), "--master-addr", "127.0.0.1", "--master-port", str(port),
             *module_argv], log_path=logs[k], cwd=tmp_path, env=env))

    with ExitStack() as stack:
        # the slowed node first, then its cycle, then the other: no step runs before both nodes meet, so none
        # runs before the cycle does
        slow = node(slow_node)
        cycle = DutyCycle(descendants_of(slow.pid), stopped_s=stopped_s, running_s=running_s)
        other = node(1 - slow_node)
        processes = [slow, other] if slow_node == 0 else [other, slow]
        try:
            codes = [p.wait(timeout=timeout_s) for p in processes]
        finally:
            cycle.close()
    assert codes == [0, 0], "\n".join(log.read_text()[-2000:] for log in logs)
    return logs


def test_the_slowed_node_is_the_straggler_of_a_real_training_run(tmp_path):
    prefix = default_dataset_prefix(tmp_path / "corpus")
    # stopped 3/4 of the time: node 1's ranks 4x slower stand out even when other work on this machine's two cores
    # slows both nodes unevenly (at 50 %, node 0 was once measured the slower on a busy machine). The running window
    # (10 ms) is shorter than a rank's compute before its collectives, so every compute window is stopped in turn:
    # with a 30 ms window the slowed rank, resumed after its peer had waited, fitted its whole compute into it and
    # was once measured the faster
    # the parameter all-gather overlapped with the forward, as the suite runs it: the fast rank's forward waits there
    # for the straggler's optimizer step, and that wait must not count as its compute
    logs = run_two_nodes(tmp_path, 1, ["-m", "megapilot.trainer", *TINY_GPT, "--data-path", prefix,
                                       "--train-iters", "12", "--log-interval", "2", "--timing-log-level", "1",
                                       "--use-distributed-optimizer", "--overlap-grad-reduce",
                                       "--overlap-param-gather"],
                         stopped_s=0.03, running_s=0.01)
    found = read_straggler_lines("node1.log", logs[1].read_text().splitlines())  # the last rank prints
    assert len(found.rank_times) == 6 and all(t.node_of_rank == (0, 1) for t in found.rank_times)
    verdict = stragglers_from_rank_times(found.rank_times)
    assert [n.name for n in verdict.slow_nodes] == ["node1"], verdict
    assert [r.name for r in verdict.slow_ranks] == ["rank1"], verdict


def test_the_probe_measures_the_slowed_nodes_own_ring_lower_and_blames_it(tmp_path):
    # sizes and calls that keep each timed window several duty cycles long (60 calls of 4 MiB, 6 ms each on this
    # machine, over a 120 ms cycle), stopped 3/4 of it: with 20 calls and a 50 % cycle a busy machine's noise
    # (another test's ranks on the same two cores) hid the slowed node's ring
    logs = run_two_nodes(tmp_path, 2, ["-m", "megapilot.trainer.collectives", "-b", "1M", "-e", "4M",
                                       "-n", "60", "--collectives", "all_reduce,alltoall"],
                         stopped_s=0.09, running_s=0.03)
    text = "\n".join(log.read_text() for log in logs).splitlines()
    runs = {(run.collective, run.scope): run for run in parse_collectives(text)}
    assert {("all_reduce", ""), ("alltoall", ""), ("all_reduce", "node0"), ("all_reduce", "node1"),
            ("sendrecv", "node0-node1")} <= set(runs)
    assert runs[("all_reduce", "")].ranks == 4 and runs[("all_reduce", "")].nodes == 2
    assert runs[("all_reduce", "node1")].peak_busbw_gbps() < runs[("all_reduce", "node0")].peak_busbw_gbps()
    assert blame_links(list(runs.values()))[0].name == "node1"
