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
from megapilot.suite.outcome import run_outcome
from megapilot.suite.predicted import TIMER_TERMS, components_ms
from megapilot.suite.results import ComboResult, MetricRow, SuiteResult, Verdict
from megapilot.suite.stragglers import ROW_PREFIX as STRAGGLER_PREFIX

if TYPE_CHECKING:
    from jinja2 import Environment

REPORT_NAME = "report.html"


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
    against: str  # the reading as a person says it: '1,579 tok/s/GPU vs ≥ 50'
    gated: bool  # a threshold judges it (shown first); the rest are records, folded


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
class HeatCell:
    """One node of a combo's straggler heat strip: its measured slowdown and the colour it is drawn in."""

    node: str
    ratio: float  # compute time over the other nodes' median (1.00 = as fast)
    label: str  # '1.29x'
    fill: str  # green at the median, yellow at the gate, red at twice the gate's margin
    verdict: str
    title: str  # the row's reason, on hover


@dataclass(frozen=True)
class ComboView:
    """Everything the page shows about one combo."""

    combo: ComboResult
    anchor: str
    metrics: list[MetricView]  # gated first, then the records
    predictions: list[PredictionView]
    prediction_note: str
    departure: str
    components: list[PredictionView]
    charts: list[Chart]
    logs: list[LinkView]
    log_tail: list[str]
    heat_strip: list[HeatCell]  # one cell per node with a measured straggler ratio; empty: none measured


def render_html(result: SuiteResult, charts: ReportCharts, log_links: dict[str, list[LogLink]], *,
                capacity_gib: float | None, generated_at: datetime, other_files: list[LinkView],
                stage_links: dict[str, list[LogLink]] | None = None) -> str:
    """The report page as text."""
    # heavy: jinja2/markupsafe load only when HTML is rendered
    from markupsafe import Markup

    template = _environment().get_template("report.html.j2")
    combos = [_combo_view(index, combo, charts.per_combo.get(combo.key, []), log_links.get(combo.key, []),
                          capacity_gib) for index, combo in enumerate(result.combos)]
    return template.render(
        result=result, outcome=run_outcome(result), card_rows=run_card_rows(result), generated_at=generated_at,
        anchors={view.combo.key: view.anchor for view in combos},
        summary_headers=RESULTS_HEADERS, summary_rows=results_rows(result, capacity_gib),
        overview_charts=charts.overview, combos=combos, other_files=other_files,
        stage_logs={name: [LinkView(label=link.href.split("/")[-2] + f" node {link.node}", href=quote(link.href))
                           for link in links] for name, links in (stage_links or {}).items()},
        plotly_js=Markup(plotly_js()), fragment=lambda chart: Markup(chart.html or ""), label=metric_label,
    )


