"""Predicted vs measured for a combo: the estimate made before it ran, where the measurement departs from it, and
the `predicted` threshold kind that gates on it.

`predict_combo` estimates the combo's exact layout on its GPU (this machine's CPU, measured, for a CPU suite) and,
with the cluster's runs from the history, calibrates it (`megapilot.estimate.history_calibration`); the uncalibrated
figures stay beside the calibrated ones. `departure` says by how much the step departs and in which component:
Megatron's timers when the log has them (forward-backward against compute + TP/CP/EP/PP communication + bubble,
the data-parallel gradient sync against the exposed DP time, the optimizer against the optimizer step), else the
total step. `judge_predicted` is the rule of the `predicted` threshold kind: `{"kind": "predicted", "min_ratio":
0.9}` on tokens/s, step time or memory passes when the measurement is at least `min_ratio` of the prediction in
the good direction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megapilot.catalog.host import host_cpu
from megapilot.errors import MegapilotError
from megapilot.estimate import estimate
from megapilot.estimate.coverage import family_of, precision_class
from megapilot.estimate.memory import memory_by_stage
from megapilot.spec import ClusterSpec
from megapilot.spec.prediction import Prediction
from megapilot.suite.results import Verdict
from megapilot.suite.thresholds import Outcome

if TYPE_CHECKING:
    from megapilot.estimate.history_calibration import MeasuredRun, RunKey, StepComponents
    from megapilot.spec import ClusterSpec, EstimateResult, GPUSpec, SavedPlan

# The step-time model's terms each Megatron timer measures, and the timer in words. `fixed` (the per-step overhead a
# calibration fits: launches, logging, data, a busy host) is under no timer: weighed against the optimizer's, a large
# fitted overhead made a healthy optimizer step read "0.0x its prediction".
TIMER_TERMS: dict[str, tuple[tuple[str, ...], str]] = {
    "forward-backward": (("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "pp_bubble",
                          "cpu_offload"), "forward-backward time"),
    "all-grads-sync": (("dp_comm",), "data-parallel time"),
    "grads-all-reduce": (("dp_comm",), "data-parallel time"),
    "grads-reduce-scatter": (("dp_comm",), "data-parallel time"),
    "optimizer": (("optimizer",), "optimizer-step time"),
}
DEPARTED_RATIO = 1.25  # a timer this far from its prediction (either way) is named as where the step departs
MIN_PREDICTED_MS = 1e-3  # a term predicted at (almost) nothing has no ratio


@dataclass(frozen=True)
class PredictedMetric:
    """A metric the `predicted` kind gates, the Prediction field it is compared with, and its good direction."""

    field: str
    higher_is_better: bool
    words: str


PREDICTED_METRICS: dict[str, PredictedMetric] = {
    "training.tokens_per_gpu": PredictedMetric("tokens_per_s_per_gpu", True, "tokens/s/GPU"),
    "training.throughput_per_gpu": PredictedMetric("tflops_per_gpu", True, "TFLOP/s/GPU"),
    "training.mfu_pct": PredictedMetric("mfu_pct", True, "MFU"),
    "training.elapsed_time_per_iteration": PredictedMetric("step_time_ms", False, "step time"),
    "training.step_time_p50_ms": PredictedMetric("step_time_ms", False, "step time"),
    "training.max_allocated_gib": PredictedMetric("memory_gib", False, "memory"),
}


# ---- the prediction ---------------------------------------------------------------------------------------

def predict_combo(plan: SavedPlan, gpu: GPUSpec | None, runs: Sequence[MeasuredRun] = (),
                  *, calibrate: bool = True) -> Prediction:
    """The estimator's view of this combo before it runs; `gpu` None: this machine's CPU (measured)."""
    try:
        device = gpu
        if device is None:
            device = host_cpu(ranks_per_node=plan.cluster.gpus_per_node)
        cluster = ClusterSpec(gpu=device, num_nodes=plan.cluster.num_nodes, gpus_per_node=plan.cluster.gpus_per_node)
        result = estimate(plan.model, cluster, plan.training, plan.parallel)
    except (MegapilotError, ValueError, ArithmeticError) as exc:  # a combo the estimator cannot price still runs
        return Prediction(note=f"not estimated: {exc}")
    return calibrated_prediction(plan, cluster, result, runs if calibrate else ())


def calibrated_prediction(plan: SavedPlan, cluster: ClusterSpec, result: EstimateResult,
                          runs: Sequence[MeasuredRun]) -> Prediction:
    """The estimate as a Prediction, calibrated on `runs` (none: the uncalibrated one)."""
    # start-up: 11 ms to import, paid only where a prediction is calibrated (not by `suite check`)
    from megapilot.estimate.history_calibration import calibrate, scaled_breakdown

    key = run_key(plan, cluster.gpu.name)
    multi_node = cluster.num_nodes > 1
    breakdown = with_fixed(result.time_breakdown_s, result.step_time_s)
    components = components_of(breakdown, result.step_time_s, multi_node)
    calibration = calibrate(key, components, runs)
    factor = calibration.factor
    calibrated = scaled_breakdown(breakdown, calibration.corrections, multi_node=multi_node,
                                  microbatches=key.microbatches)
    step_s = calibration.step_time_s
    note = "" if calibration.applied else ("uncalibrated: " + calibration.reason if runs else "")
    # a CPU rank's "peak" is its one-thread matmul rate, a pricing input, not a datasheet figure a measured run's
    # MFU is ever taken against (metrics.py: no GPU, no MFU): neither side states one
    mfu_pct = None if cluster.gpu.architecture == "cpu" else round(result.mfu * 100 / factor, 2)
    return Prediction(
        step_time_ms=round(step_s * 1000, 3), tokens_per_s_per_gpu=round(result.tokens_per_s_per_gpu / factor, 2),
        tflops_per_gpu=round(result.tflops_per_gpu / factor, 4), mfu_pct=mfu_pct,
        memory_gib=round(result.memory_gib.total, 2), capacity_gib=round(result.memory_gib.capacity, 2), note=note,
        device=cluster.gpu.name, family=family_of(plan.model), components_ms=_ms(calibrated),
        uncalibrated_step_time_ms=round(result.step_time_s * 1000, 3),
        uncalibrated_tokens_per_s_per_gpu=round(result.tokens_per_s_per_gpu, 2),
        uncalibrated_components_ms=_ms(breakdown),
        calibration=calibration.reason if runs else "no runs of this cluster in the history yet",
        calibration_runs=list(calibration.runs_used) if calibration.applied else [],
        band_pct=round(100 * calibration.band, 1) if calibration.band is not None and calibration.applied else None)


def memory_warning(key: str, plan: SavedPlan | None, gpu: GPUSpec | None) -> str | None:
    """A WARN line when the cell's predicted memory (megapilot's default mode, every pipeline rank that can be the
    most loaded) exceeds the GPU's capacity, naming the cell, each rank over it, the capacity and the fixes; None
    when it fits, on a CPU suite, or without a plan. A warning, never a refusal: the config runs as written."""
    if plan is None or gpu is None:
        return None
    p, capacity = plan.parallel, gpu.hbm_gib
    try:
        by_stage = memory_by_stage(plan.model, plan.training, p, architecture=gpu.architecture)
    except (MegapilotError, ValueError, ArithmeticError):  # a cell the estimator cannot price still runs
        return None
    over = sorted(((total, stage) for stage, total in by_stage if total > capacity), reverse=True)
    if not over:
        return None
    stages = ", ".join(f"stage {stage} {total:.0f} GiB" for total, stage in over)
    fixes = [] if p.recompute == "full" else ["full recompute (recompute 1)"]
    fixes.append(f"more pipeline stages (pipeline_parallelism, now {p.pp})")
    if p.tp < plan.cluster.gpus_per_node:  # TP stays inside a node
        fixes.append(f"more tensor parallelism (tensor_parallelism, now {p.tp})")
    if p.mbs > 1:
        fixes.append(f"a smaller micro-batch (micro_batch_size, now {p.mbs})")
    return (f"WARN cell {key}: predicted peak memory per GPU exceeds the {gpu.name}'s {capacity:.0f} GiB: {stages}; "
            f"it runs as configured, and may run out of memory — to fit: {', '.join(fixes)}")


def run_key(plan: SavedPlan, gpu_name: str) -> RunKey:
    # start-up: 11 ms to import, paid only where a prediction is calibrated (not by `suite check`)
    from megapilot.estimate.history_calibration import RunKey

    p = plan.parallel
    return RunKey(model=plan.model.name, family=family_of(plan.model), precision=precision_class(
        plan.training.precision), gpu=gpu_name, gpus=plan.cluster.world_size, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep,
        vpp=p.vpp or 1, mbs=p.mbs, gbs=plan.training.global_batch_size, seq_len=plan.training.seq_length)


def with_fixed(breakdown_s: Mapping[str, float], step_time_s: float) -> dict[str, float]:
    """The breakdown plus `fixed`: the part of the step no term names, so that the terms add up to the step."""
    terms = dict(breakdown_s)
    exposed = sum(terms.values())
    terms["fixed"] = max(0.0, step_time_s - exposed)
    return terms


def components_of(breakdown_s: Mapping[str, float], step_time_s: float, multi_node: bool) -> StepComponents:
    # start-up: 11 ms to import, paid only where a prediction is calibrated (not by `suite check`)
    from megapilot.estimate.history_calibration import StepComponents

    return StepComponents.from_breakdown(breakdown_s, step_time_s, multi_node=multi_node)


def _ms(terms: Mapping[str, float]) -> dict[str, float]:
    return {name: round(value * 1000, 4) for name, value in terms.items()}


# The step's components as the report and JUnit name them, and the model terms behind each.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "compute": ("compute", "recompute", "cpu_offload"),
    "exposed_comm": ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"),
    "pipeline_bubble": ("pp_bubble",),
    "fixed_overheads": ("optimizer", "fixed", "overhead"),
}


def components_ms(prediction: Prediction) -> dict[str, float]:
    """The predicted step in four components (compute, exposed communication, pipeline bubble, fixed overheads)."""
    terms = prediction.components_ms
    return {name: round(sum(terms.get(t, 0.0) for t in members), 4) for name, members in COMPONENTS.items()}


# ---- where the measurement departs ------------------------------------------------------------------------

@dataclass(frozen=True)
class Departure:
    """How far the measured step is from the prediction, and the component that departs most."""

    step_pct: float | None  # (measured - predicted) / predicted x 100, step time
    component: str | None  # the timer in words ("data-parallel time"), None without timers
    ratio: float | None  # measured timer / its predicted terms
    sentence: str


def departure(prediction: Prediction | None, measured_step_ms: float | None,
              timers_ms: Mapping[str, float]) -> Departure | None:
    """None when there is nothing to compare (no prediction or no measured step)."""
    if prediction is None or prediction.step_time_ms is None or not measured_step_ms or \
            not math.isfinite(measured_step_ms):
        return None
    step_pct = (measured_step_ms - prediction.step_time_ms) / prediction.step_time_ms * 100
    way = "slower" if step_pct >= 0 else "faster"
    head = f"step {abs(step_pct):.0f} % {way} than predicted"
    # the timer that explains most of the step's departure: the largest excess (or shortfall) in milliseconds, not
    # the largest ratio (a 4 ms optimizer step measured at 14 ms is 3.4x, and 10 ms of a 2 s departure)
    worst: tuple[float, str, float] | None = None
    for timer, (terms, words) in TIMER_TERMS.items():
        measured = timers_ms.get(timer)
        predicted = sum(prediction.components_ms.get(term, 0.0) for term in terms)
        if measured is None or predicted < MIN_PREDICTED_MS:
            continue
        excess_ms = abs(measured - predicted)
        if worst is None or excess_ms > worst[0]:
            worst = (excess_ms, words, measured / predicted)
    if worst is None:
        tail = ("; the log has no Megatron timers (--timing-log-level 1) to say in which component"
                if abs(step_pct) >= (DEPARTED_RATIO - 1) * 100 else "")
        return Departure(step_pct, None, None, head + tail)
    _, words, ratio = worst
    if max(ratio, 1 / ratio) < DEPARTED_RATIO:
        return Departure(step_pct, None, None, head + "; every timed component within "
                         f"{(DEPARTED_RATIO - 1) * 100:.0f} % of its prediction")
    return Departure(step_pct, words, ratio, f"{head}; the measured {words} is {ratio:.1f}x its prediction")


# ---- the `predicted` threshold kind -----------------------------------------------------------------------

def judge_predicted(name: str, value: float, min_ratio: float, prediction: Prediction | None,
                    why: Departure | None) -> Outcome:
    """The `predicted` kind's rule (`megapilot.suite.thresholds.PredictedThreshold`): tokens/s at least `min_ratio`
    of the calibrated prediction, step time and memory at most 1/`min_ratio` of it. An uncalibrated prediction only
    records: physics alone is no gate, the cluster's own runs make it one (its earlier runs: one calibrated only
    on this run's own smoke run and combos records too)."""
    metric = PREDICTED_METRICS.get(name)
    if metric is None:
        known = ", ".join(PREDICTED_METRICS)
        return Outcome(Verdict.FAIL, f"megapilot predicts no {name}: gate one of {known}")
    predicted = getattr(prediction, metric.field) if prediction is not None else None
    if prediction is None or predicted is None or not predicted > 0:
        note = prediction.note if prediction is not None and prediction.note else "no prediction for this combo"
        return Outcome(Verdict.RECORD, f"not gated: {note}")
    if not prediction.calibration_runs:
        return Outcome(Verdict.RECORD, f"not gated: the prediction is not calibrated on this cluster yet "
                                       f"({prediction.calibration or 'no runs'}); recorded, it calibrates the next "
                                       "run's")
    if prediction.calibrated_in_run:
        return Outcome(Verdict.RECORD, "not gated: the prediction is calibrated only on this run's own earlier runs, "
                                       "which share whatever slows this cluster now; recorded, it calibrates the next "
                                       "run's")
    ratio = value / predicted if metric.higher_is_better else predicted / value if value > 0 else math.inf
    passed = ratio >= min_ratio
    text = (f"{value:g} is {value / predicted:.2f}x the calibrated prediction {predicted:g} "
            f"({'>=' if passed else '<'} {min_ratio:g} in the good direction)")
    if not passed and why is not None:
        text += f": {why.sentence}"
    return Outcome(Verdict.PASS if passed else Verdict.FAIL, text,
                   (ratio - min_ratio) / min_ratio * 100 if min_ratio else None)


__all__ = [
    "COMPONENTS",
    "PREDICTED_METRICS",
    "Departure",
    "calibrated_prediction",
    "components_ms",
    "departure",
    "judge_predicted",
    "memory_warning",
    "predict_combo",
]
