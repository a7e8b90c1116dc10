"""What the multi-node executors (SLURM, SSH) share: following N per-node logs as one job.

Megatron prints its iteration lines from one rank only (the last one), so in a multi-node job the
progress shows up in whichever node's log holds that rank: node 0's log may never show a single
iteration. `NodeLogs` therefore follows every node's `out-node<N>/training.log` with its own
`LogTail`, `ProgressTracker` and `FailureClues`, and answers for the job with the node that got
furthest (the "leader"): its iteration, step time and hang deadline. Before any iteration line
every node's tracker has the same start-up deadline, so node 0 stands in.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from megapilot.execute.base import HangPolicy, JobState, JobStatus, NodeOutput
from megapilot.execute.failure import FailureClues
from megapilot.execute.progress import ProgressTracker
from megapilot.execute.rundir import node_log_path
from megapilot.execute.tail import LogTail

NODE_COMMAND_TIMEOUT_S = 60.0


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def run_node_script(node: int, argv: list[str], script: str, timeout_s: float = NODE_COMMAND_TIMEOUT_S) -> NodeOutput:
    """Run `argv` (a `bash -s` here, through ssh, ...) with `script` on its stdin; what it printed, or why not."""
    try:
        done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return NodeOutput(node, "", f"{argv[0]} is not installed here")
    except subprocess.TimeoutExpired:
        return NodeOutput(node, "", f"no answer within {timeout_s:g} s")
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return NodeOutput(node, done.stdout, error)


@dataclass
class NodeLog:
    """One node's log and what was read from it so far."""

    node: int
    tail: LogTail
    tracker: ProgressTracker
    clues: FailureClues = field(default_factory=FailureClues)

    def feed(self, lines: list[str], now_s: float) -> None:
        for line in lines:
            self.clues.feed(line, self.tracker.feed(line, now_s))


class NodeLogs:
    """The per-node logs of one job, read together."""

    def __init__(self, job_directory: Path, nodes: int, policy: HangPolicy, started_at_s: float,
                 train_iters: int | None):
        self.nodes = [
            NodeLog(node, LogTail(node_log_path(job_directory, node)),
                    ProgressTracker(policy, started_at_s, train_iters, source=f"out-node{node}/training.log"))
            for node in range(nodes)
        ]

    def read_new(self, now_s: float) -> dict[int, list[str]]:
        """Read every node's new complete lines; returns them by node, for callers that scan them too."""
        seen: dict[int, list[str]] = {}
        for node in self.nodes:
            lines = node.tail.read_new_lines()
            node.feed(lines, now_s)
            seen[node.node] = lines
        return seen

    def read_rest(self, now_s: float) -> dict[int, list[str]]:
        """After the job ended: everything left, final partial lines included."""
        seen: dict[int, list[str]] = {}
        for node in self.nodes:
            lines = node.tail.read_rest()
            node.feed(lines, now_s)
            seen[node.node] = lines
        return seen

    @property
    def leader(self) -> NodeLog:
        """The node whose log got furthest (node 0 before any iteration line)."""
        return max(self.nodes, key=lambda n: (n.tracker.iteration is not None, n.tracker.iteration or 0, -n.node))

    @property
    def iteration(self) -> int | None:
        return self.leader.tracker.iteration

    def reached_final_iteration(self) -> bool:
        return any(node.tracker.reached_final_iteration() for node in self.nodes)

    def hang_reason(self, now_s: float) -> str | None:
        return self.leader.tracker.hang_reason(now_s)

    def failure_reason(self, node: int | None, exit_code: int | None) -> str:
        """The best reason from one node's log (or, for None, the first node whose log has a clue)."""
        if node is not None:
            return self.nodes[node].clues.reason(exit_code)
        for candidate in self.nodes:
            clues = candidate.clues
            if clues.root_cause or clues.last_exception or clues.first_error or clues.first_failure:
                return f"node {candidate.node}: {clues.reason(exit_code)}"
        return self.nodes[0].clues.reason(exit_code)

    def clean_exit_verdict(self, require_final_iteration: bool) -> tuple[JobState, str | None]:
        """The state of a job whose every part exited 0: COMPLETED only with the final iteration logged."""
        tracker = self.leader.tracker
        if not require_final_iteration or self.reached_final_iteration():
            return JobState.COMPLETED, None
        if tracker.iteration is None:
            return JobState.FAILED, "exited with code 0 but printed no iteration line"
        return JobState.FAILED, (f"exited with code 0 at iteration {tracker.iteration}/{tracker.train_iters}, "
                                 f"before the final iteration")

    def status(self, state: JobState, now_s: float, started_at_s: float, *, exit_code: int | None = None,
               reason: str | None = None) -> JobStatus:
        tracker = self.leader.tracker
        step_s = tracker.step_time_s
        return JobStatus(
            state=state, exit_code=exit_code, reason=reason, iteration=tracker.iteration,
            train_iters=tracker.train_iters, step_time_s=round(step_s, 4) if step_s is not None else None,
            loss=tracker.loss, elapsed_s=round(max(0.0, now_s - started_at_s), 3),
        )

    def paths(self) -> list[Path]:
        return [node.tail.path for node in self.nodes]
