"""The report's charts, drawn by plotly: figures built here, plotly.js inlined once by the page.

Each chart becomes a `<div>` fragment without plotly.js (`include_plotlyjs=False`); the page carries one
`<script>` with plotly.js from the installed package, so the report opens offline and stays one copy of
the library however many charts it has. plotly writes the figure data as JSON with `<` escaped, so a
combo key or label cannot close the script it sits in.

Chart ids are stable (`chart-tokens`, `chart-loss-0`, ...): tests and users' scripts find them by id,
and every chart container has the class `chart` plus one naming its kind (`chart-loss`, ...).
A chart with nothing to draw (a combo that failed before its first iteration) is not drawn; the page
says why in its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from megapilot.report import measures
from megapilot.suite.cells import SMOKE_CELL_KEY
from megapilot.suite.results import ComboResult, SuiteResult, Verdict

if TYPE_CHECKING:
    import plotly.graph_objects as go

VERDICT_COLOURS = {Verdict.PASS: "#2e7d32", Verdict.FAIL: "#c62828", Verdict.RECORD: "#757575",
                   Verdict.SKIPPED: "#f9a825", Verdict.INTERRUPTED: "#455a64"}
PREDICTED_COLOUR = "#90a4ae"
MEASURED_COLOUR = "#1565c0"
_HEIGHT_PX = 320


@dataclass(frozen=True)
class Chart:
    """One chart: its container id and kind, and either its HTML fragment or why it is not drawn."""

    chart_id: str
    kind: str
    title: str
    html: str | None = None
    empty_reason: str = ""


@dataclass
class ReportCharts:
    """The run-wide charts and each combo's own (by combo key)."""

    overview: list[Chart] = field(default_factory=list)
    per_combo: dict[str, list[Chart]] = field(default_factory=dict)

    def all(self) -> list[Chart]:
        return self.overview + [chart for charts in self.per_combo.values() for chart in charts]


def plotly_js() -> str:
    """The installed plotly.js, minified, to inline once in the page."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    from plotly.offline import get_plotlyjs

    script: str = get_plotlyjs()  # plotly ships no types; it returns the bundle's text
    return script


def build_charts(result: SuiteResult, capacity_gib: float | None) -> ReportCharts:
    """Every chart of the report."""
    overview = [lifecycle_chart(result), tokens_chart(result), memory_chart(result, capacity_gib),
                predicted_vs_measured_chart(result, capacity_gib), sweep_chart(result)]
    if any(stage.name == "collectives" and stage.curves for stage in result.stages):  # off by default on CPUs
        overview.append(collectives_chart(result))
    per_combo = {combo.key: [loss_chart(combo, index), step_time_chart(combo, index)]
                 for index, combo in enumerate(result.combos)}
    return ReportCharts(overview=overview, per_combo=per_combo)


# ---- run-wide charts -----------------------------------------------------------------------------------------

def lifecycle_chart(result: SuiteResult) -> Chart:
    """The lifecycle as a timeline: one bar per stage from its start, coloured by verdict."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go

    stages = [stage for stage in result.stages if stage.duration_s > 0 or stage.started_at]
    if not stages:
        return _empty("chart-lifecycle", "lifecycle", "Lifecycle", "no stage has run")
    labels = [f"{stage.name} [{stage.combo}]" if stage.combo else stage.name for stage in stages]
    starts = _stage_offsets_s(result.started_at, [(s.started_at, s.duration_s) for s in stages])
    figure = go.Figure(go.Bar(
        y=labels, x=[stage.duration_s for stage in stages], base=starts, orientation="h",
        marker_color=[VERDICT_COLOURS[stage.verdict] for stage in stages],
        customdata=[stage.verdict.value for stage in stages],
        hovertemplate="%{y}: %{x:.1f} s (%{customdata})<extra></extra>"))
    figure.update_yaxes(autorange="reversed")
    return _chart("chart-lifecycle", "lifecycle", "Lifecycle (seconds from the start of the run)", figure,
                  x_title="seconds")


def _stage_offsets_s(run_start: datetime, stages: list[tuple[datetime | None, float]]) -> list[float]:
    """Each stage's start in seconds from the run's start; a stage without a start follows the one before it."""
    offsets, cursor = [], 0.0
    for started_at, duration_s in stages:
        start = (started_at - run_start).total_seconds() if started_at else cursor
        offsets.append(max(start, 0.0))
        cursor = max(start, 0.0) + duration_s
    return offsets


