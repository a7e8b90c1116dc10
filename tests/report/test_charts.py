"""Charts: one figure per chart kind, ids stable, plotly.js left out of each fragment, figure text escaped."""

from __future__ import annotations

from megapilot.report.charts import build_charts, plotly_js
from tests.report.factory import suite_result


def test_ids_and_kinds(tmp_path):
    charts = build_charts(suite_result(tmp_path), capacity_gib=80.0)
    assert [c.chart_id for c in charts.overview] == [
        "chart-lifecycle", "chart-tokens", "chart-memory", "chart-predicted", "chart-sweep"]
    assert [c.chart_id for c in charts.all()[5:]] == [
        "chart-loss-0", "chart-step-time-0", "chart-loss-1", "chart-step-time-1"]
    assert all(chart.html for chart in charts.all())


def test_fragments_do_not_carry_plotly_js(tmp_path):
    library_head = plotly_js()[:500]
    assert all(library_head not in (chart.html or "") for chart in build_charts(suite_result(tmp_path), 80.0).all())


def test_a_hostile_combo_key_cannot_close_the_chart_script(tmp_path):
    result = suite_result(tmp_path)
    result.combos[0].key = "</script><script>window.__xss=1</script>"
    for chart in build_charts(result, 80.0).all():
        # the key sits in the figure's JSON with `<` escaped: one script opens and closes per chart, no more
        assert (chart.html or "").count("</script>") == 1
        assert "<script>window.__xss" not in (chart.html or "")


def test_memory_chart_names_an_unknown_capacity(tmp_path):
    result = suite_result(tmp_path)
    result.card.gpu = "mystery-gpu"
    memory = build_charts(result, capacity_gib=None).overview[2]
    assert "capacity of mystery-gpu unknown to the catalog" in memory.title


def test_sweep_chart_draws_bars_for_what_was_measured_and_leaves_smoke_out(tmp_path):
    from megapilot.report.charts import sweep_chart

    result = suite_result(tmp_path)
    smoke = result.combos[0].model_copy(update={"key": "smoke"})
    result.combos = [smoke, *result.combos]
    for combo in result.combos:  # a run that measured no TFLOP/s: no TFLOP/s panel (no -1..1 axis)
        combo.metrics = [row for row in combo.metrics if row.name != "training.throughput_per_gpu"]
        combo.curves = [curve for curve in combo.curves if curve.name != "tflops_per_gpu"]
    html = sweep_chart(result).html or ""
    assert '"type":"bar"' in html and '"mode":"lines' not in html  # categorical cells: bars, never joined
    assert "TFLOP" not in html and '"text":"Tokens\\u002fs\\u002fGPU"' in html  # plotly writes / as \u002f
    assert '"smoke"' not in html  # a check, not a sweep cell


def test_collectives_chart_draws_each_collectives_measured_curve_and_the_page_lists_its_rows(tmp_path):
    from megapilot.report.render import render_report
    from megapilot.suite.results import Curve, MetricRow, StageResult, Verdict

    result = suite_result(tmp_path)
    assert "chart-collectives" not in [c.chart_id for c in build_charts(result, 80.0).overview]  # the stage was off
    rows = [MetricRow(name="collectives.all_reduce", value=359.19, unit="GB/s", threshold=">= 280", kind="min",
                      verdict=Verdict.PASS, reason="peak 359.190 GB/s"),
            MetricRow(name="node1.collectives", value=139.0, unit="GB/s", verdict=Verdict.FAIL,
                      reason="the bisection names node1")]
    curves = [Curve(name="all_reduce", unit="GB/s", points=[(1024, 0.04), (2**30, 359.19)]),
              Curve(name="alltoall", unit="GB/s", points=[(1024, 0.02), (2**30, 77.4)])]
    result.stages.insert(2, StageResult(name="collectives", verdict=Verdict.FAIL, reason="node1", checks=rows,
                                        curves=curves))
    [chart] = [c for c in build_charts(result, 80.0).overview if c.chart_id == "chart-collectives"]
    html = chart.html or ""
    assert html.count('"mode":"lines+markers"') == 2 and '"type":"log"' in html
    assert "359.19" in html and "77.4" in html
    page = render_report(result, tmp_path).html.read_text()
    assert 'id="chart-collectives"' in page and 'id="collectives"' in page
    assert 'data-metric="node1.collectives" data-verdict="FAIL"' in page
