"""Sweep: which layouts of the later-release families does `megapilot estimate` refuse, and why?

Runs the estimate's own entry point (`megapilot.estimate.estimate_case`, what `megapilot estimate` and its
`--batch` lines call) in-process over the families later Megatron-Bridge releases publish, on H100, H200, B200,
GB200, B300 and GB300, in bf16, fp8 (tensorwise, delayed, blockwise), mxfp8 and nvfp4, and over the layouts such
recipes use: TP 1-8, PP 1-16 with VPP, CP 1-8, EP 1 up to the expert count with ETP 1 or TP, Megatron-FSDP, MBS
1-4, sequences of 4K and 8K, global batches of whole micro-batch multiples, recompute none/selective/full, uneven
first/last pipeline stages and pipeline layout strings (`balanced`, the string Megatron's layout grammar takes) on
models that need them.

Every layout is drawn at random (a fixed seed, so a rerun draws the same ones) with its world size the product of
its parallel sizes, whole nodes and a global batch that divides into micro-batches: the arithmetic any recipe
satisfies. A second sweep shapes the same draws as a published recipe writes them (a layout string where PP x
VPP does not divide the layers, the expert all-to-all overlap only where Megatron runs it, ...: `_shape_as_recipe`).
What the estimator still refuses is counted by message class (numbers, model, GPU and split replaced) and field;
README.md says for each class whether Megatron-Core / Transformer Engine refuses it too, and where.

    PYTHONPATH=$PWD .venv/bin/python bench/refusals/run.py --label after   # writes results.json and results.md
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.catalog import get_model
from megapilot.errors import MegapilotError
from megapilot.estimate import CaseFlags, estimate_case
from megapilot.spec.model import ModelSpec
from megapilot.spec.validate import a2a_context_parallel_refusal

HERE = Path(__file__).resolve().parent
MODELS = ("llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b",
          "gpt-oss-20b", "gpt-oss-120b", "nemotron-h-8b", "nemotron-h-56b", "nemotron3-nano-30b-a3b",
          "nemotron3-super-120b-a12b", "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "kimi-k2",
          "qwen3-next-80b-a3b")
GPUS = ("h100", "h200", "b200", "gb200", "b300", "gb300")
PRECISIONS: tuple[tuple[str, str | None], ...] = (
    ("bf16", None), ("fp8", "tensorwise"), ("fp8", "delayed"), ("fp8", "blockwise"), ("mxfp8", None), ("nvfp4", None))
NODE_GPUS = {"gb200": 4, "gb300": 4}  # a GB200/GB300 compute tray; 8 elsewhere
MOST_GPUS = 4096


def _powers_of_two(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(limit)) + 1)]


def draw_layout(rng: random.Random, model: ModelSpec, gpu: str, *, shaped: bool = False) -> dict[str, Any]:
    """One recipe-like layout: the parallel sizes, then DP so that the world fills whole nodes and the expert
    groups (EP x ETP) divide one stage's ranks, then a batch of whole micro-batches. `shaped`: also as a published
    recipe writes it (`_shape_as_recipe`)."""
    tp = rng.choice((1, 1, 2, 4, 8))
    pp = rng.choice((1, 1, 2, 4, 8, 16))
    while pp > model.num_layers // 2:
        pp //= 2
    gdn = model.gated_delta_net
    cp = rng.choice([c for c in (1, 1, 1, 2, 4, 8) if not shaped or gdn is None or gdn.key_heads % (tp * c) == 0])
    flags: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "mbs": rng.choice((1, 1, 2, 4)),
                             "seq_len": rng.choice((4096, 8192)),
                             "recompute": rng.choice(("none", "selective", "selective", "full"))}
    if flags["recompute"] == "full":
        flags["recompute_num_layers"] = 1
    ep = etp = 1
    if model.moe is not None:
        ep = rng.choice([e for e in _powers_of_two(min(model.moe.num_experts, 256)) if model.moe.num_experts % e == 0]
                        + ([model.moe.num_experts] if model.moe.num_experts <= 512 else []))
        etp = rng.choice((1, tp))
        flags |= {"ep": ep, "etp": etp}
    if pp > 1:
        _draw_pipeline(rng, model, pp, flags)
    elif rng.random() < 0.25:
        flags["fsdp"] = True
    if model.moe is not None and rng.random() < 0.2:
        flags["moe_a2a_overlap"] = True
    if model.moe is not None and flags["recompute"] == "selective" and rng.random() < 0.3:
        flags["recompute_modules"] = rng.choice(("moe_act,layernorm", "core_attn,moe_act", "mlp", "moe"))
    if shaped:
        _shape_as_recipe(model, flags)
    cp = flags["cp"]
    ranks = tp * cp  # of one stage: DP must make tp*cp*dp a multiple of ep*etp
    dp = ep * etp // math.gcd(ranks, ep * etp) * rng.choice((1, 1, 2, 4, 8))
    node = NODE_GPUS.get(gpu, 8)
    world = tp * pp * cp * dp
    if world >= node and world % node:
        dp *= node // math.gcd(world, node)
    world = tp * pp * cp * dp
    flags |= {"gpus": world, "gbs": flags["mbs"] * dp * rng.choice((8, 16, 32, 64))}
    return flags


def _draw_pipeline(rng: random.Random, model: ModelSpec, pp: int, flags: dict[str, Any]) -> None:
    """VPP, an uneven first/last stage, or a layout string, as the model's layer count needs them."""
    layers = model.num_layers
    kind = rng.choice(("even", "even", "vpp", "uneven", "layout"))
    if kind == "vpp":
        flags["vpp"] = rng.choice([v for v in (2, 3, 4, 5, 6, 8, 10, 12, 20) if pp * v <= layers] or [1])
    elif kind == "uneven" and pp > 2:
        middle = math.ceil(layers / pp)
        rest = layers - middle * (pp - 2)
        if rest >= 2:
            flags |= {"first_stage_layers": rest // 2, "last_stage_layers": rest - rest // 2}
    elif kind == "layout":
        flags["pipeline_layout"] = "balanced"
        if rng.random() < 0.5 and pp * 2 <= layers:
            flags["vpp"] = 2


def _shape_as_recipe(model: ModelSpec, flags: dict[str, Any]) -> None:
    """What a published recipe adds to such a layout: a pipeline layout string where PP x VPP does not divide the
    layers, and the expert all-to-all overlap only where its recipe turns it on (EP > 1, no full recompute and no
    recomputed MoE block, VPP beside PP, PP beside an MTP layer), and CP on attention sinks by --cp-comm-type a2a
    (Transformer Engine serves a sink under CP only so), or CP 1 where a TP rank's heads do not split over CP."""
    pp, vpp = flags["pp"], flags.get("vpp", 1)
    if model.softmax_type != "vanilla" and flags["cp"] > 1:
        if a2a_context_parallel_refusal(model, flags["tp"], flags["cp"]) is None:
            flags["cp_comm_type"] = "a2a"
        else:
            flags["cp"] = 1
    if pp > 1 and "first_stage_layers" not in flags and "pipeline_layout" not in flags \
            and model.num_layers % (pp * vpp):
        flags["pipeline_layout"] = "balanced"
    overlap_runs = (flags.get("ep", 1) > 1 and flags["recompute"] != "full"
                    and "moe" not in flags.get("recompute_modules", "").split(",")
                    and (pp == 1 or vpp > 1) and (model.mtp_num_layers == 0 or pp > 1))
    if not overlap_runs:
        flags.pop("moe_a2a_overlap", None)


# What a performance table prints of a run (model, GPUs, GBS, MBS, sequence, FSDP, TP, PP, CP, VP, EP, precision):
# the rest of a recipe-shaped draw is what a user typing the table's row leaves to the estimate's defaults.
NOT_PRINTED = ("etp", "recompute", "recompute_num_layers", "recompute_modules", "first_stage_layers",
               "last_stage_layers", "pipeline_layout", "cp_comm_type", "moe_a2a_overlap")


def sweep(samples: int, seed: int, kind: str = "drawn") -> dict[str, Any]:
    """Estimate `samples` drawn layouts per model x GPU x precision; count the refusals by class. `kind`: the draws
    as drawn, shaped as a recipe writes them, or those typed as a table prints them (`SWEEPS`)."""
    shaped, typed = kind != "drawn", kind == "table_typed"
    rng = random.Random(seed)
    classes: Counter[str] = Counter()
    by_precision: dict[str, Counter[str]] = defaultdict(Counter)
    examples: dict[str, dict[str, Any]] = {}
    total = answered = over_memory = 0
    started = time.perf_counter()
    for name in MODELS:
        model = get_model(name)
        for gpu in GPUS:
            for precision, recipe in PRECISIONS:
                label = precision if recipe is None else f"{precision}-{recipe}"
                if shaped and precision in ("mxfp8", "nvfp4") and not gpu.startswith(("b", "gb")):
                    continue  # the block-scaled formats run on Blackwell only: no recipe asks for them on Hopper
                for _ in range(samples):
                    flags = draw_layout(rng, model, gpu, shaped=shaped) | {"model": name, "gpu": gpu,
                                                                           "precision": precision}
                    if shaped and recipe == "delayed" and flags.get("recompute_modules", "").count("moe_act"):
                        del flags["recompute_modules"]  # Megatron refuses moe_act/layernorm recompute under it
                    if typed:
                        flags = {key: value for key, value in flags.items() if key not in NOT_PRINTED}
                    if recipe is not None:
                        flags["fp8_recipe"] = recipe
                    total += 1
                    by_precision[label]["cases"] += 1
                    try:
                        result = estimate_case(CaseFlags.parse(flags))[1]
                    except MegapilotError as refusal:
                        key = f"[{refusal.field}] {message_class(refusal.problem, name, gpu)}"
                    except Exception as crash:  # noqa: BLE001  (a crash is a refusal the user cannot act on)
                        key = f"[crash] {type(crash).__name__}: {message_class(str(crash), name, gpu)}"
                    else:
                        answered += 1
                        over_memory += not result.fits
                        continue
                    classes[key] += 1
                    by_precision[label]["refused"] += 1
                    examples.setdefault(key, flags)
    return {"shaped": shaped, "typed_as_printed": typed, "samples_per_cell": samples, "seed": seed, "cases": total,
            "answered": answered,
            "answered_over_memory": over_memory, "refused": total - answered,
            "seconds": round(time.perf_counter() - started, 1),
            "by_precision": {k: dict(v) for k, v in sorted(by_precision.items())},
            "classes": dict(classes.most_common()), "examples": examples}


def message_class(message: str, model: str, gpu: str) -> str:
    """A refusal's message with its numbers, model, GPU and layout string replaced, so one rule is one class."""
    message = message.replace(model, "MODEL")
    message = re.sub(r"split \(.*?\):", "split (SPLIT):", message)
    message = re.sub(r"on \S+ \((\w+)\)", r"on GPU (\1)", message, flags=re.IGNORECASE)
    return re.sub(r"\b\d+\b", "N", message)[:160]


SWEEPS = {"drawn": "every drawn layout", "recipe_shaped": "the drawn layouts as a published recipe writes them",
          "table_typed": "the recipe-shaped layouts typed as a performance table prints them (no ETP, recompute, "
                         "pipeline split, CP exchange or all-to-all overlap: the estimate's defaults)"}


def _markdown(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = ["# Refusals of `megapilot estimate` on later-release layouts", "",
             "Written by `bench/refusals/run.py` (README.md: what each class is, its Megatron-Core source, and "
             "whether it was fixed or stays).", ""]
    for label, sweeps in results.items():
        for kind, doc in sweeps.items():  # a label from before a sweep existed lacks it
            share = doc["answered"] / doc["cases"]
            lines += [f"## {label}: {SWEEPS[kind]}", "",
                      f"{doc['cases']} layouts ({doc['samples_per_cell']} per cell, seed {doc['seed']}): "
                      f"{doc['answered']} answered ({share:.1%}; {doc['answered_over_memory']} of them over memory, "
                      f"with a warning), {doc['refused']} refused.", "",
                      "| precision | cases | refused |", "|---|---:|---:|"]
            lines += [f"| {p} | {c['cases']} | {c.get('refused', 0)} |" for p, c in doc["by_precision"].items()]
            lines += ["", "| refusals | field and message class |", "|---:|---|"]
            lines += [f"| {n} | {key.replace('|', '/')} |" for key, n in doc["classes"].items()]
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="layouts per model x GPU x precision")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--label", default="after", help="the key results.json keeps this sweep under")
    args = parser.parse_args(argv)
    out = HERE / "results.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results[args.label] = {kind: sweep(args.samples, args.seed, kind) for kind in SWEEPS}
    results = dict(sorted(results.items(), key=lambda item: item[0] != "before"))  # the baseline first
    out.write_text(json.dumps(results, indent=1) + "\n")
    (HERE / "results.md").write_text(_markdown(results))
    for kind, doc in results[args.label].items():
        print(f"{args.label} {kind}: {doc['answered']}/{doc['cases']} answered, {doc['refused']} refused "
              f"in {doc['seconds']} s")
        for key, n in doc["classes"].items():
            print(f"{n:6d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
