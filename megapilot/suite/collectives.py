"""The `collectives` stage: bus bandwidth of all-reduce, all-gather, reduce-scatter and all-to-all over a sweep of
message sizes, across every rank of the suite, before any training (config block `collectives`).

How it measures: nccl-tests / rccl-tests (`all_reduce_perf` & co.) when every node has them and they can span the
job (one node, or under SLURM's srun), else megapilot's torch.distributed probe (NCCL/RCCL on GPUs, gloo on CPUs),
launched through the suite's executor like every other job. Both print nccl-tests' table, read by
megapilot.logs.collectives.

What it gates: each collective's peak bus bandwidth over the sweep (nccl-tests doc/PERFORMANCE.md: busbw compares
with a link's speed) against `min_fraction` (default 0.7) of what the GPU catalog's links allow per GPU per
direction (`links_for`): NVLink/xGMI inside one scale-up domain; across nodes, a ring channel per NIC for the ring
collectives, each GPU's own NIC for all-to-all's off-node share, one NIC for a send/recv. `min_busbw_gbps` replaces
that with a fixed floor. Small messages are latency-bound: the peak comes from the large ones, and the report draws
the whole curve.

Which node: the probe (or nccl-tests under srun) also measures each node's own ranks and every pair of nodes. When
a collective of the whole job falls short, the node whose own groups measure below the others' (blame_links) fails
its `nodeK.collectives` row and goes into failing_nodes.txt; a node whose own group falls short of the NVLink/xGMI
figure fails on its own. With two nodes the one pair cannot say which end is slow; its row names the link.

A CPU suite's rows are recorded, not gated: there is no catalog figure for gloo over a host's memory, and "nodes"
sharing one host's cores measure its load, not a link (the figures are for the machinery; bench/collectives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from megapilot.diagnose.nodes import blame_links
from megapilot.execute.base import Executor, HangPolicy, JobResult, JobSpec, JobState, NodeOutput
from megapilot.launch.probe import NCCL_TESTS_BINARIES, ProbeSweep, render_probe_script
from megapilot.logs.collectives import CollectiveRun, parse_collectives
from megapilot.spec import GPUSpec
from megapilot.suite.config import CollectivesConfig, LoadedSuite
from megapilot.suite.render import launch_options
from megapilot.suite.results import Curve, JobSummary, MetricRow, StageResult, Verdict

STAGE = "collectives"
JOB_DIR = "collectives"
ROW_PREFIX = "collectives."
NODE_ROW = "collectives"  # `nodeK.collectives`: the node lists read the node from the prefix
# A node's own groups measuring this much below the others' is the one that slows the job: the same margin as the
# straggler gate's default (a node 15 % slow costs a synchronous job 15 %).
BLAME_RATIO = 1.15
WARMUP_CALLS = 5
DETECT_SCRIPT = 'hostname\nfor b in "$@"; do command -v "$b" >/dev/null 2>&1 && echo "have $b"; done\nexit 0\n'


@dataclass(frozen=True)
class Links:
    """What the catalog says a group of ranks should reach, and which links those are (None: no figure)."""

    busbw_gbps: float | None
    name: str


def links_for(gpu: GPUSpec | None, collective: str, *, nodes: int, ranks_per_node: int) -> Links:
    """The bus bandwidth the slowest link of this group allows, per the catalog's per-GPU, per-direction figures.

    Inside one scale-up domain (one node, or nodes of one NVL72 rack): the NVLink/xGMI bandwidth. Across domains:
    a ring (all-reduce, all-gather, reduce-scatter) leaves each node once per channel, and NCCL runs a channel per
    NIC, so the node's NICs together (ranks per node x the NIC figure) bound it, never above NVLink/xGMI; all-to-all
    sends every rank's off-node share through its own NIC: NIC x (n-1)/(n - ranks per node); a send/recv between
    two GPUs has one NIC."""
    if gpu is None:
        return Links(None, "CPU: gloo over host memory and loopback (no catalog figure)")
    fabric = "xGMI" if gpu.vendor == "AMD" else "NVLink"
    scaleup = Links(gpu.scaleup_bw_gbps, f"{fabric} ({gpu.name}: {gpu.scaleup_bw_gbps:g} GB/s per GPU per direction)")
    one_domain = nodes == 1 or (gpu.scaleup_domain_gpus > gpu.gpus_per_node and
                                nodes * gpu.gpus_per_node <= gpu.scaleup_domain_gpus)
    if one_domain:
        return scaleup
    nic = gpu.scaleout_bw_gbps
    total = nodes * ranks_per_node
    if collective == "sendrecv":
        return Links(nic, f"one NIC ({gpu.name}: {nic:g} GB/s per GPU per direction)")
    if collective == "alltoall":
        bound = nic * (total - 1) / (total - ranks_per_node)
        how = f"NIC {nic:g} GB/s x {total - 1}/{total - ranks_per_node} (each rank's off-node share)"
    else:
        bound = nic * ranks_per_node
        how = f"{ranks_per_node} NICs x {nic:g} GB/s per node (a ring channel per NIC)"
    if bound >= gpu.scaleup_bw_gbps:
        return scaleup
    return Links(bound, f"{how}, {gpu.name}")


@dataclass(frozen=True)
class Gate:
    """The floor one measurement is held to, or why it is only recorded."""

    floor_gbps: float | None
    says: str  # "70% of NVLink (...)", "min_busbw_gbps", "recorded: ..."
    gated: bool


def gate_for(settings: CollectivesConfig, links: Links, *, cpu: bool) -> Gate:
    if settings.min_busbw_gbps is not None:
        floor, says = settings.min_busbw_gbps, f"collectives.min_busbw_gbps {settings.min_busbw_gbps:g} GB/s"
    elif links.busbw_gbps is not None:
        floor = settings.min_fraction * links.busbw_gbps
        says = f"{settings.min_fraction:.0%} of {links.name}"
    else:
        floor, says = None, links.name
    gated = bool(settings.enforce) and not cpu and floor is not None
    return Gate(floor, says, gated)


# ---- judging what was measured ------------------------------------------------------------------------------
def judge(runs: Sequence[CollectiveRun], settings: CollectivesConfig, gpu: GPUSpec | None, *, nodes: int,
          ranks_per_node: int, source: str) -> list[MetricRow]:
    """Rows: one per collective of the whole job (`collectives.<op>`), one per node (`nodeK.collectives`) and one
    per pair of nodes (`collectives.link.nodeI-nodeJ`) when measured. `source` says what measured."""
    cpu = gpu is None
    whole = [run for run in runs if not run.scope]
    job_gates = {run.collective: gate_for(settings, links_for(gpu, run.collective, nodes=nodes,
                                                              ranks_per_node=ranks_per_node), cpu=cpu)
                 for run in whole}
    rows = [_row(f"{ROW_PREFIX}{run.collective}", run, job_gates[run.collective], source) for run in whole]
    node_gate = gate_for(settings, links_for(gpu, "all_reduce", nodes=1, ranks_per_node=ranks_per_node), cpu=cpu)
    pair_gate = gate_for(settings, links_for(gpu, "sendrecv", nodes=2, ranks_per_node=1), cpu=cpu)
    pairs = [run for run in runs if "-" in run.scope]
    own = {run.scope: run for run in runs if run.scope and "-" not in run.scope}
    short_job = [run.collective for run in whole if (floor := job_gates[run.collective].floor_gbps) is not None
                 and run.peak_busbw_gbps() < floor]
    job_gated = any(gate.gated for gate in job_gates.values())
    blamed = _blamed(runs) if short_job else {}
    if short_job and nodes == 1:  # the job ran on this node alone: what fell short is its own
        blamed = {"node0": 0.0}  # no ratio: named because it is the only node
    bisectable = bool(own) or len(pairs) > 1  # one pair alone cannot say which end is slow
    for index in range(nodes):
        row = _node_row(f"node{index}", own.get(f"node{index}"), node_gate, job_gated, blamed, short_job, bisectable)
        rows.append(row.model_copy(update={"node": index}))  # the node lists read the node from the row
    rows += [_row(f"{ROW_PREFIX}link.{run.scope}", run, pair_gate, source, link=True) for run in pairs]
    return rows


def _row(name: str, run: CollectiveRun, gate: Gate, source: str, *, link: bool = False) -> MetricRow:
    peak = max(run.samples, key=lambda s: s.busbw_gbps)
    where = f"{run.ranks} ranks on {run.nodes} node(s)" if not link else "first rank of each node, send/recv"
    text = f"peak {peak.busbw_gbps:.3f} GB/s bus bandwidth at {_size(peak.size_bytes)} ({where}; {source})"
    if gate.floor_gbps is None:
        return MetricRow(name=name, value=round(peak.busbw_gbps, 3), unit="GB/s", verdict=Verdict.RECORD,
                         enforced=False, reason=f"{text}; recorded: {gate.says}")
    short = peak.busbw_gbps < gate.floor_gbps
    margin = round((peak.busbw_gbps - gate.floor_gbps) / gate.floor_gbps * 100, 1)
    threshold = f">= {gate.floor_gbps:.3g}"
    if not gate.gated:
        return MetricRow(name=name, value=round(peak.busbw_gbps, 3), unit="GB/s", threshold=threshold,
                         verdict=Verdict.RECORD, enforced=False, margin_pct=margin,
                         reason=f"{text}; recorded, not gated (would {'FAIL' if short else 'PASS'}: {gate.says})")
    if link and short:
        text += "; the link between these nodes (or either end's NIC) is slow"
    return MetricRow(name=name, value=round(peak.busbw_gbps, 3), unit="GB/s", threshold=threshold, kind="min",
                     verdict=Verdict.FAIL if short else Verdict.PASS, margin_pct=margin,
                     reason=f"{text}; gate {gate.says}")


def _blamed(runs: Sequence[CollectiveRun]) -> dict[str, float]:
    """The nodes whose own groups and pairs measure BLAME_RATIO below the rest: node -> how many times slower."""
    return {s.name: s.ratio for s in blame_links(runs) if s.ratio > BLAME_RATIO}


def _node_row(node: str, own: CollectiveRun | None, gate: Gate, job_gated: bool, blamed: dict[str, float],
              short_job: list[str], bisectable: bool) -> MetricRow:
    """One node's verdict: its own ranks' all-reduce against the NVLink/xGMI floor, and, when the job's collectives
    fall short, whether the bisection points at it."""
    name = f"{node}.{NODE_ROW}"
    parts, failed, would_fail = [], False, False
    value = round(own.peak_busbw_gbps(), 3) if own is not None else None
    if own is not None and gate.floor_gbps is not None:
        short = own.peak_busbw_gbps() < gate.floor_gbps
        parts.append(f"its own {own.ranks} ranks: all-reduce {own.peak_busbw_gbps():.3f} GB/s vs >= "
                     f"{gate.floor_gbps:.3g} ({gate.says})")
        failed, would_fail = short and gate.gated, short
    elif own is not None:
        parts.append(f"its own {own.ranks} ranks: all-reduce {own.peak_busbw_gbps():.3f} GB/s")
    if node in blamed:
        how = "the job ran on it alone" if blamed[node] == 0.0 else \
            f"its groups measure {blamed[node]:.2f}x below the others' median"
        parts.insert(0, f"the bisection names {node}: {how} while the job's {', '.join(short_job)} fell short of "
                        "its gate")
        failed, would_fail = failed or job_gated, True
    elif short_job and not bisectable:
        parts.append("nothing to bisect with: no node has a group of its own (one rank each) and one pair cannot "
                     "say which end is slow")
    elif short_job:
        parts.append("not named by the bisection")
    if not parts:
        return MetricRow(name=name, verdict=Verdict.SKIPPED, enforced=False,
                         reason="one rank on the node and no other node: nothing of its own to measure")
    reason = "; ".join(parts)
    if failed:
        return MetricRow(name=name, value=value, unit="GB/s", verdict=Verdict.FAIL, reason=reason)
    if not (gate.gated or job_gated):
        note = f"recorded, not gated (would {'FAIL' if would_fail else 'PASS'})"
        return MetricRow(name=name, value=value, unit="GB/s", verdict=Verdict.RECORD, enforced=False,
                         reason=f"{note}: {reason}")
    return MetricRow(name=name, value=value, unit="GB/s", verdict=Verdict.PASS, reason=reason)


def curves(runs: Sequence[CollectiveRun]) -> list[Curve]:
    """The whole job's bus bandwidth against message size, one curve per collective (the report's chart)."""
    return [Curve(name=run.collective, unit="GB/s", points=[(s.size_bytes, s.busbw_gbps) for s in run.samples])
            for run in runs if not run.scope and run.samples]


def _size(size_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes} B"


# ---- running the stage ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeTools:
    """What each node has: its name and whether every nccl-tests binary the sweep needs is there."""

    names: list[str]
    nccl_tests: bool
    note: str


def detect_tools(suite: LoadedSuite, executor: Executor, ops: Sequence[str]) -> NodeTools:
    """Every node's hostname and nccl-tests binaries (`command -v`), through the executor."""
    binaries = [NCCL_TESTS_BINARIES[op] for op in ops] + (["sendrecv_perf"] if suite.nodes > 1 else [])
    outputs: list[NodeOutput] = executor.run_on_nodes(DETECT_SCRIPT, binaries, suite.nodes)
    names = [output.name or (output.text.splitlines() or [f"node{output.node}"])[0].strip() for output in outputs]
    have = [{line.split(" ", 1)[1] for line in o.text.splitlines() if line.startswith("have ")} for o in outputs]
    everywhere = bool(have) and all(set(binaries) <= found for found in have)
    if suite.device == "cpu":
        return NodeTools(names, False, "CPU suite: megapilot's torch.distributed probe (gloo)")
    if not everywhere:
        return NodeTools(names, False, "no nccl-tests / rccl-tests binaries on every node "
                                       f"({', '.join(binaries)}): megapilot's torch.distributed probe")
    if suite.nodes > 1 and suite.capabilities.launcher != "slurm":
        return NodeTools(names, False, "nccl-tests found, but across nodes it needs MPI's launcher (srun under "
                                       "SLURM): megapilot's torch.distributed probe")
    return NodeTools(names, True, "nccl-tests / rccl-tests binaries found on every node")


