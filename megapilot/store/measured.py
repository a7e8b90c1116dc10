"""Measured runs by cluster: what the history keeps for calibration, from suite combos, `megapilot run --plan` and
imported files.

Every row is one measured run with the uncalibrated prediction of its own layout, made when it was recorded
(suite combos: before they ran; imported runs: on import): step time split into the components the calibration
corrects, tokens/s, TFLOP/s and memory, beside what was measured. `to_calibration_run` turns a row into the
`megapilot.estimate.history_calibration.MeasuredRun` the calibration fits on. `from_combo`, `from_plan_run` and
`from_case` build rows; `megapilot.store.history.History` writes and reads them (table `measured_runs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from megapilot.suite.verdicts import Verdict

if TYPE_CHECKING:
    from megapilot.estimate.cases import Case
    from megapilot.estimate.history_calibration import MeasuredRun
    from megapilot.spec import SavedPlan
    from megapilot.suite.results import ComboResult, Prediction, SuiteResult

# The rows are read by every history command; the estimator (megapilot.estimate, 0.3 CPU-s to import: its package
# loads every model of it) only by the functions that build a row or a calibration run, which import it themselves.

MEASURED_KEYS = ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "peak_memory_gib")
COLUMNS = ("id", "cluster", "origin", "source", "verdict", "recorded_at", "model", "family", "precision", "gpu",
           "gpus", "tp", "pp", "cp", "ep", "vpp", "mbs", "gbs", "seq_len", "multi_node", "case_json",
           "software_json", "predicted_step_time_s", "predicted_compute_s", "predicted_bubble_s",
           "predicted_scaleup_comm_s", "predicted_scaleout_comm_s", "predicted_fixed_s",
           "predicted_tokens_per_s_per_gpu", "predicted_tflops_per_gpu", "predicted_memory_gib",
           "measured_step_time_s", "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "measured_memory_gib")
# A suite combo's measured figures, by the metric that measures them (the first present wins).
_COMBO_METRICS = {
    "step_time_s": ("training.step_time_p50_ms", "training.elapsed_time_per_iteration"),
    "tokens_per_s_per_gpu": ("training.tokens_per_gpu",),
    "tflops_per_gpu": ("training.throughput_per_gpu",),
    "memory_gib": ("training.max_allocated_gib",),
}


def cluster_name(name: str) -> str:
    """A cluster's name as the history stores it: trimmed, its inner runs of whitespace one space ("Lab-H100 " from a
    `--cluster-name` typed with a trailing space is Lab-H100)."""
    return " ".join(name.split())


def cluster_key(name: str) -> str:
    """What tells two spellings of one cluster the same, wherever a name is written or looked up (`History`): its
    stored name (`cluster_name`) in any case, as a GPU's name is ("Lab-H100 " and "lab-h100" are one cluster)."""
    return cluster_name(name).casefold()


