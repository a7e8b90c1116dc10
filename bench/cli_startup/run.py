"""CLI start-up: CPU seconds of `megapilot --version`, `megapilot --help` and `megapilot estimate --help` in a fresh
process, for this checkout and for another revision of it (`--baseline-rev`, default main), run interleaved.

Also timed: what reading the layout's options from ParallelConfig at start-up would add (importing
`megapilot.spec.parallel` after the CLI), the cost that megapilot/cli/layout_fields.py (generated from the spec) avoids.

CPU seconds (user + sys of the child) are the fair figure on a shared machine: wall time also counts waiting for a
core. Each figure is the median of `--repeats` runs, the baseline's and this checkout's alternating.

    python bench/cli_startup/run.py [--baseline-rev main] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

COMMANDS = {
    "version": ["--version"],
    "help": ["--help"],
    "estimate_help": ["estimate", "--help"],
}
CLI = "import sys; from megapilot.cli.app import main; sys.argv[0] = 'megapilot'; main()"
IMPORT_ONLY = "import megapilot.cli.app as app; app._register_commands()"
WITH_SPEC = IMPORT_ONLY + "; import megapilot.spec.parallel"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_s(tree: Path, code: str, args: list[str]) -> float:
    """CPU seconds of one child running `code` with `args` against the checkout at `tree`."""
    before = _children_cpu_s()
    subprocess.run([sys.executable, "-c", code, *args], cwd=tree, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "80"})
    return _children_cpu_s() - before


def extract(rev: str, into: Path) -> Path:
    """The tree of `rev` of this repository, written under `into`."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def interleaved_medians(trees: dict[str, Path], cases: list[tuple[str, str, list[str]]],
                        repeats: int) -> dict[str, float]:
    """CPU seconds of each (name, code, argv) case in each tree, keyed `<tree>_<name>_cpu_s`: the median of `repeats`
    runs with the trees alternating, so a change of the machine's load falls on both alike."""
    for tree in trees.values():  # bytecode caches written before timing, as an installed package has them
        for _, code, argv in cases:
            cpu_s(tree, code, argv)
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for label, tree in trees.items():
            for name, code, argv in cases:
                runs.setdefault(f"{label}_{name}_cpu_s", []).append(cpu_s(tree, code, argv))
    return {key: round(statistics.median(values), 3) for key, values in runs.items()}


def bench_arguments(repeats: int, results: Path) -> argparse.Namespace:
    """The start-up benches' command line: the baseline revision, the repeats, where the results go."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-rev", default="main")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--results", type=Path, default=results)
    return parser.parse_args()


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def provenance(args: argparse.Namespace, load_at_start: list[float]) -> dict[str, object]:
    """What a start-up result was measured against and on: the baseline's commit, the repeats, the machine and its
    load at the start and the end."""
    return {
        "baseline_rev": args.baseline_rev,
        "baseline_commit": subprocess.run(["git", "rev-parse", args.baseline_rev], cwd=ROOT, capture_output=True,
                                          text=True, check=True).stdout.strip(),
        "repeats": args.repeats,
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_average_at_start": load_at_start, "load_average_at_end": load_average(),
    }


def main() -> None:
    args = bench_arguments(repeats=15, results=HERE / "results.json")
    load_at_start = load_average()
    with tempfile.TemporaryDirectory(prefix="megapilot-bench-") as tmp:
        baseline = extract(args.baseline_rev, Path(tmp))
        trees = {"baseline": baseline, "this": ROOT}
        cases = [(name, CLI, argv) for name, argv in COMMANDS.items()]
        cases += [("import_cli", IMPORT_ONLY, []), ("import_cli_and_spec", WITH_SPEC, [])]
        medians = interleaved_medians(trees, cases, args.repeats)
    results = {
        **medians,
        "spec_import_cost_cpu_s": round(medians["this_import_cli_and_spec_cpu_s"] - medians["this_import_cli_cpu_s"],
                                        3),
        **provenance(args, load_at_start),
        "note": ("CPU seconds (user + sys) of a fresh process, median of `repeats` runs, baseline and this checkout "
                 "alternating, bytecode caches warm; import_cli = importing the CLI and registering its commands; "
                 "import_cli_and_spec = the same, then megapilot.spec.parallel, what building the layout options "
                 "from ParallelConfig at start-up would add (spec_import_cost_cpu_s); the machine's 2 cores are "
                 "shared, so single runs vary by tens of ms"),
    }
    args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
