"""report.html: one self-contained page (plotly.js inlined once, no network) that reads without JS too.

The page is a jinja2 template with autoescape on and undefined names refused (a template bug fails the
render, it does not print an empty cell). Everything from a run (log lines, reasons, combo keys, file
names) reaches the page only through autoescaped expressions; the chart fragments and plotly.js are
the only markup passed through as is, and both come from plotly (which escapes `<` in figure data).

Tables carry the facts (results, metric panels, predictions, findings, log tails); charts repeat them
as pictures, so a reader without JS (or a mail client) still sees every number.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import quote

from megapilot.report import measures
from megapilot.report.charts import Chart, ReportCharts, plotly_js
from megapilot.report.junit import xml_text
from megapilot.report.log_copies import LogLink
from megapilot.report.run_deck import RESULTS_HEADERS, format_number, metric_label, results_rows, run_card_rows
from megapilot.suite.results import ComboResult, MetricRow, SuiteResult

if TYPE_CHECKING:
    from jinja2 import Environment

REPORT_NAME = "report.html"


@dataclass(frozen=True)
class ResultRow:
    """A row of the results table: a stage or a combo."""

    kind: str
    name: str
    combo: str
    verdict: str
    duration_s: float
    reason: str
    anchor: str | None


@dataclass(frozen=True)
class MetricView:
    name: str
    label: str
    actual: str
    unit: str
    threshold: str
    verdict: str
    margin: str
    reason: str
    enforced: bool


@dataclass(frozen=True)
class PredictionView:
    label: str
    unit: str
    predicted: str
    measured: str
    error: str


@dataclass(frozen=True)
class LinkView:
    label: str
    href: str


@dataclass(frozen=True)
class ComboView:
    """Everything the page shows about one combo."""

    combo: ComboResult
    anchor: str
    metrics: list[MetricView]
    predictions: list[PredictionView]
    prediction_note: str
    charts: list[Chart]
    logs: list[LinkView]
    log_tail: list[str]


def render_html(result: SuiteResult, charts: ReportCharts, log_links: dict[str, list[LogLink]], *,
                capacity_gib: float | None, generated_at: datetime, other_files: list[LinkView],
                stage_links: dict[str, list[LogLink]] | None = None) -> str:
    """The report page as text."""
    from markupsafe import Markup

    template = _environment().get_template("report.html.j2")
    combos = [_combo_view(index, combo, charts.per_combo.get(combo.key, []), log_links.get(combo.key, []),
                          capacity_gib) for index, combo in enumerate(result.combos)]
    return template.render(
        result=result, card_rows=run_card_rows(result), generated_at=generated_at,
        results=_result_rows(result, {view.combo.key: view.anchor for view in combos}),
        summary_headers=RESULTS_HEADERS, summary_rows=results_rows(result, capacity_gib),
        overview_charts=charts.overview, combos=combos, other_files=other_files,
        stage_logs={name: [LinkView(label=link.href.split("/")[-2] + f" node {link.node}", href=quote(link.href))
                           for link in links] for name, links in (stage_links or {}).items()},
        plotly_js=Markup(plotly_js()), fragment=lambda chart: Markup(chart.html or ""),
    )


def _environment() -> Environment:  # jinja2 imported here: the core starts without it
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    environment = Environment(loader=PackageLoader("megapilot.report", "templates"),
                              autoescape=select_autoescape(default=True, default_for_string=True),
                              undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["seconds"] = _seconds
    environment.filters["plain"] = xml_text
    return environment


def _result_rows(result: SuiteResult, anchors: dict[str, str]) -> list[ResultRow]:
    rows = [ResultRow(kind="stage", name=s.name, combo=s.combo or "", verdict=s.verdict.value, duration_s=s.duration_s,
                      reason=s.reason, anchor=anchors.get(s.combo or "")) for s in result.stages]
    rows += [ResultRow(kind="combo", name="training", combo=c.key, verdict=c.verdict.value, duration_s=c.duration_s,
                       reason=c.reason, anchor=anchors[c.key]) for c in result.combos]
    return rows


def _combo_view(index: int, combo: ComboResult, charts: list[Chart], links: list[LogLink],
                capacity_gib: float | None) -> ComboView:
    checks = measures.prediction_checks(combo, capacity_gib)
    return ComboView(
        combo=combo, anchor=f"combo-{index}", metrics=[_metric_view(row) for row in combo.metrics],
        predictions=[PredictionView(label=c.quantity.label, unit=c.quantity.unit, predicted=format_number(c.predicted),
                                    measured=format_number(c.measured), error=_percent(c.error_pct)) for c in checks],
        prediction_note=combo.predicted.note if combo.predicted else "",
        charts=charts,
        logs=[LinkView(label=f"node {link.node}", href=quote(link.href)) for link in links],
        log_tail=[xml_text(line) for line in combo.log_tail])


def _metric_view(row: MetricRow) -> MetricView:
    return MetricView(name=row.name, label=metric_label(row.name), actual=_actual(row.value),
                      unit=row.unit, threshold=row.threshold or "not gated", verdict=row.verdict.value,
                      margin=_percent(row.margin_pct), reason=row.reason, enforced=row.enforced)


def _actual(value: float | None) -> str:
    """A measured value for display; NaN and Inf shown as such (a diverged loss is the news)."""
    if value is not None and measures.finite(value) is None:
        return str(value)
    return format_number(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


__all__ = ["REPORT_NAME", "LinkView", "render_html"]
