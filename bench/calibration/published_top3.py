"""Does the planner find the published layouts? Every row of both calibration files that prints a layout is
planned on its own model, GPUs, sequence, batch and precision, with the publisher's run features (NeMo and
Megatron-Bridge performance recipes reduce gradients in bf16, `grad_reduce_in_fp32=False`; the papers and the
Megatron-LM README keep fp32); a hit is the published TP, PP, CP, EP and FSDP among the planner's top 3 (VPP
is tuning of the same shape and not required to match). The predicted regret of a row is how much faster the
model says the planner's top pick runs than the published layout (typed in as published, the same run features):
top pick tokens/s / published layout's predicted tokens/s - 1; 0 when the published layout is the top pick.

Beside the planner's own figure, the same searches are re-ordered with variants of the tie-break
(`VARIANTS`: the rules a reader might expect, each a general rule, none naming a model), so the figures behind the
choice of rules in `megapilot/plan/preferences.py` are reproducible; and the CLI's wall time on the planner's two
latency cases (Llama 3.1 405B on 16,384 H100s, DeepSeek-V3 on 2,048 H100s; best of 3, imports included).

    .venv/bin/python bench/calibration/published_top3.py     # writes published_top3.md here
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.estimate import estimate
from megapilot.estimate.published import (
    BF16_GRADIENT_PUBLISHERS,
    PublishedLayout,
    catalog_model,
    enter_published_run,
    parenthesized_run,
    short_id,
)
from megapilot.plan import plan, search_layouts
from megapilot.plan.cost import CostModel
from megapilot.plan.planner import cross_domain_dispatcher, model_error_band
from megapilot.plan.preferences import PREFERENCES, ErrorBand, LayoutContext, Preference, order_by_recipe
from megapilot.plan.search import Fit, rank_key
from megapilot.spec import ClusterSpec, ModelSpec, TrainingSpec

Shape = tuple[int, int, int, int, bool]

DATA = ROOT / "tests" / "data" / "calibration"
OUT = Path(__file__).resolve().parent / "published_top3.md"


def _shape(tp: int, pp: int, cp: int, ep: int, fsdp: bool) -> Shape:
    return tp, pp, cp, ep, fsdp


def _log2(x: float) -> float:
    return math.log2(max(x, 1))


def _rule(name: str, penalty: Callable[[Fit, LayoutContext], float]) -> Preference:
    return Preference(name, name, "variant", penalty)


def _replace(rules: Sequence[Preference], name: str, new: Preference, after: bool = False) -> tuple[Preference, ...]:
    """`rules` with `new` inserted before (or after) the rule called `name`."""
    out: list[Preference] = []
    for rule in rules:
        if rule.name == name and not after:
            out.append(new)
        out.append(rule)
        if rule.name == name and after:
            out.append(new)
    return tuple(out)


WITHOUT_HEADROOM = tuple(r for r in PREFERENCES if r.name != "memory headroom")
SMALLER_GROUP = _rule("smaller TP×PP", lambda f, c: _log2(f.parallel.tp * f.parallel.pp))
SMALLER_TP = _rule("smaller TP", lambda f, c: _log2(f.parallel.tp))
SHALLOWER_PP = _rule("shallower PP (TP first)", lambda f, c: _log2(f.parallel.pp))
TP_FILLS_DOMAIN = _rule("TP fills the NVLink domain before PP",
                        lambda f, c: _log2(f.parallel.pp) if f.parallel.tp < min(8, c.nvlink_gpus) else 0.0)

def _fsdp_on_rack_scale_nvlink(fit: Fit, ctx: LayoutContext) -> float:
    """The FSDP rule as the 25.07 / 25.09 GB200 recipes read (Llama 3.1 405B on 128 and 256 GPUs under FSDP): a dense
    model's FSDP is not held against it on a rack-scale NVLink domain (NVL72), whatever the job's size."""
    return float(fit.parallel.fsdp and (ctx.num_experts is not None or not (ctx.one_domain or ctx.nvlink_gpus >= 64)))


FSDP_ON_RACKS = tuple(replace(rule, penalty=_fsdp_on_rack_scale_nvlink) if rule.name == "distributed optimizer"
                      else rule for rule in PREFERENCES)

# Tie-break variants scored on the same searches: (label, rules, whether a layout's FSDP twin counts as distinct).
VARIANTS: tuple[tuple[str, tuple[Preference, ...], bool], ...] = (
    ("the planner's rules", PREFERENCES, True),
    ("no tie-break (speed alone)", (), True),
    ("without the lighter-recompute rule (full recompute tied with the rest)",
     tuple(r for r in PREFERENCES if r.name != "lighter recompute"), True),
    ("the previous round's rules (smaller TP×PP, then smaller TP; no headroom, no exotic flags)",
     tuple(r for r in PREFERENCES if r.name not in ("memory headroom", "fewer exotic flags", "lighter recompute"))
     + (SMALLER_GROUP, SMALLER_TP), True),
    ("+ smaller TP×PP, then smaller TP, after the headroom", PREFERENCES + (SMALLER_GROUP, SMALLER_TP), True),
    ("without the headroom rule", WITHOUT_HEADROOM, True),
    ("+ shallower PP (TP first) before the dimension count",
     _replace(PREFERENCES, "fewer parallel dimensions", SHALLOWER_PP), True),
    ("+ shallower PP (TP first) after CP", _replace(PREFERENCES, "context parallelism", SHALLOWER_PP, True), True),
    ("+ TP fills the NVLink domain before PP, after CP",
     _replace(PREFERENCES, "context parallelism", TP_FILLS_DOMAIN, True), True),
    ("FSDP not held against a dense model on a rack-scale NVLink domain", FSDP_ON_RACKS, True),
    ("the planner's rules, FSDP twin not distinct (never the same TP/PP/CP/EP twice)", PREFERENCES, False),
)


def _variant_top3(by_speed: list[Fit], band_fraction: float, context: LayoutContext, rules: Sequence[Preference],
                  fsdp_distinct: bool) -> list[Shape]:
    ordered = order_by_recipe(by_speed, ErrorBand(band_fraction, ""), context, rules) if rules else by_speed
    seen: list[tuple[int, ...]] = []
    shapes: list[Shape] = []
    for p, _ in ordered:
        key = (p.tp, p.pp, p.cp, p.ep, p.fsdp) if fsdp_distinct else (p.tp, p.pp, p.cp, p.ep)
        if key not in seen:
            seen.append(key)
            shapes.append(_shape(p.tp, p.pp, p.cp, p.ep, p.fsdp))
        if len(shapes) == 3:
            break
    return shapes


def _variants(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> list[list[Shape]]:
    """Each variant's top 3 shapes, from one search with the planner's options and error band."""
    options = cross_domain_dispatcher(model, cluster, None)[0]
    band = model_error_band(model, cluster, training)
    outcome = search_layouts(model, cluster, training, cost=CostModel(model, cluster, training, options=options),
                             reach=band.fraction)
    by_speed = sorted(outcome.best_by_shape.values(), key=lambda fit: rank_key(*fit))
    context = LayoutContext.of(model, cluster)
    return [_variant_top3(by_speed, band.fraction, context, rules, distinct) for _, rules, distinct in VARIANTS]


def _published_tokens_per_s(row: PublishedLayout) -> float | None:
    """The model's tokens/s/GPU for the layout as published (None when it is refused), with the dispatcher the
    planner gives it (flex where its expert group leaves the NVLink domain), so the regret compares like with
    like."""
    try:
        case = enter_published_run(row).case
        options, _ = cross_domain_dispatcher(case.model, case.cluster, case.options)
        return estimate(case.model, case.cluster, case.training, case.parallel, options or case.options,
                        allow_tp_across_nodes=case.allow_tp_across_nodes).tokens_per_s_per_gpu
    except MegapilotError:
        return None


def _pct(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{100 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f} %" if ordered else "-"


@dataclass
class Tally:
    """Hits and regrets of one set of rows."""

    rows: int = 0
    hits: int = 0
    variant_hits: list[int] = field(default_factory=lambda: [0] * len(VARIANTS))
    regrets: list[float] = field(default_factory=list)

    def share(self, hits: int) -> str:
        return f"{hits} of {self.rows} ({100 * hits / max(self.rows, 1):.0f} %)"


# The planner's latency cases (bench/plan_latency): the CLI as a user runs it.
CLI_CASES = (
    ("Llama 3.1 405B on 16,384 H100s", ["--model", "llama3.1-405b", "--gpu", "h100", "--gpus", "16384",
                                        "--seq-len", "8192", "--gbs", "2048"]),
    ("DeepSeek-V3 on 2,048 H100s", ["--model", "deepseek-v3", "--gpu", "h100", "--gpus", "2048",
                                    "--seq-len", "4096", "--gbs", "15360"]),
)


def _cli_seconds(args: list[str]) -> tuple[float, float]:
    """Best of 3 (wall, CPU) seconds of `megapilot plan` (a fresh interpreter each, imports included). The CPU
    seconds (user + system of the child) are what the command costs; the wall time also counts the waits of a
    shared machine."""
    walls, cpus = [], []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "megapilot", "plan", *args, "--top", "5"], check=True,
                       capture_output=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls), min(cpus)


def _latency_line(label: str, args: list[str]) -> str:
    wall_s, cpu_s = _cli_seconds(args)
    return f"- {label}: {wall_s:.2f} s wall, {cpu_s:.2f} CPU-s"


def _check(row: PublishedLayout, these: Sequence[Tally]) -> str:
    """Plan the row's model, GPUs, sequence, batch and precision; count in `these` whether the published shape is
    among the top 3 (and by each tie-break variant); its line of the report."""
    for tally in these:
        tally.rows += 1
    model = catalog_model(row)
    want = _shape(row.tp or 1, row.pp or 1, row.cp or 1, (row.ep or 1) if model.moe else 1, row.fsdp)
    gemm = row.gemm_precision
    cluster = ClusterSpec.from_gpu_count(get_gpu(row.gpu), row.num_gpus)
    training = TrainingSpec(seq_length=row.seq_len, global_batch_size=row.gbs or 1, precision=gemm.precision,
                            grad_reduce_in_bf16=row.id.startswith(BF16_GRADIENT_PUBLISHERS),
                            **({"fp8_recipe": gemm.fp8_recipe} if gemm.fp8_recipe else {}))
    try:
        result = plan(model, cluster, training, top=3)
    except MegapilotError as refusal:
        return f"| {row.id[:60]} | {want} | refused: {str(refusal)[:90]} | no | no | - |"
    got = [_shape(c.parallel.tp, c.parallel.pp, c.parallel.cp, c.parallel.ep, c.parallel.fsdp)
           for c in result.candidates]
    variants = _variants(model, cluster, training)
    hit, speed_hit = want in got, want in variants[1]
    published = _published_tokens_per_s(row)
    regret = None if published is None else \
        max(0.0, result.candidates[0].estimate.tokens_per_s_per_gpu / published - 1)
    if got[0] == want:
        regret = 0.0
    for tally in these:
        tally.hits += hit
        for index, top3 in enumerate(variants):
            tally.variant_hits[index] += want in top3
        if regret is not None:
            tally.regrets.append(regret)
    return (f"| {short_id(row.id, 60)} | {want} | {'; '.join(map(str, got))} | {'yes' if hit else 'no'} | "
            f"{'yes' if speed_hit else 'no'} | {'-' if regret is None else f'{100 * regret:.1f} %'} |")


def main() -> int:
    lines = ["| row | published TP/PP/CP/EP/FSDP | planner top 3 | hit | by speed alone | predicted regret |",
             "|---|---|---|---|---|---|"]
    tallies = {"all": Tally(), "older": Tally(), "newer": Tally(), "parenthesized": Tally()}
    beside = []
    for name in ("published_calibration.json", "published_calibration_2025.json"):
        for raw in json.loads((DATA / name).read_text()):
            row = PublishedLayout.from_row(raw)
            if not row.has_layout:
                continue
            lines.append(_check(row, (tallies["all"], tallies["newer" if name.endswith("2025.json") else "older"])))
            other = parenthesized_run(raw)
            if other is not None:
                beside.append(PublishedLayout.from_row(other.row))
    # the other FP8 granularity the newer tables print in parentheses (MXFP8, blockwise), kept out of the headline
    lines += [_check(row, (tallies["parenthesized"],)) for row in beside]
    every, older, newer, aside = tallies["all"], tallies["older"], tallies["newer"], tallies["parenthesized"]
    summary = (f"**{every.share(every.hits)} published layouts are in the top 3; the newer file (NeMo 25.02 - "
               f"Megatron-Bridge 25.09): {newer.share(newer.hits)}; the older file (papers, Megatron-LM README, NeMo "
               f"24.07): {older.share(older.hits)}.** The runs the newer tables print in parentheses (MXFP8 on "
               f"Blackwell, blockwise FP8 on H100, at their own layouts): {aside.share(aside.hits)}.")
    head = [
        "# Published layouts in the planner's top 3",
        "",
        "Generated by `bench/calibration/published_top3.py`: every row of both calibration files that prints a",
        "layout, planned with its model, GPU count, sequence, global batch and precision (and bf16 gradient",
        "reduction for the NeMo / Megatron-Bridge rows, as their recipes run). Layouts predicted within the",
        "model's own error of the fastest are ordered by the recipe preferences of `megapilot/plan/preferences.py`.",
        "",
        summary,
        "",
        "Predicted regret (top pick over the published layout, by the model's own numbers): "
        + "; ".join(f"{label} median {_pct(t.regrets, 0.5)}, p90 {_pct(t.regrets, 0.9)} over {len(t.regrets)} rows"
                    for label, t in (("all", every), ("newer", newer), ("older", older)))
        + ". The model's own error here is 5-10 % (results.md), so a regret below it is a tie.",
        "",
        "Tie-break variants on the same searches (the published layout in the top 3):",
        "",
        "| variant | all | newer file | older file |",
        "|---|---|---|---|",
        *[f"| {label} | {every.share(every.variant_hits[i])} | {newer.share(newer.variant_hits[i])} | "
          f"{older.share(older.variant_hits[i])} |" for i, (label, _, _) in enumerate(VARIANTS)],
        "",
        "Plan latency, `megapilot plan ... --top 5` from the shell (best of 3, a fresh interpreter each, imports "
        f"included; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs when measured; bench/plan_latency "
        "times `plan()` alone):",
        "",
        *[_latency_line(label, args) for label, args in CLI_CASES],
        "",
    ]
    OUT.write_text("\n".join(head + lines) + "\n")
    print("\n".join(head))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