@dataclass(frozen=True)
class MeasuredRow:
    """One measured run of a cluster and the uncalibrated prediction of its layout (seconds, per GPU)."""

    id: str
    cluster: str
    origin: str  # suite / run / import
    source: str  # the suite run id, the run (`megapilot run`), or the file imported
    verdict: str
    recorded_at: str
    model: str
    family: str
    precision: str  # precision class: bf16 / fp8 / fp4
    gpu: str
    gpus: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    mbs: int
    gbs: int
    seq_len: int
    multi_node: bool
    case: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    predicted_step_time_s: float | None = None
    predicted_compute_s: float | None = None
    predicted_bubble_s: float | None = None
    predicted_scaleup_comm_s: float | None = None
    predicted_scaleout_comm_s: float | None = None
    predicted_fixed_s: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    predicted_tflops_per_gpu: float | None = None
    predicted_memory_gib: float | None = None
    measured_step_time_s: float | None = None
    measured_tokens_per_s_per_gpu: float | None = None
    measured_tflops_per_gpu: float | None = None
    measured_memory_gib: float | None = None

    def values(self) -> tuple[object, ...]:
        raw = asdict(self)
        raw["multi_node"] = int(self.multi_node)
        raw["case_json"] = json.dumps(raw.pop("case"), sort_keys=True)
        raw["software_json"] = json.dumps(raw.pop("software"), sort_keys=True)
        return tuple(_finite(raw[name]) for name in COLUMNS)

    @classmethod
    def from_values(cls, row: tuple[Any, ...]) -> MeasuredRow:
        raw = dict(zip(COLUMNS, row, strict=True))
        raw["multi_node"] = bool(raw["multi_node"])
        raw["case"] = json.loads(raw.pop("case_json") or "{}")
        raw["software"] = json.loads(raw.pop("software_json") or "{}")
        return cls(**raw)

    @property
    def calibrates(self) -> bool:
        """Usable by the calibration: a measured and a predicted step, from a run that did not fail."""
        return bool(self.measured_step_time_s and self.predicted_step_time_s and self.verdict != Verdict.FAIL.value)


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def to_calibration_run(row: MeasuredRow) -> MeasuredRun:
    # start-up: the estimator, only where a row is fitted on (see the imports above)
    from megapilot.estimate.history_calibration import MeasuredRun, RunKey, StepComponents

    key = RunKey(model=row.model, family=row.family, precision=row.precision, gpu=row.gpu, gpus=row.gpus, tp=row.tp,
                 pp=row.pp, cp=row.cp, ep=row.ep, vpp=row.vpp, mbs=row.mbs, gbs=row.gbs, seq_len=row.seq_len)
    components = StepComponents(row.predicted_compute_s or 0.0, row.predicted_bubble_s or 0.0,
                                row.predicted_scaleup_comm_s or 0.0, row.predicted_scaleout_comm_s or 0.0,
                                row.predicted_fixed_s or 0.0)
    return MeasuredRun(row.id, key, components, row.measured_step_time_s or 0.0)


# ---- rows from a suite combo ------------------------------------------------------------------------------

def from_combo(result: SuiteResult, combo: ComboResult, recorded_at: str) -> MeasuredRow | None:
    """A suite combo as a measured run of its cluster; None without a cluster, a prediction or a measurement."""
    # start-up: the estimator, only where a row is built (see the imports above)
    from megapilot.estimate.coverage import precision_class
    from megapilot.estimate.history_calibration import StepComponents

    predicted = combo.predicted
    cluster = None if result.card.cluster_name is None else cluster_name(result.card.cluster_name)
    if not cluster or predicted is None or not predicted.uncalibrated_step_time_ms or not predicted.device:
        return None
    measured = {name: _combo_value(combo, metrics) for name, metrics in _COMBO_METRICS.items()}
    if measured["step_time_s"] is None and measured["tokens_per_s_per_gpu"] is None:
        return None
    step_ms = measured["step_time_s"]
    terms_s = {name: value / 1000 for name, value in predicted.uncalibrated_components_ms.items()}
    step_s = predicted.uncalibrated_step_time_ms / 1000
    multi_node = combo.nodes > 1
    components = StepComponents.from_breakdown(terms_s, step_s, multi_node=multi_node)
    world = combo.nodes * combo.gpus_per_node
    held = combo.layout
    factor = predicted.step_time_ms / predicted.uncalibrated_step_time_ms if predicted.step_time_ms else 1.0
    return MeasuredRow(
        id=f"{result.run_id}/{combo.key}", cluster=cluster, origin="suite", source=result.run_id,
        verdict=combo.verdict.value, recorded_at=recorded_at, model=result.card.model, family=predicted.family,
        precision=precision_class((combo.precision or "bf16").lower()), gpu=predicted.device, gpus=world,
        tp=held.tp, pp=held.pp, cp=held.cp, ep=held.ep, vpp=held.vpp or 1, mbs=held.mbs or 1,
        gbs=combo.gbs or 1, seq_len=combo.seq_length or 1, multi_node=multi_node,
        case={"model": result.card.model, "gpu": predicted.device, "gpus": world, "tp": held.tp, "pp": held.pp,
              "cp": held.cp, "ep": held.ep, "mbs": held.mbs, "gbs": combo.gbs, "seq_len": combo.seq_length,
              "precision": (combo.precision or "bf16").lower()},
        predicted_step_time_s=step_s, predicted_compute_s=components.compute_s,
        predicted_bubble_s=components.bubble_s, predicted_scaleup_comm_s=components.scaleup_comm_s,
        predicted_scaleout_comm_s=components.scaleout_comm_s, predicted_fixed_s=components.fixed_s,
        predicted_tokens_per_s_per_gpu=predicted.uncalibrated_tokens_per_s_per_gpu,
        predicted_tflops_per_gpu=(predicted.tflops_per_gpu or 0) * factor or None,
        predicted_memory_gib=predicted.memory_gib,
        # the step the combo's tokens/s implies, what its gates and report compare with the prediction; its median
        # step only without one (on a busy host the two differ by 10-20 %: a mean of rates against a median of times)
        measured_step_time_s=_step_from_tokens(combo, measured["tokens_per_s_per_gpu"]) or (
            step_ms / 1000 if step_ms is not None else None),
        measured_tokens_per_s_per_gpu=measured["tokens_per_s_per_gpu"],
        measured_tflops_per_gpu=measured["tflops_per_gpu"], measured_memory_gib=measured["memory_gib"])


