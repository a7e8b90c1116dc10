"""What a suite run produces: typed results that the report, the run deck, JUnit and history read.

One `SuiteResult` per `megapilot suite run`, written to `<run_dir>/suite.json` as the run goes (after
every stage and combo), so a crash or Ctrl-C never loses what finished, and `megapilot suite report
RUN_DIR` can re-render everything from the run directory alone.

Verdicts, and what each means for a row:
    PASS     measured, gated, within its threshold
    FAIL     measured and outside its threshold, or the stage/combo failed (reason says why)
    RECORD   measured, not gated (no threshold, `info` kind, or `enforce_thresholds: false`)
    SKIPPED  not measured: an earlier stage failed, the GPU lacks the precision, an optional metric
             missing... (reason says why)
    INTERRUPTED  a stage or combo that started and never ended: the suite was stopped while it ran (Ctrl-C,
             SIGTERM, or killed); and the whole run's verdict when it did not finish. suite.json holds the
             stage or combo so while it runs, so a run killed outright is left saying where it was.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    model_serializer,
    model_validator,
)

from megapilot.diagnose.findings import Finding  # the one finding type: the suite reads diagnose's
from megapilot.errors import MegapilotError
from megapilot.files import atomic_write_text
from megapilot.spec.parallel import LayoutPins  # the one layout type (held in part: the pins)
from megapilot.spec.prediction import Prediction  # the one prediction type, the estimator's
from megapilot.suite.budget import BudgetProjection
from megapilot.suite.cells import RECORDED_LAYOUT_FIELDS, recorded_layout
from megapilot.suite.verdicts import Verdict  # a module of its own: the history reads it without the rest

# NaN/Inf in a curve (a reading the log printed) are written as "NaN"/"Infinity" strings, which read back as floats;
# JSON's null would not read back into a float field. Every other number is finite (see `_numbers`).
_STRICT = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

SUITE_RESULT_VERSION = 1
SUITE_RESULT_NAME = "suite.json"


# What a stage or combo that never started says, in every report, when the suite was stopped before it.
NOT_RUN_REASON = "not run: the suite was interrupted"


def overall_verdict(verdicts: list[Verdict]) -> Verdict:
    """FAIL if any FAIL; else INTERRUPTED if any; else PASS if any PASS; else RECORD if any RECORD; else SKIPPED."""
    for candidate in (Verdict.FAIL, Verdict.INTERRUPTED, Verdict.PASS, Verdict.RECORD):
        if candidate in verdicts:
            return candidate
    return Verdict.SKIPPED


class MetricRow(BaseModel):
    """One measured (or expected but missing) metric and its gate."""

    model_config = _STRICT

    name: str = Field(description="CVS-style metric name, e.g. training.throughput_per_gpu.")
    value: float | None = Field(default=None, description="Measured value; None when missing.")
    unit: str = ""
    threshold: str | None = Field(default=None, description="The gate as text: '>= 100', '<= 500 ms', '100 +/-5%'.")
    kind: str | None = Field(default=None, description="Threshold kind (min, max, max_ms, within, min_ratio, info, "
                                                        "baseline); None when not gated.")
    verdict: Verdict
    reason: str = ""
    margin_pct: float | None = Field(default=None, description="How far inside (+) or outside (-) the gate, in %.")
    enforced: bool = True
    node: int | None = Field(default=None, description="The node (0-based, as launched) a per-node row judges; None "
                                                        "for a row about the whole run.")


# The loss's own health is judged by the loss gates (finite loss, slope, convergence), not as an error.
LOSS_CATEGORIES = frozenset({"nan_loss", "loss_spike", "loss_divergence"})


def error_findings(findings: list[Finding]) -> list[Finding]:
    """The findings that fail a combo's `gate.no_errors` and its train stage: blocking, and not about the loss."""
    return [f for f in findings if f.blocking and f.category not in LOSS_CATEGORIES]


class Curve(BaseModel):
    """A per-iteration series: (iteration, value) points."""

    model_config = _STRICT

    name: str = Field(description="loss, step_time_ms, tokens_per_s_per_gpu, tflops_per_gpu, grad_norm, lr, ...")
    unit: str = ""
    points: list[tuple[int, float]] = Field(default_factory=list)


