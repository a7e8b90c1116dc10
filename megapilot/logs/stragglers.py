"""Per-rank timings that name a straggler: the embedded trainer's per-rank compute line and Megatron-LM's
`--log-straggler` report (`StragglerDetector.report` in megatron/core/utils.py).

In synchronous data parallelism every rank's *step* lasts as long as the slowest rank's, so step times cannot name
the slow rank; the time a rank spends before it waits in a collective can. Both sources give it:

- the embedded trainer, each log interval (`megapilot.trainer.logfmt.rank_compute_line`):
  ` compute time before collectives per rank (ms) [rank@node]: 0@0=12.31 1@0=12.50 2@1=20.11 3@1=19.98`
- Megatron-LM with `--log-straggler`, on rank 0, each log interval:
  `[2026-12-05 10:00:00] | MnRtt/Rnk: 10.50ms/3 | MxRtt/Rnk: 13.20ms/7 | ... | MnEtpt/Rnk: 380.12TF/7 | MxEtpt/Rnk:
  402.55TF/3` — the fastest and slowest rank's round-trip time of their GEMMs, and with `--straggler-minmax-count N`
  `^^^^ Bottom N Ranks with lowest  Etpt(TF): 380.12TF/7, ...`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from megapilot.logs.records import Evidence


@dataclass(frozen=True, slots=True)
class RankTimes:
    """One interval's per-rank compute times (ms) from one line; `node_of_rank` is torchrun's node rank."""

    compute_ms: tuple[float, ...]
    node_of_rank: tuple[int, ...]
    evidence: Evidence


@dataclass(frozen=True, slots=True)
class StragglerReport:
    """One `--log-straggler` report: the extreme ranks of Megatron's StragglerDetector."""

    fastest_rank: int
    fastest_ms: float
    slowest_rank: int
    slowest_ms: float
    lowest_throughput_ranks: tuple[int, ...]  # `Bottom N` line, else the MnEtpt rank alone
    evidence: Evidence


@dataclass
class StragglerLines:
    """What one log's lines say about ranks."""

    rank_times: list[RankTimes]
    reports: list[StragglerReport]


_RANK_TIMES = re.compile(r"compute time before collectives per rank \(ms\) \[rank@node\]:\s*(.*)$")
_CELL = re.compile(r"(\d+)@(\d+)=([\d.]+)")
_RTT = re.compile(r"MnRtt/Rnk:\s*([\d.]+)ms/(\d+)\s*\|\s*MxRtt/Rnk:\s*([\d.]+)ms/(\d+)")
_MIN_ETPT = re.compile(r"MnEtpt/Rnk:\s*[\d.]+TF/(\d+)")
_BOTTOM = re.compile(r"\^\^\^\^ Bottom\s+\d+ Ranks with lowest\s+Etpt\(TF\):\s*(.*)$")
_ETPT_RANK = re.compile(r"[\d.]+TF/(\d+)")


def read_straggler_lines(file: str, lines: Iterable[str]) -> StragglerLines:
    """Every per-rank line in `lines` (a `Bottom N` line amends the report before it)."""
    found = StragglerLines([], [])
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\n")
        if "[rank@node]" in text and (times := _RANK_TIMES.search(text)):
            cells = sorted((int(r), int(n), float(ms)) for r, n, ms in _CELL.findall(times.group(1)))
            if cells:
                found.rank_times.append(RankTimes(tuple(c[2] for c in cells), tuple(c[1] for c in cells),
                                                  Evidence(file, number, text.strip())))
        elif "MxRtt/Rnk" in text and (rtt := _RTT.search(text)):
            low = _MIN_ETPT.search(text)
            found.reports.append(StragglerReport(
                fastest_rank=int(rtt.group(2)), fastest_ms=float(rtt.group(1)), slowest_rank=int(rtt.group(4)),
                slowest_ms=float(rtt.group(3)), lowest_throughput_ranks=(int(low.group(1)),) if low else (),
                evidence=Evidence(file, number, text.strip())))
        elif "Bottom" in text and found.reports and (bottom := _BOTTOM.search(text)):
            last = found.reports[-1]
            ranks = tuple(int(r) for r in _ETPT_RANK.findall(bottom.group(1)))
            found.reports[-1] = StragglerReport(last.fastest_rank, last.fastest_ms, last.slowest_rank,
                                                last.slowest_ms, ranks, last.evidence)
    return found
