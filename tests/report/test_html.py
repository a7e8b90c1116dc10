"""report.html: one self-contained page, every section present, all run text escaped."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest

from megapilot.report import render_report
from megapilot.report.charts import plotly_js
from tests.report.factory import (
    FAILING,
    HOSTILE_LINE,
    NEVER_STARTED,
    PASSING,
    STOPPED,
    STOPPED_DIR,
    interrupted_result,
    suite_result,
    write_interrupted_run_dir,
    write_run_dir,
)


class _Page(HTMLParser):
    """The page's elements as (tag, attributes) and the text of each <script>, read by the standard parser."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {name: value or "" for name, value in attrs}))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data

    def ids(self) -> set[str]:
        return {attrs["id"] for _, attrs in self.elements if "id" in attrs}

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [attrs for _, attrs in self.elements if name in attrs.get("class", "").split()]


@pytest.fixture(scope="module")
def page(rendered) -> _Page:
    return _Page(rendered.html)


def test_plotly_js_is_inlined_once_and_nothing_is_fetched(rendered, page):
    html = rendered.html
    assert html.count(plotly_js()[:500]) == 1
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']?(https?:)?//""", html)
    assert len(html.encode()) < 6 * 1024 * 1024  # plotly.js (~4.6 MB) once, not once per chart
    drawn = page.with_class("chart")
    assert len(page.scripts) == 1 + len(drawn)  # the library, then one call per drawn chart


def test_every_chart_has_a_stable_container(page):
    ids = page.ids()
    for chart_id in ("chart-lifecycle", "chart-tokens", "chart-memory", "chart-predicted", "chart-sweep",
                     "chart-loss-0", "chart-loss-1", "chart-step-time-0", "chart-step-time-1"):
        assert chart_id in ids
        assert f"{chart_id}-plot" in ids  # plotly's own div inside the container
    assert {attrs["data-chart"] for attrs in page.with_class("chart")} == {
        "lifecycle", "tokens", "memory", "predicted", "sweep", "loss", "step-time"}


def test_banner_run_card_and_results_table(rendered, page):
    html = rendered.html
    assert page.with_class("banner")[0]["class"] == "banner verdict-FAIL"
    assert "1 of 2 combos failed" in html
    for text in ("0123456789abcdef0123456789abcdef01234567", "examples/suites/thresholds.json", "ab" * 32,
                 "TP=1,PP=1,CP=1,EP=1,DP=2", "examples/clusters/local.json"):
        assert text in html
    rows = page.with_class("result-row")  # one per combo: the stages are the lifecycle table's, not listed twice
    assert len(rows) == len(rendered.result.combos)
    assert {row["data-verdict"] for row in rows} == {"PASS", "FAIL"}
    assert "suite suite" not in html and "Device" in html


def test_metric_panels_show_every_verdict_with_threshold_and_margin(rendered, page):
    rows = page.with_class("metric-row")
    assert len(rows) == sum(len(c.metrics) for c in rendered.result.combos)
    assert {row["data-verdict"] for row in rows} == {"PASS", "FAIL", "SKIPPED", "RECORD"}
    html = rendered.html
    # the gate as a person reads it, with the metric's label and unit; the margin stays as the cell's title
    assert "3,650 tokens/s vs \u2265 3000" in html and "+21.7 %" in html and "-37.1 %" in html
    assert "tokens/s/GPU</td>" in html
    assert "optional metric missing from the log" in html
    assert ">nan" in html  # a NaN loss is shown as such, not as a number
    for panel in html.split('<div class="metric-panel"')[1:]:
        gates, _, recorded = panel.partition('<details class="recorded">')
        assert 'data-verdict="RECORD"' not in gates  # records are folded below the gates
        assert "not gated" in recorded.split("</details>")[0] or not recorded


def test_predictions_regressions_and_findings(rendered):
    html = rendered.html
    assert "Predicted vs measured" in html and "+6.9 %" in html  # 1122 ms measured vs 1050 ms predicted
    assert "tokens/s -8.3 % vs the median of the last 5 runs" in html
    assert "CUDA out of memory while allocating 2.00 GiB" in html
    assert "MBS=2,GBS=16,PRECISION=FP8/out-node0/training.log:412" in html


def test_log_text_is_escaped_and_ansi_dropped(rendered, page):
    html = rendered.html
    assert HOSTILE_LINE not in html
    assert "&lt;script&gt;window.__xss = 1;" in html
    assert "&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt; oops" in html
    assert "\x1b" not in html and "ERROR torch.OutOfMemoryError" in html
    assert not any("__xss" in script for script in page.scripts)


def test_log_links_point_at_the_copied_logs(rendered, page):
    links = page.with_class("log-link")
    assert len(links) == 2
    for link in links:
        assert (rendered.run_dir / unquote(link["href"])).is_file()
    copied = (rendered.run_dir / unquote(links[1]["href"])).read_text(encoding="utf-8")
    assert HOSTILE_LINE in copied  # the copy is the log as written; only the page escapes


def test_failed_combo_shows_its_log_tail_passing_one_does_not(page):
    tails = page.with_class("log-tail")
    assert len(tails) == 1
    sections = {attrs["data-combo"]: attrs["id"] for attrs in page.with_class("combo")}
    assert set(sections) == {PASSING, FAILING}