class JobSummary(BaseModel):
    """How a combo's training job ended, with where its logs are (relative to the run directory)."""

    model_config = _STRICT

    executor: str
    job_id: str
    state: str = Field(description="execute.JobState value: COMPLETED, FAILED, HUNG, TIMEOUT, CANCELLED...")
    exit_code: int | None = None
    reason: str | None = None
    iterations_reached: int | None = None
    train_iters: int | None = None
    duration_s: float = 0.0
    logs: list[str] = Field(default_factory=list, description="Per-node training logs, relative to run_dir.")


class ComboResult(BaseModel):
    """One sweep cell (or the smoke / checkpoint run) and everything measured about it."""

    model_config = _STRICT

    key: str = Field(description="The cell key, e.g. 'MBS=4,GBS=128,PRECISION=FP8', or 'default'.")
    directory: str = Field(description="Its job directory, relative to run_dir.")
    verdict: Verdict
    reason: str = ""
    backend: str = Field(description="megatron-lm, primus or megapilot (the embedded trainer).")
    layout: LayoutPins = Field(default_factory=lambda: LayoutPins(tp=1, pp=1, cp=1, ep=1),
                               description="What the combo ran of the layout (`RECORDED_LAYOUT_FIELDS`): TP, PP, CP, "
                               "EP and VPP as launched (VPP None: not launched), MBS as its cell set it.")
    gbs: int | None = None
    precision: str | None = None
    seq_length: int | None = None
    nodes: int = 1
    gpus_per_node: int = 1
    train_iters: int | None = None
    command: str = Field(default="", description="The launch command, secrets never included.")
    metrics: list[MetricRow] = Field(default_factory=list)
    curves: list[Curve] = Field(default_factory=list)
    predicted: Prediction | None = None
    timers_ms: dict[str, float] = Field(default_factory=dict,
                                        description="Megatron's timers (max across ranks, median over the log's "
                                                    "intervals after the first), ms per iteration.")
    findings: list[Finding] = Field(default_factory=list)
    job: JobSummary | None = None
    log_tail: list[str] = Field(default_factory=list, description="Last lines of the last node's log on failure.")
    started_at: datetime | None = None
    duration_s: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _layout_of_earlier_results(cls, data: object) -> object:
        """A result written before the layout was one field (suite.json of an earlier run, read by `suite report`
        and `suite run --resume`) has it as flat fields, TP/PP/CP/EP 1 where left out, as they were then."""
        if isinstance(data, dict) and "layout" not in data and data.keys() & set(RECORDED_LAYOUT_FIELDS):
            data = dict(data)
            flat = {name: data.pop(name, 1) for name in ("tp", "pp", "cp", "ep")}
            flat |= {name: data.pop(name, None) for name in ("vpp", "mbs")}
            data["layout"] = LayoutPins(**flat)
        return data

    @field_serializer("layout")
    def _layout_as_given(self, layout: LayoutPins) -> dict[str, Any]:
        """Only the fields the combo recorded: an unset one is left out, and reads back unset."""
        return layout.given()

    def actual(self, name: str) -> float | None:
        """A measured metric's value by name (None when absent)."""
        for row in self.metrics:
            if row.name == name:
                return row.value
        return None


class StageResult(BaseModel):
    """One lifecycle stage (prepare, preflight, tokenizer, smoke, checkpoint, train, metrics, ...)."""

    model_config = _STRICT

    name: str
    combo: str | None = Field(default=None, description="The cell key for per-combo stages.")
    verdict: Verdict
    reason: str = ""
    started_at: datetime | None = None
    duration_s: float = 0.0
    checks: list[MetricRow] = Field(default_factory=list, description="Readings (preflight) or checks (checkpoint).")
    jobs: list[JobSummary] = Field(default_factory=list, description="The stage's own jobs (checkpoint save and "
                                                                      "resume), with their logs.")
    curves: list[Curve] = Field(default_factory=list, description="Series the stage measured: the collectives "
                                                                  "stage's bus bandwidth (GB/s) by message bytes.")


