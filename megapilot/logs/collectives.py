"""Collective bandwidth as nccl-tests / rccl-tests print it, and as megapilot's own probe prints it.

The probe (`python -m megapilot.trainer.collectives`, torch.distributed with gloo on CPU or NCCL/RCCL on GPU) prints
the same table as `all_reduce_perf` & co., so one reader serves both:

    #  collective all_reduce  ranks 4  nodes 2
    #       size         count      type   redop    root     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
            1024           256     float     sum      -1    52.31    0.02    0.03      0
    # Avg bus bandwidth    : 1.234

nccl-tests prints an out-of-place and an in-place half on each row (`time algbw busbw #wrong` twice); the
out-of-place half is the one read, as nccl-tests' own summary does. The bus bandwidth rescales the algorithm
bandwidth so that it compares with a link's speed (nccl-tests doc/PERFORMANCE.md): all-reduce moves 2(n-1)/n of the
buffer over each link, all-gather, reduce-scatter and all-to-all (n-1)/n, broadcast and reduce all of it once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# The collectives, by the names nccl-tests gives their binaries (`all_reduce_perf` -> "all_reduce").
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for `collective` over `ranks` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    if collective in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")


def bus_bandwidth_gbps(collective: str, size_bytes: int, time_s: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) of one collective of `size_bytes` that took `time_s`."""
    algbw = size_bytes / time_s / 1e9 if time_s > 0 else 0.0
    return algbw, algbw * bus_factor(collective, ranks)


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One message size of one collective: nccl-tests' row, out-of-place half."""

    collective: str
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int
    ranks: int
    line: int  # 1-based line of the row in the text it came from


@dataclass(frozen=True, slots=True)
class CollectiveRun:
    """One collective's sweep: its rows in size order and the average bus bandwidth the tool printed."""

    collective: str
    ranks: int
    nodes: int
    samples: tuple[CollectiveSample, ...]
    avg_busbw_gbps: float | None
    # "" for every rank; "node1" for one node's own ranks; "node0-node1" for the first ranks of two nodes
    scope: str = ""

    def peak_busbw_gbps(self) -> float:
        return max((s.busbw_gbps for s in self.samples), default=0.0)

    def large_message_busbw_gbps(self, min_size_bytes: int) -> float | None:
        """Mean busbw over the sizes at or above `min_size_bytes`: small messages are latency-bound and say nothing
        about the links, so gates read the large ones (None when the sweep has none that large)."""
        large = [s.busbw_gbps for s in self.samples if s.size_bytes >= min_size_bytes]
        return sum(large) / len(large) if large else None


_HEADER = re.compile(r"^#\s*collective\s+(\w+)(?:@(\S+))?\s+ranks\s+(\d+)(?:\s+nodes\s+(\d+))?")
# nccl-tests prints `# Using devices` / `#  Rank  0 Group  0 Pid ...` lines, then rows; the binary's name is in
# the `# nThread 1 nGpus 1 ... ` banner's command line only when the tool echoes it, so a file of nccl-tests output
# names its collective by the file's own name or the caller's word (`collective=`).
_NCCL_RANKS = re.compile(r"^#\s+Rank\s+\d+\s+Group")
_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\S+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([\d.]+)")
# torchrun's per-rank prefix (`[default0]:`, with --tee) or Megatron's (`[rank0]:`) in front of a printed line
_RANK_PREFIX = re.compile(r"^\[(?:default|rank)\d+\]:")


def parse_collectives(lines: Iterable[str], collective: str | None = None,
                      ranks: int | None = None) -> list[CollectiveRun]:
    """Every collective sweep in `lines`: megapilot's probe sections, or one nccl-tests run (whose collective and
    rank count the caller names when the text does not: nccl-tests prints one `#  Rank` line per rank)."""
    runs: list[CollectiveRun] = []
    current: str | None = collective
    current_ranks = ranks or 0
    current_nodes = 1
    scope = ""
    counted_ranks = 0
    samples: list[CollectiveSample] = []

    def close(avg: float | None) -> None:
        nonlocal samples
        if current is not None and samples:
            width = current_ranks or counted_ranks or 1
            runs.append(CollectiveRun(current, width, current_nodes, tuple(samples), avg, scope))
        samples = []

    for number, raw in enumerate(lines, start=1):
        text = _RANK_PREFIX.sub("", raw.rstrip("\n"), count=1)
        if header := _HEADER.match(text):
            close(None)
            current, scope = header.group(1), header.group(2) or ""
            current_ranks, current_nodes = int(header.group(3)), int(header.group(4) or 1)
            continue
        if _NCCL_RANKS.match(text):
            counted_ranks += 1
            continue
        if avg := _AVG.match(text):
            close(float(avg.group(1)))
            continue
        row = _ROW.match(text)
        if row is None or current is None:
            continue
        wrong = row.group(9)
        width = current_ranks or counted_ranks or 1
        samples.append(CollectiveSample(
            collective=current, size_bytes=int(row.group(1)), time_us=float(row.group(6)),
            algbw_gbps=float(row.group(7)), busbw_gbps=float(row.group(8)),
            wrong=int(wrong) if wrong.isdigit() else 0, ranks=width, line=number))
    close(None)
    return runs


def format_header(collective: str, ranks: int, nodes: int, scope: str = "") -> list[str]:
    """The lines that open one probe section (read back by `parse_collectives`)."""
    named = f"{collective}@{scope}" if scope else collective
    return [f"#  collective {named}  ranks {ranks}  nodes {nodes}",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"]


def format_row(sample: CollectiveSample, elements: int, dtype: str = "float", redop: str = "sum") -> str:
    """One row in nccl-tests' columns."""
    return (f"{sample.size_bytes:>12d}  {elements:>12d}  {dtype:>8s}  {redop:>6s}  {-1:>6d}  {sample.time_us:>9.2f}"
            f"  {sample.algbw_gbps:>7.3f}  {sample.busbw_gbps:>7.3f}  {sample.wrong:>6d}")


def format_average(busbw_gbps: float) -> str:
    return f"# Avg bus bandwidth    : {busbw_gbps:.4f}"
