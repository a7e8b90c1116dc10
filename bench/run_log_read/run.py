"""Benchmark: the one reading of a run's log after `megapilot run` with a prediction, before and after the bulk pass
kept Megatron's timer lines.

After a predicted run ends, `megapilot run` reads its log once for two things: the timers (where the run departs from
its prediction) and the summary (the numerics warning). The bulk summary pass (`megapilot.logs.bulk`) skipped timer
lines, so that reading went line by line (every line through `LineParser.feed`); the bulk pass now has a "keep
timers" switch (`parse_logs(..., on_timer=...)`) and the reading is one bulk pass. On the same SYNTHETIC logs
(`bench/log_parse/run.py`'s generators):

- `noisy`: a multi-rank job's log with `NCCL_DEBUG=INFO` (NCCL chatter every other line behind logger timestamps and
  `[rankN]:` prefixes, Python warnings, `\\r` progress lines, two timer lines every 100 iterations, memory reports,
  saves), what a user waits on after a long run;
- `clean`: Megatron-LM iteration lines with the same timers, memory reports and saves.

Each reading runs in its own child process, as `megapilot run`'s reading runs at its end, and is timed in CPU
seconds, of the whole child (user + sys, its interpreter's start and imports included) and of the reading alone:
`before` is the line reading `megapilot.cli.run_cmd._read_log` did (`parse_logs(..., summary_only=True,
on_record=keep_timer)`, reproduced below), `after` calls `_read_log` itself (the compiled engine; `after_python` with
MEGAPILOT_LOG_ENGINE=python, the engine where no C compiler built the scanner). `REPEATS` interleaved rounds, the
median reported, the lowest and highest beside it. Each round checks that every reading gives the same summary and
the same per-timer times.
Writes results.json next to this script. Usage: python bench/run_log_read/run.py [--noisy-mb 160] [--clean-mb 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPEATS = 3

# One reading in a child process; prints what it read and its own CPU seconds.
READ_CHILD = """
import json, resource, sys, time, types
mode, path = sys.argv[1], sys.argv[2]
from megapilot.cli.run_cmd import _read_log
from megapilot.logs import TimerRecord, parse_logs
from megapilot.logs.bulk import ENGINE
from megapilot.suite.metrics import timers_ms
started = time.process_time()  # imports done: the reading alone from here
if mode == "before":  # what run_cmd._read_log did with timers: the line path, timer records streamed out
    timers = []
    def keep_timer(record):
        if isinstance(record, TimerRecord):
            timers.append(record)
    summary = parse_logs([path], summary_only=True, on_record=keep_timer).summary
    reading = types.SimpleNamespace(summary=summary, timers_ms=timers_ms(timers))
else:
    reading = _read_log(types.SimpleNamespace(logs=[path]), with_timers=True)
read_s = time.process_time() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime, "read_cpu_s": read_s, "rss_kib": usage.ru_maxrss,
                  "engine": "line path" if mode == "before" else ENGINE,
                  "summary": reading.summary.to_dict(), "timers_ms": reading.timers_ms}))
"""

VARIANTS = {"before": ("before", ""), "after": ("after", ""), "after_python": ("after", "python")}


def _log_parse_bench() -> ModuleType:
    """bench/log_parse/run.py (its log generators), loaded by path: both scripts are run.py."""
    spec = importlib.util.spec_from_file_location("log_parse_run", HERE.parent / "log_parse" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_in_child(variant: str, path: Path) -> dict:
    mode, engine = VARIANTS[variant]
    env = {**os.environ, "MEGAPILOT_LOG_ENGINE": engine, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", READ_CHILD, mode, str(path)], capture_output=True, text=True,
                          check=True, env=env)
    return json.loads(done.stdout)


def measure(path: Path, iterations: int) -> dict:
    """Every variant on `path`, `REPEATS` interleaved rounds."""
    rounds = [{variant: read_in_child(variant, path) for variant in VARIANTS} for _ in range(REPEATS)]
    mb = path.stat().st_size / 1e6
    result: dict[str, object] = {"file_mb": round(mb, 1), "iteration_lines": iterations}
    for variant in VARIANTS:
        for kind in ("cpu_s", "read_cpu_s"):
            values = sorted(reading[variant][kind] for reading in rounds)
            result[f"{variant}_{kind}"] = round(statistics.median(values), 3)
            result[f"{variant}_{kind}_lowest_highest"] = [round(values[0], 3), round(values[-1], 3)]
        result[f"{variant}_read_mb_per_cpu_s"] = round(mb / statistics.median(
            reading[variant]["read_cpu_s"] for reading in rounds), 1)
        result[f"{variant}_peak_rss_mib"] = round(max(reading[variant]["rss_kib"] for reading in rounds) / 1024, 1)
    for kind in ("cpu_s", "read_cpu_s"):
        speedups = sorted(reading["before"][kind] / reading["after"][kind] for reading in rounds)
        result[f"after_vs_before_speed_{kind}"] = round(statistics.median(speedups), 1)
        result[f"after_vs_before_speed_{kind}_lowest_highest"] = [round(speedups[0], 1), round(speedups[-1], 1)]
    first = rounds[0]["before"]
    result["engines"] = {variant: rounds[0][variant]["engine"] for variant in VARIANTS}
    result["timers_ms"] = first["timers_ms"]
    result["iterations_logged"] = first["summary"]["iterations_logged"]
    result["same_reading_every_variant"] = all(
        (reading[variant]["summary"], reading[variant]["timers_ms"]) == (first["summary"], first["timers_ms"])
        for reading in rounds for variant in VARIANTS)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--noisy-mb", type=int, default=160)
    parser.add_argument("--clean-mb", type=int, default=64)
    parser.add_argument("--results", type=Path, default=HERE / "results.json", help="where to write the results")
    args = parser.parse_args()
    generators = _log_parse_bench()
    load_at_start = [round(value, 2) for value in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="megapilot-bench-") as tmp:
        noisy, clean = Path(tmp) / "noisy.log", Path(tmp) / "clean.log"
        noisy_iterations = generators.generate_noisy(noisy, args.noisy_mb * 1024 * 1024)
        clean_iterations = generators.generate(clean, args.clean_mb * 1024 * 1024)
        results = {
            "noisy": measure(noisy, noisy_iterations),
            "clean": measure(clean, clean_iterations),
            "repeats": REPEATS,
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start, "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
            "note": ("*_cpu_s: CPU seconds (user + sys) of one child process per reading, its start-up and imports "
                     "included (what the user waits for); *_read_cpu_s: the reading alone (the child's CPU time from "
                     "its imports' end); before = the line reading run_cmd._read_log did for a predicted run's "
                     "timers, after = _read_log now (one bulk pass, timer lines kept; `engines` names each one's); "
                     "the median of `repeats` interleaved rounds, the lowest and highest beside it; SYNTHETIC logs "
                     "from bench/log_parse/run.py's generators; measured on a shared 2-core machine (load averages "
                     "beside)"),
        }
        for name in ("noisy", "clean"):
            assert results[name]["same_reading_every_variant"], f"{name}: every reading must agree"
            assert results[name]["iterations_logged"] == results[name]["iteration_lines"], name
            assert results[name]["engines"]["after"] == "compiled", "the compiled scanner must be built (make setup)"
            assert results[name]["engines"]["after_python"] == "python"
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
