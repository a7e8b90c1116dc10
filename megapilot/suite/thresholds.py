"""Threshold files in CVS's cell-keyed form, and the gate each spec applies.

    {
      "_comment": "...",
      "MBS=4,GBS=128,PRECISION=FP8": {
        "training.throughput_per_gpu": {"kind": "min", "value": 100},
        "training.elapsed_time_per_iteration": {"kind": "max_ms", "value": 500},
        "training.mem_usage": {"kind": "max", "value": 0.85, "optional": true}
      }
    }

Kinds (CVS's, plus `baseline`), one class each: the spec is a discriminated union on `kind`, and each class
says how its gate reads (`describe`) and judges a measured value (`judge`). A new kind is one class added to
`ThresholdSpec`.
    min / min_tok_s   actual >= value
    max / max_ms      actual <= value
    within            value*(1-p/100) <= actual <= value*(1+p/100), p = tolerance_pct
    min_ratio         actual / actual[reference] >= value (reference: another metric of the same cell)
    info              recorded, never gated
    baseline          within tolerance_pct of the median of the last `last_n` passing runs of the same
                      model/layout/GPU in the run history (no history yet: RECORD)
    predicted         at least `min_ratio` of megapilot's (calibrated) prediction for the combo, in the metric's
                      good direction: `{"kind": "predicted", "min_ratio": 0.9}` (megapilot.suite.predicted)
`optional: true`: a metric that is missing is SKIPPED instead of FAIL. A metric the log prints below its resolution
(a TFLOP/s/GPU of 0.0, megapilot.suite.metrics), or one that cannot exist on the run's device (the MFU of a CPU run:
the metric table's `gpu_only`), is not measured, and SKIPPED under any kind but `info` (RECORD).
Keys starting with `_` are comments.
Margins are in %, positive inside the gate and negative outside; a value at the bound passes with margin 0.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from megapilot.spec.training import Precision
from megapilot.suite.config_read import _message, near_key
from megapilot.suite.metric_table import MEASURED_METRICS, METRICS, measured_name
from megapilot.suite.results import Verdict

if TYPE_CHECKING:
    from megapilot.spec import GPUSpec, Prediction
    from megapilot.suite.predicted import Departure

DEFAULT_CELL = "default"


@dataclass(frozen=True)
class BaselineStats:
    """What the run history says about one metric: the median of its last passing runs."""

    median: float
    runs: int


class BaselineLookup(Protocol):
    """The caller's view of history: a metric's baseline, or None when there is none yet."""

    def __call__(self, metric: str) -> BaselineStats | None: ...


@dataclass(frozen=True)
class Outcome:
    """A gate's result before enforcement: PASS/FAIL (or RECORD/SKIPPED) with its reason and margin."""

    verdict: Verdict
    reason: str = ""
    margin_pct: float | None = None


@dataclass(frozen=True)
class GateInput:
    """What a gate judges: the metric, its value, the cell's other actuals, the history, why it may be missing."""

    name: str
    value: float | None
    actuals: Mapping[str, float | None]
    baseline: BaselineLookup | None = None
    missing_reason: str | None = None
    prediction: Prediction | None = None  # what megapilot predicted for the combo, before it ran
    departure: Departure | None = None  # where the measured step departs from that prediction
    unresolved: bool = False  # missing below the log's resolution, or off the run's device: no fault of the run's


@dataclass(frozen=True)
class Peak:
    """The suite's GPU's dense peak at a cell's precision (the catalog's, as the MFU divides by): the TFLOP/s per GPU
    no run of that cell exceeds, for a metric the table marks `peak_bound`."""

    tflops: float
    gpu: str
    precision: str

    @classmethod
    def of(cls, gpu: GPUSpec, precision: str) -> Peak | None:
        """The peak of a cell's precision (as the config writes it, FP8); None for one the catalog has no peak of."""
        name = precision.lower()
        if name not in get_args(Precision):
            return None
        return cls(gpu.peak_tflops(name), gpu.name, precision)  # type: ignore[arg-type]  # checked just above

    def __str__(self) -> str:
        return f"{self.tflops:g} TFLOP/s/GPU, the {self.gpu} dense {self.precision} peak"


def _ceiling(metric: str, peak: Peak | None) -> tuple[float, str] | None:
    """The most a measurement of `metric` can be, as said: the GPU's peak for a metric it bounds (when known), else
    the table's ceiling; None when unbounded."""
    info = METRICS.get(metric)
    if info is None:
        return None
    if info.peak_bound and peak is not None:
        return peak.tflops, str(peak)
    return None if info.ceiling is None else (info.ceiling, f"{info.ceiling:g}")


