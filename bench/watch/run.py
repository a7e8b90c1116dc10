"""Benchmark: the suite's live fatal watch (`megapilot.suite.watch.FatalWatch`) against the line judge it replaced.

The watch reads every node's log while a job runs. It now reads them through the log analysis itself (a
`LineParser` per node behind the bulk reader); before, it judged each line on its own (`match_line` plus the
parser's glog-warning and workers-done filters), the `previous_watch` kept below only to be measured against. On
the same SYNTHETIC logs (`bench/log_parse/run.py`'s generators):

- `noisy`: a multi-rank job's log with `NCCL_DEBUG=INFO` (NCCL chatter every other line behind logger timestamps and
  `[rankN]:` prefixes, Python warnings, `\\r` progress lines, timers, memory reports, saves);
- `clean`: Megatron-LM iteration lines with timers, memory reports and saves;

`NODES` node logs grow round-robin in appends of `APPEND_BYTES`, as a job writes them, and each watch scans all of
them after every round, as the suite's poll does; only the scans are timed (CPU seconds of this process, the
appends left out). Each variant (the previous judge; the watch with the compiled engine; with the pure-Python
engine, where no C compiler built the scanner) runs `REPEATS` times interleaved, the median reported. Then a fatal
line is appended to one node and every variant must name it (and nothing before it: the logs are healthy).
Writes results.json next to this script. Usage: python bench/watch/run.py [--mb-per-node 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from megapilot.diagnose.findings import EXPLANATIONS, Finding
from megapilot.logs.parser import GLOG_WARNING_RE, WORKERS_DONE_RE
from megapilot.logs.records import Evidence
from megapilot.logs.signatures import match_line
from megapilot.suite.watch import FATAL_CATEGORIES, MAX_READ_BYTES, FatalWatch

NODES = 8
APPEND_BYTES = 256 * 1024  # what a node's log gains between two polls here (a busy node at NCCL_DEBUG=INFO)
REPEATS = 5
FATAL_LINE = ("[rank42]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total "
              "capacity of 79.11 GiB of which 1.05 GiB is free.\n")
FATAL_NODE = 5


def _log_parse_bench() -> ModuleType:
    """bench/log_parse/run.py (its log generators), loaded by path: both scripts are run.py."""
    spec = importlib.util.spec_from_file_location("log_parse_run", HERE.parent / "log_parse" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the line judge the watch used to be (measured against, nothing else) ---------------------------------------

@dataclass
class _Cursor:
    offset: int = 0
    line_no: int = 0
    partial: bytes = b""
    node_done: bool = False


@dataclass
class PreviousWatch:
    """Each new line judged on its own: `match_line`, the glog-warning and workers-done filters."""

    cursors: dict[Path, _Cursor] = field(default_factory=dict)

    def scan(self, node_logs: list[Path]) -> Finding | None:
        for node, path in enumerate(node_logs):
            finding = self._scan_file(node, path)
            if finding is not None:
                return finding
        return None

    def _scan_file(self, node: int, path: Path) -> Finding | None:
        cursor = self.cursors.setdefault(path, _Cursor())
        size = path.stat().st_size
        if size == cursor.offset or cursor.node_done:
            return None
        with path.open("rb") as handle:
            handle.seek(cursor.offset)
            data = handle.read(min(size - cursor.offset, MAX_READ_BYTES))
        cursor.offset += len(data)
        lines = (cursor.partial + data).split(b"\n")
        cursor.partial = lines.pop()
        for raw in lines:
            cursor.line_no += 1
            text = raw.decode("utf-8", "replace").rstrip("\r")
            if WORKERS_DONE_RE.search(text):
                cursor.node_done = True
                return None
            signature = None if GLOG_WARNING_RE.match(text) else match_line(text)
            if signature is not None and signature.category in FATAL_CATEGORIES:
                return Finding(category=signature.category, severity="critical", title=text[:300],
                               evidence=[Evidence(str(path), cursor.line_no, text)],
                               cause=EXPLANATIONS[signature.category], node=node)
        return None


# ---- one timed run -------------------------------------------------------------------------------------------

Watch = Callable[[list[Path]], Finding | None]


def grow_and_watch(source: bytes, folder: Path, scan: Watch) -> tuple[float, Finding | None]:
    """CPU seconds the scans took while NODES logs grew to `source` each, round-robin in APPEND_BYTES appends; and
    what a scan said after a fatal line was appended to one node (None before it: the logs are healthy)."""
    nodes = [folder / f"node{i}.log" for i in range(NODES)]
    for path in nodes:
        path.write_bytes(b"")
    cpu_s = 0.0
    for start in range(0, len(source), APPEND_BYTES):
        piece = source[start:start + APPEND_BYTES]
        for path in nodes:
            with path.open("ab") as handle:
                handle.write(piece)
        began = time.process_time()
        early = scan(nodes)
        cpu_s += time.process_time() - began
        if early is not None:
            raise SystemExit(f"a healthy log stopped the watch: {early.title}")
    with nodes[FATAL_NODE].open("ab") as handle:
        handle.write(FATAL_LINE.encode())
    began = time.process_time()
    found = scan(nodes)
    return cpu_s + time.process_time() - began, found


def variants() -> dict[str, Callable[[], Watch]]:
    return {
        "previous_line_judge": lambda: PreviousWatch().scan,
        "watch_compiled_engine": lambda: FatalWatch(engine="compiled").scan,
        "watch_python_engine": lambda: FatalWatch(engine="python").scan,
    }


def measure(source: bytes, folder: Path) -> dict[str, object]:
    size_mb = len(source) * NODES / 1e6
    cpu: dict[str, list[float]] = {name: [] for name in variants()}
    verdicts: dict[str, tuple[object, ...]] = {}
    for _ in range(REPEATS):  # interleaved: a burst of load on the shared machine hits every variant alike
        for name, make in variants().items():
            cpu_s, found = grow_and_watch(source, folder, make())
            cpu[name].append(cpu_s)
            verdicts[name] = (found.category, found.node, found.evidence[0].line) if found else ("none",)
    medians = {name: statistics.median(values) for name, values in cpu.items()}
    previous = medians["previous_line_judge"]
    return {
        "mb_watched": round(size_mb, 1),
        "verdicts": {name: list(verdict) for name, verdict in verdicts.items()},
        "same_verdict": len(set(verdicts.values())) == 1,
        **{f"{name}_cpu_s": round(value, 3) for name, value in medians.items()},
        **{f"{name}_cpu_s_all": [round(v, 3) for v in values] for name, values in cpu.items()},
        **{f"{name}_mb_per_cpu_s": round(size_mb / value, 1) for name, value in medians.items()},
        **{f"{name}_speedup_vs_previous": round(previous / value, 1) for name, value in medians.items()
           if name != "previous_line_judge"},
        # what watching a node log that grows by 1 MB/s (a 64-rank node at NCCL_DEBUG=INFO, more than a training
        # log's steady pace) takes of one core
        **{f"{name}_core_share_at_1_mb_per_s": round(value / size_mb, 4) for name, value in medians.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb-per-node", type=int, default=4)
    args = parser.parse_args()
    generators = _log_parse_bench()
    results: dict[str, object] = {
        "nodes": NODES, "append_kib": APPEND_BYTES // 1024, "repeats": REPEATS, "python": platform.python_version(),
        "machine": platform.machine(), "cpus": os.cpu_count(), "load_average_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name, generate in (("noisy", generators.generate_noisy), ("clean", generators.generate)):
            generate(folder / "source.log", args.mb_per_node * 1024 * 1024)
            source = (folder / "source.log").read_bytes()
            (folder / "source.log").unlink()
            results[name] = measure(source, folder)
            print(name, json.dumps(results[name], indent=1), flush=True)
    results["load_average_after"] = os.getloadavg()[0]
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