def calibration_run_of(result: SuiteResult, combo: ComboResult) -> MeasuredRun | None:
    """A finished combo of a suite run still going, as the run the calibration of its later combos fits on: the row
    the history will keep for it, read the same way (None where the history would not calibrate on it)."""
    row = from_combo(result, combo, recorded_at="")
    return to_calibration_run(row) if row is not None and row.calibrates else None


def _combo_value(combo: ComboResult, metrics: tuple[str, ...]) -> float | None:
    for name in metrics:
        value = combo.actual(name)
        if value is not None and math.isfinite(value) and value > 0:
            return value
    return None


def _step_from_tokens(combo: ComboResult, tokens_per_s_per_gpu: float | None) -> float | None:
    if not tokens_per_s_per_gpu or not combo.gbs or not combo.seq_length:
        return None
    return combo.gbs * combo.seq_length / (tokens_per_s_per_gpu * combo.nodes * combo.gpus_per_node)


# ---- rows from a `megapilot run --plan` -------------------------------------------------------------------

def from_plan_run(run_id: str, cluster: str, plan: SavedPlan, predicted: Prediction, measured_step_time_s: float,
                  *, completed: bool, recorded_at: str) -> MeasuredRow | None:
    """A plan's run as a measured run of its cluster, its prediction (made before it started) beside its
    measured step; None without an uncalibrated prediction to calibrate against. A run that did not complete is
    kept as FAIL: it is listed, and calibrates nothing."""
    # start-up: the estimator, only where a row is built (see the imports above)
    from megapilot.estimate.coverage import precision_class
    from megapilot.estimate.history_calibration import StepComponents

    if not predicted.uncalibrated_step_time_ms or not predicted.device or not measured_step_time_s > 0:
        return None
    p, training = plan.parallel, plan.training
    world = plan.cluster.world_size
    multi_node = plan.cluster.num_nodes > 1
    terms_s = {name: value / 1000 for name, value in predicted.uncalibrated_components_ms.items()}
    step_s = predicted.uncalibrated_step_time_ms / 1000
    components = StepComponents.from_breakdown(terms_s, step_s, multi_node=multi_node)
    factor = predicted.step_time_ms / predicted.uncalibrated_step_time_ms if predicted.step_time_ms else 1.0
    case = {"model": plan.model.name, "gpu": predicted.device, "gpus": world, "tp": p.tp, "pp": p.pp, "cp": p.cp,
            "ep": p.ep, "vpp": p.vpp, "mbs": p.mbs, "gbs": training.global_batch_size, "seq_len": training.seq_length,
            "precision": training.precision, "recompute": p.recompute}
    if p.cp_comm_type != "p2p":  # the case re-estimates as it ran (attention sinks take CP by a2a only)
        case["cp_comm_type"] = p.cp_comm_type
    return MeasuredRow(
        id=run_id, cluster=cluster_name(cluster), origin="run", source=run_id,
        verdict=(Verdict.PASS if completed else Verdict.FAIL).value, recorded_at=recorded_at,
        model=plan.model.name, family=predicted.family, precision=precision_class(training.precision),
        gpu=predicted.device, gpus=world, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, vpp=p.vpp or 1, mbs=p.mbs,
        gbs=training.global_batch_size, seq_len=training.seq_length, multi_node=multi_node, case=case,
        predicted_step_time_s=step_s, predicted_compute_s=components.compute_s,
        predicted_bubble_s=components.bubble_s, predicted_scaleup_comm_s=components.scaleup_comm_s,
        predicted_scaleout_comm_s=components.scaleout_comm_s, predicted_fixed_s=components.fixed_s,
        predicted_tokens_per_s_per_gpu=predicted.uncalibrated_tokens_per_s_per_gpu,
        predicted_tflops_per_gpu=(predicted.tflops_per_gpu or 0) * factor or None,
        predicted_memory_gib=predicted.memory_gib, measured_step_time_s=measured_step_time_s,
        measured_tokens_per_s_per_gpu=training.tokens_per_step / (measured_step_time_s * world))