RunJob = Callable[[JobSpec], tuple[JobResult, "str | None"]]  # how the job ended, and the fatal line that stopped it


def run_collectives_stage(suite: LoadedSuite, executor: Executor, run_dir: Path, *, run_job: RunJob,
                          env: dict[str, str], master_port: int,
                          write_lists: Callable[[list[str], list[MetricRow]], object] | None = None) -> StageResult:
    """Detect the tools, run the probe job, judge it; `write_lists(names, rows)` adds the blamed nodes to
    failing_nodes.txt."""
    settings = suite.config.collectives
    if not settings.runs_on(suite.device):
        why = "collectives.enabled is false" if settings.enabled is False else \
            "CPU suite: off unless collectives.enabled is true (gloo figures say nothing about a machine)"
        return StageResult(name=STAGE, verdict=Verdict.SKIPPED, reason=why)
    tools = detect_tools(suite, executor, settings.ops)
    sweep = ProbeSweep(tuple(settings.ops), settings.min_bytes, settings.largest_bytes(suite.device),
                       settings.iters, WARMUP_CALLS)
    job_dir = run_dir / JOB_DIR
    options = launch_options(suite, suite.smoke, job_dir=job_dir, request=executor.launch_request(
        gpus=suite.device == "gpu"), master_port=master_port)
    script = render_probe_script(options, suite.nodes, suite.gpus_per_node, sweep, nccl_tests=tools.nccl_tests)
    block = suite.config.megapilot
    job = JobSpec(combo=JOB_DIR, run_dir=run_dir, script_text=script, env=env, nodes=suite.nodes,
                  gpus_per_node=suite.gpus_per_node, require_final_iteration=False,
                  hang=HangPolicy(startup_s=block.startup_timeout_s), timeout_s=block.job_timeout_s,
                  blocked_in_queue_s=block.blocked_queue_timeout_s)
    result, fatal = run_job(job)
    summary = JobSummary(executor=result.executor, job_id=result.job_id, state=result.state.value,
                         exit_code=result.exit_code, reason=result.reason, duration_s=round(result.duration_s, 3),
                         logs=[_relative(Path(p), run_dir) for p in result.logs])
    runs = read_runs([Path(p) for p in result.logs])
    source = "nccl-tests" if tools.nccl_tests else f"torch probe ({'gloo' if suite.device == 'cpu' else 'NCCL/RCCL'})"
    if result.state is not JobState.COMPLETED or not any(not run.scope for run in runs):
        why = f"stopped at a fatal line: {fatal}" if fatal else (result.reason or "no reason given")
        return StageResult(name=STAGE, verdict=Verdict.FAIL, jobs=[summary], curves=curves(runs),
                           reason=f"the probe job {result.state.value.lower()} without a full table ({why}); "
                                  f"{tools.note}")
    rows = judge(runs, settings, suite.gpu, nodes=suite.nodes, ranks_per_node=suite.gpus_per_node, source=source)
    if write_lists is not None:
        write_lists(tools.names, [r for r in rows if r.name.startswith("node")])
    failed = [r for r in rows if r.verdict is Verdict.FAIL]
    reason = _failures(failed) if failed else _summary(rows, tools.note)
    return StageResult(name=STAGE, verdict=Verdict.FAIL if failed else Verdict.PASS, reason=reason, checks=rows,
                       jobs=[summary], curves=curves(runs))