class _Threshold(BaseModel):
    """What every kind shares: `optional`, CVS's extra keys kept, and the order of the checks."""

    # CVS files carry comments and future fields: unknown keys are kept. A NaN or infinite bound gates nothing.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    optional: bool = False

    def describe(self) -> str:
        raise NotImplementedError

    def settled(self, metric: str, peak: Peak | None = None) -> str | None:
        """Why this gate's verdict on `metric` is the same on every run whatever is measured (a bound no value can
        miss, or none can meet), said before anything runs; None when the measurement decides. `peak`: the suite's
        GPU's at the cell's precision, where known (the ceiling of a `peak_bound` metric)."""
        return None

    def judge(self, gate: GateInput) -> Outcome:
        """Missing, then not finite, then the kind's own rule on a finite value."""
        if gate.value is None:
            return self._missing(gate)
        if not math.isfinite(gate.value):
            return Outcome(Verdict.FAIL, f"value is {gate.value} (not a finite number)")
        return self.judge_value(gate.value, gate)

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        raise NotImplementedError

    def _missing(self, gate: GateInput) -> Outcome:
        if self.optional:
            return Outcome(Verdict.SKIPPED, f"optional, not measured ({gate.missing_reason or 'not in the log'})")
        if gate.unresolved:  # too coarse a print, or not on this device: nothing to gate, nothing wrong
            return Outcome(Verdict.SKIPPED, f"not measured ({gate.missing_reason or 'below the log resolution'})")
        expected = (METRICS[gate.name].expected_line if gate.name in METRICS else None) or "a line that reports it"
        why = f" ({gate.missing_reason})" if gate.missing_reason else ""
        return Outcome(Verdict.FAIL, f"missing from the log{why}; expected {expected}")


class MinThreshold(_Threshold):
    kind: Literal["min", "min_tok_s"]
    value: float

    def describe(self) -> str:
        return f">= {self.value:g}"

    def settled(self, metric: str, peak: Peak | None = None) -> str | None:
        info = METRICS.get(metric)
        if info is None:
            return None
        if info.floor is not None and self.value <= info.floor:
            return f"a floor of {self.value:g} passes every run ({metric} is never below {info.floor:g})"
        ceiling = _ceiling(metric, peak)
        if ceiling is not None and self.value > ceiling[0]:
            return f"a floor of {self.value:g} fails every run ({metric} is never above {ceiling[1]})"
        return None

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        passed = value >= self.value
        return Outcome(Verdict.PASS if passed else Verdict.FAIL,
                       f"{value:g} {'>=' if passed else '<'} {self.value:g}", _margin(value - self.value, self.value))


class MaxThreshold(_Threshold):
    kind: Literal["max", "max_ms"]
    value: float

    @property
    def unit(self) -> str:
        return " ms" if self.kind == "max_ms" else ""

    def describe(self) -> str:
        return f"<= {self.value:g}{self.unit}"

    def settled(self, metric: str, peak: Peak | None = None) -> str | None:
        info = METRICS.get(metric)
        if info is None:
            return None
        if info.floor is not None and (self.value <= info.floor if info.above_floor else self.value < info.floor):
            bound = f"always above {info.floor:g}" if info.above_floor else f"never below {info.floor:g}"
            return f"a ceiling of {self.value:g}{self.unit} fails every run ({metric} is {bound})"
        ceiling = _ceiling(metric, peak)
        if ceiling is not None and self.value > ceiling[0]:
            # a fraction written as a percentage (85 for 0.85) is the likely slip
            meant = f"; did you mean {self.value / 100:g}?" if ceiling[0] == 1 and 10 <= self.value <= 100 else ""
            return f"a ceiling of {self.value:g} passes every run ({metric} is never above {ceiling[1]}{meant})"
        return None

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        passed = value <= self.value
        return Outcome(Verdict.PASS if passed else Verdict.FAIL,
                       f"{value:g}{self.unit} {'<=' if passed else '>'} {self.value:g}{self.unit}",
                       _margin(self.value - value, self.value))


class WithinThreshold(_Threshold):
    kind: Literal["within"]
    value: float
    tolerance_pct: float = Field(ge=0)

    def describe(self) -> str:
        return f"{self.value:g} +/-{self.tolerance_pct:g}%"

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        return band(value, self.value, self.tolerance_pct, "")


