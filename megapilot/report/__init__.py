"""Reports of a suite run: one self-contained HTML page, the run deck JSON (with its JSON Schema) and JUnit XML.

    from megapilot.report import render_report
    files = render_report(result, run_dir)   # report.html, megatron_run_deck.json, junit.xml, logs/

Everything here reads a `megapilot.suite.results.SuiteResult` and the run directory; nothing runs a job.
plotly and jinja2 are imported when a report is rendered, not when this package is imported.
"""

from megapilot.report.render import ReportFiles, render_report, render_run_dir
from megapilot.report.run_deck import RUN_DECK_SCHEMA_VERSION, RunDeck, build_run_deck, run_deck_json_schema

__all__ = ["RUN_DECK_SCHEMA_VERSION", "ReportFiles", "RunDeck", "build_run_deck", "render_report", "render_run_dir",
           "run_deck_json_schema"]
