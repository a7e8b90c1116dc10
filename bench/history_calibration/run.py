"""Calibration from a large run history, timed as a user feels it: `megapilot history calibration --cluster X` and
`megapilot estimate ... --cluster X` in a fresh process, on a history of hundreds of imported runs, with this
checkout's calibration and with the one of `--baseline-rev` (its megapilot/estimate/history_calibration.py, loaded
in place of this checkout's; everything else is this checkout, so the two read the same history the same way).

The history: `history import` records like tests/data/history_import (an `estimate --batch` case plus "measured"),
on one H100 cluster: four models (Llama 3.1 8B and 70B, Qwen 2.5 7B, Mixtral 8x7B), bf16 and fp8, layouts drawn
from TP 1-8, PP 1-4, EP 1-8 (Mixtral), MBS 1-4, GBS 128-512, sequence 4096 or 8192, on 8-128 GPUs. Each measured
step is the uncalibrated prediction of its layout times what a real cluster adds: a per-precision and per-family
efficiency (x1.12 bf16, x1.25 fp8, x1.1 more for MoE), 3 % faster on the newer container, 5 % log-normal noise, and
one run in twenty on a slow node (x1.3). `mixed` histories hold all of it (four fit groups: bf16/fp8 x dense/MoE);
`one group` histories only dense bf16 runs, every run in the one group `history calibration` fits.

Figures: CPU seconds (user + sys of the child; wall time on a shared machine also counts waiting for a core),
the median of `--repeats` runs, baseline and this checkout alternating; and, for the largest histories, what the
held-out columns said with each (the baseline predicts each run from every other run, this checkout from its
`MAX_RUNS` nearest, as `calibrate` predicts a case).

    .venv/bin/python bench/history_calibration/run.py [--baseline-rev REV] [--repeats 3]
        # writes results.json and results.md here
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from megapilot.errors import MegapilotError
from megapilot.estimate import estimate
from megapilot.estimate.cases import CaseFlags, case_from

CLUSTER = "team-h100"
BASELINE_REV = "42a1e74"  # the last revision whose held-out check refitted on every other run
MODELS = {"llama3.1-8b": (8, 64), "llama3.1-70b": (32, 128), "mixtral-8x7b": (16, 64), "qwen2.5-7b": (8, 32)}
SIZES = (("mixed", 100), ("mixed", 200), ("mixed", 400), ("mixed", 800), ("one group", 200), ("one group", 400))
ESTIMATE = ["estimate", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--tp", "2", "--gbs", "256",
            "--seq-len", "8192"]
# The CLI with the baseline's calibration module in place of this checkout's (argv[1]: its source file).
BASELINE_CLI = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("megapilot.estimate.history_calibration", sys.argv.pop(1))
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
from megapilot.cli.app import main
sys.argv[0] = "megapilot"
main()
"""
CLI = "import sys; from megapilot.cli.app import main; sys.argv[0] = 'megapilot'; main()"