class RunCard(BaseModel):
    """What ran, where, with what: the head of the report and of the run deck."""

    model_config = _STRICT

    suite_name: str
    model: str
    model_family: str = ""
    gpu: str
    nodes: int
    gpus_per_node: int
    executor: str
    backend: str
    layout: str = Field(default="", description="e.g. 'TP=1,PP=1,CP=1,EP=1,DP=2'.")
    precision: str = Field(default="", description="What the cells trained in (FP32 on a CPU run, whatever asked).")
    device: str = Field(default="", description="CPU, or GPU (its name): where the training ran.")
    megapilot_version: str = ""
    git_commit: str | None = None
    megatron_version: str | None = None
    torch_version: str | None = None
    python_version: str = ""
    host: str = ""
    config_file: str = ""
    cluster_file: str | None = None
    cluster_name: str | None = Field(default=None, description="The cluster the run is recorded under (the cluster "
                                                                "file's name, or --cluster-name).")
    threshold_file: str | None = None
    config_hash: str = Field(default="", description="sha256 of the resolved config (secrets excluded).")
    enforce_thresholds: bool = True


class Regression(BaseModel):
    """A metric that moved against the run history (computed by megapilot.store, shown by the report)."""

    model_config = _STRICT

    combo: str
    metric: str
    value: float
    baseline_median: float
    change_pct: float = Field(description="(value - median) / median x 100; sign as measured.")
    runs_compared: int
    worse: bool = Field(description="True when the change is in the bad direction for this metric.")
    message: str = Field(description="e.g. 'tokens/s -8.3 % vs the median of the last 5 runs'.")


