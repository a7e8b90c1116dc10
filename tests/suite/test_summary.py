"""suite.summary: the `suite run --json` document and the terminal summary of a finished run."""

from __future__ import annotations

import io
import json

from rich.console import Console

from megapilot.suite.results import Verdict
from megapilot.suite.summary import print_summary, result_json
from tests.report.factory import NEVER_STARTED, STOPPED, interrupted_result, suite_result


def test_the_json_leads_with_the_one_verdict_and_keeps_the_gates_verdict_beside_it(tmp_path):
    result = suite_result(tmp_path)  # a failing combo and a regression
    document = result_json(result)
    assert list(document)[:4] == ["verdict", "reason", "finished", "exit_code"]
    assert (document["verdict"], document["exit_code"], document["gates_verdict"]) == ("FAIL", 1, "FAIL")
    combos = document["combos"]
    assert [c["key"] for c in combos] == [c.key for c in result.combos]
    assert set(combos[0]["metrics"][0]) == {"name", "value", "unit", "threshold", "verdict", "reason"}
    assert document["regressions"][0]["change_pct"] == -8.3
    json.dumps(document, allow_nan=True)  # every value is JSON


def test_an_interrupted_run_is_interrupted_and_its_gates_verdict_is_what_finished(tmp_path):
    document = result_json(interrupted_result(tmp_path))
    assert (document["verdict"], document["exit_code"], document["gates_verdict"]) == ("INTERRUPTED", 130, "PASS")
    assert document["reason"].startswith("stopped by SIGINT during combo 2 of 3")
    assert [(c["key"], c["verdict"]) for c in document["combos"]][-1] == (STOPPED, "INTERRUPTED")
    assert document["combos"][-1]["job"]["iterations_reached"] == 10 and document["not_started"] == [NEVER_STARTED]
    text = _printed(interrupted_result(tmp_path))
    assert text.rstrip().splitlines()[-2].startswith("INTERRUPTED — stopped by SIGINT during combo 2 of 3")


def _printed(result) -> str:
    out = io.StringIO()
    print_summary(result, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_the_terminal_lists_each_failed_row_the_regressions_and_ends_with_the_verdict(tmp_path):
    result = suite_result(tmp_path)
    text = _printed(result)
    failed = [(c.key, r.name) for c in result.combos for r in c.metrics if r.verdict is Verdict.FAIL]
    assert failed and all(f"FAIL {key} {name} = " in text for key, name in failed)
    assert "regression " + result.regressions[0].combo in text
    assert text.rstrip().splitlines()[-2].startswith("FAIL — ")
    assert text.rstrip().endswith(f"run directory: {tmp_path}")


def test_text_with_markup_brackets_is_printed_as_it_is(tmp_path):
    result = suite_result(tmp_path)
    result.stages[0].reason = "disk full under [/scratch/small] [bold]x[/bold]"
    result.run_dir = "/runs/[/odd]"
    text = _printed(result)
    assert "[/scratch/small] [bold]x[/bold]" in text and "run directory: /runs/[/odd]" in text


def test_a_failed_row_prints_its_value_as_the_gate_does_and_a_missing_one_as_not_measured(tmp_path):
    from megapilot.suite.results import MetricRow

    result = suite_result(tmp_path)
    result.combos[0].metrics = [
        MetricRow(name="training.elapsed_time_per_iteration", value=179.72857142857146, unit="ms",
                  threshold="100 +/-10%", verdict=Verdict.FAIL, reason="179.729 outside [90, 110] (100 +/-10%)"),
        MetricRow(name="training.tokens_per_gpu", value=None, unit="tok/s/GPU", threshold=">= 50",
                  verdict=Verdict.FAIL, reason="missing from the log"),
        MetricRow(name="gate.completed", value=None, unit="iterations", verdict=Verdict.FAIL,
                  reason="no iteration logged"),  # a gate with no threshold text
    ]
    lines = [line for line in _printed(result).splitlines() if line.startswith(f"FAIL {result.combos[0].key} ")]
    assert [line.split(" ", 2)[2] for line in lines[:3]] == [
        "training.elapsed_time_per_iteration = 179.729 ms (gate 100 +/-10%): 179.729 outside [90, 110] (100 +/-10%)",
        "training.tokens_per_gpu = not measured (gate >= 50): missing from the log",
        "gate.completed = not measured: no iteration logged",
    ]


def test_a_long_stage_reason_cut_in_the_table_ends_in_an_ellipsis(tmp_path):
    """The table cut a reason at 200 characters without a sign, so a cut sentence read as the whole of it."""
    result = suite_result(tmp_path)
    result.stages[0].reason = "preflight: " + " ".join(f"node{n:03d} unreachable" for n in range(40))
    short = "disk almost full on node0"
    result.stages[1].reason = short
    out = io.StringIO()
    print_summary(result, Console(file=out, width=400, color_system=None))
    lines = out.getvalue().splitlines()
    cut = next(line for line in lines if "node000 unreachable" in line)
    shown = cut[cut.index("preflight: "):].rstrip(" \u2502|")
    assert shown.endswith("\u2026") and 190 < len(shown) <= 200 and result.stages[0].reason.startswith(shown[:-1])
    assert any(line.rstrip(" \u2502|").endswith(short) for line in lines)  # a short one is shown whole, no ellipsis
