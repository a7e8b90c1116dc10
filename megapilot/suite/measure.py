"""One combo's logs → its metric rows, curves and findings: the suite config mapped onto the gates.

`megapilot.suite.metrics` measures and `megapilot.suite.gates` judges, both without knowing the
config file; this module is the one place that reads the config's `loss_curve`, `convergence`,
`scaling_baseline` and the cell's thresholds and passes them on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from megapilot.errors import MegapilotError
from megapilot.estimate import flops_per_token
from megapilot.suite.curves import LossCurveGate
from megapilot.suite.gates import BaselineLookup, builtin_gates, evaluate
from megapilot.suite.metrics import ConvergenceGate, CurveTargets, ScalingBaseline, measure_combo
from megapilot.suite.predicted import PREDICTED_METRICS, departure
from megapilot.suite.results import Curve, Finding, MetricRow
from megapilot.suite.stragglers import straggler_rows
from megapilot.suite.thresholds import DEFAULT_CELL, ThresholdSpec

if TYPE_CHECKING:
    from megapilot.spec import Prediction, SavedPlan
    from megapilot.suite.cells import SweepCell
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.render import CellLaunch


@dataclass
class ComboOutcome:
    rows: list[MetricRow] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    timers_ms: dict[str, float] = field(default_factory=dict)


def cell_thresholds(suite: LoadedSuite, cell: SweepCell) -> dict[str, ThresholdSpec] | None:
    """The threshold cell of this sweep cell (the `default` cell when there is no sweep)."""
    return suite.thresholds.get(cell.key) or (suite.thresholds.get(DEFAULT_CELL) if cell.key == DEFAULT_CELL else None)


def measure_and_gate(suite: LoadedSuite, cell: SweepCell, launch: CellLaunch, logs: list[Path], *,
                     gates: bool, baseline: BaselineLookup | None = None,
                     prediction: Prediction | None = None, record_speed: bool = False) -> ComboOutcome:
    """Measure the logs; with `gates`, judge them against the cell's thresholds and the built-in gates.

    Without `gates` (smoke and checkpoint runs) only the built-in gates apply: no error signature,
    finite loss, final iteration reached; `record_speed` (the smoke run) adds the figures a prediction is compared
    with as RECORD rows, never gated: they calibrate the predictions of the combos after it.
    `prediction`: what megapilot predicted for the combo (`predicted` gates).
    """
    config = suite.config
    plan = launch.plan
    assert plan is not None  # only combos that were launched from a plan reach measurement
    loss_curve = LossCurveGate(sample_every=config.loss_curve.sample_every,
                               milestone_steps=tuple(config.loss_curve.milestone_steps),
                               max_slope=config.loss_curve.max_slope, enforce=bool(config.loss_curve.enforce))
    convergence = ConvergenceGate(target_metric=config.convergence.target_metric,
                                  target_value=config.convergence.target_value)
    scaling = None
    if config.scaling_baseline.tokens_per_sec_total > 0:
        scaling = ScalingBaseline(tokens_per_sec_total=config.scaling_baseline.tokens_per_sec_total,
                                  num_nodes=config.scaling_baseline.num_nodes)
    measurement = measure_combo(
        logs, gpu=suite.gpu, world_size=launch.nodes * launch.gpus_per_node, gpus_per_node=launch.gpus_per_node,
        nodes=launch.nodes, seq_length=cell.seq_length, gbs=cell.gbs, train_iters=plan.training.train_iters,
        model_flops_per_token=_flops_per_token(plan), precision=cell.precision.lower(),
        targets=CurveTargets(loss_curve=loss_curve, convergence=convergence, scaling_baseline=scaling),
        cpu=suite.device == "cpu")
    built_in = builtin_gates(measurement, loss_curve=loss_curve, convergence=convergence,
                             train_iters=plan.training.train_iters)
    if not gates:
        keep = {"gate.no_errors", "gate.finite_loss", "gate.completed"}
        rows = [r for r in built_in if r.name in keep]
        if record_speed:
            rows = _speed_records(measurement.actuals, measurement.units) + rows
    else:
        why = departure(prediction, measured_step_ms(measurement.actuals), measurement.timers_ms)
        rows = evaluate(measurement.actuals, measurement.units, cell_thresholds(suite, cell),
                        enforce=bool(config.enforce_thresholds), baseline=baseline,
                        record_only=measurement.record_only, why_missing=measurement.why_missing,
                        prediction=prediction, departure=why, unresolved=measurement.unresolved) + built_in
        rows += straggler_rows(measurement.stragglers, max_ratio=config.straggler.max_ratio,
                               enforce=bool(config.straggler.enforce), ranks_per_node=launch.gpus_per_node,
                               cpu=suite.device == "cpu")
    return ComboOutcome(rows=rows, curves=measurement.curves, findings=measurement.findings,
                        timers_ms=measurement.timers_ms)


STEP_TIME_METRICS = ("training.step_time_p50_ms", "training.elapsed_time_per_iteration")


def _speed_records(actuals: dict[str, float | None], units: dict[str, str]) -> list[MetricRow]:
    """The measured figures a prediction is compared with (`PREDICTED_METRICS`), as the gates record a metric with
    no threshold: never gated."""
    measured = {name: value for name in PREDICTED_METRICS if (value := actuals.get(name)) is not None}
    why = "recorded, never gated: calibrates the predictions of the combos after it"
    return evaluate(measured, units, None, enforce=False, record_only=dict.fromkeys(measured, why))


def measured_step_ms(actuals: dict[str, float | None]) -> float | None:
    """The combo's steady step time, ms: the median when measured, else Megatron's elapsed time per iteration."""
    return next((v for name in STEP_TIME_METRICS if (v := actuals.get(name)) is not None), None)


def _flops_per_token(plan: SavedPlan) -> float | None:
    """Training FLOPs per token (Megatron's convention) for MFU; None when the model cannot be counted."""
    try:
        return flops_per_token(plan.model, plan.training.seq_length, tp=plan.parallel.tp).total
    except MegapilotError:
        return None


__all__ = ["ComboOutcome", "cell_thresholds", "measure_and_gate", "measured_step_ms"]