class SuiteResult(BaseModel):
    """A whole suite run. Written as `<run_dir>/suite.json` and updated as the run goes.

    `verdict` and `reason` are what the gates said. suite.json stores the run's one verdict there instead
    (`megapilot.suite.outcome`, what the report, the history and `suite run --json` say); where that is not the
    gates' (a regression beyond its band: WARN, or FAIL under enforcement), the gates' are kept beside it as
    `gates_verdict` and `gates_reason`, and read back into `verdict` and `reason`. A file without them (written
    before, or by a run the gates decided) reads as it is."""

    model_config = _STRICT

    version: int = SUITE_RESULT_VERSION
    run_id: str
    run_dir: str
    verdict: Verdict = Field(description="What the gates said; stored as the run's one verdict (see above).")
    reason: str = ""
    card: RunCard
    started_at: datetime
    ended_at: datetime | None = None
    duration_s: float = 0.0
    finished: bool = Field(default=False, description="False while running, or when interrupted.")
    stages: list[StageResult] = Field(default_factory=list)
    combos: list[ComboResult] = Field(default_factory=list)
    regressions: list[Regression] = Field(default_factory=list, description="Filled from the run history.")
    regressions_enforced: bool = Field(default=False, description="A regression beyond its band fails the run "
                                                                  "(regressions.enforce / --enforce-regressions).")
    notes: list[str] = Field(default_factory=list, description="What the user should know (defaults taken...).")
    budget: BudgetProjection | None = Field(default=None, description="The config's token budget, projected from "
                                                                      "what the run measured.")
    planned_combos: list[str] = Field(default_factory=list, description="The combos (cell keys) the run was to run, "
                                      "in order: those an interrupted run never started are the rest.")
    stopped_by: str | None = Field(default=None, description="What stopped an unfinished run: the signal (SIGINT, "
                                   "SIGTERM, SIGHUP) or the error; None when nothing was seen (killed outright, or "
                                   "still running).")

    @model_validator(mode="before")
    @classmethod
    def _gates_verdict_as_stored(cls, data: object) -> object:
        """suite.json whose verdict a regression decided: the gates' verdict and reason are the ones kept beside."""
        if isinstance(data, dict) and "gates_verdict" in data:
            data = dict(data)
            data["verdict"] = data.pop("gates_verdict")
            data["reason"] = data.pop("gates_reason", "")
        return data

    @model_serializer(mode="wrap")
    def _one_verdict_stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The run's one verdict as `verdict` and `reason`; the gates' beside it when they differ."""
        data: dict[str, Any] = handler(self)
        from megapilot.suite.outcome import stored_verdict  # cycle: the outcome is judged from this module's types

        status, reason = stored_verdict(self)
        if "verdict" not in data or status.value == self.verdict.value:
            return data
        stored: dict[str, Any] = {}
        for key, value in data.items():
            if key == "verdict":
                stored |= {"verdict": status.value, "reason": reason, "gates_verdict": value,
                           "gates_reason": data.get("reason", self.reason)}
            elif key != "reason":
                stored[key] = value
        return stored

    def combo(self, key: str) -> ComboResult | None:
        for combo in self.combos:
            if combo.key == key:
                return combo
        return None

    def interrupted_stage(self) -> StageResult | None:
        """The run-wide stage the run was stopped in (None: it was in a combo, between two steps, or finished)."""
        return next((s for s in self.stages if s.verdict is Verdict.INTERRUPTED and s.combo is None), None)

    def interrupted_combo(self) -> ComboResult | None:
        """The combo the run was stopped in (None: it was not in one)."""
        return next((c for c in self.combos if c.verdict is Verdict.INTERRUPTED), None)

    def not_started(self) -> list[str]:
        """The planned combos an unfinished run never started, in order (none once the run finished: a finished run
        lists every combo, skipped ones included)."""
        if self.finished:
            return []
        begun = [c.key for c in self.combos if c.key != "smoke"]
        left = []
        for key in self.planned_combos:  # a key listed twice in sweep.runs is run twice: matched one for one
            if key in begun:
                begun.remove(key)
            else:
                left.append(key)
        return left

    def finished_verdict(self) -> Verdict:
        """The verdict of what finished: every stage and combo but the one the run was stopped in."""
        return overall_verdict([v for v in [s.verdict for s in self.stages] + [c.verdict for c in self.combos]
                                if v is not Verdict.INTERRUPTED])

    def failure_summary(self) -> str:
        """What failed, in one line: failed stages first, then failed combos."""
        stages = [s.name for s in self.stages if s.verdict is Verdict.FAIL and s.combo is None]
        combos = [c.key for c in self.combos if c.verdict is Verdict.FAIL and c.key != "smoke"]
        parts = ([f"stage {', '.join(stages)} failed"] if stages else []) + \
            ([f"{len(combos)} combo(s) failed: {'; '.join(combos)}"] if combos else [])
        return "; ".join(parts)

    def recompute_verdict(self) -> Verdict:
        """Overall verdict from every stage and combo (FAIL wins); stored and returned."""
        verdicts = [s.verdict for s in self.stages] + [c.verdict for c in self.combos]
        self.verdict = overall_verdict(verdicts)
        return self.verdict

    def write(self, run_dir: Path | None = None) -> Path:
        """Write atomically and durably to `<run_dir>/suite.json` (a reader, or a resume after a reboot, never
        sees half a file)."""
        directory = Path(run_dir or self.run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        data = json.loads(self.model_dump_json())
        for _, number, held_in, key, _owner in _numbers(self, data, ()):
            if not math.isfinite(number):  # no JSON form: null (not measured), as the run deck writes it
                held_in[key] = None
        return atomic_write_text(directory / SUITE_RESULT_NAME, json.dumps(data, indent=2, ensure_ascii=False))


def read_suite_result(run_dir: Path) -> SuiteResult:
    """Load `<run_dir>/suite.json`; a missing or unreadable file is a user error naming the directory."""

    path = Path(run_dir) / SUITE_RESULT_NAME
    if not path.is_file():
        raise MegapilotError(f"{run_dir} has no {SUITE_RESULT_NAME}", field="run_dir",
                             fix="pass the directory `megapilot suite run` printed")
    damaged = "re-run the suite; the file was written by another version or damaged"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] > SUITE_RESULT_VERSION:
            raise MegapilotError(f"{path} is suite result version {data['version']}; this megapilot reads up to "
                                 f"version {SUITE_RESULT_VERSION}", field="run_dir",
                                 fix="report it with the megapilot that ran the suite (or a newer one)")
        result = SuiteResult.model_validate(data)
    except ValidationError as exc:
        raise MegapilotError(f"{path} is not a suite result ({_first_error(exc)})", field="run_dir",
                             fix=f"correct that field, or {damaged}") from None
    except MegapilotError:
        raise
    except ValueError as exc:
        raise MegapilotError(f"{path} is not a suite result ({str(exc).splitlines()[0]})", field="run_dir",
                             fix=damaged) from None
    for where, _, held_in, key, owner in _numbers(result, data, ()):
        found = held_in[key]
        if found in _EARLIER_NON_FINITE and _may_be_unset(owner, key):
            setattr(owner, key, None)  # as `write` writes it now: no bound, nothing measured
            continue
        if isinstance(found, bool) or not isinstance(found, int | float) or not math.isfinite(found):
            raise MegapilotError(f"{path} is not a suite result ({where}: Input should be a finite number (found "
                                 f"{_short(found)}))", field="run_dir", fix=f"correct that field, or {damaged}")
    return result


# How megapilot wrote an infinite or NaN number before `write` wrote null for it (a gate's margin when the measured
# figure was 0, a budget's checkpoint interval with no failures, a measured value the log made infinite): read back
# as unset where the field may be unset, so those runs still report and resume; anywhere else it is damage.
_EARLIER_NON_FINITE = ("Infinity", "-Infinity", "NaN")


def _may_be_unset(owner: object, key: object) -> bool:
    """Whether `owner`'s field `key` takes None (a model's optional number)."""
    if not isinstance(owner, BaseModel) or not isinstance(key, str) or key not in type(owner).model_fields:
        return False
    return type(None) in get_args(type(owner).model_fields[key].annotation)


# The one rule for every number of suite.json, whatever type holds it (a duration, a gate's value, margin or
# threshold, a regression, a prediction, a budget): a finite JSON number. `write` writes a number that is not finite as
# null, and `read_suite_result` refuses anything else found where a number belongs (a NaN, an infinity, text such as
# "Infinity" or "12", a boolean), by its path and the value found: damage, which a report, run deck or history row made
# of it would pass on. A curve's points are exempt: a non-finite one is a reading the log printed (a diverged loss),
# drawn as a gap.
_Numbers = Iterator[tuple[str, float, "dict[Any, Any] | list[Any]", Any, object]]


def _numbers(node: object, held: object, where: tuple[str, ...]) -> _Numbers:
    """Each number of `node` (a result, or any part of one) with its dotted path, and the JSON container and key that
    hold it in `held`, `node` as JSON; a part `held` lacks is passed over (a key the file leaves out holds its default,
    and one an earlier format held elsewhere was read from there)."""
    if isinstance(node, Curve) or not isinstance(held, dict | list):
        return
    children: list[tuple[Any, object]]
    if isinstance(node, BaseModel):
        children = [(name, getattr(node, name)) for name in type(node).model_fields]
    elif dataclasses.is_dataclass(node):
        children = [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    elif isinstance(node, dict):
        children = list(node.items())
    elif isinstance(node, list | tuple):
        children = list(enumerate(node))
    else:
        return
    for key, child in children:
        if key in held if isinstance(held, dict) else isinstance(key, int) and key < len(held):
            path = (*where, str(key))
            if isinstance(child, int | float) and not isinstance(child, bool):
                yield ".".join(path), child, held, key, node
            else:
                yield from _numbers(child, held[key], path)


def _first_error(exc: ValidationError) -> str:
    """The first field pydantic refused, by its dotted path in the file and with the value found there, and how many
    more there are: which part of a damaged file to look at."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    found = "" if first["type"] == "missing" else f" (found {_short(first.get('input'))})"
    more = f"; and {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{found}{more}"


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


__all__ = [
    "LOSS_CATEGORIES",
    "NOT_RUN_REASON",
    "RECORDED_LAYOUT_FIELDS",
    "SUITE_RESULT_NAME",
    "ComboResult",
    "Curve",
    "Finding",
    "JobSummary",
    "MetricRow",
    "Regression",
    "RunCard",
    "StageResult",
    "SuiteResult",
    "Verdict",
    "error_findings",
    "overall_verdict",
    "read_suite_result",
    "recorded_layout",
]