def _failures(failed: list[MetricRow]) -> str:
    """One line: what fell short of which gate, then the nodes named (each row's reason says why)."""
    short = [f"{r.name.removeprefix(ROW_PREFIX)} {r.value:g} GB/s ({r.threshold})" for r in failed
             if r.name.startswith(ROW_PREFIX) and r.value is not None]
    nodes = [r.name.split(".")[0] for r in failed if not r.name.startswith(ROW_PREFIX)]
    parts = [f"below the gate: {', '.join(short)}"] if short else []
    parts += [f"failing node(s): {', '.join(nodes)} (their rows say why; in failing_nodes.txt)"] if nodes else []
    return "; ".join(parts)


def _summary(rows: list[MetricRow], note: str) -> str:
    ops = [r for r in rows if r.name.startswith(ROW_PREFIX) and ".link." not in r.name]
    peaks = ", ".join(f"{r.name.removeprefix(ROW_PREFIX)} {r.value:g} GB/s" for r in ops if r.value is not None)
    recorded = all(r.verdict is Verdict.RECORD for r in ops)
    return f"{'recorded' if recorded else 'all above their gates'}: {peaks}; {note}"


def read_runs(logs: Sequence[Path]) -> list[CollectiveRun]:
    """Every table of every node's log (each node prints its own groups)."""
    runs: list[CollectiveRun] = []
    for path in logs:
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as lines:
                runs += parse_collectives(lines)
    return runs


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


__all__ = ["STAGE", "Gate", "Links", "curves", "detect_tools", "gate_for", "judge", "links_for", "read_runs",
           "run_collectives_stage"]
