"""A rendered report of the factory's two-combo run, shared by the report tests (rendering is the slow part)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from megapilot.report import ReportFiles, render_report
from megapilot.suite.results import SuiteResult
from tests.report.factory import write_run_dir


@dataclass(frozen=True)
class Rendered:
    run_dir: Path
    result: SuiteResult
    files: ReportFiles

    @property
    def html(self) -> str:
        return self.files.html.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    run_dir = tmp_path_factory.mktemp("run")
    result = write_run_dir(run_dir)
    return Rendered(run_dir=run_dir, result=result, files=render_report(result, run_dir))