# ---- rows from a case and its measurement (imports) -------------------------------------------------------

def from_case(row_id: str, cluster: str, source: str, case: Case, flags: Mapping[str, object],
              measured: Mapping[str, float], software: Mapping[str, Any], recorded_at: str) -> MeasuredRow:
    """An imported run: the case estimated now (uncalibrated), its measured step from whichever figure it gives
    (step time, else tokens/s, else TFLOP/s through the model's FLOPs per step)."""
    # start-up: the estimator, only where a row is built (see the imports above)
    from megapilot.estimate import estimate
    from megapilot.estimate.coverage import family_of, precision_class
    from megapilot.estimate.history_calibration import StepComponents

    result = estimate(case.model, case.cluster, case.training, case.parallel, case.options,
                      allow_tp_across_nodes=case.allow_tp_across_nodes)
    world = case.cluster.world_size
    multi_node = case.cluster.num_nodes > 1
    components = StepComponents.from_breakdown(result.time_breakdown_s, result.step_time_s, multi_node=multi_node)
    step_s = measured.get("step_time_s")
    if step_s is None and measured.get("tokens_per_s_per_gpu"):
        step_s = case.training.tokens_per_step / (measured["tokens_per_s_per_gpu"] * world)
    if step_s is None and measured.get("tflops_per_gpu"):
        step_s = result.flops_per_step / (measured["tflops_per_gpu"] * 1e12 * world)
    p = case.parallel
    return MeasuredRow(
        id=row_id, cluster=cluster_name(cluster), origin="import", source=source, verdict=Verdict.RECORD.value,
        recorded_at=recorded_at, model=case.model.name, family=family_of(case.model),
        precision=precision_class(case.training.precision), gpu=case.cluster.gpu.name, gpus=world, tp=p.tp, pp=p.pp,
        cp=p.cp, ep=p.ep, vpp=p.vpp or 1, mbs=p.mbs, gbs=case.training.global_batch_size,
        seq_len=case.training.seq_length, multi_node=multi_node, case=dict(flags), software=dict(software),
        predicted_step_time_s=result.step_time_s, predicted_compute_s=components.compute_s,
        predicted_bubble_s=components.bubble_s, predicted_scaleup_comm_s=components.scaleup_comm_s,
        predicted_scaleout_comm_s=components.scaleout_comm_s, predicted_fixed_s=components.fixed_s,
        predicted_tokens_per_s_per_gpu=result.tokens_per_s_per_gpu, predicted_tflops_per_gpu=result.tflops_per_gpu,
        predicted_memory_gib=result.memory_gib.total, measured_step_time_s=step_s,
        measured_tokens_per_s_per_gpu=measured.get("tokens_per_s_per_gpu"),
        measured_tflops_per_gpu=measured.get("tflops_per_gpu"), measured_memory_gib=measured.get("peak_memory_gib"))


__all__ = ["COLUMNS", "MEASURED_KEYS", "MeasuredRow", "calibration_run_of", "cluster_key", "cluster_name", "from_case",
           "from_combo", "from_plan_run", "to_calibration_run"]
