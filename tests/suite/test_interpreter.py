"""Preflight asks the interpreter the launch scripts start, on each node, what it can import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from megapilot.execute.local import LocalExecutor
from megapilot.suite.config import load_suite
from megapilot.suite.interpreter import interpreter_rows
from megapilot.suite.results import Verdict
from megapilot.suite.templates import template_path


def _tiny_local(tmp_path: Path, **megapilot: object) -> Path:
    config = json.loads(template_path("tiny-local").read_text())
    config["megapilot"].update(megapilot)
    config["threshold_json"] = str(template_path("tiny-local").with_name("tiny-local_threshold.json"))
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(config))
    return path


def test_the_default_interpreter_is_the_one_megapilot_runs_under(tmp_path: Path) -> None:
    suite = load_suite(_tiny_local(tmp_path, executor="slurm"))
    assert suite.python == sys.executable  # SLURM nodes share this machine's file system


def test_an_interpreter_without_torch_fails_preflight_naming_the_node_interpreter_and_module(tmp_path: Path) -> None:
    # a real interpreter without torch: a fresh virtual environment that does not see this one's packages
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = str(tmp_path / "bare" / "bin" / "python")
    suite = load_suite(_tiny_local(tmp_path, python=bare))
    [row] = interpreter_rows(suite, LocalExecutor())
    assert row.verdict is Verdict.FAIL
    assert row.reason.startswith(f"node 0: {bare} cannot import")
    assert "No module named 'torch'" in row.reason and "megapilot.python" in row.reason


def test_a_missing_interpreter_fails_preflight_too(tmp_path: Path) -> None:
    suite = load_suite(_tiny_local(tmp_path, python="/nonexistent/python3"))
    [row] = interpreter_rows(suite, LocalExecutor())
    assert row.verdict is Verdict.FAIL and "/nonexistent/python3: no such interpreter" in row.reason
