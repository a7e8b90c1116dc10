"""Does the planner find the published layouts? Every row of both calibration files that prints a layout is
planned on its own model, GPUs, sequence, batch and precision, with the publisher's run features (NeMo and
Megatron-Bridge performance recipes reduce gradients in bf16, `grad_reduce_in_fp32=False`; the papers and the
Megatron-LM README keep fp32); a hit is the published TP, PP, CP, EP and FSDP among the planner's top 3 (VPP
is tuning of the same shape and not required to match). The predicted regret of a row is how much faster the
model says the planner's top pick runs than the published layout (typed in as published, the same run features):
top pick tokens/s / published layout's predicted tokens/s - 1; 0 when the published layout is the top pick.

    .venv/bin/python bench/calibration/published_top3.py     # writes published_top3.md here
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.estimate import EstimateOptions, estimate
from megapilot.estimate.published import PublishedLayout, catalog_model, enter_published_run
from megapilot.plan import plan, search_layouts
from megapilot.plan.cost import CostModel
from megapilot.plan.planner import cross_domain_dispatcher, distinct_shapes
from megapilot.plan.search import rank_key
from megapilot.spec import ClusterSpec, ModelSpec, TrainingSpec

Shape = tuple[int, int, int, int, bool]

DATA = ROOT / "tests" / "data" / "calibration"
OUT = Path(__file__).resolve().parent / "published_top3.md"


# Rows published from NVIDIA's performance recipes (NeMo, Megatron-Bridge), which set grad_reduce_in_fp32=False.
BF16_GRADIENT_PUBLISHERS = ("nemo-", "bridge-")


def _options(row: PublishedLayout) -> EstimateOptions:
    return EstimateOptions(grad_reduce_in_bf16=row.id.startswith(BF16_GRADIENT_PUBLISHERS))


def _shape(tp: int, pp: int, cp: int, ep: int, fsdp: bool) -> Shape:
    return tp, pp, cp, ep, fsdp


def _speed_only_top3(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                     options: EstimateOptions) -> list[Shape]:
    """The top 3 shapes by predicted speed alone (the search's own order, no recipe tie-break)."""
    options = cross_domain_dispatcher(model, cluster, options)[0] or options
    outcome = search_layouts(model, cluster, training, cost=CostModel(model, cluster, training, options=options))
    by_speed = sorted(outcome.best_by_shape.values(), key=lambda fit: rank_key(*fit))
    return [_shape(p.tp, p.pp, p.cp, p.ep, p.fsdp) for p, _ in distinct_shapes(by_speed, 3)]


def _published_tokens_per_s(row: PublishedLayout) -> float | None:
    """The model's tokens/s/GPU for the layout as published (None when it is refused), with the dispatcher the
    planner gives it (flex where its expert group leaves the NVLink domain), so the regret compares like with
    like."""
    try:
        case = enter_published_run(row).case
        options, _ = cross_domain_dispatcher(case.model, case.cluster, _options(row))
        return estimate(case.model, case.cluster, case.training, case.parallel, options or _options(row),
                        allow_tp_across_nodes=case.allow_tp_across_nodes).tokens_per_s_per_gpu
    except MegapilotError:
        return None


def _pct(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{100 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f} %" if ordered else "-"


def main() -> int:
    lines = ["| row | published TP/PP/CP/EP/FSDP | planner top 3 | hit | by speed alone | predicted regret |",
             "|---|---|---|---|---|---|"]
    hits = speed_hits = total = 0
    newer_hits = newer_total = 0
    regrets: list[float] = []
    for name in ("published_calibration.json", "published_calibration_2025.json"):
        for raw in json.loads((DATA / name).read_text()):
            row = PublishedLayout.from_row(raw)
            if not row.has_layout:
                continue
            total += 1
            model = catalog_model(row)
            want = _shape(row.tp or 1, row.pp or 1, row.cp or 1, (row.ep or 1) if model.moe else 1, row.fsdp)
            gemm = row.gemm_precision
            cluster = ClusterSpec.from_gpu_count(get_gpu(row.gpu), row.num_gpus)
            training = TrainingSpec(seq_length=row.seq_len, global_batch_size=row.gbs or 1, precision=gemm.precision,
                                    **({"fp8_recipe": gemm.fp8_recipe} if gemm.fp8_recipe else {}))
            try:
                result = plan(model, cluster, training, top=3, options=_options(row))
            except MegapilotError as refusal:
                lines.append(f"| {row.id[:60]} | {want} | refused: {str(refusal)[:90]} | no | no | - |")
                newer_total += name.endswith("2025.json")
                continue
            got = [_shape(c.parallel.tp, c.parallel.pp, c.parallel.cp, c.parallel.ep, c.parallel.fsdp)
                   for c in result.candidates]
            hit, speed_hit = want in got, want in _speed_only_top3(model, cluster, training, _options(row))
            hits += hit
            speed_hits += speed_hit
            newer_total += name.endswith("2025.json")
            newer_hits += hit and name.endswith("2025.json")
            published = _published_tokens_per_s(row)
            regret = None if published is None else \
                max(0.0, result.candidates[0].estimate.tokens_per_s_per_gpu / published - 1)
            if got[0] == want:
                regret = 0.0
            if regret is not None:
                regrets.append(regret)
            lines.append(f"| {row.id[:60]} | {want} | {'; '.join(map(str, got))} | {'yes' if hit else 'no'} | "
                         f"{'yes' if speed_hit else 'no'} | "
                         f"{'-' if regret is None else f'{100 * regret:.1f} %'} |")
    head = [
        "# Published layouts in the planner's top 3",
        "",
        "Generated by `bench/calibration/published_top3.py`: every row of both calibration files that prints a",
        "layout, planned with its model, GPU count, sequence, global batch and precision (and bf16 gradient",
        "reduction for the NeMo / Megatron-Bridge rows, as their recipes run). Layouts predicted within the",
        "model's own error of the fastest are ordered by the recipe preferences of `megapilot/plan/preferences.py`.",
        "",
        f"**{hits} of {total} published layouts ({100 * hits / total:.0f} %) are in the top 3.** By predicted",
        f"speed alone (the same search without the tie-break): {speed_hits} of {total} "
        f"({100 * speed_hits / total:.0f} %). The newer file (NeMo 25.02 - Megatron-Bridge 25.09): {newer_hits} of "
        f"{newer_total} ({100 * newer_hits / max(newer_total, 1):.0f} %).",
        "",
        f"Predicted regret (top pick over the published layout, by the model's own numbers) over {len(regrets)} "
        f"rows: median {_pct(regrets, 0.5)}, p90 {_pct(regrets, 0.9)}; the model's own error here is 5-10 % "
        "(results.md), so a regret below it is a tie.",
        "",
    ]
    OUT.write_text("\n".join(head + lines) + "\n")
    print(*head[-5:-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
