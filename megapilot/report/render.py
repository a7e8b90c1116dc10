"""render_report: a suite result to report.html, megatron_run_deck.json, junit.xml and logs/ in its run directory.

Everything is rendered from the `SuiteResult` and the files of the run directory alone, so
`megapilot suite report RUN_DIR` gives the same report later, elsewhere, or after an interrupted run.
Files are written whole and then moved into place: a reader never sees half a report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from megapilot.files import atomic_write_text
from megapilot.report import measures
from megapilot.report.charts import build_charts
from megapilot.report.html import REPORT_NAME, LinkView, render_html
from megapilot.report.junit import JUNIT_NAME, build_junit
from megapilot.report.log_copies import LOGS_DIR_NAME, copy_combo_logs, copy_stage_logs
from megapilot.report.run_deck import RUN_DECK_NAME, build_run_deck, deck_json
from megapilot.suite.interruption import settle
from megapilot.suite.results import SuiteResult, read_suite_result


@dataclass(frozen=True)
class ReportFiles:
    """The files a report render wrote (absolute paths)."""

    html: Path
    run_deck: Path
    junit: Path
    logs_dir: Path
    log_files: tuple[Path, ...]

    def as_json(self) -> dict[str, str | list[str]]:
        """The paths for `--json` (stable keys)."""
        return {"html": str(self.html), "run_deck": str(self.run_deck), "junit": str(self.junit),
                "logs_dir": str(self.logs_dir), "log_files": [str(path) for path in self.log_files]}


def render_report(result: SuiteResult, run_dir: Path, *, generated_at: datetime | None = None) -> ReportFiles:
    """Write report.html, megatron_run_deck.json, junit.xml and logs/ into run_dir; returns their paths."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    when = generated_at or datetime.now(timezone.utc)
    links = copy_combo_logs(result, run_dir)
    stage_links = copy_stage_logs(result, run_dir)
    capacity_gib = measures.gpu_capacity_gib(result.card.gpu)

    deck = build_run_deck(result, links, report_href=REPORT_NAME, junit_href=JUNIT_NAME, generated_at=when)
    deck_path = _write(run_dir / RUN_DECK_NAME, deck_json(deck))
    junit_path = _write(run_dir / JUNIT_NAME, build_junit(result))
    html = render_html(result, build_charts(result, capacity_gib), links, stage_links=stage_links,
                       capacity_gib=capacity_gib,
                       generated_at=when, other_files=[LinkView("run deck (JSON)", RUN_DECK_NAME),
                                                       LinkView("JUnit XML", JUNIT_NAME)])
    html_path = _write(run_dir / REPORT_NAME, html)
    log_files = tuple(run_dir / link.href for group in (*links.values(), *stage_links.values()) for link in group)
    return ReportFiles(html=html_path.resolve(), run_deck=deck_path.resolve(), junit=junit_path.resolve(),
                       logs_dir=(run_dir / LOGS_DIR_NAME).resolve(), log_files=tuple(p.resolve() for p in log_files))


def render_run_dir(run_dir: Path) -> ReportFiles:
    """Re-render the report of a run directory from its suite.json (what `megapilot suite report` does). A run that
    did not finish is told where it stopped from what its job left (a run killed outright could not say it);
    suite.json itself is left as it is: the run may still be going."""
    result = read_suite_result(run_dir)
    settle(result, run_dir)
    return render_report(result, run_dir)


def _write(target: Path, text: str) -> Path:
    return atomic_write_text(target, text)  # 0644: a report is meant to be read by others


__all__ = ["ReportFiles", "render_report", "render_run_dir"]
