"""Gates: measured actuals + a threshold cell → one `MetricRow` per metric, plus built-in gates.

`evaluate(actuals, units, cell_specs, enforce=...)` applies every threshold kind of `thresholds.py`:

    min / min_tok_s   PASS iff actual >= value            margin = (actual - value) / |value|
    max / max_ms      PASS iff actual <= value            margin = (value - actual) / |value|
    within            PASS iff value(1-p) <= actual <= value(1+p); margin = distance to the nearer bound / |value|
    min_ratio         PASS iff actual / actual[reference] >= value; margin on the ratio
    baseline          PASS iff within tolerance_pct of the history's median (no history: RECORD)
    info              RECORD

Margins are in %, positive inside the gate and negative outside; a value at the bound passes with
margin 0. A NaN/Inf value always FAILs. A spec'd metric that is missing FAILs naming the log line it
comes from, unless the spec is `optional`, the log prints it below its resolution (a TFLOP/s/GPU of 0.0) or it
cannot exist on the run's device (the MFU of a CPU run): SKIPPED. A spec naming a metric nobody measures FAILs
naming the close names (an `info` spec RECORDs, an `optional` one is SKIPPED, as for a missing metric);
`suite check` reports each of these before anything runs (thresholds.spec_issues; for a CPU suite, the gates on
a metric it cannot have: config_sweep.cpu_gate_warnings). With `enforce=False`
nothing fails: every gated row is RECORD and its reason says what the verdict would have been. Measured
metrics without a spec are RECORD rows.

`builtin_gates(measurement, ...)` adds the gates that need no threshold file: `gate.no_errors`,
`gate.finite_loss`, `gate.loss_slope`, `gate.convergence`, `gate.completed`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from megapilot.suite.curves import LossCurveGate, loss_slope
from megapilot.suite.metric_table import METRICS
from megapilot.suite.metrics import ComboMeasurement, ConvergenceGate, measure_convergence
from megapilot.suite.results import MetricRow, Verdict
from megapilot.suite.thresholds import (
    BaselineLookup,
    BaselineStats,
    GateInput,
    InfoThreshold,
    Outcome,
    ThresholdSpec,
    unknown_name,
)

if TYPE_CHECKING:
    from megapilot.spec import Prediction
    from megapilot.suite.predicted import Departure


def evaluate(
    actuals: Mapping[str, float | None], units: Mapping[str, str], cell_specs: Mapping[str, ThresholdSpec] | None,
    *, enforce: bool, baseline: BaselineLookup | None = None, record_only: Mapping[str, str] | None = None,
    why_missing: Mapping[str, str] | None = None, prediction: Prediction | None = None,
    departure: Departure | None = None, unresolved: Collection[str] = (),
) -> list[MetricRow]:
    """Rows for every spec'd metric (spec order), then every other known metric (actuals order).

    `record_only`: metric → why it is never gated (e.g. a CPU run's memory); `why_missing`: metric → why
    it has no value (used in SKIPPED/FAIL reasons); `unresolved`: the missing metrics the log prints below its
    resolution or the run's device cannot have, whose gates are SKIPPED. All three come from `ComboMeasurement`.
    `prediction` and `departure`: the combo's prediction and where the measurement departs from it (`predicted`
    kind).
    """
    specs = dict(cell_specs or {})
    record_only = record_only or {}
    why_missing = why_missing or {}
    rows = [_gated_row(name, spec, actuals, units, enforce=enforce, baseline=baseline,
                       record_reason=record_only.get(name), missing_reason=why_missing.get(name),
                       prediction=(prediction, departure), unresolved=name in unresolved)
            for name, spec in specs.items()]
    for name, value in actuals.items():
        if name not in specs:
            rows.append(_ungated_row(name, value, units.get(name, ""), record_only.get(name), why_missing.get(name),
                                     enforce=enforce))
    return rows


def _gated_row(name: str, spec: ThresholdSpec, actuals: Mapping[str, float | None], units: Mapping[str, str], *,
               enforce: bool, baseline: BaselineLookup | None, record_reason: str | None,
               missing_reason: str | None,
               prediction: tuple[Prediction | None, Departure | None] = (None, None),
               unresolved: bool = False) -> MetricRow:
    value = actuals.get(name)
    outcome = _outcome(name, spec, value, actuals, baseline, missing_reason, prediction, unresolved)
    if record_reason is not None and outcome.verdict in (Verdict.PASS, Verdict.FAIL):
        outcome = Outcome(Verdict.RECORD, f"{record_reason}; not gated (would {outcome.verdict.value}: "
                                           f"{outcome.reason})", outcome.margin_pct)
    elif not enforce and outcome.verdict in (Verdict.PASS, Verdict.FAIL):
        outcome = Outcome(Verdict.RECORD, f"thresholds not enforced; would {outcome.verdict.value}: {outcome.reason}",
                           outcome.margin_pct)
    return MetricRow(name=name, value=_json_safe(value), unit=units.get(name, METRICS[name].unit if name in METRICS
                                                                           else ""),
                     threshold=spec.describe(), kind=spec.kind, verdict=outcome.verdict, reason=outcome.reason,
                     margin_pct=outcome.margin_pct, enforced=enforce and record_reason is None)


def _ungated_row(name: str, value: float | None, unit: str, record_reason: str | None,
                 missing_reason: str | None, *, enforce: bool) -> MetricRow:
    if value is None:
        return MetricRow(name=name, unit=unit, verdict=Verdict.SKIPPED, enforced=False,
                         reason=f"not measured: {missing_reason or 'not in the log'}")
    reason = record_reason or "no threshold"
    if not math.isfinite(value):  # a NaN/Inf actual fails even without a threshold
        not_finite = f"value is {value} (not a finite number)"
        if not enforce:
            return MetricRow(name=name, unit=unit, verdict=Verdict.RECORD, enforced=False,
                             reason=f"thresholds not enforced; would FAIL: {not_finite}")
        return MetricRow(name=name, unit=unit, verdict=Verdict.FAIL, reason=not_finite)
    return MetricRow(name=name, value=value, unit=unit, verdict=Verdict.RECORD, reason=reason, enforced=False)


def _json_safe(value: float | None) -> float | None:
    """NaN/Inf have no JSON form: the row keeps None and its reason names the value."""
    return value if value is None or math.isfinite(value) else None


# ---- one spec ---------------------------------------------------------------------------------------------

def _outcome(name: str, spec: ThresholdSpec, value: float | None, actuals: Mapping[str, float | None],
             baseline: BaselineLookup | None, missing_reason: str | None,
             prediction: tuple[Prediction | None, Departure | None] = (None, None),
             unresolved: bool = False) -> Outcome:
    if name not in actuals and name not in METRICS:
        # as a metric that is not measured: info records, optional skips (a threshold file may gate info on names
        # the suite does not measure), the rest fail; `suite check` says which, before the run
        if isinstance(spec, InfoThreshold):
            return Outcome(Verdict.RECORD, f"info: {unknown_name(name, actuals)}")
        if spec.optional:
            return Outcome(Verdict.SKIPPED, f"optional; {unknown_name(name, actuals)}")
        return Outcome(Verdict.FAIL, unknown_name(name, actuals))
    return spec.judge(GateInput(name, value, actuals, baseline, missing_reason, *prediction, unresolved=unresolved))


# ---- built-in gates -----------------------------------------------------------------------------------------

def builtin_gates(measurement: ComboMeasurement, *, loss_curve: LossCurveGate | None = None,
                  convergence: ConvergenceGate | None = None, train_iters: int | None = None) -> list[MetricRow]:
    """Gates every combo gets without a threshold file, in a fixed order.

    `train_iters`: the iterations the combo was asked to run (default: the measurement's planned count).
    """
    planned = train_iters or measurement.planned_iters
    return [
        _no_errors(measurement),
        _finite_loss(measurement),
        _loss_slope_gate(measurement, loss_curve or LossCurveGate(), planned),
        _convergence_gate(measurement, convergence or ConvergenceGate()),
        _completed(measurement, planned),
    ]


def _gate(name: str, verdict: Verdict, reason: str, *, value: float | None = None, unit: str = "",
          threshold: str | None = None, enforced: bool = True) -> MetricRow:
    return MetricRow(name=name, value=_json_safe(value), unit=unit, threshold=threshold, verdict=verdict,
                     reason=reason, enforced=enforced)


def _no_errors(m: ComboMeasurement) -> MetricRow:
    if not m.errors:
        return _gate("gate.no_errors", Verdict.PASS, "no error signature on any node", value=0.0, threshold="== 0")
    summary = "; ".join(f.message for f in m.errors[:5])
    more = f" (+{len(m.errors) - 5} more)" if len(m.errors) > 5 else ""
    return _gate("gate.no_errors", Verdict.FAIL, summary + more, value=float(len(m.errors)), threshold="== 0")


def _finite_loss(m: ComboMeasurement) -> MetricRow:
    # counted and bounded as gate.no_errors is: the reports show "1 vs == 0", not a NaN loss as "not measured"
    bad = m.nan_findings
    if bad:
        return _gate("gate.finite_loss", Verdict.FAIL, "; ".join(f.message for f in bad), value=float(len(bad)),
                     threshold="== 0")
    if m.actuals.get("training.lm_loss") is None:
        return _gate("gate.finite_loss", Verdict.SKIPPED, "no loss logged", threshold="== 0")
    return _gate("gate.finite_loss", Verdict.PASS, "every logged loss and grad norm is finite, no NaN iteration",
                 value=0.0, threshold="== 0")


def _loss_slope_gate(m: ComboMeasurement, gate: LossCurveGate, planned: int | None) -> MetricRow:
    slope, sampled = loss_slope(m.points("loss"), gate, planned)
    threshold = f"< {gate.max_slope:g}"
    if slope is None:
        return _gate("gate.loss_slope", Verdict.SKIPPED, f"{sampled} sampled loss point(s) after the warm-up "
                     f"(need 2): increase training_iterations", threshold=threshold, enforced=gate.enforce)
    passed = slope < gate.max_slope
    comparison = "<" if passed else ">="
    reason = f"least-squares slope {slope:.4g} over {sampled} sampled points {comparison} {gate.max_slope:g}"
    verdict = Verdict.PASS if passed else Verdict.FAIL
    if not gate.enforce:
        verdict, reason = Verdict.RECORD, f"loss_curve.enforce is false; would {verdict.value}: {reason}"
    return _gate("gate.loss_slope", verdict, reason, value=slope, unit="loss/iteration", threshold=threshold,
                 enforced=gate.enforce)


def _convergence_gate(m: ComboMeasurement, target: ConvergenceGate) -> MetricRow:
    if not target.enabled:
        return _gate("gate.convergence", Verdict.SKIPPED, "no convergence target (target_value <= 0)",
                     enforced=False)
    result = measure_convergence(m.points("loss"), m.points("eval_loss"), m.points("step_time_ms"), target)
    threshold = f"{result.series} <= {target.target_value:g} ({'final' if target.rule == 'final' else 'any step'})"
    if result.final_loss is None:
        return _gate("gate.convergence", Verdict.FAIL if target.enforce else Verdict.RECORD,
                     f"no {result.series} logged", threshold=threshold, enforced=target.enforce)
    crossed = (f"first reached at step {result.steps_to_target}" if result.steps_to_target is not None
               else "never reached")
    value: float | None
    if target.rule == "final":
        passed = result.final_loss <= target.target_value
        comparison = "<=" if passed else ">"
        reason = f"final {result.series} {result.final_loss:.4g} {comparison} {target.target_value:g}; {crossed}"
        value = result.final_loss
    else:
        passed = result.steps_to_target is not None
        reason = f"{result.series} {crossed}; final {result.final_loss:.4g}"
        value = None if result.steps_to_target is None else float(result.steps_to_target)
    if result.note:
        reason = f"{reason} ({result.note})"
    verdict = Verdict.PASS if passed else Verdict.FAIL
    if not target.enforce:
        verdict, reason = Verdict.RECORD, f"convergence not enforced; would {verdict.value}: {reason}"
    return _gate("gate.convergence", verdict, reason, value=value,
                 unit="" if target.rule == "final" else "iterations", threshold=threshold, enforced=target.enforce)


def _completed(m: ComboMeasurement, planned: int | None) -> MetricRow:
    reached = m.actuals.get("training.iterations_reached")
    if planned is None:
        verdict = Verdict.RECORD if reached is not None else Verdict.FAIL
        return _gate("gate.completed", verdict, "planned iterations unknown" if reached is not None
                     else "no iteration logged", value=reached, unit="iterations")
    if reached is None:
        return _gate("gate.completed", Verdict.FAIL, f"no iteration logged (planned {planned})",
                     unit="iterations", threshold=f">= {planned}")
    passed = reached >= planned
    return _gate("gate.completed", Verdict.PASS if passed else Verdict.FAIL,
                 f"reached iteration {reached:g} of {planned}", value=reached, unit="iterations",
                 threshold=f">= {planned}")


__all__ = ["BaselineLookup", "BaselineStats", "builtin_gates", "evaluate"]
