"""A job its executor refuses fails its own stage with the executor's words and fix; the run still ends with a
written result, never with a traceback or a lost report."""

from __future__ import annotations

import json
from pathlib import Path

from megapilot.execute.local import LocalExecutor
from megapilot.suite.config import check_suite
from megapilot.suite.lifecycle import RunRequest, run_suite
from megapilot.suite.results import Verdict
from megapilot.suite.templates import template_path


def test_a_refused_submission_fails_the_stage_and_the_result_is_written(tmp_path: Path) -> None:
    config = json.loads(template_path("tiny-local").read_text())
    config["megapilot"]["nodes"] = 2  # the local executor runs one node: it refuses these jobs
    config["threshold_json"] = str(template_path("tiny-local").with_name("tiny-local_threshold.json"))
    (tmp_path / "suite.json").write_text(json.dumps(config))
    check = check_suite(tmp_path / "suite.json")
    assert check.suite is not None and any("runs one node, not 2" in w for w in check.warnings)
    result = run_suite(check.suite, RunRequest(out_dir=tmp_path / "runs", only_stage="smoke"), LocalExecutor())
    smoke = next(s for s in result.stages if s.name == "smoke")
    assert smoke.verdict is Verdict.FAIL
    assert "the local executor runs on one node, not 2; fix:" in smoke.reason
    assert result.verdict is Verdict.FAIL and (Path(result.run_dir) / "suite.json").is_file()
