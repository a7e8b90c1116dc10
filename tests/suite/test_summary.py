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
