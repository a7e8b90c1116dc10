"""Calibration from a cluster's own runs, measured on the published rows: calibrate on k runs, predict the rest.

    .venv/bin/python bench/calibration/from_history.py     # writes from_history.json and from_history.md

Every published row (both committed files, tests/data/calibration/) becomes a measured run: its layout as the
estimator sees it (the rules of `megapilot.estimate.calibration` and `megapilot.estimate.published`), the
uncalibrated step-time components megapilot predicts for it, and the step time the publisher measured. A group is
one model on one GPU in one precision class. For each group with more than k runs and each choice of k of its runs
(every choice for k = 1; up to 20 seeded choices for k = 3), the history is those k runs - alone ("same model
only"), and beside every run of other models on the same GPU ("with the cluster's other runs", what a user's
history holds) - and every other run of the group is predicted from it. Figures are |predicted / published
tokens/s - 1| over all those predictions: median and p90, for
    uncalibrated   the committed model as it is;
    single factor  the step scaled by the median measured / predicted ratio of the k runs;
    calibrated     `megapilot.estimate.history_calibration.calibrate` (per-component, shrunk, held-out checked).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.errors import MegapilotError
from megapilot.estimate.calibration import (
    PRIOR,
    CalibrationRow,
    PublishedRun,
    calibration_rows,
    predicted_publisher_tflops,
    resolve_layout,
)
from megapilot.estimate.coverage import family_of, precision_class
from megapilot.estimate.efficiency import CALIBRATED, EfficiencyParams
from megapilot.estimate.history_calibration import (
    NONE,
    MeasuredRun,
    RunKey,
    StepComponents,
    calibrate,
    quantile,
    single_factor,
)
from megapilot.estimate.published import PublishedLayout, enter_published_run
from megapilot.estimate.step_time import step_time

DATA = ROOT / "tests" / "data" / "calibration" / "published_calibration.json"
RELEASE_DATA = ROOT / "tests" / "data" / "calibration" / "published_calibration_2025.json"
OUT_DIR = Path(__file__).resolve().parent
KS = (1, 3)
MAX_CHOICES = 20
SEED = 30


def _key(name: str, model: Any, gpu: str, precision: str, p: Any, gbs: int, seq: int, gpus: int) -> RunKey:
    return RunKey(model=name, family=family_of(model), precision=precision_class(precision), gpu=gpu, gpus=gpus,
                  tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, vpp=p.vpp or 1, mbs=p.mbs, gbs=gbs, seq_len=seq)


def older_runs(params: EfficiencyParams = CALIBRATED) -> list[MeasuredRun]:
    """The papers' and NeMo 24.07 rows: measured step = predicted step x predicted / published TFLOP/s (same
    FLOPs in the publisher's convention on both sides)."""
    published = [PublishedRun.model_validate(raw) for raw in json.loads(DATA.read_text())]
    names = {run.id: run.model for run in published}
    rows, _ = calibration_rows(published)
    runs = []
    for row in rows:
        runs.append(_older(row, names[row.id], params))
    return runs


def _older(row: CalibrationRow, name: str, params: EfficiencyParams) -> MeasuredRun:
    layout, _ = resolve_layout(row)
    time = step_time(row.model, row.cluster, row.training, layout, replace(row.options, efficiency=params))
    ratio = predicted_publisher_tflops(row, layout, params) / row.published_tflops
    components = StepComponents.from_breakdown(time.breakdown_s, time.step_time_s,
                                               multi_node=row.cluster.num_nodes > 1)
    key = _key(name, row.model, row.cluster.gpu.name, row.training.precision, layout,
               row.training.global_batch_size, row.training.seq_length, row.cluster.world_size)
    return MeasuredRun(row.id, key, components, time.step_time_s * ratio)


def release_runs(params: EfficiencyParams = CALIBRATED) -> list[MeasuredRun]:
    """The NeMo 25.xx / Megatron-Bridge rows typed in as published: measured step from their tokens/s/GPU."""
    runs = []
    for raw in json.loads(RELEASE_DATA.read_text()):
        layout = PublishedLayout.from_row(raw)
        published = (raw.get("measured") or {}).get("tokens_per_sec_per_gpu")
        if not published:
            continue
        try:
            case = enter_published_run(layout).case
        except MegapilotError:
            continue
        time = step_time(case.model, case.cluster, case.training, case.parallel,
                         replace(case.options, efficiency=params))
        measured_s = case.training.tokens_per_step / (published * case.cluster.world_size)
        components = StepComponents.from_breakdown(time.breakdown_s, time.step_time_s,
                                                   multi_node=case.cluster.num_nodes > 1)
        key = _key(layout.model, case.model, case.cluster.gpu.name, case.training.precision, case.parallel,
                   case.training.global_batch_size, case.training.seq_length, case.cluster.world_size)
        runs.append(MeasuredRun(layout.id, key, components, measured_s))
    return runs


def _group(run: MeasuredRun) -> tuple[str, str, str]:
    return (run.key.model, run.key.gpu, run.key.precision)