class MinRatioThreshold(_Threshold):
    kind: Literal["min_ratio"]
    value: float
    reference: str = Field(min_length=1, description="The metric the ratio is taken against.")

    @field_validator("reference")
    @classmethod
    def _measured_reference(cls, reference: str) -> str:
        """Another dialect's name of a measured metric (the metric table's `same_as`) refers to that metric."""
        return measured_name(reference)

    def describe(self) -> str:
        return f">= {self.value:g} x {self.reference}"

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        reference, actuals = self.reference, gate.actuals
        ref_value = actuals.get(reference)
        if reference not in actuals and reference not in METRICS:
            if self.optional:  # as a reference that is not measured: what `suite check` said it would be
                return Outcome(Verdict.SKIPPED, f"optional; reference {unknown_name(reference, actuals)}")
            return Outcome(Verdict.FAIL, f"reference {unknown_name(reference, actuals)}")
        if ref_value is None or not math.isfinite(ref_value) or ref_value == 0:
            if self.optional:
                return Outcome(Verdict.SKIPPED, f"optional; reference {reference} is {ref_value}, no ratio")
            return Outcome(Verdict.FAIL, f"reference {reference} is {ref_value}: no ratio can be taken")
        ratio = value / ref_value
        passed = ratio >= self.value
        return Outcome(Verdict.PASS if passed else Verdict.FAIL,
                       f"{value:g} / {reference} {ref_value:g} = {ratio:g} {'>=' if passed else '<'} {self.value:g}",
                       _margin(ratio - self.value, self.value))


class InfoThreshold(_Threshold):
    kind: Literal["info"]
    value: float | None = None

    def describe(self) -> str:
        return "info" if self.value is None else f"info ({self.value:g})"

    def judge(self, gate: GateInput) -> Outcome:
        return Outcome(Verdict.RECORD, "info: recorded, never gated" if gate.value is not None
                       else f"info: not measured ({gate.missing_reason or 'not in the log'})")


class BaselineThreshold(_Threshold):
    kind: Literal["baseline"]
    tolerance_pct: float = Field(ge=0)
    last_n: int = Field(default=5, ge=1, description="How many earlier passing runs make the median.")

    def describe(self) -> str:
        return f"median of last {self.last_n} passing runs +/-{self.tolerance_pct:g}%"

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        stats = gate.baseline(gate.name) if gate.baseline is not None else None
        if stats is None or stats.runs <= 0:
            return Outcome(Verdict.RECORD, "no history yet for this model/layout/GPU: recorded as the first baseline")
        return band(value, stats.median, self.tolerance_pct, f" of the median of {stats.runs} run(s)")


class PredictedThreshold(_Threshold):
    """The measurement within `min_ratio` of the combo's calibrated prediction, in the metric's good direction."""

    kind: Literal["predicted"]
    min_ratio: float = Field(gt=0, le=1, description="The least measured / predicted ratio (good direction).")

    def describe(self) -> str:
        return f">= {self.min_ratio:g} x predicted"

    def settled(self, metric: str, peak: Peak | None = None) -> str | None:
        from megapilot.suite.predicted import PREDICTED_METRICS  # cycle: suite.predicted imports thresholds

        if metric not in PREDICTED_METRICS:
            return f"megapilot predicts no {metric}, so this gate fails every run (kind predicted gates one of " \
                   f"{', '.join(PREDICTED_METRICS)})"
        return None

    def judge_value(self, value: float, gate: GateInput) -> Outcome:
        from megapilot.suite.predicted import judge_predicted  # cycle: suite.predicted imports thresholds

        return judge_predicted(gate.name, value, self.min_ratio, gate.prediction, gate.departure)


ThresholdSpec = Annotated[
    MinThreshold | MaxThreshold | WithinThreshold | MinRatioThreshold | InfoThreshold | BaselineThreshold
    | PredictedThreshold,
    Field(discriminator="kind"),
]
_SPEC = TypeAdapter(ThresholdSpec)
THRESHOLD_KINDS: tuple[str, ...] = tuple(
    kind for spec in get_args(get_args(ThresholdSpec)[0]) for kind in get_args(spec.model_fields["kind"].annotation))
# A threshold table: cell key -> metric name -> spec. Comment keys (leading `_`) are dropped on load.
ThresholdTable = dict[str, dict[str, ThresholdSpec]]


def parse_threshold(data: Any) -> ThresholdSpec:
    """One spec from a threshold file; a ValueError naming what its kind needs when it is incomplete."""
    try:
        return _SPEC.validate_python(data)
    except ValidationError as exc:
        raise ValueError(_problem(exc.errors()[0], data)) from None


def threshold(**fields: Any) -> ThresholdSpec:
    """A spec from keyword fields: `threshold(kind="min", value=100)`."""
    return parse_threshold(fields)


