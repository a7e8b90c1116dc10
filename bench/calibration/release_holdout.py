"""Hold-out by release: the committed step-time parameters, fitted on the papers, NeMo 24.07 and the newer file's
`TRAIN_RELEASES` (NeMo 25.02, 25.04), judged on the releases they never saw (NeMo 25.07, Megatron-Bridge 25.09).

    .venv/bin/python bench/calibration/release_holdout.py     # writes release_holdout.md and .json here

Each row is typed in as published and priced as `megapilot estimate` prices it (`megapilot.estimate.published`: the
table's layout, ETP 1 on MoE rows as the MoE recipes set it, the balanced split where the layers do not divide over
PP x VPP, the lightest recompute that fits, `--grad-reduce-in-bf16`; retyped only with a fix a refusal offers); error =
predicted / published tokens/s/GPU - 1. Judged rows are reported per family (dense / MoE / hybrid), GPU, precision
and release; the rows the fit saw are listed apart. Leave-one-source-out over both files
is in results.md (bench/calibration/run.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import load_release_rows, load_rows, release_tables  # bench/calibration/run.py: the rows as the fit saw them

from megapilot.estimate import estimate_case
from megapilot.estimate.calibration import TRAIN_RELEASES, ReleaseRow, release_error, same_layout_repeats
from megapilot.estimate.comm import scaleup_domain
from megapilot.estimate.coverage import mechanisms
from megapilot.estimate.efficiency import CALIBRATED
from megapilot.estimate.published import (
    PARENTHESIZED_TAG,
    PublishedLayout,
    enter_published_run,
    parenthesized_twin,
    short_id,
)
from megapilot.estimate.step_time import layer_terms, step_time

OUT_DIR = Path(__file__).resolve().parent
IN_SAMPLE = OUT_DIR / "results.json"  # bench/calibration/run.py's per-row errors on the older file
COVERAGE = ROOT / "megapilot" / "estimate" / "data" / "calibration_coverage.json"


WORST = 0.15  # judged rows above this |error| get their step and one layer printed term by term

# What the Megatron-Bridge 25.09 recipes ran beside the printed layout, where megapilot has the flag: Bridge
# v0.1.0rc4 (the 25.09 container's scripts), `scripts/performance/configs/*/*.yaml` (`perf_matrix`: cuda_graphs,
# cpu_offloading_num_layers, recompute) and `run_script.py`'s DeepSeek-V3 branch (DeepEP and the 1F1B all-to-all
# overlap on H100, recompute_modules per GPU). `cuda_graphs: true` sets `enable_cuda_graph`: Megatron's own graphs of
# each whole layer. Left out, having no flag here: NCCL user buffers (H100 Llama 3 8B), the shared experts'
# overlap and delayed weight gradients (DeepSeek-V3). DeepSeek-V3's pipeline layout is the recipe's own
# (`deepseek_v3.py` `map_pp_vp_to_layout` for PP x VPP = 16: the embedding and 4 layers, 14 stages of 4, one layer
# beside the MTP and the loss; `run_script.py` passes H100's). (GPU, the label in the row's id, formats, flags.)
WHOLE_LAYER_GRAPHS = {"cuda_graph_impl": "local"}
DEEPSEEK_V3_LAYOUT_16_STAGES = "Et*4|(t*4|)*14tmL"
RECIPE_RAN: tuple[tuple[str, str, tuple[str, ...], dict[str, Any]], ...] = (
    ("GB200", "LLAMA3_8B", ("FP8-MX",), WHOLE_LAYER_GRAPHS),
    ("GB200", "LLAMA3_70B", ("FP8-CS",), {"cpu_offloading_num_layers": 40, "recompute": "none"}),
    ("GB200", "LLAMA3.1_405B", ("FP8-CS",), {"cpu_offloading_num_layers": 95, "recompute": "none"}),
    ("GB200", "DeepSeekV3", ("FP8-CS", "FP8-MX"), {"recompute": "selective", "recompute_modules": "mla_up_proj",
                                                   "pipeline_layout": DEEPSEEK_V3_LAYOUT_16_STAGES}),
    ("GB200", "Qwen3_30B", ("FP8-CS", "FP8-MX"), WHOLE_LAYER_GRAPHS),
    ("GB200", "Qwen3_235B", ("FP8-CS", "FP8-MX"), WHOLE_LAYER_GRAPHS),
    ("B200", "LLAMA3_8B", ("FP8-CS", "FP8-MX"), WHOLE_LAYER_GRAPHS),
    ("B200", "DeepSeekV3", ("FP8-CS", "FP8-MX"), {"recompute": "selective", "recompute_modules": "mla_up_proj",
                                                  "pipeline_layout": DEEPSEEK_V3_LAYOUT_16_STAGES}),
    ("B200", "Qwen3_30B", ("FP8-CS", "FP8-MX"), WHOLE_LAYER_GRAPHS),
    ("H100", "DeepSeekV3", ("FP8-CS", "FP8-SC"), {"moe_flex_dispatcher": "deepep", "moe_a2a_overlap": True,
                                                  "recompute": "selective", "recompute_modules": "mla_up_proj mlp",
                                                  "pipeline_layout": "Et|(tt|)*30mL"}),
)


def evaluate() -> list[dict[str, Any]]:
    release, notes = load_release_rows()
    by_id = {row.id: row for row in release}
    repeats = same_layout_repeats(release)
    rows = []
    for row_id, note in notes.items():
        doc: dict[str, Any] = {"id": row_id, **note}
        row = by_id.get(row_id)
        if row is not None:
            error = release_error(row, CALIBRATED)
            doc |= {"release": row.release, "family": row.family, "gpu": row.case.cluster.gpu.name,
                    "judged": row.release not in TRAIN_RELEASES,
                    "recompute": row.case.parallel.recompute, "etp": row.case.parallel.expert_tp,
                    "predicted_tokens_per_s_per_gpu": round(row.published_tokens_per_s * (1 + error), 1),
                    "error": round(error, 4), "repeats_twin_layout": row.id in repeats}
            if doc["judged"] and abs(error) > WORST:
                doc["terms"] = _terms(row)
            if _ep_leaves_the_domain(row):
                doc["error_with_flex_and_a2a_overlap"] = round(_error_with_moe_options(row), 4)
        rows.append(doc)
    for raw, published, _ in release_tables():
        doc = next(d for d in rows if d["id"] == raw["id"])
        ran = recipe_ran(raw["id"])
        if ran is not None and published and "error" in doc:
            doc["recipe_ran"] = ran
            doc["error_as_recipe_ran"] = round(_error_as_run(PublishedLayout.from_row(raw), ran, published), 4)
    return rows


def recipe_ran(row_id: str) -> dict[str, Any] | None:
    """The flags the 25.09 recipe ran a row with beyond its printed layout (`RECIPE_RAN`), or None."""
    fmt = row_id.split(PARENTHESIZED_TAG)[1].strip(" ]") if PARENTHESIZED_TAG in row_id else "FP8-CS"
    return next((flags for gpu, label, formats, flags in RECIPE_RAN
                 if row_id.startswith("bridge-25.09") and f"-{gpu}-" in row_id and label in row_id
                 and fmt in formats), None)


def _error_as_run(layout: PublishedLayout, ran: dict[str, Any], published: float) -> float:
    """The row's error with the recipe's flags added to what it was typed with (`enter_published_run`)."""
    entry = enter_published_run(layout)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.json"
        path.write_text(entry.model.model_dump_json())
        case, _ = estimate_case(entry.flags.changed(ran | {"model": str(path)}))
    options = replace(case.options, efficiency=CALIBRATED)
    result = step_time(case.model, case.cluster, case.training, case.parallel, options)
    return result.tokens_per_s_per_gpu / published - 1


def _terms(row: ReleaseRow) -> dict[str, Any]:
    """The step's terms (s) against the published step, and the last layer's terms (ms per micro-batch)."""
    c = row.case
    options = replace(c.options, efficiency=CALIBRATED)
    result = step_time(c.model, c.cluster, c.training, c.parallel, options)
    layer = layer_terms(c.model, c.model.num_layers - 1, c.cluster, c.training, c.parallel, options, recomputed=False)
    published_step_s = c.training.tokens_per_step / (row.published_tokens_per_s * c.cluster.world_size)
    return {"step_s": round(result.step_time_s, 3), "published_step_s": round(published_step_s, 3),
            "step_terms_s": {k: round(v, 3) for k, v in result.breakdown_s.items() if v >= 0.0005},
            "last_layer_terms_ms": {k: round(1e3 * v, 3) for k, v in layer.items() if v >= 5e-7}}


def _ep_leaves_the_domain(row: ReleaseRow) -> bool:
    p = row.case.parallel
    return row.case.model.moe is not None and p.ep * p.expert_tp > scaleup_domain(row.case.cluster)


def _error_with_moe_options(row: ReleaseRow) -> float:
    """The error had the row been typed with the flex dispatcher and the EP all-to-all overlap on (options the
    tables do not print; Megatron and megapilot's scripts leave both off)."""
    c = row.case
    options = replace(c.options, efficiency=CALIBRATED, moe_flex_dispatcher=True, moe_a2a_overlap=True)
    return step_time(c.model, c.cluster, c.training, c.parallel, options).tokens_per_s_per_gpu / \
        row.published_tokens_per_s - 1


def _summary(errors: list[float]) -> dict[str, float]:
    absolute = sorted(abs(e) for e in errors)
    return {"rows": len(errors), "median_abs": statistics.median(absolute),
            "p90_abs": absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))],
            "mean_signed": statistics.fmean(errors)}


