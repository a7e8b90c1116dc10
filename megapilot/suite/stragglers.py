"""The straggler gate of a combo: which node (and rank) computed slower than its peers, from what the job printed.

The lines are records of the log parser (`ParsedLog.rank_times`, `.straggler_reports`), read with the rest of each
node's log by the measure step. Sources, in order: the embedded trainer's per-rank compute time before the gradient
collectives (every log interval, on the last rank), else Megatron-LM's `--log-straggler` reports
(megapilot.logs.stragglers). Each node gets a row `straggler.nodeK`: its compute time over the median of the other
nodes' (1.00 = as fast), gated at `straggler.max_ratio` (default 1.15: a node 15 % slow costs a synchronous job
15 %). Ranks are named in the rows' reasons and recorded, not gated: ranks of one node share its CPU or GPU clocks, so
a rank apart from its node's others is a data or placement question, not a bad machine. A CPU run's rows are
recorded, not gated: its ranks share cores with the host's every other process (and, for "nodes" on one host, with
each other), so their compute times say more about the host's load than about a machine.
"""

from __future__ import annotations

from pathlib import PurePath

from megapilot.diagnose.nodes import StragglerVerdict, stragglers_from_rank_times, stragglers_from_reports
from megapilot.logs.stragglers import StragglerLines
from megapilot.suite.results import MetricRow, Verdict

ROW_PREFIX = "straggler."


def straggler_rows(lines: StragglerLines, *, max_ratio: float, enforce: bool, ranks_per_node: int | None = None,
                   cpu: bool = False) -> list[MetricRow]:
    """One row per node (a SKIPPED row when no log holds per-rank timings)."""
    verdict = read_verdict(lines, max_ratio=max_ratio, ranks_per_node=ranks_per_node)
    if verdict is None:
        return [MetricRow(name=f"{ROW_PREFIX}max_ratio", verdict=Verdict.SKIPPED, enforced=False,
                          reason="no per-rank timing in the logs (the embedded trainer prints it each log "
                                 "interval; Megatron-LM with --log-straggler)")]
    slow_ranks = ", ".join(f"{r.name} {r.ratio:.2f}x" for r in verdict.slow_ranks[:4])
    rows = []
    for node in sorted(verdict.nodes, key=lambda s: s.name):
        failed = node.ratio > max_ratio
        peers = "one node: no peers to compare with" if len(verdict.nodes) == 1 else \
            f"{node.ratio:.2f}x the other nodes' median compute time ({node.median_ms:.1f} ms)"
        reason = f"{peers}; from {verdict.source}" + (f"; slow ranks: {slow_ranks}" if slow_ranks else "")
        if node.evidence:
            reason += f" | {_short(node.evidence[0].file)}:{node.evidence[0].line}"
        gated = enforce and not cpu
        if cpu and enforce:
            reason = f"CPU run: recorded, not gated (would {'FAIL' if failed else 'PASS'}); " + reason
        status = (Verdict.FAIL if failed else Verdict.PASS) if gated else Verdict.RECORD
        rows.append(MetricRow(name=f"{ROW_PREFIX}{node.name}", value=round(node.ratio, 3), unit="x",
                              threshold=f"<= {max_ratio:g}", verdict=status, reason=reason, enforced=gated,
                              node=node.index,
                              margin_pct=round((max_ratio - node.ratio) / max_ratio * 100, 1)))
    return rows


def read_verdict(lines: StragglerLines, *, max_ratio: float,
                 ranks_per_node: int | None = None) -> StragglerVerdict | None:
    return (stragglers_from_rank_times(lines.rank_times, max_ratio)
            or stragglers_from_reports(lines.reports, ranks_per_node=ranks_per_node, max_ratio=max_ratio))


def _short(file: str) -> str:
    """A node log named by its folder and name (`out-node1/training.log`), as the run directory shows it."""
    path = PurePath(file)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name
