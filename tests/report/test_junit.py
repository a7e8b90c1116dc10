"""junit.xml: one testcase per stage, combo and metric row, read back by a JUnit parser."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from megapilot.report import render_report
from megapilot.report.junit import build_junit, xml_text
from megapilot.suite.results import NOT_RUN_REASON, MetricRow, StageResult, Verdict
from tests.report.factory import (
    FAILING,
    NEVER_STARTED,
    PASSING,
    STOPPED,
    interrupted_result,
    suite_result,
    write_interrupted_run_dir,
)


@pytest.fixture
def suite(rendered):
    suites = list(JUnitXml.fromfile(str(rendered.files.junit)))  # the parser wraps a <testsuite> root in <testsuites>
    assert len(suites) == 1
    suite = suites[0]
    assert suite.name == "megapilot.suite.megatron-single-node"
    return suite


@pytest.fixture
def properties(rendered):
    """A testcase's properties by (classname, name), read with the standard library."""
    root = ET.parse(rendered.files.junit).getroot()
    return {(case.get("classname"), case.get("name")): {p.get("name"): p.get("value") for p in case.iter("property")}
            for case in root.iter("testcase")}


def _cases(suite) -> dict[tuple[str, str], object]:
    return {(case.classname, case.name): case for case in suite}


def test_one_case_per_stage_combo_and_metric_row(suite, rendered):
    result = rendered.result
    expected = (len(result.stages) + sum(len(s.checks) for s in result.stages) + len(result.combos)
                + sum(len(c.metrics) for c in result.combos) + sum(r.worse for r in result.regressions))
    assert suite.tests == expected == len(list(suite))
    cases = _cases(suite)
    assert ("megapilot.suite.prepare", "prepare") in cases
    assert ("megapilot.suite.preflight", "preflight.free_disk_gib") in cases
    assert (f"megapilot.suite.{FAILING}", "train") in cases
    assert (f"megapilot.suite.{FAILING}", "training") in cases
    assert (f"megapilot.suite.{PASSING}", "training.tokens_per_gpu") in cases


def test_fail_is_a_failure_skipped_is_skipped_record_passes_with_a_property(suite, properties):
    cases = _cases(suite)
    failed = sorted(key for key, case in cases.items() if any(isinstance(r, Failure) for r in case.result))
    assert failed == sorted([(f"megapilot.suite.{FAILING}", "train"), (f"megapilot.suite.{FAILING}", "training"),
                             (f"megapilot.suite.{FAILING}", "training.throughput_per_gpu"),
                             (f"megapilot.suite.{FAILING}", "training.tokens_per_gpu")])
    skipped = sorted(key for key, case in cases.items() if any(isinstance(r, Skipped) for r in case.result))
    assert skipped == sorted([("megapilot.suite.tokenizer", "tokenizer"),
                              (f"megapilot.suite.{PASSING}", "training.grad_norm"),
                              (f"megapilot.suite.{PASSING}", "regression training.tokens_per_gpu")])  # a WARN
    assert (suite.failures, suite.skipped, suite.errors) == (4, 3, 0)
    recorded = cases[(f"megapilot.suite.{PASSING}", "training.lm_loss")]
    assert recorded.is_passed
    assert properties[(f"megapilot.suite.{PASSING}", "training.lm_loss")]["verdict"] == "RECORD"


def test_failure_carries_reason_and_log_tail_as_text(suite, properties):
    combo = _cases(suite)[(f"megapilot.suite.{FAILING}", "training")]
    failure = combo.result[0]
    assert failure.message.startswith("training job FAILED at iteration 7/20")
    assert "<script>window.__xss = 1;" in failure.text  # the hostile line, read back as text
    assert "\x1b" not in failure.text and "ERROR torch.OutOfMemoryError" in failure.text
    assert properties[(f"megapilot.suite.{PASSING}", "training.tokens_per_gpu")] == {
        "value": "3650", "unit": "tokens/s", "threshold": ">= 3000", "margin_pct": "21.7"}


def test_control_characters_cannot_break_the_xml(tmp_path):
    result = suite_result(tmp_path)
    result.stages.append(StageResult(name="odd\x00stage\x07", verdict=Verdict.FAIL, reason="bell \x07 and nul \x00"))
    root = ET.fromstring(build_junit(result).encode("utf-8"))
    names = [case.get("name") for case in root.iter("testcase")]
    assert "oddstage" in names


def test_xml_text_keeps_unicode_and_drops_ansi():
    assert xml_text("\x1b[1;31mloss\x1b[0m ↓ 2.5 µs") == "loss ↓ 2.5 µs"


def _outcomes(xml: str) -> dict[tuple[str, str], tuple[str, str, str]]:
    """Each case's outcome element as (tag, message, text), '' for a pass, by (classname, name)."""
    root = ET.fromstring(xml.encode("utf-8"))
    found = {}
    for case in root.iter("testcase"):
        element = next((e for e in case if e.tag in ("failure", "error", "skipped")), None)
        found[(case.get("classname") or "", case.get("name") or "")] = (
            ("", "", "") if element is None else (element.tag, element.get("message") or "", element.text or ""))
    return found


