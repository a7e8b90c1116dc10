"""Calibration of the step-time model on published Megatron runs: row rules, prediction, fit, hold-out.

The committed `efficiency.CALIBRATED` parameters come from here (`bench/calibration/run.py` reads the
published rows, calls `calibration_rows`, `fit` and the hold-out checks, and writes its results).
No I/O: callers parse the published JSON into `PublishedRun` records.

For every usable row the estimator gets the row's model dimensions, GPU, GPU count, TP/PP/VPP/CP,
global batch, sequence length and precision, and predicts TFLOP/s/GPU. That figure is converted to the
FLOP convention the publisher used (see `PUBLISHER_CONVENTION`), then compared with the published one.

Rules for what a row does not state (the same for every row):
- micro-batch size: 1 (the most common published choice for these model sizes; choosing the size the
  model itself predicts fastest was tried and fits worse: median 7.8 % vs 4.2 %);
- recompute: the lightest of none / selective / full that fits by megapilot's memory model (rows of
  the 2021-22 papers state it);
- TP/PP of Narayanan Table 2 rows: TP 8 and PP = model-parallel size / 8 (the paper's heuristic);
- VPP and CP: 1; sequence parallel: on when TP > 1 except for the 2021 paper and the 2022 paper's
  full-recompute baselines (which predate / exclude it); distributed optimizer, communication
  overlap and flash attention: on for the 2024 Megatron README and NeMo runs, off for the 2021-22 papers (their
  Megatron-LM wrote the s x s attention scores to HBM, `step_time._unfused_attention_core_s`); NeMo's
  performance recipes keep and reduce gradients in bf16;
- architecture: "LLAMA" rows SwiGLU + RMSNorm, others a non-gated MLP; FFN 4h and MHA when not given.
Excluded: fine-tuning rows (SFT on packed sequences, LoRA with frozen weights - other FLOP accounting)
and rows without a global batch or any throughput figure.

Newer releases (`ReleaseRow`): the NeMo 25.02 - 25.09 / Megatron-Bridge tables print tokens/s/GPU and
the layout; each row is typed in as published (`megapilot.estimate.published`) and predicted in tokens/s.

Fit: least squares on log(predicted / published) - TFLOP/s for the older rows, tokens/s for the release
rows - over the six `EfficiencyParams` with a small Nelder-Mead; a parameter no training row can identify
(the FP8 GEMM fraction without FP8 rows, the grouped-GEMM fraction without MoE rows) stays at the prior.
Hold-out: by release (`TRAIN_RELEASES`: fit on the papers, NeMo 24.07, 25.02 and 25.04; judge on 25.07 and
25.09), leave-one-source-out over both files, and a seeded k-fold split.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from megapilot.case_flags import SPLIT_FIELDS
from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.estimate.cases import Case
from megapilot.estimate.coverage import family_of, precision_class
from megapilot.estimate.efficiency import EfficiencyParams
from megapilot.estimate.flops import flops_per_token
from megapilot.estimate.memory import memory_per_gpu
from megapilot.estimate.published import PublishedLayout, parenthesized_twin
from megapilot.estimate.step_time import EstimateOptions, step_time
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, TrainingSpec, validate_layout
from megapilot.spec.model import MlpActivation
from megapilot.spec.parallel import Recompute

# Physically motivated starting point (not fitted): large-GEMM efficiency ~75 % of BF16 peak, ~55 %
# of FP8 peak; half efficiency at 0.3 x the roofline ridge; glue moves ~3 x the stored activations;
# flash attention at ~50 % of BF16 peak; each kernel costs the 0.9 us launch gap NVIDIA measured between
# back-to-back kernels (latency.py).
PRIOR = EfficiencyParams(
    gemm_peak_fraction_16bit=0.75,
    gemm_peak_fraction_8bit=0.55,
    ridge_multiplier=0.3,
    elementwise_passes=3.0,
    attention_peak_fraction=0.5,
    grouped_gemm_fraction=0.8,
    kernel_overhead_s=0.9e-6,
)
PARAM_NAMES = tuple(asdict(PRIOR))
# Physical ranges the fit must stay in (so that it cannot buy accuracy with impossible values):
# GEMM and flash-attention kernels reach 30-95 % of peak; the glue moves between 0.5 and 6 times the
# stored activations; the GEMM half-efficiency point lies within 0.01-3 ridges; a kernel's fixed cost on the
# GPU lies between the bare launch gap (0.5 us) and 5 us, a short kernel's whole launch-to-drain time (NVIDIA's
# 3.8 us per back-to-back 2.9 us kernel, latency.py, and its first wave's memory latency): more would be the
# host's dispatch, which a host running ahead hides behind long kernels.
# The flash-attention fraction's floor is cuDNN's measured rate, the kernel Transformer Engine runs on Hopper and
# Blackwell: on H100 at head dim 128 its forward runs 617 / 600 TFLOP/s and its backward 465 / 518 (counted at 2.5x
# the forward's FLOPs) at 2K / 8K tokens (FlashAttention-3, Shah et al. 2024, Figs. 5 and 7), 0.43 / 0.47 of the
# BF16 peak in Megatron's three-pass count; every flash row runs 2K tokens or more. Blackwell's backward waits on its
# shared memory beyond that (attention_bounds.backward_smem_bound), not on a lower fraction.
BOUNDS = {
    "gemm_peak_fraction_16bit": (0.3, 0.95),
    "gemm_peak_fraction_8bit": (0.3, 0.95),
    "ridge_multiplier": (0.01, 3.0),
    "elementwise_passes": (0.5, 6.0),
    "attention_peak_fraction": (0.43, 0.95),
    "grouped_gemm_fraction": (0.3, 1.0),  # a grouped GEMM never beats the dense GEMM of its shape
    "kernel_overhead_s": (0.5e-6, 5e-6),
}
OUT_OF_BOUNDS_LOSS = 1e9  # what the fit sees for parameters outside BOUNDS: worse than any real fit

SOURCES = ("narayanan2021", "korthikanti2022", "megatron-readme", "nemo-24.07")
PublisherConvention = Literal["narayanan_eq3", "megatron_full_attention"]
# How each publisher counted the FLOPs behind its TFLOP/s (planner_formulas.md Sec. 1-3, 5).
PUBLISHER_CONVENTION: dict[str, PublisherConvention] = {
    "narayanan2021": "narayanan_eq3",  # 96 B s l h^2 (1 + s/6h + V/16lh): full attention + recompute pass
    "korthikanti2022": "megatron_full_attention",  # 72 B L s h^2 (1 + s/6h + V/12hL)
    "megatron-readme": "megatron_full_attention",  # core r0.8.0
    "nemo-24.07": "megatron_full_attention",  # flops_convention_check: ratio to full = 1.000
}
MODERN = {"megatron-readme", "nemo-24.07"}
# Hold-out by release: the newer file's releases the fit may see; the later ones are judged.
TRAIN_RELEASES = ("25.02", "25.04")


# ---- the published records ------------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PublishedMeasurement(_Record):
    tflops_per_gpu: float | None = None
    step_time_s: float | None = None


class FlopConventionCheck(_Record):
    megatron_style_flops_per_token_full_attention: float | None = None


class PublishedDerived(_Record):
    flops_convention_check: FlopConventionCheck | None = None


class PublishedRun(PublishedLayout):
    """One row of the published calibration file: its layout, and what the calibration also reads."""

    # The calibration rows all state their model's shape and precision (`PublishedLayout` allows gaps).
    layers: int
    hidden: int
    heads: int
    vocab: int
    precision: str
    task: str
    recompute: str | None = None
    notes: list[str] = Field(default_factory=list)
    measured: PublishedMeasurement
    derived: PublishedDerived = Field(default_factory=PublishedDerived)


@dataclass(frozen=True)
class CalibrationRow:
    """A published run as the estimator sees it, with the figure it must predict."""

    id: str
    source: str
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    base: ParallelConfig  # mbs / recompute still to choose when `choose_mbs` / `choose_recompute`
    choose_mbs: bool
    choose_recompute: bool
    options: EstimateOptions
    published_tflops: float
    publisher_check_flops_per_token: float | None


class Excluded(NamedTuple):
    """A published run left out of the calibration, and why."""

    id: str
    reason: str


def source_of(row_id: str) -> str:
    for source in SOURCES:
        if row_id.startswith(source):
            return source
    raise ValueError(row_id)


def build_model(run: PublishedRun) -> ModelSpec:
    name, h = run.model, run.hidden
    llama = "llama" in name.lower()
    activation: MlpActivation = "swiglu" if llama else ("squared_relu" if "nemotron" in name.lower() else "gelu")
    return ModelSpec(
        name=name, num_layers=run.layers, hidden_size=h, ffn_hidden_size=run.ffn_hidden or 4 * h,
        num_attention_heads=run.heads, num_query_groups=run.kv_heads if run.kv_heads != run.heads else None,
        vocab_size=run.vocab, max_position_embeddings=run.seq_len, mlp_activation=activation,
        normalization="RMSNorm" if llama else "LayerNorm",
    )


def _model_parallel_size(run: PublishedRun) -> int:
    for note in run.notes:
        found = re.search(r"model-parallel size \(tp\*pp\) = (\d+)", note)
        if found:
            return int(found.group(1))
    raise ValueError(f"{run.id}: no TP/PP")


def _stated_recompute(run: PublishedRun) -> Recompute | None:
    text = (run.recompute or "").lower()
    return "selective" if "selective" in text else ("full" if "full" in text else None)


def _published_tflops(run: PublishedRun, model: ModelSpec) -> float:
    """The published TFLOP/s/GPU; Korthikanti Table 5 gives an iteration time instead (full attention)."""
    if run.measured.tflops_per_gpu is not None:
        return run.measured.tflops_per_gpu
    if run.measured.step_time_s is None or run.gbs is None:
        raise ValueError(f"{run.id}: no throughput figure")
    per_token = flops_per_token(model, run.seq_len, convention="megatron_full_attention").total
    return per_token * run.seq_len * run.gbs / (run.measured.step_time_s * run.num_gpus) / 1e12


def build_row(run: PublishedRun) -> CalibrationRow:
    source = source_of(run.id)
    tp, pp = run.tp, run.pp
    if tp is None or pp is None:
        tp, pp = 8, _model_parallel_size(run) // 8
    cp = run.cp or 1
    recompute = _stated_recompute(run)
    modern = source in MODERN
    base = ParallelConfig(
        tp=tp, pp=pp, vpp=run.vp or 1, cp=cp, dp=run.num_gpus // (tp * pp * cp), mbs=run.mbs or 1,
        sequence_parallel=tp > 1 and (modern or recompute == "selective"), recompute=recompute or "none",
        distributed_optimizer=modern,
    )
    options = EstimateOptions(tp_comm_overlap=modern, overlap_grad_reduce=modern, overlap_param_gather=modern,
                              flash_attention=modern)
    model = build_model(run)
    check = run.derived.flops_convention_check
    assert run.gbs is not None  # calibration_rows excludes rows without a global batch
    return CalibrationRow(
        id=run.id, source=source, model=model,
        cluster=ClusterSpec.from_gpu_count(get_gpu(run.gpu), run.num_gpus),
        training=TrainingSpec(
            seq_length=run.seq_len, global_batch_size=run.gbs,
            precision="fp8" if "fp8" in run.precision.lower() else "bf16",
            grad_reduce_in_bf16=source == "nemo-24.07",  # the NeMo performance recipes keep gradients in bf16
        ),
        base=base, choose_mbs=run.mbs is None, choose_recompute=recompute is None, options=options,
        published_tflops=_published_tflops(run, model),
        publisher_check_flops_per_token=None if check is None else check.megatron_style_flops_per_token_full_attention,
    )


def _exclusion_reason(run: PublishedRun) -> str | None:
    if run.task != "pretrain":
        return f"{run.task}: fine-tuning FLOP accounting differs (packed sequences / frozen weights)"
    if run.gbs is None:
        return "global batch not published"
    if run.measured.tflops_per_gpu is None and run.measured.step_time_s is None:
        return "no TFLOP/s or step time published"
    return None


def calibration_rows(runs: Iterable[PublishedRun]) -> tuple[list[CalibrationRow], list[Excluded]]:
    """The usable rows, and the others with the reason each was left out."""
    rows: list[CalibrationRow] = []
    excluded: list[Excluded] = []
    for run in runs:
        reason = _exclusion_reason(run)
        if reason is None:
            try:
                row = build_row(run)
                validate_layout(row.model, row.cluster, row.training, row.base)
                rows.append(row)
                continue
            except MegapilotError as exc:
                reason = f"layout rejected: {exc}"
        excluded.append(Excluded(run.id, reason))
    return rows, excluded


# ---- the newer releases' rows ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseRow:
    """A NeMo 25.xx / Megatron-Bridge row as the estimator sees it (typed in as published), and its figure."""

    id: str
    source: str  # "nemo-25.02" ... "bridge-25.09"
    release: str  # "25.02" ...
    family: str  # dense / moe / hybrid
    case: Case
    published_tokens_per_s: float


def release_source(row_id: str) -> str:
    """`nemo-25.02-DGX-B200-...` -> `nemo-25.02`; `bridge-25.09-pretrain-...` -> `bridge-25.09`."""
    parts = row_id.split("-")
    if len(parts) < 2 or not re.fullmatch(r"\d\d\.\d\d", parts[1]):
        raise ValueError(f"{row_id}: no release in the id")
    return f"{parts[0]}-{parts[1]}"


def release_row(row_id: str, case: Case, published_tokens_per_s: float) -> ReleaseRow:
    source = release_source(row_id)
    return ReleaseRow(row_id, source, source.split("-")[1], family_of(case.model), case, published_tokens_per_s)


def same_layout_repeats(rows: Iterable[ReleaseRow]) -> set[str]:
    """Ids of the parenthesized runs (`published.parenthesized_run`) that ran their twin's layout: one layout
    measured again in another FP8 granularity, its error all but its twin's. The coverage cells pool the FP8
    recipes, so they count such a layout once (its twin's): one run's miss must not stand for two. The layout is
    the printed one: what the typing chose beside it (the recompute that fits, the balanced pipeline split, each
    priced on the run's own format) does not make a second layout."""
    rows = list(rows)
    by_id = {r.id: r for r in rows}
    repeats = set()
    for row in rows:
        twin = by_id.get(parenthesized_twin(row.id) or "")
        if twin is not None and _printed(twin.case.parallel) == _printed(row.case.parallel):
            repeats.add(row.id)
    return repeats


# What the performance tables do not print, and the typing fills in (`published.enter_published_run`).
_UNPRINTED = dict.fromkeys((*SPLIT_FIELDS, "recompute_modules", "recompute_num_layers"))


def _printed(p: ParallelConfig) -> ParallelConfig:
    """The layout as a table prints it: no recompute and Megatron's even split (the rest as typed)."""
    return p.model_construct(**(p.model_dump() | _UNPRINTED | {"recompute": "none"}))


def release_error(row: ReleaseRow, params: EfficiencyParams) -> float:
    """Predicted / published tokens/s/GPU - 1 (the estimate a user gets, with these parameters)."""
    c = row.case
    result = step_time(c.model, c.cluster, c.training, c.parallel, replace(c.options, efficiency=params))
    return result.tokens_per_s_per_gpu / row.published_tokens_per_s - 1


def split_by_release(release: Iterable[ReleaseRow]) -> tuple[list[ReleaseRow], list[ReleaseRow]]:
    """(rows the fit may see: `TRAIN_RELEASES`, rows judged: every later release)."""
    rows = list(release)
    return [r for r in rows if r.release in TRAIN_RELEASES], [r for r in rows if r.release not in TRAIN_RELEASES]


# ---- prediction -------------------------------------------------------------------------------------


def publisher_flops_per_token(row: CalibrationRow) -> float:
    parts = flops_per_token(row.model, row.training.seq_length, convention="megatron_full_attention", tp=row.base.tp)
    if PUBLISHER_CONVENTION[row.source] == "narayanan_eq3":
        return parts.layers * 4 / 3 + parts.logits  # the recompute forward of every layer counted too
    return parts.total


def resolve_layout(row: CalibrationRow) -> tuple[ParallelConfig, bool]:
    """Apply the stated rules for unpublished micro-batch size and recompute; returns (layout, fits)."""
    mbs = 1 if row.choose_mbs else row.base.mbs
    choices: tuple[Recompute, ...] = ("none", "selective", "full") if row.choose_recompute else (row.base.recompute,)
    layout = row.base
    for recompute in choices:
        layout = row.base.model_copy(update={"mbs": mbs, "recompute": recompute})
        memory = memory_per_gpu(row.model, row.training, layout, row.cluster.gpu.hbm_gib,
                                architecture=row.cluster.gpu.architecture)
        if memory.fits:
            return layout, True
    return layout, False


def predicted_publisher_tflops(row: CalibrationRow, layout: ParallelConfig, params: EfficiencyParams) -> float:
    result = step_time(row.model, row.cluster, row.training, layout, replace(row.options, efficiency=params))
    flops = publisher_flops_per_token(row) * row.training.tokens_per_step
    return flops / (result.step_time_s * row.cluster.world_size) / 1e12


Layouts = dict[str, ParallelConfig]  # row id -> the layout resolved for it


def errors(rows: list[CalibrationRow], layouts: Layouts, params: EfficiencyParams) -> dict[str, float]:
    """Predicted / published TFLOP/s/GPU - 1 for every row, by row id."""
    return {row.id: predicted_publisher_tflops(row, layouts[row.id], params) / row.published_tflops - 1 for row in rows}


# ---- fitting ----------------------------------------------------------------------------------------


def _params_from(free: tuple[str, ...], vector: list[float]) -> EfficiencyParams | None:
    """Parameters with the `free` ones taken from `vector` and the rest at the prior; None out of bounds."""
    values = asdict(PRIOR) | dict(zip(free, vector, strict=True))
    if any(not low <= values[k] <= high for k, (low, high) in BOUNDS.items()):
        return None
    return EfficiencyParams(**values)


def identifiable(rows: list[CalibrationRow], release: Iterable[ReleaseRow] = ()) -> tuple[str, ...]:
    """The parameters the rows can pin down: the 8-bit GEMM fraction needs an FP8 row, the grouped-GEMM
    fraction a MoE row."""
    release = list(release)
    has_8bit = any(row.training.precision != "bf16" for row in rows) or any(
        row.case.training.precision != "bf16" for row in release)
    has_moe = any(row.case.model.moe is not None for row in release)
    has_16bit = any(row.training.precision == "bf16" for row in rows) or any(
        row.case.training.precision == "bf16" for row in release)
    unidentified = set() if has_8bit else {"gemm_peak_fraction_8bit"}
    unidentified |= set() if has_16bit else {"gemm_peak_fraction_16bit"}
    unidentified |= set() if has_moe else {"grouped_gemm_fraction"}
    return tuple(name for name in PARAM_NAMES if name not in unidentified)


def loss(
    rows: list[CalibrationRow], layouts: Layouts, free: tuple[str, ...], vector: list[float],
    release: Iterable[ReleaseRow] = (),
) -> float:
    params = _params_from(free, vector)
    if params is None:
        return OUT_OF_BOUNDS_LOSS
    older = sum(
        math.log(predicted_publisher_tflops(row, layouts[row.id], params) / row.published_tflops) ** 2 for row in rows
    )
    return older + sum(math.log(1 + release_error(row, params)) ** 2 for row in release)


def nelder_mead(
    f: Callable[[list[float]], float], start: list[float], *, iterations: int = 400, step: float = 0.15
) -> list[float]:
    """Plain Nelder-Mead (Nelder & Mead 1965) with relative initial steps; enough for five parameters."""
    n = len(start)
    simplex = [list(start)] + [[x * (1 + step) if i == j else x for j, x in enumerate(start)] for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(p[i] for p in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


FIT_ROUNDS = 8  # Nelder-Mead restarted from its best vertex: a collapsed simplex stalls short of the minimum
FIT_ROUND_GAIN = 1e-4  # a round that lowers the loss by less ends the fit


def fit(rows: list[CalibrationRow], layouts: Layouts, release: Iterable[ReleaseRow] = ()) -> EfficiencyParams:
    """Least squares on log error over the identifiable parameters; the others stay at the prior."""
    release = list(release)
    free = identifiable(rows, release)

    def objective(vector: list[float]) -> float:
        return loss(rows, layouts, free, vector, release)

    vector = [asdict(PRIOR)[name] for name in free]
    best = objective(vector)
    for _ in range(FIT_ROUNDS):
        vector = nelder_mead(objective, vector)
        reached = objective(vector)
        if best - reached < FIT_ROUND_GAIN:
            break
        best = reached
    params = _params_from(free, vector)
    if params is None:  # Nelder-Mead keeps the best vertex, and out-of-bounds vertices never win
        raise ValueError("calibration fit left the parameter bounds")
    return params


# ---- error summaries and hold-out checks ---------------------------------------------------------


class ErrorSummary(NamedTuple):
    median_abs_error: float
    max_abs_error: float
    mean_signed_error: float
    rows: int
    p90_abs_error: float = 0.0


def p90(values: Iterable[float]) -> float:
    """The 90th percentile by the nearest-rank rule (the value 90 % of the list lies at or below)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def summary(errs: list[float]) -> ErrorSummary:
    absolute = [abs(e) for e in errs]
    return ErrorSummary(statistics.median(absolute), max(absolute), statistics.fmean(errs), len(errs), p90(absolute))


class HeldOutSource(NamedTuple):
    """One leave-one-source-out fold: the held-out source's errors and the parameters fitted without it."""

    held_out: ErrorSummary
    fitted: EfficiencyParams
    errors: dict[str, float]  # row id -> predicted / published - 1, the row unseen by the fit


AnyRow = CalibrationRow | ReleaseRow
GroupKey = Callable[[AnyRow], str]


Fitter = Callable[[list[CalibrationRow], Layouts, list[ReleaseRow]], EfficiencyParams]


def leave_group_out(
    rows: list[CalibrationRow], layouts: Layouts, release: Iterable[ReleaseRow], key: GroupKey,
    fitter: Fitter | None = None,
) -> dict[str, HeldOutSource]:
    """For every group `key` names: fit on every other group of both files, predict this one. `fitter` (default
    `fit`) lets a caller run the fits elsewhere, e.g. in parallel, and hand back their parameters."""
    fitter = fitter or fit
    release = list(release)
    result = {}
    every: list[AnyRow] = [*rows, *release]
    for group in dict.fromkeys(key(r) for r in every):
        params = fitter([r for r in rows if key(r) != group], layouts, [r for r in release if key(r) != group])
        held = errors([r for r in rows if key(r) == group], layouts, params) | {
            r.id: release_error(r, params) for r in release if key(r) == group}
        result[group] = HeldOutSource(summary(list(held.values())), params, held)
    return result


def leave_one_source_out(
    rows: list[CalibrationRow], layouts: Layouts, release: Iterable[ReleaseRow] = (), fitter: Fitter | None = None
) -> dict[str, HeldOutSource]:
    """Fit on every other source of both files, predict this one; the held-out errors keep each row's id."""
    return leave_group_out(rows, layouts, release, lambda r: r.source, fitter)


# Model families for the leave-one-family-out split: the first prefix a model's name starts with (Llama 4 is a
# MoE apart from the dense Llama 2/3). A split of the rows, never an input of the model.
MODEL_FAMILIES = ("llama4", "llama", "gpt", "nemotron", "mixtral", "qwen", "deepseek")


def model_family(row: AnyRow) -> str:
    """The family in the published model name (a release row's id names it; its preset may be called otherwise)."""
    if isinstance(row, CalibrationRow):
        name = row.model.name.lower()
        return next((family for family in MODEL_FAMILIES if name.startswith(family)), name.split("-")[0])
    published = row.id.lower().removeprefix(row.source)
    return next((family for family in MODEL_FAMILIES if family in published), row.case.model.name.lower())


def gpu_of(row: AnyRow) -> str:
    return (row.cluster if isinstance(row, CalibrationRow) else row.case.cluster).gpu.name


def leave_one_family_out(
    rows: list[CalibrationRow], layouts: Layouts, release: Iterable[ReleaseRow] = (), fitter: Fitter | None = None
) -> dict[str, HeldOutSource]:
    """Fit without a model family (every GPU, release and precision of it), predict it: a new architecture."""
    return leave_group_out(rows, layouts, release, model_family, fitter)


def leave_one_gpu_out(
    rows: list[CalibrationRow], layouts: Layouts, release: Iterable[ReleaseRow] = (), fitter: Fitter | None = None
) -> dict[str, HeldOutSource]:
    """Fit without a GPU, predict its runs: a machine the parameters never saw."""
    return leave_group_out(rows, layouts, release, gpu_of, fitter)


def k_fold(rows: list[CalibrationRow], layouts: Layouts, *, k: int, release: Iterable[ReleaseRow] = (),
           fitter: Fitter | None = None) -> ErrorSummary:
    """Errors of every row predicted by parameters fitted without its fold (seeded shuffle of both kinds)."""
    fitter = fitter or fit
    shuffled: list[CalibrationRow | ReleaseRow] = [*rows, *release]
    random.Random(0).shuffle(shuffled)
    held_out: list[float] = []
    for fold in range(k):
        test = shuffled[fold::k]
        train = [r for r in shuffled if r not in test]
        params = fitter([r for r in train if isinstance(r, CalibrationRow)], layouts,
                        [r for r in train if isinstance(r, ReleaseRow)])
        held_out += list(errors([r for r in test if isinstance(r, CalibrationRow)], layouts, params).values())
        held_out += [release_error(r, params) for r in test if isinstance(r, ReleaseRow)]
    return summary(held_out)


# ---- the constant-MFU baseline ----------------------------------------------------------------------


def baseline_cell(row: AnyRow) -> tuple[str, str]:
    """(precision class, dense / moe): the cells of the baseline, one MFU each."""
    model, training = (row.model, row.training) if isinstance(row, CalibrationRow) else (row.case.model,
                                                                                         row.case.training)
    return precision_class(training.precision), "moe" if model.moe is not None else "dense"


def row_mfu(row: AnyRow) -> float:
    """The published run's model FLOPs (Megatron convention, causal attention) per second over its precision's peak.
    The older rows' TFLOP/s are turned into tokens/s in their publisher's convention first."""
    if isinstance(row, CalibrationRow):
        model, training, gpu = row.model, row.training, row.cluster.gpu
        tokens_per_s = row.published_tflops * 1e12 / publisher_flops_per_token(row)
    else:
        model, training, gpu = row.case.model, row.case.training, row.case.cluster.gpu
        tokens_per_s = row.published_tokens_per_s
    flops = flops_per_token(model, training.seq_length).total
    return tokens_per_s * flops / (gpu.peak_tflops(training.precision) * 1e12)


@dataclass(frozen=True)
class ConstantMfu:
    """Baseline: every run reaches its cell's median published MFU (cell: precision class x dense / MoE); a
    cell no training row fills falls back to its precision's median, then to every row's."""

    by_cell: dict[tuple[str, str], float]
    by_precision: dict[str, float]
    overall: float

    @classmethod
    def fitted(cls, rows: Iterable[AnyRow]) -> ConstantMfu:
        rows = list(rows)
        cells: dict[tuple[str, str], list[float]] = {}
        for row in rows:
            cells.setdefault(baseline_cell(row), []).append(row_mfu(row))
        precisions: dict[str, list[float]] = {}
        for (precision, _), values in cells.items():
            precisions.setdefault(precision, []).extend(values)
        return cls({k: statistics.median(v) for k, v in cells.items()},
                   {k: statistics.median(v) for k, v in precisions.items()},
                   statistics.median(row_mfu(r) for r in rows))

    def error(self, row: AnyRow) -> float:
        """Predicted / published throughput - 1 (the same in TFLOP/s and tokens/s)."""
        cell = baseline_cell(row)
        mfu = self.by_cell.get(cell, self.by_precision.get(cell[0], self.overall))
        return mfu / row_mfu(row) - 1


def baseline_held_out(rows: Iterable[AnyRow], key: GroupKey) -> dict[str, float]:
    """The baseline's error on every row, fitted without the row's group (by row id)."""
    rows = list(rows)
    result: dict[str, float] = {}
    for group in dict.fromkeys(key(r) for r in rows):
        baseline = ConstantMfu.fitted(r for r in rows if key(r) != group)
        result |= {r.id: baseline.error(r) for r in rows if key(r) == group}
    return result


def constant_mfu_errors(rows: list[CalibrationRow]) -> list[float]:
    """Baseline, in-sample on the older file."""
    baseline = ConstantMfu.fitted(rows)
    return [baseline.error(r) for r in rows]
