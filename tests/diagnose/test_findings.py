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


def test_a_fix_reads_as_the_change_a_person_makes_of_its_kind():
    assert Fix("add", "--lr", "1.20e-06", "why").text == "add --lr 1.20e-06"
    assert Fix("remove", "--fp16", None, "why").text == "remove --fp16"
    assert Fix("set", "NCCL_DEBUG", "INFO", "why", kind="env").text == "export NCCL_DEBUG=INFO"
    assert Fix("remove", "NCCL_ALGO", None, "why", kind="env").text == "unset NCCL_ALGO"
    assert Fix("add", "rm -rf megatron/fused_kernels/build", None, "why", kind="command").text == (
        "run: rm -rf megatron/fused_kernels/build")
    assert Fix("set", "#SBATCH --exclude", "node-3", "why", kind="command").text == "set #SBATCH --exclude node-3"
    assert Fix("add", "profile one step", None, "why", kind="advice").text == "profile one step"
    assert Fix("add", "--shm-size", "64g", "why", kind="container").text == "add container option --shm-size 64g"


def test_every_fix_the_rules_build_as_a_megatron_flag_is_a_flag():
    """A command or a sentence built with the default kind would print as `add pip list | ...`: read from the source
    (nothing run), every literal Fix of kind megatron_flag names a `--flag`."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "megapilot" / "diagnose"
    wrong = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Fix"):
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            flag = node.args[1] if len(node.args) > 1 else keywords.get("flag")
            kind = keywords.get("kind")
            if (kind is None or (isinstance(kind, ast.Constant) and kind.value == "megatron_flag")) and isinstance(
                    flag, ast.Constant) and not str(flag.value).startswith("--"):
                wrong.append(f"{path.name}:{node.lineno} {flag.value}")
    assert wrong == []