def test_an_interrupted_run_is_an_error_with_the_partial_log_and_what_never_started_is_skipped(tmp_path):
    write_interrupted_run_dir(tmp_path)
    junit = render_report(interrupted_result(tmp_path), tmp_path).junit
    suite = next(iter(JUnitXml.fromfile(str(junit))))  # a CI parser's reading: never green
    assert suite.errors == 2 and suite.failures == 0
    errors = sorted((case.classname, case.name) for case in suite if any(isinstance(r, Error) for r in case.result))
    assert errors == [(f"megapilot.suite.{STOPPED}", "train"), (f"megapilot.suite.{STOPPED}", "training")]
    outcomes = _outcomes(junit.read_text(encoding="utf-8"))
    tag, message, text = outcomes[(f"megapilot.suite.{STOPPED}", "training")]
    assert (tag, message) == ("error", "interrupted at iteration 10 of 80 by SIGINT")
    assert "iteration       10/      80" in text and "<stopped> by SIGINT" in text  # the partial log's tail
    for never in [(f"megapilot.suite.{NEVER_STARTED}", "training"), ("megapilot.suite.collectives", "collectives"),
                  ("megapilot.suite.results", "results"), ("megapilot.suite.teardown", "teardown")]:
        assert outcomes[never] == ("skipped", NOT_RUN_REASON, ""), never
    assert outcomes[(f"megapilot.suite.{STOPPED}", "metrics")] == ("skipped", NOT_RUN_REASON, "")
    assert outcomes[(f"megapilot.suite.{PASSING}", "training")] == ("", "", "")  # what finished stays as it was
    assert ("megapilot.suite.run", "run") not in outcomes  # the combo carries the stop


def test_a_run_stopped_between_two_steps_still_errors_in_a_case_of_its_own(tmp_path):
    result = interrupted_result(tmp_path)
    result.combos = result.combos[:1]
    result.stages = [s for s in result.stages if s.combo != STOPPED]
    outcomes = _outcomes(build_junit(result))
    tag, message, _text = outcomes[("megapilot.suite.run", "run")]
    assert tag == "error" and message.startswith("stopped by SIGINT; what finished: all PASS; not started: 2 combos")
    root = ET.fromstring(build_junit(result).encode("utf-8"))
    assert root.get("errors") == "1"


def test_a_metric_row_a_stage_holds_a_copy_of_is_one_case(tmp_path):
    """As the lifecycle writes a run: each combo's `metrics` stage and the smoke stage hold copies of their combo's
    rows, and the tokenizer stage holds a row of its own name. A CI reader keys cases by classname and name: a
    case twice counts its failure twice, or hides one of the two."""
    from collections import Counter

    result = suite_result(tmp_path)
    smoke = result.combos[0].model_copy(update={"key": "smoke"})
    result.combos.insert(0, smoke)
    tokenizer = MetricRow(name="tokenizer", verdict=Verdict.SKIPPED, reason="mock data: no tokenizer needed")
    result.stages = [StageResult(name="tokenizer", verdict=Verdict.SKIPPED, reason=tokenizer.reason,
                                 checks=[tokenizer]),
                     StageResult(name="smoke", verdict=Verdict.PASS, checks=smoke.metrics),
                     *(StageResult(name="metrics", combo=combo.key, verdict=combo.verdict, checks=combo.metrics)
                       for combo in result.combos[1:])]
    root = ET.fromstring(build_junit(result).encode("utf-8"))
    cases = Counter((case.get("classname"), case.get("name")) for case in root.iter("testcase"))
    assert [key for key, count in cases.items() if count > 1] == []
    rows = {(combo.key, row.name) for combo in result.combos for row in combo.metrics}
    assert all((f"megapilot.suite.{key}", name) in cases for key, name in rows)
    assert root.get("tests") == str(len(cases))
    failing_rows = sum(row.verdict is Verdict.FAIL for combo in result.combos for row in combo.metrics)
    failing_cases = 1 + failing_rows + 1  # the failing combo's training case, its rows, the metrics stage case
    assert root.get("failures") == str(failing_cases)


def test_the_testsuite_has_the_attributes_the_junit_schema_requires(tmp_path):
    """Ant's JUnit schema (what strict readers validate against): hostname required, a timestamp to the second
    with no zone; failure and error carry a type; every case a classname, a name and a time."""
    import re
    from datetime import timedelta, timezone

    result = suite_result(tmp_path)
    result.started_at = result.started_at.astimezone(timezone(timedelta(hours=2)))  # a run started in UTC+2
    root = ET.fromstring(build_junit(result).encode("utf-8"))
    assert root.get("hostname") == "node-a"
    assert root.get("timestamp") == result.started_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}", root.get("timestamp"))
    for attribute in ("name", "tests", "failures", "errors", "time"):
        assert root.get(attribute), attribute
    for case in root.iter("testcase"):
        assert case.get("classname") and case.get("name") and re.fullmatch(r"[0-9]+\.[0-9]+", case.get("time"))
        assert len([e for e in case if e.tag in ("failure", "error", "skipped")]) <= 1
        assert all(e.get("type") for e in case if e.tag in ("failure", "error"))
    result.card = result.card.model_copy(update={"host": ""})  # a run that could not name its host
    assert ET.fromstring(build_junit(result).encode("utf-8")).get("hostname") == "localhost"
