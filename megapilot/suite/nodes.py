"""Run a small read-only command on every node of the suite, wherever the nodes are.

Used by preflight (and by container preparation): locally for the local executor, through the system
`ssh` client for the ssh executor (BatchMode, so a node that asks for a password fails at once instead
of hanging the suite), and through `srun --nodes N --ntasks-per-node 1` for SLURM, so the probe reads
the nodes the jobs will get, not the login node.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.diagnose.nodes import NodeLists
from megapilot.suite.preflight import PROBE_SCRIPT, NodeProbe, PreflightExpectations, judge, parse_probe
from megapilot.suite.results import MetricRow, Verdict

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite

PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeOutput:
    """What one node printed, or why it could not be reached."""

    node: int
    text: str
    error: str = ""
    name: str = ""  # what a scheduler or the host list calls the node (ssh: its host); else its hostname


def probe_nodes(suite: LoadedSuite, run_dir: Path) -> list[MetricRow]:
    """Probe every node, keep the raw readings in `<run_dir>/preflight/`, and judge them."""
    directories = [str(run_dir)]
    log_dir = getattr(suite.config.paths, "log_dir", None)
    if log_dir and suite.executor != "local":
        directories.append(str(log_dir))
    outputs = run_on_nodes(suite, PROBE_SCRIPT, directories)
    folder = run_dir / "preflight"
    folder.mkdir(exist_ok=True)
    probes: list[NodeProbe] = []
    for output in outputs:
        error_line = f"\nerror={output.error}\n" if output.error else ""
        (folder / f"node{output.node}.txt").write_text(output.text + error_line, encoding="utf-8")
        probe = parse_probe(output.node, output.text)
        probe.error = output.error
        probes.append(probe)
    rows = judge(probes, expectations(suite))
    write_node_lists(run_dir, [output.name or probe.host for output, probe in zip(outputs, probes, strict=True)],
                     rows)
    return rows


def write_node_lists(run_dir: Path, names: list[str], rows: list[MetricRow]) -> NodeLists:
    """`passing_nodes.txt` and `failing_nodes.txt` in the run directory, one node a line, for `srun --exclude`
    or the next run's host list. A row names its node by its `nodeK.` prefix (none with one node)."""
    failed: dict[int, list[str]] = {}
    for row in rows:
        if row.verdict is Verdict.FAIL:
            index, _, check = row.name.partition(".") if row.name.startswith("node") else ("node0", "", row.name)
            failed.setdefault(int(index[4:]) if index[4:].isdigit() else 0, []).append(f"{check}: {row.reason}")
    lists = NodeLists([name for k, name in enumerate(names) if k not in failed],
                      {name: failed[k] for k, name in enumerate(names) if k in failed})
    (run_dir / "passing_nodes.txt").write_text(lists.passing_text(), encoding="utf-8")
    (run_dir / "failing_nodes.txt").write_text(lists.failing_text(), encoding="utf-8")
    return lists


def expectations(suite: LoadedSuite) -> PreflightExpectations:
    block = suite.config.megapilot
    env = suite.config.container.env if suite.config.container else {}
    interface = env.get("NCCL_SOCKET_IFNAME")
    return PreflightExpectations(gpus_per_node=suite.gpus_per_node, device=suite.device,
                                 expected_nic_gbps=block.expected_nic_gbps,
                                 socket_interface=str(interface) if interface else None)


def run_on_nodes(suite: LoadedSuite, script: str, args: list[str]) -> list[NodeOutput]:
    """`bash -s ARGS <<< script` on every node; one NodeOutput per node, node 0 first."""
    if suite.executor == "ssh":
        from megapilot.suite.executors import ssh_nodes

        # ssh joins the remote words into one shell line: each argument is quoted to arrive as one word.
        return [_run(index, [*node.ssh_argv(), "bash", "-s", "--", *(shlex.quote(a) for a in args)], script,
                     name=node.host) for index, node in enumerate(ssh_nodes(suite))]
    if suite.executor == "slurm":
        return _run_srun(suite, script, args)
    return [_run(0, ["bash", "-s", "--", *args], script)]


def _run(node: int, argv: list[str], script: str, name: str = "") -> NodeOutput:
    try:
        done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except FileNotFoundError:
        return NodeOutput(node, "", f"{argv[0]} is not installed here", name)
    except subprocess.TimeoutExpired:
        return NodeOutput(node, "", f"no answer within {PROBE_TIMEOUT_S:g} s", name)
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return NodeOutput(node, done.stdout, error, name)


def _run_srun(suite: LoadedSuite, script: str, args: list[str]) -> list[NodeOutput]:
    """One task per node with `--label`, so each output line says which node printed it."""
    import os

    argv = ["srun", f"--nodes={suite.nodes}", "--ntasks-per-node=1", f"--ntasks={suite.nodes}", "--label",
            "--kill-on-bad-exit=0"]
    block = suite.config.megapilot
    if block.partition:
        argv.append(f"--partition={block.partition}")
    if block.account:
        argv.append(f"--account={block.account}")
    argv += ["bash", "-c", script, "probe", *args]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S * 5, check=False,
                              env=os.environ.copy())
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return [NodeOutput(n, "", f"srun: {exc}") for n in range(suite.nodes)]
    per_node: dict[int, list[str]] = {}
    for line in done.stdout.splitlines():
        label, sep, rest = line.partition(": ")
        if sep and label.strip().isdigit():
            per_node.setdefault(int(label), []).append(rest)
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"srun exit {done.returncode}"])[-1]
    return [NodeOutput(n, "\n".join(per_node.get(n, [])), error if n not in per_node else "")
            for n in range(suite.nodes)]


__all__ = ["NodeOutput", "expectations", "probe_nodes", "run_on_nodes", "write_node_lists"]
