"""Planner latency on the families whose walk the shared TP/CP rules change (`plan.space` asking
`spec.validate`'s predicates): TP above the KV heads where it is a multiple of them, Gated DeltaNet CP over
whole heads, the Mamba-2 mixer's head and group splits, no CP on attention sinks.

    PYTHONPATH=$PWD .venv/bin/python bench/plan_latency/widened.py --label after   # writes widened.json/.md

`--label before` with PYTHONPATH at a checkout from before the change records the other column (the script
imports megapilot from PYTHONPATH, not from this tree); `--label pruned` the search that leaves unwalked a shape
whose bound is out of reach (`search._Search._shape_cannot_reach`). Each case runs `plan()` in a fresh interpreter, best
of 3; the walked TP and CP values are the `best_by` keys of one `search_layouts` over the same inputs (a
value is there when at least one layout with it fits).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent
CASES = {
    # 16 key / 32 value Gated DeltaNet heads, 2 KV groups: TP 4 and 8 above the KV heads, CP over whole heads
    "qwen3-next-80b-a3b@256xh100": dict(model="qwen3-next-80b-a3b", gpu="h100", gpus=256, seq=4096, gbs=1024),
    # 4 KV groups: TP 8 above them
    "qwen3-30b-a3b@64xh100": dict(model="qwen3-30b-a3b", gpu="h100", gpus=64, seq=4096, gbs=512),
    # Mamba-2 hybrid, 2 KV groups, 64 Mamba heads in 8 groups: TP 4 and 8, CP by the mixer's splits
    "nemotron3-nano-30b-a3b@64xh100": dict(model="nemotron3-nano-30b-a3b", gpu="h100", gpus=64, seq=8192,
                                           gbs=512),
    # attention sinks: no CP
    "gpt-oss-120b@64xh100": dict(model="gpt-oss-120b", gpu="h100", gpus=64, seq=4096, gbs=512),
}


def _specs(case: dict):
    from megapilot.catalog import get_gpu, get_model
    from megapilot.spec import ClusterSpec, TrainingSpec

    return (get_model(case["model"]), ClusterSpec.from_gpu_count(get_gpu(case["gpu"]), case["gpus"]),
            TrainingSpec(seq_length=case["seq"], global_batch_size=case["gbs"]))


def run_case(case: dict) -> dict:
    from megapilot.plan import plan, search_layouts
    from megapilot.plan.space import Pins

    specs = _specs(case)
    started = time.perf_counter()
    result = plan(*specs, top=5)
    wall_s = time.perf_counter() - started
    walked = search_layouts(*specs, pins=Pins()).best_by
    best = result.best
    return {"wall_s": round(wall_s, 3), "estimates": result.layouts_costed, "memory_checks": result.memory_checks,
            "tp_fitting": sorted(v for k, v in walked if k == "tp"),
            "cp_fitting": sorted(v for k, v in walked if k == "cp"),
            "best": best.parallel.shell_block(specs[2].global_batch_size),
            "best_tokens_per_s_per_gpu": round(best.estimate.tokens_per_s_per_gpu, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", help="internal: run one case in this process and print JSON")
    parser.add_argument("--label", default="after")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(CASES[args.case])))
        return 0
    # the parent only: run.py puts this tree on sys.path, and a `--case` child must import megapilot from PYTHONPATH
    sys.path.insert(0, str(OUT))
    from run import fastest_of_three  # one timing loop for both benches

    path = OUT / "widened.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report[args.label] = {}
    for name in CASES:
        report[args.label][name] = fastest_of_three(__file__, name)
    path.write_text(json.dumps(report, indent=2) + "\n")
    (OUT / "widened.md").write_text(_markdown(report))
    print(_markdown(report))
    return 0


def _markdown(report: dict) -> str:
    labels = [label for label in ("before", "after", "pruned") if label in report]
    lines = ["# Planner latency where the shared TP/CP rules change the walk", "",
             "Wall time of `plan()` (top 5), best of 3 fresh processes; TP/CP fitting: the values with at least one "
             "fitting layout in the search.", "",
             "| case | " + " | ".join(f"{label} s | {label} estimates | {label} TP fitting | {label} CP fitting"
                                     for label in labels) + " |",
             "|---|" + "---|---|---|---|" * len(labels)]
    for name in CASES:
        cells = []
        for label in labels:
            c = report[label].get(name)
            cells += ([str(c["wall_s"]), str(c["estimates"]), ", ".join(map(str, c["tp_fitting"])),
                       ", ".join(map(str, c["cp_fitting"]))] if c else ["-"] * 4)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Best layout per case:", ""]
    for label in labels:
        for name, c in report[label].items():
            lines.append(f"- {label}, {name}: `{c['best']}`, {c['best_tokens_per_s_per_gpu']:,} tok/s/GPU")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