def tokens_chart(result: SuiteResult) -> Chart:
    """Tokens/s per GPU of each combo (bar), coloured by the combo's verdict."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go

    combos, values = _measured_combos(result, measures.TOKENS_PER_S_PER_GPU)
    if not combos:
        return _empty("chart-tokens", "tokens", "Tokens/s per GPU", "no combo measured tokens/s")
    figure = go.Figure(go.Bar(x=[c.key for c in combos], y=values,
                              marker_color=[VERDICT_COLOURS[c.verdict] for c in combos],
                              hovertemplate="%{x}: %{y:,.0f} tokens/s/GPU<extra></extra>"))
    return _chart("chart-tokens", "tokens", "Tokens/s per GPU by combo", figure, y_title="tokens/s/GPU")


def memory_chart(result: SuiteResult, capacity_gib: float | None) -> Chart:
    """Measured (and predicted) memory per combo against the GPU's HBM capacity."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go

    measured = {c.key: measures.measured(c, measures.MEMORY_GIB, capacity_gib) for c in result.combos}
    predicted = {c.key: measures.finite(c.predicted.memory_gib) if c.predicted else None for c in result.combos}
    if not any(v is not None for v in [*measured.values(), *predicted.values()]):
        return _empty("chart-memory", "memory", "Memory", "no combo measured or predicted its memory")
    keys = [c.key for c in result.combos]
    figure = go.Figure([
        go.Bar(name="measured", x=keys, y=[measured[k] for k in keys], marker_color=MEASURED_COLOUR),
        go.Bar(name="predicted", x=keys, y=[predicted[k] for k in keys], marker_color=PREDICTED_COLOUR)])
    title = "Memory per GPU (GiB)"
    if capacity_gib:
        figure.add_hline(y=capacity_gib, line_dash="dash", line_color=VERDICT_COLOURS[Verdict.FAIL],
                         annotation_text=f"{result.card.gpu} capacity {capacity_gib:g} GiB")
    else:
        title += f": capacity of {result.card.gpu} unknown to the catalog"
    figure.update_layout(barmode="group")
    return _chart("chart-memory", "memory", title, figure, y_title="GiB")


def predicted_vs_measured_chart(result: SuiteResult, capacity_gib: float | None) -> Chart:
    """Measured against predicted for each quantity the estimator predicted, one panel per quantity."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    checks = {c.key: measures.prediction_checks(c, capacity_gib) for c in result.combos}
    quantities = [q for q in measures.PREDICTED_QUANTITIES
                  if any(check.quantity is q for combo_checks in checks.values() for check in combo_checks)]
    if not quantities:
        return _empty("chart-predicted", "predicted", "Predicted vs measured", "no combo has a prediction")
    figure = make_subplots(rows=1, cols=len(quantities), subplot_titles=[q.label for q in quantities])
    for column, quantity in enumerate(quantities, start=1):
        rows = [(key, check) for key, combo_checks in checks.items() for check in combo_checks
                if check.quantity is quantity]
        keys = [key for key, _ in rows]
        figure.add_trace(go.Bar(name="predicted", x=keys, y=[check.predicted for _, check in rows],
                                marker_color=PREDICTED_COLOUR, showlegend=column == 1, legendgroup="predicted"),
                         row=1, col=column)
        figure.add_trace(go.Bar(name="measured", x=keys, y=[check.measured for _, check in rows],
                                marker_color=MEASURED_COLOUR, showlegend=column == 1, legendgroup="measured"),
                         row=1, col=column)
        figure.update_yaxes(title_text=quantity.unit, row=1, col=column)  # as the sweep chart: the unit on its axis
    figure.update_layout(barmode="group")
    return _chart("chart-predicted", "predicted", "Predicted vs measured", figure, top_px=90)


def sweep_chart(result: SuiteResult) -> Chart:
    """The sweep at a glance: bars per cell (categorical, never joined by lines) for each throughput measured, one
    panel per quantity; the smoke run is not a sweep cell, and a quantity no cell measured is not drawn."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cells = [c for c in result.combos if c.key != SMOKE_CELL_KEY]  # a check, not a sweep cell
    measured = [(quantity, [measures.measured(c, quantity) for c in cells])
                for quantity in (measures.TOKENS_PER_S_PER_GPU, measures.TFLOPS_PER_GPU)]
    measured = [(quantity, values) for quantity, values in measured if any(v is not None for v in values)]
    if not measured:
        return _empty("chart-sweep", "sweep", "Sweep comparison", "no sweep cell measured its throughput")
    figure = make_subplots(rows=1, cols=len(measured), subplot_titles=[q.label for q, _ in measured])
    for column, (quantity, values) in enumerate(measured, start=1):
        figure.add_trace(go.Bar(name=quantity.label, x=[c.key for c in cells], y=values, showlegend=False,
                                marker_color=[VERDICT_COLOURS[c.verdict] for c in cells]), row=1, col=column)
        figure.update_yaxes(title_text=quantity.unit, row=1, col=column)
    return _chart("chart-sweep", "sweep", "Sweep comparison: throughput by cell", figure)


