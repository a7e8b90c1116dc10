"""Benchmark: peak memory of `megapilot diagnose` against the size of the log.

Generates SYNTHETIC Megatron-LM logs with `bench/log_parse/run.py`'s `generate` (core-v0.16 iteration lines with
timers, memory reports and checkpoint saves) at the full size (300 MB by default) and at 1/8 of it, runs
`python -m megapilot diagnose FILE --json` on each in a child process, and records the child's peak RSS
(ru_maxrss), its wall seconds and the categories it found in results.json next to this script (under the label
given, e.g. "before" / "after" a change). The generated logs are deleted. Flat memory means the two peaks are
about equal. Usage: python bench/diagnose_memory/run.py [--size-mb 300] [--label after]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _log_parse_generator() -> Callable[[Path, int], int]:
    """The log_parse benchmark's `generate` (the same synthetic log), loaded by path: both scripts are run.py."""
    spec = importlib.util.spec_from_file_location("log_parse_run", HERE.parent / "log_parse" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate  # type: ignore[no-any-return]


generate = _log_parse_generator()


def diagnose_in_child(path: Path) -> dict[str, object]:
    """Peak RSS (MiB), wall seconds and finding categories of one `megapilot diagnose --json` child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "megapilot", "diagnose", str(path), "--json"], capture_output=True,
                          text=True, check=True)
    wall_s = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    findings = json.loads(done.stdout)["findings"]
    return {"size_mb": round(path.stat().st_size / 1e6, 1), "peak_rss_mib": round(max(peak_kib, before) / 1024, 1),
            "wall_s": round(wall_s, 1), "categories": [f["category"] for f in findings]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=300)
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        # the small file first: ru_maxrss of children is a maximum over all of them so far
        for size_mb in (max(1, args.size_mb // 8), args.size_mb):
            log = Path(folder) / f"megatron_{size_mb}mb.log"
            iterations = generate(log, size_mb * 1_000_000)
            runs.append({**diagnose_in_child(log), "iterations": iterations})
            log.unlink()
    results_file = HERE / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results[args.label] = {"python": platform.python_version(), "machine": platform.machine(), "runs": runs}
    results_file.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results[args.label], indent=2))


if __name__ == "__main__":
    main()
