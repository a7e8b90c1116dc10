"""One analysis: the suite's findings are `megapilot diagnose`'s, and the report shows the same ones.

Over every fixture log: `diagnose` on the file, the suite's measure step on the file as a one-node combo,
and the run deck built from a suite result holding that combo (written to suite.json and read back) give
the same findings (category, severity, title, evidence), the suite's naming the node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megapilot.diagnose import diagnose
from megapilot.diagnose.findings import EXPLANATIONS, Finding
from megapilot.logs import CATEGORIES
from megapilot.logs.signatures import SIGNATURES
from megapilot.report.run_deck import build_run_deck
from megapilot.suite.metrics import measure_combo
from megapilot.suite.results import ComboResult, Verdict, read_suite_result
from tests.report.factory import suite_result

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURE_LOGS = sorted(DATA.rglob("*.log"))


def _facts(findings: list[Finding]) -> list[tuple[object, ...]]:
    return [(f.category, f.severity, f.title, [(e.file, e.line, e.text) for e in f.evidence]) for f in findings]


def test_there_are_fixture_logs_to_compare():
    assert len(FIXTURE_LOGS) >= 40


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: str(p.relative_to(DATA)))
def test_diagnose_suite_and_report_give_the_same_findings(path, tmp_path):
    by_diagnose = diagnose([path]).findings
    measured = measure_combo([path], gpu=None, world_size=1, gpus_per_node=1, nodes=1, seq_length=None, gbs=None,
                             train_iters=None).findings
    assert _facts(measured) == _facts(by_diagnose)
    assert all(f.node == 0 for f in measured)

    result = suite_result(tmp_path)
    result.combos = [ComboResult(key="default", directory="default", verdict=Verdict.PASS, backend="megatron-lm",
                                 findings=measured)]
    result.write(tmp_path)
    read_back = read_suite_result(tmp_path)
    assert read_back.combos[0].findings == measured
    deck = build_run_deck(read_back, {}, report_href="report.html", junit_href="junit.xml")
    assert _facts(deck.cells[0].findings) == _facts(by_diagnose)


def test_every_category_has_an_explanation_and_every_signature_a_known_category():
    assert set(EXPLANATIONS) == set(CATEGORIES)
    assert {signature.category for signature in SIGNATURES} <= set(CATEGORIES)


def test_every_line_category_has_a_rule():
    from megapilot.diagnose.rules import LINE_RULES

    assert {signature.category for signature in SIGNATURES} <= set(LINE_RULES)
