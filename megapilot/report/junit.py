"""JUnit XML for CI: one testsuite, one testcase per lifecycle stage, per combo and per metric row.

CI systems (GitLab, Jenkins, GitHub test reporters) show a suite run as tests this way:

    classname  megapilot.suite.<stage name>   for a run-wide stage (prepare, preflight, ...)
               megapilot.suite.<combo key>    for a combo, its per-combo stages and its metric rows
    name       the stage name, 'training' for the combo itself, or the metric name

The testsuite carries every attribute Ant's JUnit schema requires (name, timestamp in UTC to the second with no
zone, hostname, tests, failures, errors, time), which the strictest readers check.

FAIL is a `<failure message=...>` (the combo's log tail as its text), SKIPPED is `<skipped message=...>`,
RECORD passes and carries a `verdict=RECORD` property (measured, not gated). Every metric row carries
its value, unit and threshold as properties. A metric row is one case however many places hold it: a combo's
`metrics` stage and the smoke stage hold copies of their combo's rows, and a stage may hold a row of its own name
(tokenizer); CI readers key cases by classname and name, and would count a failure twice or drop one of the two.
Log text may hold bytes XML cannot (ANSI colour codes, other control characters): they are dropped so the file
always parses.

An interrupted run is never green to a CI parser, which reads the counts and the cases, not the properties: the
stage or combo it stopped in is an `<error type="INTERRUPTED">` (where it stopped, and the combo's partial log
tail as its text), every stage and combo it never started is a case `<skipped message="not run: the suite was
interrupted">`, and a run stopped between two steps gets one error case of its own (`megapilot.suite.run`).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from megapilot.report import measures
from megapilot.suite.outcome import RunOutcome, run_outcome
from megapilot.suite.predicted import components_ms
from megapilot.suite.results import NOT_RUN_REASON, ComboResult, MetricRow, StageResult, SuiteResult, Verdict
from megapilot.suite.stages import COMBO_STAGES, STAGES

JUNIT_NAME = "junit.xml"
CLASS_PREFIX = "megapilot.suite"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """Text XML 1.0 can hold: ANSI colour sequences and other control characters removed."""
    return _NOT_XML.sub("", _ANSI.sub("", text))


def build_junit(result: SuiteResult) -> str:
    """The JUnit XML document of a suite result."""
    suite = ET.Element("testsuite", name=xml_text(f"{CLASS_PREFIX}.{result.card.suite_name}"),
                       timestamp=_timestamp(result.started_at), hostname=xml_text(result.card.host) or "localhost",
                       time=_seconds(result.duration_s))
    outcome = run_outcome(result)
    properties = ET.SubElement(suite, "properties")
    for label, value in (("run_id", result.run_id), ("started_at", result.started_at.isoformat()),
                         ("model", result.card.model), ("gpu", result.card.gpu),
                         ("verdict", outcome.status.value), ("verdict_reason", outcome.summary),
                         ("exit_code", str(outcome.exit_code))):
        ET.SubElement(properties, "property", name=label, value=xml_text(value))
    seen: set[tuple[str, str]] = set()  # (owner, name) of every case written: each once
    for stage in result.stages:
        _stage_case(suite, stage, seen)
    for combo in result.combos:
        _combo_cases(suite, combo, seen)
    if not result.finished:
        _unfinished_cases(suite, result, outcome)
    _regression_cases(suite, outcome)
    _count(suite)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _stage_case(suite: ET.Element, stage: StageResult, seen: set[tuple[str, str]]) -> None:
    owner = stage.combo or stage.name
    case = _case(suite, owner, stage.name, stage.duration_s)
    seen.add((owner, stage.name))
    _outcome(case, stage.verdict, stage.reason, detail="")
    for check in stage.checks:
        _metric_case(suite, owner, check, seen)


def _combo_cases(suite: ET.Element, combo: ComboResult, seen: set[tuple[str, str]]) -> None:
    case = _case(suite, combo.key, "training", combo.duration_s)
    if combo.job:
        _properties(case, job_state=combo.job.state, exit_code=_optional(combo.job.exit_code))
    _prediction_properties(case, combo)
    _outcome(case, combo.verdict, combo.reason, detail="\n".join(combo.log_tail))
    for row in combo.metrics:
        _metric_case(suite, combo.key, row, seen)


def _unfinished_cases(suite: ET.Element, result: SuiteResult, outcome: RunOutcome) -> None:
    """What an interrupted run never started, as skipped cases; an error case when no stage or combo says it
    stopped (stopped between two steps, or written before runs said where they were)."""
    begun = {s.name for s in result.stages if s.combo is None}
    for name in STAGES:
        if name not in COMBO_STAGES and name not in begun:
            ET.SubElement(_case(suite, name, name, 0.0), "skipped", message=NOT_RUN_REASON)
    for key in result.not_started():
        ET.SubElement(_case(suite, key, "training", 0.0), "skipped", message=NOT_RUN_REASON)
    if suite.find("testcase/error") is None:
        ET.SubElement(_case(suite, "run", "run", result.duration_s), "error", message=xml_text(outcome.summary),
                      type=Verdict.INTERRUPTED.value)


def _prediction_properties(case: ET.Element, combo: ComboResult) -> None:
    """What megapilot predicted for the combo beside what it measured, and where the two part."""
    if combo.predicted is None:
        return
    values: dict[str, str] = {}
    for check in measures.prediction_checks(combo):
        values[f"predicted_{check.quantity.key}"] = _optional(check.predicted)
        values[f"measured_{check.quantity.key}"] = _optional(check.measured)
    if combo.predicted.components_ms:
        values |= {f"predicted_{name}_ms": _optional(value) for name, value in components_ms(combo.predicted).items()}
    values |= {f"measured_timer_{name}_ms": _optional(value) for name, value in combo.timers_ms.items()}
    if combo.predicted.uncalibrated_step_time_ms is not None:
        values["uncalibrated_step_time_ms"] = _optional(combo.predicted.uncalibrated_step_time_ms)
    sentence = measures.departure_sentence(combo)
    if sentence:
        values["prediction_departure"] = sentence
    _properties(case, **values)


def _regression_cases(suite: ET.Element, outcome: RunOutcome) -> None:
    """One case per metric that regressed beyond its band: a failure when enforced, else skipped with a WARN
    message (what CI dashboards show in yellow: never a green pass)."""
    for regression in outcome.regressions:
        case = _case(suite, regression.combo, f"regression {regression.metric}", 0.0)
        _properties(case, value=_optional(regression.value), baseline_median=_optional(regression.baseline_median),
                    change_pct=_optional(regression.change_pct), verdict=outcome.status.value)
        if outcome.regressions_enforced:
            ET.SubElement(case, "failure", message=xml_text(regression.message), type="REGRESSION")
        else:
            ET.SubElement(case, "skipped", message=xml_text(f"WARN: {regression.message} (regressions not enforced)"))


def _metric_case(suite: ET.Element, owner: str, row: MetricRow, seen: set[tuple[str, str]]) -> None:
    if (owner, row.name) in seen:  # a copy of a row already written (a stage's copy of its combo's rows)
        return
    seen.add((owner, row.name))
    case = _case(suite, owner, row.name, 0.0)
    value = measures.finite(row.value)
    _properties(case, value=_optional(value if value is not None else row.value), unit=row.unit,
                threshold=row.threshold or "", margin_pct=_optional(row.margin_pct))
    message = row.reason or (f"{row.value} {row.unit} vs {row.threshold}".strip() if row.threshold else "")
    _outcome(case, row.verdict, message, detail="")


def _case(suite: ET.Element, owner: str, name: str, duration_s: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=xml_text(f"{CLASS_PREFIX}.{owner}"), name=xml_text(name),
                         time=_seconds(duration_s))


def _outcome(case: ET.Element, verdict: Verdict, reason: str, *, detail: str) -> None:
    if verdict is Verdict.FAIL:
        failure = ET.SubElement(case, "failure", message=xml_text(reason or "failed"), type="FAIL")
        failure.text = xml_text(detail) if detail else None
    elif verdict is Verdict.SKIPPED:
        ET.SubElement(case, "skipped", message=xml_text(reason or "not measured"))
    elif verdict is Verdict.RECORD:
        _properties(case, verdict=Verdict.RECORD.value, reason=reason)
    elif verdict is Verdict.INTERRUPTED:
        error = ET.SubElement(case, "error", message=xml_text(reason or "interrupted"), type=verdict.value)
        error.text = xml_text(detail) if detail else None


def _properties(case: ET.Element, **values: str) -> None:
    """Add properties to a testcase (one <properties> per case, as JUnit readers expect)."""
    holder = case.find("properties")
    if holder is None:
        holder = ET.Element("properties")
        case.insert(0, holder)
    for name, value in values.items():
        ET.SubElement(holder, "property", name=name, value=xml_text(value))


def _count(suite: ET.Element) -> None:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for case in cases if case.find("failure") is not None)))
    suite.set("skipped", str(sum(1 for case in cases if case.find("skipped") is not None)))
    suite.set("errors", str(sum(1 for case in cases if case.find("error") is not None)))


def _timestamp(moment: datetime) -> str:
    """The JUnit schema's timestamp: seconds, no zone (readers that follow it refuse an offset or a fraction), so
    UTC; the `started_at` property keeps the moment with its zone."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _optional(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["JUNIT_NAME", "build_junit", "xml_text"]
