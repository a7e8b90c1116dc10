"""Benchmark: `megapilot logs parse LOG`'s table (its default output) on a big multi-rank log, before and after it
was read in bulk, against `--summary-only` as the baseline, all in the same run.

The log (SYNTHETIC, ~400 MB in a temporary folder): `run.py`'s noisy multi-rank log (`generate_noisy`: NCCL chatter
every other line, `[rankN]:` prefixes, warnings, `\\r` progress lines, timers, memory reports, saves) in 8 MiB pieces,
each followed by one of the multi-rank and crash fixtures of tests/data/logs in turn (a 2-rank CPU run with its
arguments block, the two nodes of a crash during a save, a core 0.16 log, a rank-prefixed traceback, Primus ANSI
lines, an NCCL watchdog timeout): restarts, errors, arguments blocks and markers throughout the file.

- `summary_only`: `megapilot logs parse --summary-only LOG` (the bulk path, the baseline),
- `table`: `megapilot logs parse LOG` (now `megapilot.cli.logs_table.read_table_log`: the bulk path plus the memory
  reports counted, the markers and the first dated iteration line kept),
- `before`: what the table did before, reproduced in a child: a full parse (`parse_logs`, a record per line) and the
  same printer; run once (~45 CPU-s, >1 GB), checked to print the same bytes as `table`.

Each CLI run is a child process started as an installed package starts (from its bytecode cache), timed by its own
rusage (CPU seconds user + sys, peak RSS); `REPEATS` interleaved summary-only/table pairs, the median pair reported
with the lowest and highest ratio beside it. Writes table_results.json next to this script and deletes the log.
Usage: python bench/log_parse/table.py [--size-mb 400] [--skip-before]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from run import generate_noisy, timed_rusage  # the generator and the child timing of run.py

REPEATS = 3
FIXTURES = ("cpu_tour/training.log", "synthetic_crash_during_save/out-node0/training.log",
            "synthetic_crash_during_save/out-node1/training.log", "synthetic_megatron_core016_full.log",
            "fake/rank_prefixed_typeerror.log", "cvs/cvs_primus_ansi_rank_prefixed.log",
            "real/09_nccl_watchdog_timeout_allreduce_moe.log")
# the children import this checkout's package (first on sys.path), whatever the environment has installed
CHECKOUT = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
CLI = CHECKOUT + "from megapilot.cli.app import main; main(sys.argv[1:])"
# The table as `logs parse` printed it before this change: a full parse, then the same printer.
BEFORE = CHECKOUT + (
    "from megapilot.cli.logs_cmd import _print_log\n"
    "from megapilot.diagnose.megatron_version import recognise_megatron_version\n"
    "from megapilot.logs import parse_logs\n"
    "log = parse_logs(sys.argv[1:])\n"
    "_print_log(log, memory_reports=len(log.memory), version=recognise_megatron_version(log))\n"
)


def generate(path: Path, size_mb: int) -> int:
    """Write the big log; returns the number of fixture copies in it."""
    piece_path = path.with_suffix(".piece")
    generate_noisy(piece_path, 8 * 1024 * 1024)
    piece = piece_path.read_bytes()
    piece_path.unlink()
    fixtures = [(ROOT / "tests/data/logs" / name).read_bytes() for name in FIXTURES]
    written = copies = 0
    with path.open("wb") as out:
        while written < size_mb * 1024 * 1024:
            fixture = fixtures[copies % len(fixtures)]
            out.write(piece)
            out.write(fixture)
            written += len(piece) + len(fixture)
            copies += 1
    return copies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--skip-before", action="store_true", help="do not run the old full parse (~45 CPU-s)")
    parser.add_argument("--results", type=Path, default=HERE / "table_results.json")
    args = parser.parse_args()
    load_at_start = [round(value, 2) for value in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="megapilot-bench-table-") as tmp:
        log = Path(tmp) / "multi_rank.log"
        copies = generate(log, args.size_mb)
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        env["COLUMNS"] = "200"

        def cli(*argv: str) -> tuple[float, float, str]:
            return timed_rusage([sys.executable, "-c", CLI, *argv], env)

        cli("logs", "parse", "--summary-only", str(ROOT / "tests/data/logs/real/01_iteration_megatron2019_bert.log"))
        pairs = [(cli("logs", "parse", "--summary-only", str(log)), cli("logs", "parse", str(log)))
                 for _ in range(REPEATS)]
        ratios = sorted(table[0] / summary[0] for summary, table in pairs)
        summary, table = sorted(pairs, key=lambda pair: pair[1][0] / pair[0][0])[REPEATS // 2]
        results: dict[str, object] = {
            "file_mb": round(log.stat().st_size / 1e6, 1), "fixture_copies": copies,
            "summary_only_cpu_s": round(summary[0], 3), "summary_only_peak_rss_mib": round(summary[1], 1),
            "table_cpu_s": round(table[0], 3), "table_peak_rss_mib": round(table[1], 1),
            "table_vs_summary_only_cpu": round(ratios[REPEATS // 2], 3), "pairs": REPEATS,
            "table_vs_summary_only_lowest": round(ratios[0], 3), "table_vs_summary_only_highest": round(ratios[-1], 3),
        }
        # the table and the summary-only one differ in the memory reports only ("not kept" there)
        differing = [(a, b) for a, b in zip(summary[2].splitlines(), table[2].splitlines(), strict=True) if a != b]
        results["table_differs_from_summary_only_in"] = [b.split("│")[1].strip() for _, b in differing]
        if not args.skip_before:
            before = timed_rusage([sys.executable, "-c", BEFORE, str(log)], env)
            results.update({
                "before_cpu_s": round(before[0], 3), "before_peak_rss_mib": round(before[1], 1),
                "before_vs_table_speed_cpu": round(before[0] / table[0], 1),
                "same_table_as_before": before[2] == table[2],
            })
            assert results["same_table_as_before"], "the table must print what the full parse printed"
        results.update({
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start, "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
            "note": ("CPU seconds (user + sys) and peak RSS of each child from its own rusage, interpreter "
                     "start-up and imports included (~0.5 CPU-s); the table's extra cost over --summary-only: the "
                     "memory reports parsed (the bulk scan skips them otherwise) and the canonical iteration lines "
                     "tested for the release's format until one matches (the first fixture copy here); shared "
                     "2-core machine, load averages beside"),
        })
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
