"""The suite's quick commands and the lifecycle's import: CPU seconds and modules loaded in a fresh process, for this
checkout and another revision (`--baseline-rev`), run interleaved (the method of run.py, beside it).

An import moved to the top of a module is paid whenever that module loads; this shows where a user would feel it:
`suite check`, `suite run --dry-run` (both on the packaged tiny-local template) and `import megapilot.suite.lifecycle`.

    python bench/cli_startup/suite_commands.py [--baseline-rev main] [--repeats 9]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# run.py, beside this file: one method and one record for both start-up benches
from run import CLI, ROOT, bench_arguments, extract, interleaved_medians, load_average, provenance

HERE = Path(__file__).resolve().parent
TEMPLATE = "megapilot/suite/templates/tiny-local.json"
LOADED = ("import atexit, json, sys\n"
          "atexit.register(lambda: sys.__stderr__.write('LOADED ' + json.dumps(len(sys.modules)) + '\\n'))\n")


def cases(out_dir: Path) -> dict[str, tuple[str, list[str]]]:
    return {
        "suite_check": (CLI, ["suite", "check", TEMPLATE]),
        "suite_run_dry_run": (CLI, ["suite", "run", "--dry-run", TEMPLATE, "--out", str(out_dir)]),
        "import_lifecycle": ("import megapilot.suite.lifecycle", []),
    }


def modules_loaded(tree: Path, code: str, argv: list[str]) -> int:
    """How many modules the process held at exit."""
    done = subprocess.run([sys.executable, "-c", LOADED + code, *argv], cwd=tree, capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "80"})
    return int(next(line for line in done.stderr.splitlines() if line.startswith("LOADED ")).split()[1])


def main() -> None:
    args = bench_arguments(repeats=9, results=HERE / "suite_commands.json")
    load_at_start = load_average()
    with tempfile.TemporaryDirectory(prefix="megapilot-bench-") as tmp:
        baseline = extract(args.baseline_rev, Path(tmp))
        for scanner in (ROOT / "megapilot" / "logs").glob("_scan*.so"):  # built, not in git
            (baseline / "megapilot" / "logs" / scanner.name).write_bytes(scanner.read_bytes())
        trees = {"baseline": baseline, "this": ROOT}
        timed = cases(Path(tmp) / "runs")
        results: dict[str, object] = {}
        for label, tree in trees.items():  # bytecode caches written before timing; modules counted once
            for name, (code, argv) in timed.items():
                results[f"{label}_{name}_modules"] = modules_loaded(tree, code, argv)
        results.update(interleaved_medians(trees, [(name, code, argv) for name, (code, argv) in timed.items()],
                                           args.repeats))
    results.update({
        **provenance(args, load_at_start),
        "note": "CPU seconds (user + sys) of a fresh process, median of `repeats`, baseline and this checkout "
                "alternating; *_modules: sys.modules at exit (one run each)",
    })
    args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