def _groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row.get("error") is None or not row["judged"]:
            continue
        groups["all"].append(row["error"])
        for key in ("family", "gpu", "format", "release"):
            groups[f"{key}={row[key]}"].append(row["error"])
    return {name: _summary(errors) for name, errors in sorted(groups.items())}


def granularity_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row beside its parenthesized run where both ran the same layout (`calibration.same_layout_repeats`): the
    other FP8 granularity's throughput over the row's, published and predicted. The ratio leaves out everything the
    two runs share (the model, the layout, the software of the day), so it checks what the model prices for the
    granularity alone."""
    by_id = {row["id"]: row for row in rows}
    pairs = []
    for row in rows:
        if not row.get("repeats_twin_layout"):
            continue
        main = by_id[parenthesized_twin(row["id"]) or ""]
        published = row["published_tokens_per_s_per_gpu"] / main["published_tokens_per_s_per_gpu"]
        predicted = row["predicted_tokens_per_s_per_gpu"] / main["predicted_tokens_per_s_per_gpu"]
        pairs.append({"row": main["id"], "model": main["model"], "gpu": main["gpu"], "family": main["family"],
                      "layout": main["layout"], "formats": f"{row['format']} / {main['format']}",
                      "published_ratio": round(published, 4), "predicted_ratio": round(predicted, 4),
                      "ratio_error": round(predicted / published - 1, 4)})
    return pairs


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def write(rows: list[dict[str, Any]]) -> None:
    groups = _groups(rows)
    pairs = granularity_pairs(rows)
    (OUT_DIR / "release_holdout.json").write_text(json.dumps({"groups": groups, "granularity_pairs": pairs,
                                                             "rows": rows}, indent=1) + "\n")
    judged = sorted({row["release"] for row in rows if row.get("judged")})
    lines = [
        f"# Hold-out by release: fitted on <= NeMo 24.07 + {' + '.join(TRAIN_RELEASES)}, judged on "
        f"{' + '.join(judged)}",
        "",
        "Generated by `bench/calibration/release_holdout.py`. Parameters: the committed `CALIBRATED` ones, fitted by",
        "`bench/calibration/run.py` on the papers, NeMo 24.07 and the NeMo " + " and ".join(TRAIN_RELEASES) + " rows "
        "only. Error = predicted /",
        "published tokens/s/GPU - 1; every row typed in as published and priced as `megapilot estimate` prices it (ETP",
        "1 on MoE rows, the balanced pipeline split where the layers do not divide over PP x VPP, the lightest",
        "recompute that fits, --grad-reduce-in-bf16 as the NeMo/Bridge recipes run), retyped only with a fix a refusal",
        "offers. Groups: judged rows only.",
        "",
        "| group | rows | median abs error | p90 abs error | mean signed |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {name} | {s['rows']} | {_pct(s['median_abs'])} | {_pct(s['p90_abs'])} | {_pct(s['mean_signed'])} |"
              for name, s in groups.items()]
    for title, judged_rows in (("Judged (releases the fit never saw)", True), ("In the fit", False)):
        lines += ["", f"{title}:", "", "| row | layout | recompute | published | predicted | error | retyped |",
                  "|---|---|---|---|---|---|---|"]
        for row in rows:
            if "refused" in row:
                if judged_rows:
                    lines.append(f"| {short_id(row['id'], 70)} | {row['layout']} | | "
                                 f"{row['published_tokens_per_s_per_gpu']} | refused: {row['refused'][:80]} | | |")
                continue
            if row.get("error") is None or row["judged"] is not judged_rows:
                continue
            lines.append(f"| {short_id(row['id'], 70)} | {row['layout']}{' FSDP' if row['fsdp'] else ''} | "
                         f"{row['recompute']} | {row['published_tokens_per_s_per_gpu']} | "
                         f"{row['predicted_tokens_per_s_per_gpu']} | {_pct(row['error'])} | "
                         f"{'; '.join(row['retyped'])} |")
    lines += ["", f"Judged rows off by more than {100 * WORST:.0f} %, term by term: the step (s) against the published",
              "step, and one micro-batch of the last layer (ms).", "",
              "| row | error | step s (published) | step terms, s | last layer, ms |", "|---|---|---|---|---|"]
    for row in rows:
        if "terms" in row:
            t = row["terms"]
            step = ", ".join(f"{k} {v}" for k, v in t["step_terms_s"].items())
            layer = ", ".join(f"{k} {v}" for k, v in t["last_layer_terms_ms"].items())
            lines.append(f"| {short_id(row['id'], 50)} | {_pct(row['error'])} | {t['step_s']} "
                         f"({t['published_step_s']}) | {step} | {layer} |")
    lines += ["", "The same layout in two FP8 granularities (the tables print the second in parentheses): its",
              "throughput over the per-tensor current scaling's, published and predicted; the ratio's error isolates",
              "what the model prices for the granularity itself.", "",
              "| row | GPU | family | layout | formats | published ratio | predicted ratio | ratio error |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p['model']} | {p['gpu']} | {p['family']} | {p['layout']} | {p['formats']} | "
              f"{p['published_ratio']:.3f} | {p['predicted_ratio']:.3f} | {_pct(p['ratio_error'])} |" for p in pairs]
    if pairs:
        lines += ["", f"Median ratio error over {len(pairs)} pairs: "
                      f"{_pct(statistics.median(p['ratio_error'] for p in pairs))}."]
    crossing = [row for row in rows if "error_with_flex_and_a2a_overlap" in row]
    lines += ["", "MoE rows whose expert group leaves the NVLink domain, as typed (alltoall dispatcher, no all-to-all",
              "overlap: Megatron's defaults) and with the flex dispatcher (a token crosses to each remote domain once)",
              "and the EP all-to-all overlap, which some recipes turn on and the tables do not print:", "",
              "| row | judged | error as typed | with flex + overlap |", "|---|---|---|---|"]
    lines += [f"| {short_id(row['id'], 60)} | {'yes' if row['judged'] else 'no'} | {_pct(row['error'])} | "
              f"{_pct(row['error_with_flex_and_a2a_overlap'])} |" for row in crossing]
    ran = [row for row in rows if "error_as_recipe_ran" in row]
    lines += ["", "The 25.09 rows as their recipe ran them: the printed layout with what Megatron-Bridge v0.1.0rc4's",
              "performance scripts also set, where megapilot has the flag (`RECIPE_RAN`: whole-layer CUDA graphs,",
              "activation offloading, the recompute modules, DeepEP and the EP all-to-all overlap). The judged figures",
              "above keep the rows as a user types them from the table:", "",
              "| row | error as typed | as the recipe ran it | what it also ran |", "|---|---|---|---|"]
    lines += [f"| {short_id(row['id'], 60)} | {_pct(row['error'])} | {_pct(row['error_as_recipe_ran'])} | "
              f"{', '.join(f'{k}={v}' for k, v in row['recipe_ran'].items())} |" for row in ran]
    if ran:
        typed, as_run = ([abs(row[key]) for row in ran] for key in ("error", "error_as_recipe_ran"))
        lines += ["", f"Median |error| over these {len(ran)} rows: {_pct(statistics.median(typed))} as typed, "
                      f"{_pct(statistics.median(as_run))} as the recipe ran them."]
    (OUT_DIR / "release_holdout.md").write_text("\n".join(lines) + "\n")


def write_coverage(rows: list[dict[str, Any]]) -> None:
    """Per (family, GPU, precision): published runs, median |error| and median signed error, for every estimate's
    coverage line."""
    from megapilot.catalog.gpus import get_gpu

    errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for old in json.loads(IN_SAMPLE.read_text())["rows"]:
        precision = "fp8" if old["precision"] in ("fp8", "mxfp8", "nvfp4") else "bf16"
        errors[("dense", get_gpu(old["gpu"]).name, precision)].append(old["error"])
    for row in rows:  # one layout counted once per cell
        if row.get("error") is not None and not row["repeats_twin_layout"]:
            errors[(row["family"], get_gpu(row["gpu"]).name, row["precision"])].append(row["error"])
    # each row's errors when the fit saw neither its model family nor its GPU (run.py): the interval's residuals
    in_sample = json.loads(IN_SAMPLE.read_text())
    heldout: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for row_id, pair in in_sample["heldout_residuals"].items():
        family, gpu, precision = in_sample["heldout_cells"][row_id]
        heldout[(family, gpu, precision)].extend(pair)
    cells = [{"family": family, "gpu": gpu, "precision": precision, "runs": len(errs),
              "median_abs_error": round(statistics.median(abs(e) for e in errs), 4),
              "median_signed_error": round(statistics.median(errs), 4),
              "heldout_errors": heldout.get((family, gpu, precision), [])}
             for (family, gpu, precision), errs in sorted(errors.items())]
    # every mechanism some published run had: an estimate whose model runs another is checked by no run
    runs = [(row.model, row.training) for row in load_rows()[0]] + [
        (row.case.model, row.case.training) for row in load_release_rows()[0]]
    checked = sorted(set().union(*(mechanisms(model, training.gemm_format) for model, training in runs)))
    COVERAGE.write_text(json.dumps({
        "source": "bench/calibration/release_holdout.py: bench/calibration/results.json (papers, NeMo <= 24.07, "
                  "in-sample) and the NeMo 25.02-25.09 / Megatron-Bridge tables (25.02, 25.04 in the fit; 25.07, "
                  "25.09 held out by release); heldout_errors: each run's error when its model family, then its GPU, "
                  "was left out of the fit (bench/calibration/run.py), the residuals of every estimate's 80 % interval",
        "checked_mechanisms": checked, "cells": cells}, indent=1) + "\n")


def main() -> int:
    rows = evaluate()
    write(rows)
    write_coverage(rows)
    print((OUT_DIR / "release_holdout.md").read_text().split("\n\nJudged")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
