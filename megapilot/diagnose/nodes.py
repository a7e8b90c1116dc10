"""Which node is bad: stragglers, node health and collective bandwidth judged per node, and the node lists a
scheduler takes (`passing_nodes.txt`, `failing_nodes.txt` for `srun --exclude`).

Every judgement compares a node with its peers, not with an absolute figure, where it can: a node is slow when its
ranks' compute time stands above the median of the *other* nodes' (leave-one-out, so that with two nodes the slow
one is measured against the healthy one instead of against a median it pulls up itself).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from megapilot.diagnose.rules import XID_MEANING
from megapilot.logs.collectives import CollectiveRun
from megapilot.logs.health import GpuState, HcaPort, KernelFault
from megapilot.logs.records import Evidence
from megapilot.logs.stragglers import RankTimes, StragglerReport

# A rank or node whose compute time is more than this much above its peers' median is a straggler. Healthy ranks
# of one job differ by a few percent (data-dependent MoE routing, OS noise); a node 15 % slow costs the whole job
# 15 % in synchronous training, the loss a cluster acceptance run (DGX Cloud benchmarking: >= 95 % of baseline)
# does not accept.
DEFAULT_MAX_STRAGGLER_RATIO = 1.15
# A GPU above this is throttling or about to (H100/MI300X slow down from about 87-90 C).
DEFAULT_MAX_GPU_TEMPERATURE_C = 85.0

Status = Literal["PASS", "FAIL", "SKIPPED"]


@dataclass(frozen=True)
class Slowdown:
    """How much slower one rank or node is than the median of its peers (1.0 = as fast)."""

    name: str  # "node1", "rank3"
    ratio: float
    median_ms: float
    evidence: tuple[Evidence, ...] = ()
    index: int | None = None  # the node's (or rank's) number; None where only a name is known


@dataclass(frozen=True)
class StragglerVerdict:
    source: str  # what the timings came from, said in the report
    max_ratio: float
    nodes: tuple[Slowdown, ...]  # slowest first
    ranks: tuple[Slowdown, ...]  # slowest first

    @property
    def slow_nodes(self) -> list[Slowdown]:
        return [n for n in self.nodes if n.ratio > self.max_ratio]

    @property
    def slow_ranks(self) -> list[Slowdown]:
        return [r for r in self.ranks if r.ratio > self.max_ratio]

    @property
    def worst_ratio(self) -> float:
        return max((s.ratio for s in (*self.nodes, *self.ranks)), default=1.0)


def _leave_one_out(values: Mapping[str, float]) -> dict[str, float]:
    """Each entry's value over the median of the others' (a lone entry has no peers: 1.0)."""
    ratios = {}
    for name, value in values.items():
        others = [v for other, v in values.items() if other != name]
        reference = statistics.median(others) if others else value
        ratios[name] = value / reference if reference > 0 else 1.0
    return ratios


def _steady(series: Sequence[float]) -> list[float]:
    """Drop the first interval when there are three or more: it holds the warm-up (compilation, allocator, first
    data), which is the rule the step-time summary uses too."""
    return list(series[1:]) if len(series) >= 3 else list(series)


def stragglers_from_rank_times(lines: Sequence[RankTimes],
                               max_ratio: float = DEFAULT_MAX_STRAGGLER_RATIO) -> StragglerVerdict | None:
    """Slowdowns from per-rank compute times before the collectives (the embedded trainer's line)."""
    width = max((len(line.compute_ms) for line in lines), default=0)
    lines = [line for line in lines if len(line.compute_ms) == width]
    if width < 2 or not lines:
        return None
    node_of_rank = lines[-1].node_of_rank
    per_rank = {f"rank{r}": statistics.median(_steady([line.compute_ms[r] for line in lines])) for r in range(width)}
    per_node: dict[str, list[float]] = {}
    for rank in range(width):
        per_node.setdefault(f"node{node_of_rank[rank]}", []).append(per_rank[f"rank{rank}"])
    node_ms = {node: statistics.median(times) for node, times in per_node.items()}
    evidence = (lines[-1].evidence,)
    rank_ratio, node_ratio = _leave_one_out(per_rank), _leave_one_out(node_ms)
    ranks = tuple(sorted((Slowdown(f"rank{r}", rank_ratio[f"rank{r}"], per_rank[f"rank{r}"], evidence, r)
                          for r in range(width)), key=lambda s: -s.ratio))
    nodes = tuple(sorted((Slowdown(f"node{n}", node_ratio[f"node{n}"], node_ms[f"node{n}"], evidence, n)
                          for n in sorted(set(node_of_rank))), key=lambda s: -s.ratio))
    return StragglerVerdict("per-rank compute time before the gradient collectives", max_ratio, nodes, ranks)


def stragglers_from_reports(reports: Sequence[StragglerReport], ranks_per_node: int | None = None,
                            max_ratio: float = DEFAULT_MAX_STRAGGLER_RATIO) -> StragglerVerdict | None:
    """Slowdowns from Megatron's `--log-straggler` reports: they name only the extreme ranks, so the verdict is
    about the rank that is slowest most often (and its node, when the ranks per node are known), by the median of
    its max/min round-trip ratio over the reports where it was the slowest."""
    if not reports:
        return None
    counts = Counter(report.slowest_rank for report in reports)
    rank, _ = counts.most_common(1)[0]
    own = [r for r in reports if r.slowest_rank == rank]
    ratio = statistics.median(r.slowest_ms / r.fastest_ms for r in own if r.fastest_ms > 0) if own else 1.0
    median_ms = statistics.median(r.slowest_ms for r in own)
    evidence = tuple(r.evidence for r in own[-3:])
    slow = Slowdown(f"rank{rank}", ratio, median_ms, evidence, rank)
    nodes: tuple[Slowdown, ...] = ()
    if ranks_per_node:
        nodes = (Slowdown(f"node{rank // ranks_per_node}", ratio, median_ms, evidence, rank // ranks_per_node),)
    return StragglerVerdict("Megatron --log-straggler reports (slowest vs fastest rank)", max_ratio, nodes, (slow,))


def stragglers_from_node_steps(step_ms_by_node: Mapping[str, Sequence[float]],
                               evidence_by_node: Mapping[str, Evidence] | None = None,
                               max_ratio: float = DEFAULT_MAX_STRAGGLER_RATIO) -> StragglerVerdict | None:
    """Slowdowns from each node's own log's step times (jobs that run one process group per node, or logs of
    separate single-node jobs); with synchronous data parallelism across nodes these are equal and say nothing."""
    medians = {node: statistics.median(_steady(steps)) for node, steps in step_ms_by_node.items() if steps}
    if len(medians) < 2:
        return None
    ratios = _leave_one_out(medians)
    evidence = evidence_by_node or {}
    nodes = tuple(sorted((Slowdown(node, ratios[node], medians[node],
                                   (evidence[node],) if node in evidence else ()) for node in medians),
                         key=lambda s: -s.ratio))
    return StragglerVerdict("each node's own step times", max_ratio, nodes, ())


# ----------------------------------------------------------------------------- node health
@dataclass(frozen=True)
class HealthCheck:
    """One check on one node. SKIPPED says why it could not run (the tool is missing, no GPU)."""

    node: str
    check: str  # "gpus", "kernel", "versions", "nic", "straggler", "collectives"
    status: Status
    reason: str
    evidence: tuple[Evidence, ...] = ()


def check_gpus(node: str, gpus: Sequence[GpuState] | None, expected_count: int,
               max_temperature_c: float = DEFAULT_MAX_GPU_TEMPERATURE_C) -> HealthCheck:
    """The GPUs a node's query tool lists: all there, none hot, no uncorrected ECC errors."""
    if gpus is None:
        return HealthCheck(node, "gpus", "SKIPPED", "no GPU query tool on the node (nvidia-smi, amd-smi)")
    problems = []
    if len(gpus) != expected_count:
        problems.append(f"{len(gpus)} GPU(s) visible, {expected_count} expected")
    problems += [f"GPU {g.index} at {g.temperature_c:.0f} C (limit {max_temperature_c:.0f} C)" for g in gpus
                 if g.temperature_c is not None and g.temperature_c > max_temperature_c]
    problems += [f"GPU {g.index} has {g.uncorrected_ecc} uncorrected ECC error(s)" for g in gpus
                 if g.uncorrected_ecc]
    if problems:
        return HealthCheck(node, "gpus", "FAIL", "; ".join(problems))
    return HealthCheck(node, "gpus", "PASS", f"{len(gpus)} x {gpus[0].name if gpus else 'GPU'}")


def check_kernel(node: str, faults: Sequence[KernelFault] | None) -> HealthCheck:
    """The node's kernel log: any GPU hardware fault fails the node, but for Xid codes that the application
    itself causes (a kernel's illegal access), which do not condemn the machine."""
    if faults is None:
        return HealthCheck(node, "kernel", "SKIPPED", "the kernel log could not be read (dmesg needs privileges)")
    condemning = [f for f in faults if f.xid is None or XID_MEANING.get(f.xid, ("", "hardware"))[1] != "application"]
    if not condemning:
        note = f" ({len(faults)} application-caused Xid line(s) ignored)" if faults else ""
        return HealthCheck(node, "kernel", "PASS", "no GPU hardware fault in the kernel log" + note)
    named = list(dict.fromkeys(
        f"Xid {f.xid} ({XID_MEANING[f.xid][0]})" if f.xid in XID_MEANING else (f"Xid {f.xid}" if f.xid else f.signature)
        for f in condemning))
    return HealthCheck(node, "kernel", "FAIL", "kernel log reports " + ", ".join(named),
                       tuple(f.evidence for f in condemning[:3]))


def check_versions(versions_by_node: Mapping[str, Mapping[str, str]]) -> list[HealthCheck]:
    """Driver, CUDA/ROCm, torch and container versions the same on every node: a node that differs from the
    majority fails (with one node, or a tie, nothing to compare against: PASS)."""
    keys = sorted({key for versions in versions_by_node.values() for key in versions})
    majority = {}
    for key in keys:
        counts = Counter(v[key] for v in versions_by_node.values() if key in v)
        (value, count), *rest = counts.most_common()
        majority[key] = value if not rest or count > rest[0][1] else None
    checks = []
    for node, versions in versions_by_node.items():
        odd = [f"{key} {versions[key]} (others {majority[key]})" for key in keys
               if key in versions and majority[key] is not None and versions[key] != majority[key]]
        checks.append(HealthCheck(node, "versions", "FAIL" if odd else "PASS",
                                  "differs: " + "; ".join(odd) if odd else "same as the other nodes"))
    return checks


def check_nic(node: str, ports: Sequence[HcaPort] | None, grown_counters: Mapping[str, int] | None,
              expected_rate_gbps: float | None = None) -> HealthCheck:
    """Every HCA port Active at its rate, and no NIC fault counter grew during the run."""
    if ports is None and grown_counters is None:
        return HealthCheck(node, "nic", "SKIPPED", "no ibstat and no NIC counters on the node")
    problems = [f"{p.device} port {p.port} is {p.state}" for p in ports or () if p.state != "Active"]
    if expected_rate_gbps:
        problems += [f"{p.device} port {p.port} at {p.rate_gbps:g} Gb/s, {expected_rate_gbps:g} expected"
                     for p in ports or () if p.rate_gbps is not None and p.rate_gbps < expected_rate_gbps]
    problems += [f"{name} +{delta}" for name, delta in (grown_counters or {}).items()]
    if problems:
        return HealthCheck(node, "nic", "FAIL", "; ".join(problems))
    return HealthCheck(node, "nic", "PASS", f"{len(ports or ())} port(s) Active, no error counter grew")


def check_stragglers(verdict: StragglerVerdict, nodes: Iterable[str]) -> list[HealthCheck]:
    """A node slower than its peers by more than the verdict's ratio fails its own row only."""
    ratio_of = {s.name: s for s in verdict.nodes}
    checks = []
    for node in nodes:
        slow = ratio_of.get(node)
        if slow is None:
            checks.append(HealthCheck(node, "straggler", "SKIPPED", f"no timing of {node} in {verdict.source}"))
        elif slow.ratio > verdict.max_ratio:
            checks.append(HealthCheck(node, "straggler", "FAIL",
                                      f"{slow.ratio:.2f}x the other nodes' median ({slow.median_ms:.1f} ms; "
                                      f"limit {verdict.max_ratio:.2f}x, from {verdict.source})", slow.evidence))
        else:
            checks.append(HealthCheck(node, "straggler", "PASS", f"{slow.ratio:.2f}x the other nodes' median"))
    return checks


# ----------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class CollectiveCheck:
    """One collective over all ranks against what its links should give."""

    collective: str
    measured_busbw_gbps: float | None
    expected_busbw_gbps: float | None
    min_fraction: float
    status: Status
    reason: str


def check_collective(run: CollectiveRun, expected_busbw_gbps: float | None, min_fraction: float,
                     min_size_bytes: int) -> CollectiveCheck:
    """The large-message bus bandwidth against `min_fraction` of the expected (SKIPPED when nothing is expected,
    e.g. gloo on CPU, which is never compared with a GPU link's ceiling)."""
    measured = run.large_message_busbw_gbps(min_size_bytes)
    if measured is None:
        return CollectiveCheck(run.collective, None, expected_busbw_gbps, min_fraction, "SKIPPED",
                               f"no message of {min_size_bytes} bytes or more in the sweep")
    if not expected_busbw_gbps:
        return CollectiveCheck(run.collective, measured, None, min_fraction, "PASS",
                               f"{measured:.3f} GB/s bus bandwidth (recorded; no expected figure for these links)")
    ok = measured >= min_fraction * expected_busbw_gbps
    return CollectiveCheck(run.collective, measured, expected_busbw_gbps, min_fraction, "PASS" if ok else "FAIL",
                           f"{measured:.1f} GB/s vs >= {min_fraction * expected_busbw_gbps:.1f} GB/s "
                           f"({min_fraction:.0%} of {expected_busbw_gbps:.1f})")


def blame_links(runs: Sequence[CollectiveRun]) -> list[Slowdown]:
    """Which node makes collectives slow, from the probe's per-node groups and node pairs (slowest first).

    Like is compared with like: a node's own group with the other nodes' groups (NVLink/xGMI inside a node), and the
    node pairs it is in with the pairs it is not in (the NICs and the fabric between nodes); its slowdown is the
    larger of the two ratios (the others' median bandwidth over its own). With two nodes the one pair says nothing
    about which end is slow; each node's own group does."""
    per_node = {run.scope: run.peak_busbw_gbps() for run in runs if run.scope and "-" not in run.scope}
    pairs = {tuple(run.scope.split("-")): run.peak_busbw_gbps() for run in runs if "-" in run.scope}
    nodes = sorted(set(per_node) | {node for pair in pairs for node in pair})
    blamed = []
    for node in nodes:
        ratios = []
        others = [bw for other, bw in per_node.items() if other != node]
        if node in per_node and others and per_node[node] > 0:
            ratios.append(statistics.median(others) / per_node[node])
        own_pairs = [bw for pair, bw in pairs.items() if node in pair]
        other_pairs = [bw for pair, bw in pairs.items() if node not in pair]
        if own_pairs and other_pairs and statistics.median(own_pairs) > 0:
            ratios.append(statistics.median(other_pairs) / statistics.median(own_pairs))
        if ratios:
            blamed.append(Slowdown(node, max(ratios), 0.0))
    return sorted(blamed, key=lambda s: -s.ratio)


# ----------------------------------------------------------------------------- node lists
@dataclass
class NodeLists:
    """`passing_nodes.txt` and `failing_nodes.txt`: each failing node with the checks it failed."""

    passing: list[str] = field(default_factory=list)
    failing: dict[str, list[str]] = field(default_factory=dict)

    def failing_text(self) -> str:
        """One node a line, nothing else: what `srun --exclude=$(paste -sd, failing_nodes.txt)` takes (the reasons
        are the report's)."""
        return "".join(f"{node}\n" for node in self.failing)

    def passing_text(self) -> str:
        return "".join(f"{node}\n" for node in self.passing)


def node_lists(nodes: Sequence[str], checks: Iterable[HealthCheck]) -> NodeLists:
    """A node fails when any of its own checks fails; SKIPPED checks neither pass nor fail it."""
    failed: dict[str, list[str]] = {}
    for check in checks:
        if check.status == "FAIL":
            failed.setdefault(check.node, []).append(f"{check.check}: {check.reason}")
    return NodeLists([n for n in nodes if n not in failed], {n: failed[n] for n in nodes if n in failed})
