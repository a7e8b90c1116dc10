"""One verdict: the banner, the terminal summary, the run deck, JUnit, the exit code and suite.json all say what
`run_outcome` says, on PASS, FAIL, WARN (a regression not enforced), FAIL by an enforced regression, SKIPPED and
an interrupted run. Each case is rendered for real (report.html, megatron_run_deck.json, junit.xml)."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from megapilot.report import render_report
from megapilot.suite.outcome import run_outcome
from megapilot.suite.results import StageResult, SuiteResult, Verdict, read_suite_result
from megapilot.suite.summary import print_summary, result_json
from tests.report.factory import interrupted_result, passing_combo, stages, suite_result

GREEN = "PASS"


def _passing(result: SuiteResult) -> SuiteResult:
    result.combos = [passing_combo()]
    result.stages = [s for s in stages() if s.verdict is not Verdict.FAIL]
    result.verdict, result.reason = Verdict.PASS, ""
    return result


def _case(name: str, tmp_path) -> SuiteResult:
    result = suite_result(tmp_path)
    if name == "fail":
        return result  # a failing combo, and a regression
    result = _passing(result)
    if name == "pass":
        result.regressions = [r.model_copy(update={"worse": False}) for r in result.regressions]  # an improvement
    elif name == "warn":
        pass  # gates pass, tokens/s regressed 8.3 %, not enforced
    elif name == "enforced":
        result.regressions_enforced = True
    elif name == "skipped":
        result.combos, result.regressions = [], []
        result.stages = [StageResult(name="smoke", verdict=Verdict.SKIPPED, reason="--stage train")]
        result.verdict = Verdict.SKIPPED
    elif name == "interrupted":
        result = interrupted_result(tmp_path)
    return result


EXPECTED = {"pass": ("PASS", 0, "pass"), "fail": ("FAIL", 1, "fail"), "warn": ("WARN", 0, "warn"),
            "enforced": ("FAIL", 1, "fail"), "skipped": ("SKIPPED", 0, "na"),
            "interrupted": ("INTERRUPTED", 130, "interrupted")}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_banner_terminal_deck_junit_and_exit_code_agree(name, tmp_path):
    result = _case(name, tmp_path)
    result.write(tmp_path)
    status, exit_code, overall = EXPECTED[name]
    outcome = run_outcome(result)
    assert (outcome.status.value, outcome.exit_code) == (status, exit_code)

    files = render_report(result, tmp_path)
    html = files.html.read_text(encoding="utf-8")
    title = re.search(r"<title>[^:]*: (\w+) ", html)
    assert title is not None and title.group(1) == status
    banner = re.search(r'<header class="banner verdict-(\w+)" id="verdict-banner">.*?'
                       r'<span class="verdict-word">(\w+)</span>.*?<p class="banner-reason">(.*?)</p>', html, re.S)
    assert banner is not None and banner.group(1) == banner.group(2) == status

    deck = json.loads(files.run_deck.read_text(encoding="utf-8"))
    assert (deck["verdict"], deck["exit_code"], deck["overall_status"]) == (status, exit_code, overall)

    junit = ET.parse(files.junit).getroot()
    properties = {p.get("name"): p.get("value") for p in junit.find("properties")}
    assert (properties["verdict"], properties["exit_code"]) == (status, str(exit_code))
    if status not in (GREEN, "RECORD", "SKIPPED", "WARN"):  # what a CI parser counts: never all green
        assert int(junit.get("failures")) + int(junit.get("errors")) > 0

    terminal = io.StringIO()
    print_summary(result, Console(file=terminal, width=200, color_system=None))
    last = [line for line in terminal.getvalue().splitlines() if line.strip()][-2]
    assert last.startswith(f"{status} — ")
    assert result_json(result)["verdict"] == status and result_json(result)["exit_code"] == exit_code

    summary = outcome.summary
    assert banner.group(3).startswith(summary[:20].replace("&", "&amp;")) and deck["overall_reason"] == summary
    if status != GREEN:
        assert overall != "pass"
    stored = json.loads((tmp_path / "suite.json").read_text(encoding="utf-8"))
    assert (stored["verdict"], stored["reason"]) == (status, summary if name in ("warn", "enforced") else result.reason)
    # what the gates said is kept beside a verdict a regression decided, and read back: the same verdict again
    assert stored.get("gates_verdict") == ("PASS" if name in ("warn", "enforced") else None)
    again = run_outcome(read_suite_result(tmp_path))
    assert (again.status, again.summary, again.exit_code) == (outcome.status, summary, exit_code)


def test_a_regressed_run_is_never_green_and_junit_shows_the_regression(tmp_path):
    for name in ("warn", "enforced"):
        result = _case(name, tmp_path / name)
        files = render_report(result, tmp_path / name)
        junit = ET.parse(files.junit).getroot()
        case = next(c for c in junit.iter("testcase") if c.get("name") == "regression training.tokens_per_gpu")
        if name == "warn":
            assert case.find("skipped").get("message").startswith("WARN: tokens/s -8.3 %")
        else:
            assert case.find("failure").get("type") == "REGRESSION"
        assert run_outcome(result).green is False
