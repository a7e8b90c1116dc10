"""Planner latency and top 5 on hybrid (Mamba-2) models, whose uneven pipeline splits and interleaving the planner
walks where the layer pattern's `|` segments place them (`plan.space` asking `spec.validate.hybrid_split_refusal`).

    PYTHONPATH=$PWD .venv/bin/python bench/plan_latency/hybrid.py --label after   # writes hybrid.json/.md

`--label before` with PYTHONPATH at a checkout from before the change records the other column (the script imports
megapilot from PYTHONPATH, not from this tree). Each hybrid case runs `plan()` (top 5) in a fresh interpreter: the
first call's wall time (what `megapilot plan` pays, its caches cold; imports excluded) and the best of three. The
control cases, dense and MoE presets whose plans the change must leave alone, run in one interpreter for their top 5
only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent
HYBRIDS = ("nemotron3-nano-30b-a3b", "nemotron3-super-120b-a12b", "nemotron-h-8b", "nemotron-h-56b")
CONTROLS = ("llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b",
            "gpt-oss-120b")
GPUS = ("h100", "b200", "gb200")
SEQ = 8192
CONTROL_SEQ = 4096


def _gbs(gpus: int) -> int:
    return max(256, 2 * gpus)


CASES = {f"{model}@{gpus}x{gpu}": dict(model=model, gpu=gpu, gpus=gpus, seq=SEQ, gbs=_gbs(gpus))
         for model in HYBRIDS for gpu in GPUS for gpus in (8, 16, 32, 64, 128, 256)}
CONTROL_CASES = {f"{model}@{gpus}x{gpu}": dict(model=model, gpu=gpu, gpus=gpus, seq=CONTROL_SEQ, gbs=_gbs(gpus))
                 for model in CONTROLS for gpu in GPUS for gpus in (16, 64, 256)}


def _specs(case: dict):
    from megapilot.catalog import get_gpu, get_model
    from megapilot.spec import ClusterSpec, TrainingSpec

    return (get_model(case["model"]), ClusterSpec.from_gpu_count(get_gpu(case["gpu"]), case["gpus"]),
            TrainingSpec(seq_length=case["seq"], global_batch_size=case["gbs"]))


def _top(result) -> list[list]:
    from megapilot.plan.reasons import layout_label

    return [[layout_label(c.parallel), round(c.estimate.tokens_per_s_per_gpu, 1)] for c in result.candidates]


def run_case(case: dict) -> dict:
    """One hybrid case: the first call's wall time (imports and specs excluded), the best of three, the estimates
    costed and the top 5."""
    from megapilot.errors import MegapilotError
    from megapilot.plan import plan

    specs = _specs(case)
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        try:
            result = plan(*specs, top=5)
        except MegapilotError as error:  # nothing fits: the refusal is the answer
            return {"wall_s": round(time.perf_counter() - started, 3), "error": error.problem}
        walls.append(time.perf_counter() - started)
    return {"wall_s": round(walls[0], 3), "best_wall_s": round(min(walls), 3), "estimates": result.layouts_costed,
            "top": _top(result), "uneven_or_vpp_in_top": sum(not c.parallel.pipeline_split.is_even or c.parallel.vpp > 1
                                                              for c in result.candidates)}


def run_controls() -> dict:
    from megapilot.errors import MegapilotError
    from megapilot.plan import plan

    tops = {}
    for name, case in CONTROL_CASES.items():
        try:
            tops[name] = _top(plan(*_specs(case), top=5))
        except MegapilotError as error:
            tops[name] = error.problem
    return tops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", help="internal: run one case in this process and print JSON")
    parser.add_argument("--controls", action="store_true", help="internal: run the control cases, print JSON")
    parser.add_argument("--label", default="after")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(CASES[args.case])))
        return 0
    if args.controls:
        print(json.dumps(run_controls()))
        return 0
    path = OUT / "hybrid.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report[args.label] = {"cases": {name: _child("--case", name) for name in CASES}, "controls": _child("--controls")}
    path.write_text(_json(report))
    (OUT / "hybrid.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


def _json(report: dict) -> str:
    """The report with one line per case, so that a rerun's diff shows the cases that moved."""
    groups = [f'  "{label}": {{\n' + ",\n".join(
        f'    "{group}": {{\n' + ",\n".join(f"      {json.dumps(name)}: {json.dumps(entry)}"
                                           for name, entry in entries.items()) + "\n    }"
        for group, entries in groups.items()) + "\n  }" for label, groups in report.items()]
    return "{\n" + ",\n".join(groups) + "\n}\n"


def _child(*args: str) -> dict:
    """This script in a fresh interpreter (megapilot from PYTHONPATH)."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _markdown(report: dict) -> str:
    labels = [label for label in ("before", "after") if label in report]
    lines = ["# Planner latency and top 5 on hybrid models", "",
             f"`plan()` top 5 at seq {SEQ}, GBS max(256, 2 x GPUs), bf16. Wall: the first call in a fresh "
             "interpreter, imports excluded (best of 3 in brackets); estimates: layouts costed; uneven/VPP: layouts "
             "in the top 5 with an uneven split or VPP > 1. The machine is shared: wall times vary by tens of percent "
             "between runs.", "",
             "| case | " + " | ".join(f"{label} wall s | {label} estimates | {label} uneven/VPP in top 5"
                                     for label in labels) + " | top 5 changed |",
             "|---|" + "---|---|---|" * len(labels) + "---|"]
    for name in CASES:
        cells = []
        for label in labels:
            c = report[label]["cases"].get(name, {})
            cells += ([f"{c['wall_s']} ({c['best_wall_s']})", str(c["estimates"]), str(c["uneven_or_vpp_in_top"])]
                      if "top" in c else [f"{c.get('wall_s', '-')}", "-", c.get("error", "-")[:40]])
        changed = len(labels) == 2 and report["before"]["cases"].get(name, {}).get("top") != \
            report["after"]["cases"].get(name, {}).get("top")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if changed else 'no'} |")
    lines.append("")
    for label in labels:
        walls = [c["wall_s"] for c in report[label]["cases"].values()]
        costed = [c["estimates"] for c in report[label]["cases"].values() if "estimates" in c]
        planned = [c for c in report[label]["cases"].values() if "top" in c]
        lines.append(f"- {label}: wall median {statistics.median(walls):.3f} s, max {max(walls):.3f} s; "
                     f"{sum(costed):,} estimates in all; an uneven split or VPP > 1 in the top 5 of "
                     f"{sum(c['uneven_or_vpp_in_top'] > 0 for c in planned)} of {len(planned)} plans")
    if len(labels) == 2:
        before, after = report["before"]["controls"], report["after"]["controls"]
        same = sum(before.get(name) == after.get(name) for name in CONTROL_CASES)
        lines.append(f"- control (dense and MoE presets {', '.join(CONTROLS)} on {', '.join(GPUS)} x 16/64/256, seq "
                     f"{CONTROL_SEQ}): top 5 identical in {same} of {len(CONTROL_CASES)} cases")
        lines += ["", "Top 5 where it changed (before -> after):", ""]
        for name in CASES:
            old, new = report["before"]["cases"][name].get("top"), report["after"]["cases"][name].get("top")
            if old == new:
                continue
            lines.append(f"- {name}")
            for rank, (was, now) in enumerate(zip(old or [], new or [], strict=False), start=1):
                lines.append(f"  {rank}. `{was[0]}` {was[1]:,} -> " + ("same" if was == now else
                                                                        f"`{now[0]}` {now[1]:,}"))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