def _problem(error: Any, data: Any) -> str:
    kind = data.get("kind") if isinstance(data, dict) else None
    if not isinstance(data, dict):
        return f"a spec is an object with a kind, not {data!r}"
    if error["type"] == "union_tag_not_found":
        return f"the spec has no 'kind' (use one of {', '.join(THRESHOLD_KINDS)})"
    if error["type"] == "union_tag_invalid":
        return f"kind {kind!r} is not a threshold kind (use one of {', '.join(THRESHOLD_KINDS)})"
    field = ".".join(str(part) for part in error["loc"][1:])
    if error["type"] == "missing":
        what = "a numeric 'value'" if field == "value" else repr(field)
        return f"kind {kind!r} needs {what}"
    return f"{field}: {_message(error)}"  # with the value found, as the config's own problems say it


def band(value: float, centre: float, tolerance_pct: float, what: str) -> Outcome:
    """Inside [centre(1-p), centre(1+p)]; the margin is the distance to the nearer bound."""
    low, high = centre * (1 - tolerance_pct / 100.0), centre * (1 + tolerance_pct / 100.0)
    low, high = min(low, high), max(low, high)
    passed = low <= value <= high
    inside = min(value - low, high - value)
    text = f"{value:g} {'inside' if passed else 'outside'} [{low:g}, {high:g}] ({centre:g} +/-{tolerance_pct:g}%{what})"
    return Outcome(Verdict.PASS if passed else Verdict.FAIL, text, _margin(inside, centre))


def unknown_name(name: str, actuals: Mapping[str, float | None]) -> str:
    known = sorted(set(MEASURED_METRICS) | set(actuals))
    close = close_metrics(name, known)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known metrics: {', '.join(known)}"
    return f"unknown metric {name!r}: nothing measures it{hint}"


def close_metrics(name: str, known: Sequence[str] = MEASURED_METRICS) -> list[str]:
    """The measured metrics `name` may have meant: the one measuring the same quantity under the suite's name
    (`training.tflops_per_gpu` -> training.throughput_per_gpu), else the nearest spellings."""
    quantity = METRICS[name].quantity if name in METRICS else None
    same = [other for other in known if quantity is not None and METRICS.get(other) is not None
            and METRICS[other].quantity == quantity and other != name]
    # compared without the `training.` every name shares, which makes any two names look alike
    stems = {other.removeprefix(_PREFIX): other for other in known}
    spelled = [stems[stem] for stem in difflib.get_close_matches(name.removeprefix(_PREFIX), list(stems), n=3,
                                                                 cutoff=0.6)]
    return list(dict.fromkeys(same[:1] + spelled))[:3]


_PREFIX = "training."


# ---- what `suite check` says of a spec before anything runs ------------------------------------------------
@dataclass(frozen=True)
class SpecIssue:
    """Something a threshold spec asks that its gate will not do as written, found before anything runs."""

    message: str
    fix: str
    blocks: bool  # True: the gate is settled or misread whatever is measured (a problem while thresholds are
    # enforced); False: a key the gate ignores, or a metric that only ever records or skips (a warning)


SETTLED_FIX = "give a bound a measurement can miss"
_FIELDS_OF_KIND = {kind: frozenset(spec.model_fields) for spec in get_args(get_args(ThresholdSpec)[0])
                   for kind in get_args(spec.model_fields["kind"].annotation)}
_SPEC_FIELDS = frozenset().union(*_FIELDS_OF_KIND.values())


def spec_issues(metric: str, data: Mapping[str, Any], spec: ThresholdSpec) -> list[SpecIssue]:
    """What `suite check` reports of one parsed spec (`data`: as written): its metric and reference, keys its kind
    does not read, and a bound that settles the verdict. Run time says the same of each (megapilot.suite.gates).
    A metric under another dialect's name (the metric table's `same_as`) is the measured metric it names."""
    metric = measured_name(metric)
    issues = _metric_issues(metric, spec, "")
    if isinstance(spec, MinRatioThreshold):
        issues += _metric_issues(spec.reference, spec, "reference ")
    issues += _field_issues(data, spec)
    settled = spec.settled(metric)
    if settled is not None:
        issues.append(SpecIssue(settled, SETTLED_FIX, blocks=True))
    else:  # a settled bound says enough of it
        issues += _direction_issues(metric, spec)
    return issues


def peak_issue(metric: str, spec: ThresholdSpec, peak: Peak) -> SpecIssue | None:
    """What `suite check` says of a spec once the suite's GPU is known, beyond `spec_issues`: a bound the GPU's dense
    peak at the cell's precision settles (a TFLOP/s/GPU floor above it fails every run)."""
    metric = measured_name(metric)
    if spec.settled(metric) is not None:  # said already, by spec_issues
        return None
    settled = spec.settled(metric, peak)
    return None if settled is None else SpecIssue(settled, SETTLED_FIX, blocks=True)


