"""CLI start-up: CPU and wall seconds of everyday commands in a fresh process, for this checkout and for another
revision of it (`--baseline-rev`, default main), run interleaved.

Timed: `megapilot --version`, `--help`, `estimate --help`, `gpus`, `plan --model llama3.1-8b --gpu h100 --gpus 8`,
`history list` and `history show latest` (on a history the bench records from tests/data/suite_results, with this
checkout, before timing), and the modules each loads. Also timed: what reading the layout's options from
ParallelConfig at start-up would add (importing `megapilot.spec.parallel` after the CLI), the cost that
megapilot/cli/layout_fields.py (generated from the spec) avoids.

CPU seconds (user + sys of the child) are the fair figure on a shared machine: wall time also counts waiting for a
core. Each figure is the median of `--repeats` runs (and the best of them, `_best`), the baseline's and this
checkout's alternating.

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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

COMMANDS = {
    "version": ["--version"],
    "help": ["--help"],
    "estimate_help": ["estimate", "--help"],
    "gpus": ["gpus"],
    "plan": ["plan", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8"],
}
# Read from a history the bench records first (a two-combo suite run as an earlier version wrote it).
HISTORY_COMMANDS = {
    "history_list": ["history", "list"],
    "history_show": ["history", "show", "latest"],
}
RECORDED_RUN = ROOT / "tests" / "data" / "suite_results" / "flat_layout"
CLI = "import sys; from megapilot.cli.app import main; sys.argv[0] = 'megapilot'; main()"
IMPORT_ONLY = "import megapilot.cli.app as app; app._register_commands()"
WITH_SPEC = IMPORT_ONLY + "; import megapilot.spec.parallel"


LOADED = ("import atexit, json, sys\n"
          "atexit.register(lambda: sys.__stderr__.write('LOADED ' + json.dumps(len(sys.modules)) + '\\n'))\n")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "80"}


def timed(tree: Path, code: str, args: list[str]) -> tuple[float, float]:
    """CPU and wall seconds of one child running `code` with `args` against the checkout at `tree`."""
    before, started = _children_cpu_s(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], cwd=tree, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=_env(tree))
    return _children_cpu_s() - before, time.perf_counter() - started


def cpu_s(tree: Path, code: str, args: list[str]) -> float:
    """CPU seconds of one child running `code` with `args` against the checkout at `tree`."""
    return timed(tree, code, args)[0]


def modules_loaded(tree: Path, code: str, args: list[str]) -> int:
    """How many modules the process held at exit (it must succeed: a failing command would time its error)."""
    done = subprocess.run([sys.executable, "-c", LOADED + code, *args], cwd=tree, capture_output=True, text=True,
                          check=False, env=_env(tree))
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return int(next(line for line in done.stderr.splitlines() if line.startswith("LOADED ")).split()[1])


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


def interleaved_stats(trees: dict[str, Path], cases: list[tuple[str, str, list[str]]],
                      repeats: int) -> dict[str, float]:
    """As `interleaved_medians`, with the best (least) CPU and wall seconds beside the medians: keys
    `<tree>_<name>_cpu_s`, `_cpu_s_best`, `_wall_s`, `_wall_s_best`."""
    for tree in trees.values():
        for _, code, argv in cases:
            cpu_s(tree, code, argv)
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeats):
        for label, tree in trees.items():
            for name, code, argv in cases:
                runs.setdefault(f"{label}_{name}", []).append(timed(tree, code, argv))
    stats: dict[str, float] = {}
    for key, values in runs.items():
        cpu, wall = [v[0] for v in values], [v[1] for v in values]
        stats.update({f"{key}_cpu_s": round(statistics.median(cpu), 3), f"{key}_cpu_s_best": round(min(cpu), 3),
                      f"{key}_wall_s": round(statistics.median(wall), 3), f"{key}_wall_s_best": round(min(wall), 3)})
    return stats


def record_history(into: Path) -> Path:
    """A history holding one suite run, recorded by this checkout."""
    db = into / "history.sqlite"
    subprocess.run([sys.executable, "-c", CLI, "history", "record", str(RECORDED_RUN), "--db", str(db)], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL, env=_env(ROOT))
    return db


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
        for scanner in (ROOT / "megapilot" / "logs").glob("_scan*.so"):  # built, not in git
            (baseline / "megapilot" / "logs" / scanner.name).write_bytes(scanner.read_bytes())
        trees = {"baseline": baseline, "this": ROOT}
        db = record_history(Path(tmp))
        commands = {**COMMANDS, **{name: [*argv, "--db", str(db)] for name, argv in HISTORY_COMMANDS.items()}}
        cases = [(name, CLI, argv) for name, argv in commands.items()]
        cases += [("import_cli", IMPORT_ONLY, []), ("import_cli_and_spec", WITH_SPEC, [])]
        modules = {f"{label}_{name}_modules": modules_loaded(tree, code, argv)
                   for label, tree in trees.items() for name, code, argv in cases}
        stats = interleaved_stats(trees, cases, args.repeats)
    results = {
        **stats,
        **modules,
        "spec_import_cost_cpu_s": round(stats["this_import_cli_and_spec_cpu_s"] - stats["this_import_cli_cpu_s"], 3),
        **provenance(args, load_at_start),
        "note": ("CPU seconds (user + sys) and wall seconds of a fresh process: the median of `repeats` runs and the "
                 "best (_best), baseline and this checkout alternating, bytecode caches warm; *_modules: sys.modules "
                 "at exit (one run); history_*: read from a history of one recorded suite run; import_cli = "
                 "importing the CLI and registering its commands; import_cli_and_spec = the same, then "
                 "megapilot.spec.parallel, what building the layout options from ParallelConfig at start-up would "
                 "add (spec_import_cost_cpu_s); the machine's 2 cores are shared, so single runs vary by tens of ms"),
    }
    args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))
    print(table(results, [*commands, "import_cli", "import_cli_and_spec"]))


def table(results: dict[str, object], names: list[str]) -> str:
    """Before and after, one row a command: median (best) CPU seconds, median wall seconds, modules loaded."""
    lines = ["| command | baseline CPU-s median (best) | this CPU-s median (best) | wall-s baseline -> this | "
             "modules baseline -> this |", "|---|---:|---:|---:|---:|"]
    for name in names:
        def get(label: str, what: str, name: str = name) -> object:
            return results[f"{label}_{name}_{what}"]
        lines.append(f"| {name} | {get('baseline', 'cpu_s')} ({get('baseline', 'cpu_s_best')}) | "
                     f"{get('this', 'cpu_s')} ({get('this', 'cpu_s_best')}) | "
                     f"{get('baseline', 'wall_s')} -> {get('this', 'wall_s')} | "
                     f"{get('baseline', 'modules')} -> {get('this', 'modules')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