def evaluate(runs: list[MeasuredRun], k: int, with_cluster: bool) -> dict[str, Any]:
    """Every choice of k runs per group, predicting the group's other runs."""
    rng = random.Random(SEED)
    groups: dict[tuple[str, str, str], list[MeasuredRun]] = {}
    for run in runs:
        groups.setdefault(_group(run), []).append(run)
    errors: dict[str, list[float]] = {"uncalibrated": [], "single_factor": [], "calibrated": []}
    applied = predictions = 0
    used_groups = 0
    for group, members in sorted(groups.items()):
        if len(members) <= k:
            continue
        used_groups += 1
        choices = list(itertools.combinations(range(len(members)), k))
        if len(choices) > MAX_CHOICES:
            choices = rng.sample(choices, MAX_CHOICES)
        others = [r for r in runs if r.key.gpu == group[1] and _group(r) != group] if with_cluster else []
        for chosen in choices:
            history = [members[i] for i in chosen] + others
            for index, target in enumerate(members):
                if index in chosen:
                    continue
                measured = target.measured_step_time_s
                result = calibrate(target.key, target.predicted, history)
                baseline = single_factor(target.key, target.predicted, history)
                errors["uncalibrated"].append(abs(measured / target.predicted.total_s - 1))
                errors["single_factor"].append(abs(measured / baseline - 1))
                errors["calibrated"].append(abs(measured / result.step_time_s - 1))
                applied += result.applied and result.corrections != NONE  # a correction, not the model as it is
                predictions += 1
    summary = {name: {"median_pct": round(100 * statistics.median(values), 2),
                      "p90_pct": round(100 * quantile(values, 0.9), 2)} if values else None
               for name, values in errors.items()}
    return {"k": k, "with_cluster": with_cluster, "groups": used_groups, "predictions": predictions,
            "calibration_corrected": applied, **summary}


def main() -> None:
    runs = older_runs() + release_runs()
    results = [evaluate(runs, k, with_cluster) for k in KS for with_cluster in (False, True)]
    # the same, with the physics' unfitted prior parameters: a model that has never seen these rows (out of sample)
    prior_runs = older_runs(PRIOR) + release_runs(PRIOR)
    prior = [evaluate(prior_runs, k, with_cluster) for k in KS for with_cluster in (False, True)]
    (OUT_DIR / "from_history.json").write_text(json.dumps({"runs": len(runs), "results": results,
                                                           "prior_parameters": prior}, indent=2) + "\n")
    lines = [
        "# Calibration from a cluster's own runs (bench/calibration/from_history.py)",
        "",
        f"{len(runs)} published runs (both committed files) as measured runs. For each model / GPU / precision class "
        "with more than k runs: calibrate on k of them and predict the others (every choice for k = 1, up to "
        f"{MAX_CHOICES} seeded choices for k = 3). |predicted / published tokens/s - 1|, median / p90:",
        "",
        "| k | history | groups | predictions | uncalibrated | single factor | calibrated | corrected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += _table(results)
    lines += ["", "The same with the step-time model's unfitted prior parameters (`calibration.PRIOR`): physics that "
              "has never seen these rows, as on a new release or cluster:", "",
              "| k | history | groups | predictions | uncalibrated | single factor | calibrated | corrected |",
              "|---|---|---|---|---|---|---|---|", *_table(prior)]
    lines += ["", "Goal (the issue): median <= 4 %, p90 <= 15 %, never worse than uncalibrated on median or p90.", "",
              "Read with care: the committed efficiency parameters were fitted on these same rows, so the "
              "uncalibrated column is in-sample (optimistic) here; only 9 model/GPU/precision groups have two runs or "
              "more and one has four, so the k = 3 rows rest on 4 predictions. The published runs a user has not "
              "seen (later containers) are not in the repository; this bench measures the mechanism, not that "
              "claim.", "",
              "Where the calibration makes no correction (the corrected column counts those it corrects), its "
              "held-out runs said a fit would be worse than the uncalibrated model, or better by less than the "
              "runs' noise (NOISE / sqrt(runs)): the runs calibrate the case with no correction. The k = 3 group "
              "of one model is GPT-529.6B on A100, "
              "which the committed model predicts within 1-5 % on every run: a fit on 3 of them learned their noise "
              "and predicted the fourth worse (2.6 % median against 2.3 %), so the model stands there as it is."]
    (OUT_DIR / "from_history.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _table(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        cells = [f"{r[n]['median_pct']:.1f} % / {r[n]['p90_pct']:.1f} %" if r[n] else "-"
                 for n in ("uncalibrated", "single_factor", "calibrated")]
        history = "k runs + the GPU's other models" if r["with_cluster"] else "k runs of the model only"
        lines.append(f"| {r['k']} | {history} | {r['groups']} | {r['predictions']} | {' | '.join(cells)} | "
                     f"{r['calibration_corrected']}/{r['predictions']} |")
    return lines


if __name__ == "__main__":
    main()
