"""Run a small read-only command on every node of the suite, wherever the nodes are.

Used by preflight (and by container preparation). The executor runs it where its jobs run (`run_on_nodes`
of the protocol): here, over ssh (BatchMode, so a node that asks for a password fails at once), or with
`srun --nodes N --ntasks-per-node 1`, so the probe reads the nodes the jobs will get, not the login node.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.diagnose.nodes import NodeLists
from megapilot.execute.base import Executor, NodeOutput
from megapilot.suite.nic_counters import counter_rows, take_snapshot
from megapilot.suite.preflight import PROBE_SCRIPT, NodeProbe, PreflightExpectations, judge, parse_probe
from megapilot.suite.results import ComboResult, MetricRow, Verdict
from megapilot.suite.stragglers import ROW_PREFIX as STRAGGLER_PREFIX

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite

def probe_nodes(suite: LoadedSuite, executor: Executor, run_dir: Path) -> list[MetricRow]:
    """Probe every node, keep the raw readings in `<run_dir>/preflight/`, and judge them."""
    directories = [str(run_dir)]
    log_dir = getattr(suite.config.paths, "log_dir", None)
    if log_dir and not suite.capabilities.runs_here:
        directories.append(str(log_dir))
    take_snapshot(suite, executor, run_dir, "before")  # NIC counters, compared after the last combo
    # the probe sees each node with the environment the cluster file gives its jobs: a tool on that PATH (a
    # cluster's module, a site's bin directory) is the one it runs
    outputs = run_on_nodes(suite, executor, env_exports(node_env(suite)) + PROBE_SCRIPT, directories)
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
    or the next run's host list (`suite run --exclude-failing`). Each failed row names its node in `row.node`; a
    failed row about no node (None) fails none."""
    failed: dict[int, list[str]] = {}
    for row in rows:
        if row.verdict is Verdict.FAIL and row.node is not None:
            check = row.name.removeprefix(f"node{row.node}.")
            failed.setdefault(row.node, []).append(f"{check}: {row.reason}")
    lists = NodeLists([name for k, name in enumerate(names) if k not in failed],
                      {name: failed[k] for k, name in enumerate(names) if k in failed})
    (run_dir / "passing_nodes.txt").write_text(lists.passing_text(), encoding="utf-8")
    (run_dir / "failing_nodes.txt").write_text(lists.failing_text(), encoding="utf-8")
    (run_dir / "failing_nodes.json").write_text(json.dumps(lists.failing, indent=1) + "\n", encoding="utf-8")
    return lists


def close_node_lists(suite: LoadedSuite, executor: Executor, run_dir: Path,
                     combos: list[ComboResult]) -> list[MetricRow]:
    """After the last combo: each node's NIC counters against the preflight's snapshot (the rows returned), and the
    node lists again with every node those counters or a gated straggler row failed."""
    names = take_snapshot(suite, executor, run_dir, "after")
    rows = counter_rows(run_dir, suite.nodes, cpu=suite.device == "cpu")
    stragglers = [r for combo in combos for r in combo.metrics
                  if r.name.startswith(STRAGGLER_PREFIX) and r.verdict is Verdict.FAIL and r.node is not None]
    if any(r.verdict is Verdict.FAIL for r in rows) or stragglers:
        add_failing(run_dir, names, rows + [r.model_copy(update={"name": f"node{r.node}.{r.name}"})
                                            for r in stragglers])
    return rows


def add_failing(run_dir: Path, names: list[str], rows: list[MetricRow]) -> NodeLists:
    """The node lists again, with the nodes that `rows` (a later check: the NIC counters after the run) failed
    added to those the preflight failed."""
    reasons_file = run_dir / "failing_nodes.json"
    earlier: dict[str, list[str]] = {}
    if reasons_file.is_file():
        earlier = {str(k): list(v) for k, v in json.loads(reasons_file.read_text(encoding="utf-8")).items()}
    earlier_rows = [MetricRow(name=f"node{k}.{check}", node=k, verdict=Verdict.FAIL, reason=reason)
                    for k, name in enumerate(names) for check, _, reason in
                    (why.partition(": ") for why in earlier.pop(name, []))]
    lists = write_node_lists(run_dir, names, earlier_rows + rows)
    for name, why in earlier.items():  # a node failed earlier under a name not seen now: kept failing
        lists.failing[name] = why
    if earlier:
        (run_dir / "failing_nodes.txt").write_text(lists.failing_text(), encoding="utf-8")
        (run_dir / "failing_nodes.json").write_text(json.dumps(lists.failing, indent=1) + "\n", encoding="utf-8")
    return lists


def node_env(suite: LoadedSuite) -> dict[str, str]:
    """What the cluster file sets on its nodes for every job (env_vars); the jobs add the config's container.env
    (for inside a container, not the node's own tools) and their secrets."""
    return dict(suite.cluster.env_vars) if suite.cluster else {}


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_exports(env: dict[str, str]) -> str:
    """`export NAME='value'` lines ahead of a node script (a name no shell takes is left out: the job refuses it)."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items()
                   if _SHELL_NAME.fullmatch(name))


def expectations(suite: LoadedSuite) -> PreflightExpectations:
    block = suite.config.megapilot
    env = suite.config.container.env if suite.config.container else {}
    interface = env.get("NCCL_SOCKET_IFNAME")
    return PreflightExpectations(gpus_per_node=suite.gpus_per_node, device=suite.device,
                                 expected_nic_gbps=block.expected_nic_gbps,
                                 socket_interface=str(interface) if interface else None)


def run_on_nodes(suite: LoadedSuite, executor: Executor, script: str, args: list[str]) -> list[NodeOutput]:
    """`bash -s ARGS <<< script` on every node of the suite, through its executor; node 0 first."""
    return executor.run_on_nodes(script, args, suite.nodes)


__all__ = ["NodeOutput", "add_failing", "close_node_lists", "env_exports", "expectations", "node_env", "probe_nodes",
           "run_on_nodes", "write_node_lists"]