def records(count: int, *, one_group: bool, seed: int = 7) -> list[dict[str, object]]:
    """`history import` records of one cluster, each measured as a real cluster would run its layout (above)."""
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    models = ["llama3.1-8b", "llama3.1-70b", "qwen2.5-7b"] if one_group else list(MODELS)
    while len(out) < count:
        model = rng.choice(models)
        low, high = MODELS[model]
        record: dict[str, object] = {
            "model": model, "gpu": "h100", "gpus": rng.choice([g for g in (8, 16, 32, 64, 128) if low <= g <= high]),
            "tp": rng.choice([1, 2, 4, 8]), "pp": rng.choice([1, 2, 4]), "mbs": rng.choice([1, 2, 4]),
            "gbs": rng.choice([128, 256, 512]), "seq_len": rng.choice([4096, 8192]),
            "precision": "bf16" if one_group else rng.choice(["bf16", "fp8"])}
        if model.startswith("mixtral"):
            record["ep"] = rng.choice([1, 2, 4, 8])
        try:
            case = case_from(CaseFlags.parse(record))
            predicted_s = estimate(case.model, case.cluster, case.training, case.parallel, case.options).step_time_s
        except (MegapilotError, ValueError):
            continue  # a layout Megatron would refuse or that does not fit: not a run anyone measured
        container = rng.choice(["nemo:25.04", "nemo:25.07"])
        efficiency = {"bf16": 1.12, "fp8": 1.25}[str(record["precision"])] * (1.1 if model == "mixtral-8x7b" else 1)
        efficiency *= 0.97 if container == "nemo:25.07" else 1.0
        slow_node = 1.3 if rng.random() < 0.05 else 1.0
        step_s = predicted_s * efficiency * slow_node * rng.lognormvariate(0.0, 0.05)
        record.update(id=f"run-{len(out):04d}", cluster=CLUSTER, software={"container": container},
                      measured={"step_time_s": round(step_s, 5)})
        out.append(record)
    return out


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli(args: list[str], baseline: Path | None) -> tuple[float, str]:
    """CPU seconds of one `megapilot ARGS` in a fresh process, and what it printed."""
    code = [CLI] if baseline is None else [BASELINE_CLI, str(baseline)]
    before = _children_cpu_s()
    done = subprocess.run([sys.executable, "-c", *code, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}, check=False)
    spent = _children_cpu_s() - before
    if done.returncode != 0:
        raise SystemExit(f"megapilot {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return spent, done.stdout


def held_out_columns(stdout: str) -> dict[str, dict[str, object]]:
    """`history calibration --cluster --json`: each group's held-out medians (%), with every correction and alone."""
    groups = json.loads(stdout)["groups"]
    return {f"{g['precision']}/{g['family']}": {"runs": g["runs"], "median_pct": g["held_out_median_pct"],
                                                "p90_pct": g["held_out_p90_pct"],
                                                "alone_pct": g["held_out_median_pct_by_correction"]}
            for g in groups}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-rev", default=BASELINE_REV)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mp-bench-hc-") as tmp:
        baseline = Path(tmp) / "baseline_history_calibration.py"
        baseline.write_text(subprocess.run(
            ["git", "show", f"{args.baseline_rev}:megapilot/estimate/history_calibration.py"], cwd=ROOT,
            capture_output=True, text=True, check=True).stdout)
        for kind, count in SIZES:
            db = Path(tmp) / f"{kind.replace(' ', '-')}-{count}.sqlite"
            lines = Path(tmp) / f"{kind.replace(' ', '-')}-{count}.jsonl"
            lines.write_text("".join(json.dumps(r) + "\n" for r in records(count, one_group=kind == "one group")))
            cli(["history", "import", str(lines), "--db", str(db)], None)
            commands = {"history calibration": ["history", "calibration", "--cluster", CLUSTER, "--db", str(db)],
                        "estimate --cluster": [*ESTIMATE, "--cluster", CLUSTER, "--db", str(db)]}
            for name, argv in commands.items():
                spent: dict[str, list[float]] = {"baseline": [], "now": []}
                for _ in range(args.repeats):
                    spent["baseline"].append(cli(argv, baseline)[0])
                    spent["now"].append(cli(argv, None)[0])
                row: dict[str, object] = {"history": kind, "runs": count, "command": name,
                                          "baseline_cpu_s": round(statistics.median(spent["baseline"]), 3),
                                          "now_cpu_s": round(statistics.median(spent["now"]), 3)}
                if name == "history calibration":
                    row["held_out_baseline"] = held_out_columns(cli([*argv, "--json"], baseline)[1])
                    row["held_out_now"] = held_out_columns(cli([*argv, "--json"], None)[1])
                rows.append(row)
                print(f"{kind:9} {count:4} runs  {name:20} baseline {row['baseline_cpu_s']:7.3f} s  "
                      f"now {row['now_cpu_s']:6.3f} s", flush=True)
    result = {"baseline_rev": args.baseline_rev, "repeats": args.repeats, "python": platform.python_version(),
              "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs", "rows": rows}
    (HERE / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (HERE / "results.md").write_text(markdown(result))


def markdown(result: dict[str, object]) -> str:
    rows = result["rows"]
    assert isinstance(rows, list)
    lines = ["# History calibration on a large history: CLI CPU seconds", "",
             f"`python bench/history_calibration/run.py` ({result['machine']}, Python {result['python']}; median of "
             f"{result['repeats']} fresh processes each; baseline: the calibration of {result['baseline_rev']}).", "",
             "| history | runs | command | baseline CPU s | now CPU s |", "|---|---:|---|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['history']} | {row['runs']} | `{row['command']}` | {row['baseline_cpu_s']:.2f} | "
                     f"{row['now_cpu_s']:.2f} |")
    lines += ["", "## Held-out columns of `history calibration` (median / p90 %, and each correction alone)", "",
              "| history | runs | group | runs in group | baseline median / p90 | now median / p90 | "
              "baseline alone (compute, up, out, step, mb) | now alone |", "|---|---:|---|---:|---|---|---|---|"]
    for row in rows:
        if "held_out_now" not in row:
            continue
        for group, now in row["held_out_now"].items():
            before = row["held_out_baseline"][group]
            lines.append(
                f"| {row['history']} | {row['runs']} | {group} | {now['runs']} | {before['median_pct']} / "
                f"{before['p90_pct']} | {now['median_pct']} / {now['p90_pct']} | "
                f"{', '.join(str(v) for v in before['alone_pct'].values())} | "
                f"{', '.join(str(v) for v in now['alone_pct'].values())} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
