"""junit.xml: one testcase per stage, combo and metric row, read back by a JUnit parser."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from junitparser import Failure, JUnitXml, Skipped

from megapilot.report.junit import build_junit, xml_text
from megapilot.suite.results import StageResult, Verdict
from tests.report.factory import FAILING, PASSING, suite_result


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
