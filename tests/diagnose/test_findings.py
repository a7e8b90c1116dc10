"""Findings: ranking by severity then root cause then first line, and the stable JSON of fixes."""

from __future__ import annotations

import math

from megapilot.diagnose.findings import ROOT_CAUSE_ORDER, SEVERITY_RANK, Finding, Fix, ranked
from megapilot.logs.records import Evidence


def _finding(category: str, severity: str = "error", lines: tuple[int, ...] = (1,)) -> Finding:
    return Finding(category, severity, category, [Evidence("train.log", n, "x") for n in lines], "cause")  # type: ignore[arg-type]  # test strings


def test_ranking_orders_by_severity_then_root_cause():
    ev = [Evidence("f", 1, "x")]
    unordered = [Finding("slowdown", "warning", "", ev, ""), Finding("process_crash", "error", "", ev, ""),
                 Finding("nccl_timeout", "critical", "", ev, ""), Finding("oom", "critical", "", ev, "")]
    assert [f.category for f in ranked(unordered)] == ["oom", "nccl_timeout", "process_crash", "slowdown"]


def test_same_category_and_severity_ranks_by_earliest_evidence_line():
    later, earlier = _finding("oom", lines=(50, 40)), _finding("oom", lines=(7, 90))
    assert ranked([later, earlier]) == [earlier, later]


def test_unknown_category_ranks_after_every_known_one_of_its_severity():
    unknown, known = _finding("something_new"), _finding(ROOT_CAUSE_ORDER[-1])
    assert ranked([unknown, known]) == [known, unknown]


def test_finding_without_evidence_sorts_as_line_zero():
    assert _finding("oom", lines=()).sort_key == (SEVERITY_RANK["error"], ROOT_CAUSE_ORDER.index("oom"), 0)


def test_ranked_returns_a_new_list_and_leaves_the_input_alone():
    findings = [_finding("slowdown", "info"), _finding("oom", "critical")]
    original = list(findings)
    assert ranked(findings) is not findings and findings == original


def test_fix_json_rounds_finite_floats_and_keeps_non_finite_and_none():
    fix = Fix(action="set", flag="--micro-batch-size", value="1", reason="r", option="o",
              predicted_memory_gib=12.345678, predicted_tokens_per_s_per_gpu=math.inf)
    data = fix.to_dict()
    assert data["predicted_memory_gib"] == 12.346 and data["predicted_tokens_per_s_per_gpu"] == math.inf
    assert data["kind"] == "megatron_flag" and data["value"] == "1" and data["option"] == "o"
    assert Fix(action="add", flag="--bf16", value=None, reason="r").to_dict()["predicted_memory_gib"] is None


def test_finding_json_has_the_stable_schema_with_evidence_and_fixes():
    finding = Finding("oom", "critical", "Out of memory", [Evidence("a.log", 3, "CUDA out of memory")], "too big",
                      fixes=[Fix(action="add", flag="--sequence-parallel", value=None, reason="r")], occurrences=4)
    data = finding.to_dict()
    assert list(data) == ["category", "severity", "title", "occurrences", "evidence", "cause", "fixes"]
    assert data["evidence"] == [{"file": "a.log", "line": 3, "text": "CUDA out of memory"}]
    assert data["occurrences"] == 4 and data["fixes"][0]["flag"] == "--sequence-parallel"