def collectives_chart(result: SuiteResult) -> Chart:
    """The collectives stage's bus bandwidth against message size, one line per collective of the whole job, as
    measured (log-scaled sizes: the sweep doubles them); its gates are the stage's rows."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go

    stage = next((s for s in result.stages if s.name == "collectives" and s.curves), None)
    if stage is None:
        return _empty("chart-collectives", "collectives", "Collective bus bandwidth",
                      "the collectives stage did not run or measured nothing")
    figure = go.Figure()
    for series in stage.curves:
        figure.add_trace(go.Scatter(x=[size for size, _ in series.points], y=[bw for _, bw in series.points],
                                    mode="lines+markers", name=series.name,
                                    hovertemplate="%{x:,} B: %{y:.3f} GB/s<extra>" + series.name + "</extra>"))
    figure.update_xaxes(type="log")
    return _chart("chart-collectives", "collectives", "Collective bus bandwidth by message size (whole job)",
                  figure, x_title="message size (bytes)", y_title="bus bandwidth (GB/s)")


def _measured_combos(result: SuiteResult, quantity: measures.Quantity) -> tuple[list[ComboResult], list[float]]:
    pairs = [(combo, measures.measured(combo, quantity)) for combo in result.combos]
    kept = [(combo, value) for combo, value in pairs if value is not None]
    return [combo for combo, _ in kept], [value for _, value in kept]


# ---- per-combo charts ----------------------------------------------------------------------------------------

def loss_chart(combo: ComboResult, index: int) -> Chart:
    return _curve_chart(combo, f"chart-loss-{index}", "loss", measures.LOSS_CURVE, "LM loss", "loss")


def step_time_chart(combo: ComboResult, index: int) -> Chart:
    return _curve_chart(combo, f"chart-step-time-{index}", "step-time", measures.STEP_TIME_CURVE,
                        "Step time per iteration", "ms")


def _curve_chart(combo: ComboResult, chart_id: str, kind: str, curve_name: str, title: str, y_title: str) -> Chart:
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.graph_objects as go

    points = measures.finite_points(measures.curve(combo, curve_name))
    if not points:
        return _empty(chart_id, kind, title, "no iteration logged this value")
    figure = go.Figure(go.Scatter(x=[step for step, _ in points], y=[value for _, value in points],
                                  mode="lines+markers", marker_color=VERDICT_COLOURS[combo.verdict], name=combo.key))
    return _chart(chart_id, kind, title, figure, x_title="iteration", y_title=y_title)


# ---- rendering -----------------------------------------------------------------------------------------------

def _chart(chart_id: str, kind: str, title: str, figure: go.Figure, *, x_title: str = "", y_title: str = "",
           top_px: int = 50) -> Chart:
    """The figure as a `<div>` fragment without plotly.js (the page has it once); `top_px`: room for subplot titles."""
    # heavy: plotly (about 0.5 s) loads only when a chart is drawn
    import plotly.io as pio

    figure.update_layout(title={"text": title}, height=_HEIGHT_PX, margin={"l": 60, "r": 30, "t": top_px, "b": 60},
                         template="plotly_white")
    if x_title:
        figure.update_xaxes(title_text=x_title)
    if y_title:
        figure.update_yaxes(title_text=y_title)
    html = pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=f"{chart_id}-plot",
                       config={"displaylogo": False, "responsive": True})
    return Chart(chart_id=chart_id, kind=kind, title=title, html=html)


def _empty(chart_id: str, kind: str, title: str, reason: str) -> Chart:
    return Chart(chart_id=chart_id, kind=kind, title=title, empty_reason=reason)


__all__ = ["VERDICT_COLOURS", "Chart", "ReportCharts", "build_charts", "plotly_js"]