def _environment() -> Environment:  # jinja2 imported here: the core starts without it
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    environment = Environment(loader=PackageLoader("megapilot.report", "templates"),
                              autoescape=select_autoescape(default=True, default_for_string=True),
                              undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    environment.filters["seconds"] = _seconds
    environment.filters["plain"] = xml_text
    return environment


def _prediction_note(combo: ComboResult) -> str:
    predicted = combo.predicted
    if predicted is None:
        return ""
    parts = [predicted.note] if predicted.note else []
    if predicted.calibration_runs:
        band = f", band +/-{predicted.band_pct:g} %" if predicted.band_pct is not None else ""
        whose = "of this run's own earlier runs" if predicted.calibrated_in_run else "run(s) of this cluster"
        parts.append(f"calibrated on {len(predicted.calibration_runs)} {whose}{band}; uncalibrated "
                     f"step {format_number(predicted.uncalibrated_step_time_ms)} ms")
    elif predicted.calibration:
        parts.append(f"uncalibrated ({predicted.calibration})")
    return "; ".join(parts)


def _component_views(combo: ComboResult) -> list[PredictionView]:
    """The predicted step's components; Megatron's timers beside the terms each one measures."""
    if combo.predicted is None or not combo.predicted.components_ms:
        return []
    labels = {"compute": "Compute", "exposed_comm": "Exposed communication", "pipeline_bubble": "Pipeline bubble",
              "fixed_overheads": "Fixed overheads"}
    views = [PredictionView(label=labels[name], unit="ms", predicted=format_number(value), measured="",
                            error="") for name, value in components_ms(combo.predicted).items()]
    for timer, (terms, words) in TIMER_TERMS.items():
        if timer in combo.timers_ms:
            predicted = sum(combo.predicted.components_ms.get(t, 0.0) for t in terms)
            error = (combo.timers_ms[timer] - predicted) / predicted * 100 if predicted > 0 else None
            views.append(PredictionView(label=f"{words.capitalize()} (timer {timer})", unit="ms",
                                        predicted=format_number(predicted),
                                        measured=format_number(combo.timers_ms[timer]), error=_percent(error)))
    return views


def _combo_view(index: int, combo: ComboResult, charts: list[Chart], links: list[LogLink],
                capacity_gib: float | None) -> ComboView:
    checks = measures.prediction_checks(combo, capacity_gib)
    return ComboView(
        combo=combo, anchor=f"combo-{index}",
        metrics=sorted((_metric_view(row) for row in combo.metrics), key=lambda view: not view.gated),
        predictions=[PredictionView(label=c.quantity.label, unit=c.quantity.unit, predicted=format_number(c.predicted),
                                    measured=format_number(c.measured), error=_percent(c.error_pct)) for c in checks],
        prediction_note=_prediction_note(combo),
        departure=measures.departure_sentence(combo),
        components=_component_views(combo),
        charts=charts,
        logs=[LinkView(label=f"node {link.node}", href=quote(link.href)) for link in links],
        log_tail=[xml_text(line) for line in combo.log_tail],
        heat_strip=heat_strip(combo))


DEFAULT_STRAGGLER_GATE = 1.15  # the colour scale of a row without a readable gate (config's straggler.max_ratio)


def heat_strip(combo: ComboResult) -> list[HeatCell]:
    """The combo's `straggler.nodeK` rows that hold a measured ratio, node order, each coloured by how far above
    the median it is relative to the gate (nothing drawn for a node without a measurement)."""
    cells = []
    for row in sorted(combo.metrics, key=lambda r: r.name):
        if not row.name.startswith(STRAGGLER_PREFIX) or row.value is None or not measures.finite(row.value):
            continue
        gate = _gate_of(row.threshold) or DEFAULT_STRAGGLER_GATE
        share = min(max((row.value - 1.0) / (2 * (gate - 1.0)), 0.0), 1.0)  # 0 at the median, 0.5 at the gate
        fill = f"hsl({120 * (1 - share):.0f}, 65%, {85 - 35 * share:.0f}%)"
        cells.append(HeatCell(node=row.name.removeprefix(STRAGGLER_PREFIX), ratio=row.value,
                              label=f"{row.value:.2f}x", fill=fill, verdict=row.verdict.value, title=row.reason))
    return cells


def _gate_of(threshold: str | None) -> float | None:
    """1.15 of '<= 1.15' (a gate above 1, else None)."""
    try:
        value = float((threshold or "").replace("<=", "").strip())
    except ValueError:
        return None
    return value if value > 1.0 else None


def _metric_view(row: MetricRow) -> MetricView:
    actual = _actual(row.value)
    gate = _symbols(row.threshold) if row.threshold else ""
    reading = f"{actual} {row.unit}".strip() if actual != "-" else "not measured"
    return MetricView(name=row.name, label=metric_label(row.name), actual=actual,
                      unit=row.unit, threshold=gate or "not gated", verdict=row.verdict.value,
                      margin=_percent(row.margin_pct), reason=row.reason, enforced=row.enforced,
                      against=f"{reading} vs {gate}" if gate else reading,
                      # a row a gate judged (gate.finite_loss holds no threshold text) is a gate: a FAIL folded
                      # away under "recorded, not gated" would hide why the combo failed
                      gated=row.verdict in _JUDGED or (row.threshold is not None and row.verdict is not Verdict.RECORD))


_JUDGED = frozenset({Verdict.PASS, Verdict.FAIL, Verdict.INTERRUPTED})


def _symbols(threshold: str) -> str:
    """'>= 50' -> '≥ 50', '<= 500 ms' -> '≤ 500 ms', '+/-5%' -> '±5%': the gate as it is written by hand."""
    return threshold.replace(">=", "\u2265").replace("<=", "\u2264").replace("+/-", "\u00b1")


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


__all__ = ["REPORT_NAME", "HeatCell", "LinkView", "heat_strip", "render_html"]
