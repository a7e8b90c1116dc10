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
from dataclasses import dataclass, replace

from megapilot.logs.records import Evidence, RankTimes, StragglerReport

# Lowercase substrings of the lines read here (the log parser's needles: `megapilot.logs.parser.RECORD_NEEDLES`).
NEEDLES: tuple[str, ...] = ("[rank@node]", "mxrtt/rnk", "^^^^ bottom")


@dataclass
class StragglerLines:
    """What one log's lines say about ranks (the log parser collects the same records into `ParsedLog`)."""

    rank_times: list[RankTimes]
    reports: list[StragglerReport]


_RANK_TIMES = re.compile(r"compute time before collectives per rank \(ms\) \[rank@node\]:\s*(.*)$")
_CELL = re.compile(r"(\d+)@(\d+)=([\d.]+)")
_RTT = re.compile(r"MnRtt/Rnk:\s*([\d.]+)ms/(\d+)\s*\|\s*MxRtt/Rnk:\s*([\d.]+)ms/(\d+)")
_MIN_ETPT = re.compile(r"MnEtpt/Rnk:\s*[\d.]+TF/(\d+)")
_BOTTOM = re.compile(r"\^\^\^\^ Bottom\s+\d+ Ranks with lowest\s+Etpt\(TF\):\s*(.*)$")
_ETPT_RANK = re.compile(r"[\d.]+TF/(\d+)")


def rank_times_line(file: str, line_no: int, text: str) -> RankTimes | None:
    """The embedded trainer's per-rank compute line, else None."""
    times = _RANK_TIMES.search(text) if "[rank@node]" in text else None
    if times is None:
        return None
    cells = sorted((int(r), int(n), float(ms)) for r, n, ms in _CELL.findall(times.group(1)))
    if not cells:
        return None
    return RankTimes(tuple(c[2] for c in cells), tuple(c[1] for c in cells), Evidence(file, line_no, text.strip()))


def straggler_report_line(file: str, line_no: int, text: str) -> StragglerReport | None:
    """A `--log-straggler` report line (`MnRtt/Rnk ... MxRtt/Rnk ...`), else None."""
    rtt = _RTT.search(text) if "MxRtt/Rnk" in text else None
    if rtt is None:
        return None
    low = _MIN_ETPT.search(text)
    return StragglerReport(fastest_rank=int(rtt.group(2)), fastest_ms=float(rtt.group(1)),
                           slowest_rank=int(rtt.group(4)), slowest_ms=float(rtt.group(3)),
                           lowest_throughput_ranks=(int(low.group(1)),) if low else (),
                           evidence=Evidence(file, line_no, text.strip()))


def amended_report(report: StragglerReport, text: str) -> StragglerReport | None:
    """The report before a `^^^^ Bottom N Ranks with lowest Etpt(TF): ...` line, with those ranks; None when `text`
    is no such line. It keeps the report's evidence, so a collector replaces the report it amends."""
    bottom = _BOTTOM.search(text) if "Bottom" in text else None
    if bottom is None:
        return None
    return replace(report, lowest_throughput_ranks=tuple(int(r) for r in _ETPT_RANK.findall(bottom.group(1))))


def read_straggler_lines(file: str, lines: Iterable[str]) -> StragglerLines:
    """Every per-rank line in `lines` (a `Bottom N` line amends the report before it)."""
    found = StragglerLines([], [])
    for number, raw in enumerate(lines, start=1):
        text = raw.rstrip("\n")
        if (times := rank_times_line(file, number, text)) is not None:
            found.rank_times.append(times)
        elif (report := straggler_report_line(file, number, text)) is not None:
            found.reports.append(report)
        elif found.reports and (amended := amended_report(found.reports[-1], text)) is not None:
            found.reports[-1] = amended
    return found


__all__ = ["NEEDLES", "RankTimes", "StragglerLines", "StragglerReport", "amended_report", "rank_times_line",
           "read_straggler_lines", "straggler_report_line"]
