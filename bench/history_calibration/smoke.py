"""Should a suite's smoke run (a few steps) calibrate the combos after it? Measured on real suite runs.

    .venv/bin/python bench/history_calibration/smoke.py DIR [DIR ...]   # writes smoke.json and smoke.md here

Every `suite.json` under the directories that has a smoke run and combos after it (a CPU suite such as tiny-local:
real Megatron-Core training) is re-calibrated the way `megapilot suite run` calibrates a first run of a cluster:
each combo on this run's finished runs before it (`megapilot.store.measured.calibration_run_of`, the history's
own rule), `megapilot.estimate.history_calibration.calibrate`, compared with what the combo measured:
    uncalibrated     the model alone;
    every own run    the smoke run and every combo before it (the rule before this bench);
    measured_so_far  `megapilot.suite.lifecycle.measured_so_far`: the smoke run until a combo of its layout ran.
Figures: |miss| of the calibrated step (median, p90) and how often the measured step fell within the stated band.

And, from every real training log under the directories (torchrun's `[defaultN]:` lines, 12 iterations or more):
how much slower each of the first iterations is than the run's median step (the start-up a short run would carry),
and how far a run's steady step (the warm-up rule of megapilot.logs.summary) is from the median of the other long
runs of its layout (the same model shape, batch, sequence and parallel sizes), for runs of 5 iterations or fewer
and of 12 or more: whether a short run measures its layout worse than a long one.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from megapilot.estimate.history_calibration import calibrate, miss
from megapilot.store.measured import calibration_run_of
from megapilot.suite.lifecycle import measured_so_far
from megapilot.suite.results import SuiteResult, Verdict

ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
ARGUMENT = re.compile(r"^\[default0\]:\s+(\w+) \.+ (.+)$", re.M)
LAYOUT_ARGS = ("num_layers", "hidden_size", "ffn_hidden_size", "micro_batch_size", "global_batch_size", "seq_length",
               "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size", "bf16", "fp16")


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "median": round(statistics.median(ordered), 4),
            "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 4), "max": round(ordered[-1], 4)}


def _trained(run_dir: Path) -> bool:
    """The run's smoke log is real training: torchrun's `[defaultN]:` lines."""
    return any("[default" in log.read_text(errors="replace") for log in (run_dir / "smoke").rglob("training.log"))


def suites(dirs: list[Path]) -> dict[str, Any]:
    """Each combo after a smoke run, calibrated three ways (above)."""
    by_position: dict[str, dict[str, list[tuple[float, float | None]]]] = defaultdict(lambda: defaultdict(list))
    runs_read = 0
    for path in sorted({p for d in dirs for p in d.rglob("suite.json") if "inputs" not in p.parts}):
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict) or not raw.get("combos") or raw["combos"][0].get("key") != "smoke":
                continue
            result = SuiteResult.model_validate(raw)
        except (OSError, ValueError):
            continue
        if not _trained(path.parent):
            continue  # a stand-in executor's steps (the tests'), not training
        runs_read += 1
        for position in range(1, len(result.combos)):
            combo = result.combos[position]
            case = calibration_run_of(result, combo)
            if case is None or combo.verdict is Verdict.FAIL:
                continue
            before = result.model_copy(update={"combos": result.combos[:position]})
            every = [run for c in before.combos if c.verdict is not Verdict.FAIL
                     and (run := calibration_run_of(before, c)) is not None]
            chosen = list(measured_so_far(before, calibration_run_of))
            where = "first combo" if position == 1 else "later combos"
            measured = case.measured_step_time_s
            by_position[where]["uncalibrated"].append((miss(case.predicted.total_s, measured), None))
            for name, used in (("every own run", every), ("measured_so_far", chosen)):
                calibrated = calibrate(case.key, case.predicted, used)
                by_position[where][name].append((miss(calibrated.step_time_s, measured), calibrated.band))
    table: dict[str, Any] = {"suite_runs": runs_read}
    for where, ways in by_position.items():
        table[where] = {name: {**_stats([m for m, _ in rows]),
                               "within_band": sum(1 for m, band in rows if band is not None and m <= band)}
                        for name, rows in ways.items()}
    return table


def logs(dirs: list[Path]) -> dict[str, Any]:
    """Start-up of the first iterations, and short against long runs of one layout (above)."""
    startup: dict[int, list[float]] = defaultdict(list)
    by_layout: dict[tuple[str, ...], list[tuple[int, float, Path]]] = defaultdict(list)
    for path in sorted({p for d in dirs for p in d.rglob("training.log")}):
        text = path.read_text(errors="replace")
        if "[default" not in text:
            continue
        steps: dict[int, float] = {}
        for match in ITERATION.finditer(text):
            steps.setdefault(int(match.group(1)), float(match.group(3)))
        if 1 not in steps or len(set(steps.values())) < min(3, len(steps)):
            continue  # no first step, or fixture lines with one repeated time
        times = [steps[i] for i in sorted(steps)]
        if len(times) >= 12:
            median = statistics.median(times[5:])
            for k in range(1, 6):
                startup[k].append(times[k - 1] / median)
        warmup = max(1, math.ceil(0.1 * len(times)))  # megapilot.logs.summary's rule
        steady = statistics.fmean(times[warmup:] or times)
        arguments = dict(ARGUMENT.findall(text))
        by_layout[tuple(arguments.get(k, "?").strip() for k in LAYOUT_ARGS)].append((len(times), steady, path))
    against: dict[str, list[float]] = {"5 iterations or fewer": [], "12 iterations or more": []}
    for runs in by_layout.values():
        for count, steady, path in runs:
            others = [s for n, s, p in runs if n >= 12 and p != path]
            if not others or 5 < count < 12:
                continue
            reference = statistics.median(others)
            against["5 iterations or fewer" if count <= 5 else "12 iterations or more"].append(
                max(steady / reference, reference / steady) - 1)
    return {"startup_ratio_by_iteration": {k: _stats(v) for k, v in sorted(startup.items())},
            "miss_against_other_long_runs_of_the_layout": {k: _stats(v) for k, v in against.items() if v}}


def markdown(result: dict[str, Any]) -> str:
    lines = ["# The smoke run as a calibration run", "",
             f"`python bench/history_calibration/smoke.py` over {result['suite']['suite_runs']} real CPU suite runs "
             "(tiny-local: smoke MBS 1, then combos MBS 1 and MBS 2, on a shared 2-core machine).", "",
             "## Combos calibrated on this run's own earlier runs", "",
             "| combo | calibrated on | n | median miss | p90 miss | within band |", "|---|---|---:|---:|---:|---:|"]
    for where in ("first combo", "later combos"):
        for name, row in result["suite"].get(where, {}).items():
            band = "-" if name == "uncalibrated" else f"{row['within_band']}/{row['n']}"
            lines.append(f"| {where} | {name} | {row['n']} | {100 * row['median']:.1f} % | {100 * row['p90']:.1f} % "
                         f"| {band} |")
    lines += ["", "## Start-up: step k / the run's median step (runs of 12+ iterations)", "",
              "| iteration | n | median | p90 |", "|---:|---:|---:|---:|"]
    for k, row in result["logs"]["startup_ratio_by_iteration"].items():
        lines.append(f"| {k} | {row['n']} | {row['median']:.2f} | {row['p90']:.2f} |")
    lines += ["", "## A run's steady step against the other long runs of its layout", "",
              "| run | n | median miss | p90 miss | max |", "|---|---:|---:|---:|---:|"]
    for name, row in result["logs"]["miss_against_other_long_runs_of_the_layout"].items():
        lines.append(f"| {name} | {row['n']} | {100 * row['median']:.0f} % | {100 * row['p90']:.0f} % | "
                     f"{100 * row['max']:.0f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    result = {"suite": suites(args.dirs), "logs": logs(args.dirs)}
    (HERE / "smoke.json").write_text(json.dumps(result, indent=2) + "\n")
    (HERE / "smoke.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