def _direction_issues(metric: str, spec: ThresholdSpec) -> list[SpecIssue]:
    """A bound that points the wrong way for its metric (a floor on a step time: CVS's legacy suite gated
    elapsed_time_per_iteration as higher-is-better), or a kind named for another unit (max_ms on tokens/s). Warnings:
    the gate still judges as written, and a deliberate sanity bound is possible."""
    info = METRICS.get(metric)
    if info is None or not isinstance(spec, MinThreshold | MaxThreshold):
        return []
    issues = []
    if isinstance(spec, MinThreshold) and info.direction == "lower":
        issues.append(SpecIssue(f"a floor ({spec.kind}) on {metric}, which is better lower: it passes a worse run and "
                                "fails a better one", "use kind max for a ceiling" + (
                                    " (max_ms for a time in ms)" if info.unit == "ms" else ""), blocks=False))
    if isinstance(spec, MaxThreshold) and info.direction == "higher":
        issues.append(SpecIssue(f"a ceiling ({spec.kind}) on {metric}, which is better higher: it passes a worse run "
                                "and fails a better one", "use kind min for a floor", blocks=False))
    for kind, unit in (("max_ms", "ms"), ("min_tok_s", "tok/s/GPU")):
        if spec.kind == kind and info.unit != unit and not issues:  # a bound pointing the wrong way says enough
            issues.append(SpecIssue(f"kind {kind} is for a metric in {unit}; {metric} is in {info.unit or 'no unit'}",
                                    f"use kind {kind.split('_')[0]}", blocks=False))
    return issues


def _metric_issues(metric: str, spec: ThresholdSpec, role: str) -> list[SpecIssue]:
    if metric in MEASURED_METRICS:
        return []
    close = close_metrics(metric)
    fix = f"rename it to {close[0]}" if close else f"gate one of: {', '.join(MEASURED_METRICS)}"
    if metric in METRICS:
        problem = f"{role}{metric!r} is not measured by the suite (a name the history reads from other tools)"
    else:
        problem = f"unknown {role}metric {metric!r}: nothing measures it" + (
            f" (did you mean {', '.join(close)}?)" if close else "")
    if isinstance(spec, InfoThreshold):
        return [SpecIssue(f"{problem}; recorded as not measured on every run", fix, blocks=False)]
    if spec.optional:
        return [SpecIssue(f"{problem}; optional, so SKIPPED on every run", fix, blocks=False)]
    return [SpecIssue(f"{problem}; the gate fails every run", fix, blocks=True)]


def _field_issues(data: Mapping[str, Any], spec: ThresholdSpec) -> list[SpecIssue]:
    own = _FIELDS_OF_KIND[spec.kind]
    issues = []
    for key in (k for k in data if isinstance(k, str) and not k.startswith("_") and k not in own):
        near = near_key(key, own) or near_key(key, _SPEC_FIELDS)
        kinds = sorted(kind for kind, fields in _FIELDS_OF_KIND.items() if key in fields)
        if near is not None and near in own:
            issues.append(SpecIssue(f"unknown field {key!r} (did you mean {near}?)", f"rename it to {near}", True))
        elif kinds or near is not None:
            field = key if kinds else near
            takes = ", ".join(sorted(k for k, fields in _FIELDS_OF_KIND.items() if field in fields))
            issues.append(SpecIssue(
                f"{key!r} is not read by kind {spec.kind!r} (its fields: {', '.join(sorted(own - {'kind'}))}); "
                f"{field} belongs to kind {takes}", f"use a kind that reads it ({takes}), or remove it", True))
        else:
            issues.append(SpecIssue(f"{key!r} is not a field of a threshold spec; ignored",
                                    "remove it, or write a comment key starting with _", False))
    return issues


def _margin(distance: float, scale: float) -> float | None:
    return distance / abs(scale) * 100.0 if scale else None


__all__ = ["DEFAULT_CELL", "SETTLED_FIX", "THRESHOLD_KINDS", "BaselineLookup", "BaselineStats", "BaselineThreshold",
           "GateInput", "InfoThreshold", "MaxThreshold", "MinRatioThreshold", "MinThreshold", "Outcome", "Peak",
           "PredictedThreshold", "SpecIssue", "ThresholdSpec", "ThresholdTable", "WithinThreshold", "band",
           "close_metrics", "parse_threshold", "peak_issue", "spec_issues", "threshold", "unknown_name"]