def test_unfinished_run_says_so_and_empty_charts_say_why(tmp_path):
    result = write_run_dir(tmp_path)
    result.finished = False
    result.combos[1].curves = []
    render_report(result, tmp_path)
    page = _Page(html := (tmp_path / "report.html").read_text(encoding="utf-8"))
    assert "not finished (interrupted or still running)" in html
    empty = {attrs["id"] for attrs in page.with_class("chart-empty")}
    assert empty == {"chart-loss-1", "chart-step-time-1"}
    assert "no iteration logged this value" in html


def test_a_run_with_no_stage_and_no_combo_renders(tmp_path):
    result = suite_result(tmp_path)
    result.stages, result.combos, result.regressions = [], [], []
    result.card.gpu = "not-in-the-catalog"
    result.recompute_verdict()
    files = render_report(result, tmp_path)
    html = files.html.read_text(encoding="utf-8")
    assert "No stage has run." in html and "SKIPPED" in html
    assert files.log_files == ()
    assert len(_Page(html).with_class("chart")) == 0


def test_rendering_twice_gives_the_same_files(tmp_path):
    from datetime import datetime, timezone

    result = write_run_dir(tmp_path)
    when = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
    first = render_report(result, tmp_path, generated_at=when)
    texts = [Path(p).read_bytes() for p in (first.run_deck, first.junit)]
    second = render_report(result, tmp_path, generated_at=when)
    assert [Path(p).read_bytes() for p in (second.run_deck, second.junit)] == texts
    assert first == second


def test_the_straggler_heat_strip_draws_each_measured_node_coloured_by_its_slowdown(tmp_path):
    from megapilot.report.html import heat_strip
    from tests.report.factory import with_stragglers

    combo = next(c for c in with_stragglers(suite_result(tmp_path)).combos if c.key == PASSING)
    cells = heat_strip(combo)
    assert [(c.node, c.label, c.verdict) for c in cells] == [("node0", "0.99x", "PASS"), ("node1", "1.01x", "PASS"),
                                                            ("node2", "1.31x", "FAIL")]  # node3: nothing measured
    hues = [int(c.fill.split("(")[1].split(",")[0]) for c in cells]
    assert hues[0] == 120 and hues[0] > hues[1] > hues[2] and hues[2] < 60  # past the gate: past yellow
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    text = render_report(with_stragglers(write_run_dir(run_dir)), run_dir).html.read_text()
    assert text.count('class="heat-cell"') == 3 and 'data-node="node2"' in text and "1.31x" in text


def test_an_interrupted_run_says_so_in_its_title_and_banner_and_shows_the_combo_it_stopped_in(tmp_path):
    write_interrupted_run_dir(tmp_path)
    html = render_report(interrupted_result(tmp_path), tmp_path).html.read_text(encoding="utf-8")
    page = _Page(html)
    title = re.search(r"<title>(.*?)</title>", html)
    assert title is not None and title.group(1).startswith("megatron-single-node: INTERRUPTED")
    assert '<span class="verdict-word">INTERRUPTED</span>' in html
    assert (f"stopped by SIGINT during combo 2 of 3 ({STOPPED}: train, iteration 10 of 80); what finished: all PASS"
            in html)
    banner = re.search(r'<header class="banner verdict-INTERRUPTED" id="verdict-banner">(.*?)</header>', html, re.S)
    assert banner is not None and "FAIL" not in banner.group(1)  # nothing that finished failed
    rows = {attrs.get("data-verdict") for attrs in page.with_class("result-row")}
    assert rows == {"PASS", "INTERRUPTED"} and "No combo has run." not in html
    section = next(attrs for attrs in page.with_class("combo") if attrs["data-combo"] == STOPPED)
    assert "combo-INTERRUPTED" in section["class"]
    assert "10/80 iterations" in html and "&lt;stopped&gt; by SIGINT" in html  # the partial log's tail
    links = [unquote(attrs["href"]) for attrs in page.with_class("log-link")]
    assert f"logs/{STOPPED_DIR}/node0.log" in links
    assert f"Not run, the suite was interrupted before it started: {NEVER_STARTED}" in html


def test_a_gate_judged_without_threshold_text_is_shown_among_the_gates_not_folded_as_recorded():
    # gate.finite_loss (a NaN loss) and gate.completed without a planned count judge with no threshold text: a FAIL
    # of theirs folded under "recorded, not gated" would hide why the combo failed
    from megapilot.report.html import _metric_view
    from megapilot.suite.results import MetricRow, Verdict

    nan = MetricRow(name="gate.finite_loss", verdict=Verdict.FAIL, reason="lm loss is nan at iteration 7")
    assert _metric_view(nan).gated
    assert _metric_view(nan.model_copy(update={"verdict": Verdict.PASS})).gated
    for verdict in (Verdict.RECORD, Verdict.SKIPPED):  # measured only, or never measured: not a gate's verdict
        assert not _metric_view(MetricRow(name="training.grad_norm", value=1.3, verdict=verdict)).gated
