"""report.html in a real headless Chromium: tables, metric panels and every chart render, no console error, no XSS.

The browser is driven over the DevTools protocol through a pipe (`--remote-debugging-pipe`: JSON
messages ended by NUL on fds 3 and 4), so no network port and no client library is needed. The page
is the one `render_report` writes for the factory's two-combo run, whose failed combo's log holds
`<script>window.__xss = 1; document.title = 'pwned'</script></td></tr></table>`.

Set MEGAPILOT_REPORT_SCREENSHOT=docs/report.png to keep the screenshot (the README shows it).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from megapilot.report import render_report
from tests.report.factory import HOSTILE_LINE, write_run_dir

pytestmark = pytest.mark.slow

CHART_IDS = ("chart-lifecycle", "chart-tokens", "chart-memory", "chart-predicted", "chart-sweep",
             "chart-loss-0", "chart-loss-1", "chart-step-time-0", "chart-step-time-1")
TIMEOUT_S = 30.0


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no Chromium on PATH (Debian: apt-get install chromium, listed in scripts/apt-packages.txt)")


class DevTools:
    """A headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, binary: str, profile: Path):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        argv = [binary, "--headless", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", f"--user-data-dir={profile}", "--window-size=1400,1800",
                "--hide-scrollbars", "about:blank"]
        if os.geteuid() == 0:
            argv.insert(1, "--no-sandbox")  # Chromium refuses to sandbox as root (containers, CI)

        def pipe_fds_3_and_4() -> None:  # in the child: the browser reads commands on fd 3, replies on fd 4
            # copies above 9 first, in case a pipe end is itself fd 3 or 4
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=pipe_fds_3_and_4)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def open_page(self) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for_event(self, method: str) -> dict:
        while True:
            for event in self.events:
                if event.get("method") == method:
                    self.events.remove(event)
                    return event
            self.events.append(self._read())

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error calls and browser log errors seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(params["entry"].get("text", "")[:500])
        return found

    def _read(self) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise TimeoutError("Chromium sent nothing for 30 s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    binary = _chromium()
    run_dir = tmp_path_factory.mktemp("run")
    files = render_report(write_run_dir(run_dir), run_dir)
    browser = DevTools(binary, tmp_path_factory.mktemp("profile"))
    try:
        browser.open_page()
        browser.call("Page.navigate", url=files.html.as_uri())
        browser.wait_for_event("Page.loadEventFired")
        _wait_for_charts(browser)
        yield browser, run_dir
    finally:
        browser.close()


def _wait_for_charts(browser: DevTools) -> None:
    """plotly draws after load; wait until every chart container holds its SVG (or time runs out)."""
    deadline = time.monotonic() + TIMEOUT_S
    count = "document.querySelectorAll('figure.chart .main-svg').length"
    while browser.evaluate(count) < len(CHART_IDS) and time.monotonic() < deadline:
        time.sleep(0.2)


def test_every_chart_rendered(page):
    browser, _ = page
    drawn = browser.evaluate("Array.from(document.querySelectorAll('figure.chart'))"
                             ".filter(f => f.querySelector('.main-svg')).map(f => f.id)")
    assert sorted(drawn) == sorted(CHART_IDS)
    # a drawn chart has marks: bars or lines, not only axes
    marks = browser.evaluate("Array.from(document.querySelectorAll('figure.chart')).map(f => "
                             "f.querySelectorAll('.point, .trace path, .bars path').length)")
    assert all(count > 0 for count in marks)


def test_results_table_and_metric_panels_rendered(page):
    browser, _ = page
    rows = browser.evaluate("Array.from(document.querySelectorAll('#results-table tbody tr'))"
                            ".map(r => [r.cells.length, r.dataset.verdict])")
    assert len(rows) == 2 and all(cells == 12 for cells, _ in rows)  # one row per combo, stages not repeated
    assert {verdict for _, verdict in rows} == {"PASS", "FAIL"}
    panels = browser.evaluate("Array.from(document.querySelectorAll('.metric-panel'))"
                              ".map(p => p.querySelectorAll('tr.metric-row').length)")
    assert panels == [6, 3]
    # at a glance: the gates are shown, the records folded (in the page, not displayed until opened)
    shown = browser.evaluate("Array.from(document.querySelectorAll('tr.metric-row'))"
                             ".filter(r => r.checkVisibility()).map(r => r.dataset.verdict)")
    assert shown and "RECORD" not in shown
    first = browser.evaluate("document.querySelector('table.gated tr.metric-row td:nth-child(2)').innerText")
    assert first == "41.2 TFLOP/s vs \u2265 35"
    colour = browser.evaluate("getComputedStyle(document.querySelector('.verdict-FAIL')).backgroundColor")
    assert colour == "rgb(198, 40, 40)"


def test_no_console_error_and_no_template_left_unrendered(page):
    browser, _ = page
    assert browser.errors() == []
    text = browser.evaluate("document.body.innerText")
    assert "{{" not in text and "{%" not in text
    assert browser.evaluate("document.getElementById('verdict-banner').innerText").startswith("megatron-single-node")


def test_hostile_log_line_shows_as_text_and_runs_nothing(page):
    browser, _ = page
    assert browser.evaluate("typeof window.__xss") == "undefined"
    assert "pwned" not in browser.evaluate("document.title")
    assert browser.evaluate("document.querySelector('.log-tail pre').textContent").count(HOSTILE_LINE) == 1
    assert browser.evaluate("document.querySelectorAll('.log-tail script, .findings script').length") == 0
    # the `</td></tr></table>` in the evidence table did not end it: every evidence row still has 2 cells
    assert browser.evaluate("Array.from(document.querySelectorAll('table.evidence tr'))"
                            ".every(r => r.cells.length === 2)")


def test_log_links_open_the_copied_logs(page):
    browser, run_dir = page
    hrefs = browser.evaluate("Array.from(document.querySelectorAll('a.log-link')).map(a => a.href)")
    assert len(hrefs) == 2
    for href in hrefs:
        assert href.startswith(run_dir.resolve().as_uri() + "/logs/")


def test_the_straggler_heat_strip_draws_a_labelled_cell_per_measured_node(tmp_path):
    from tests.report.factory import with_stragglers

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    files = render_report(with_stragglers(write_run_dir(run_dir)), run_dir)
    browser = DevTools(_chromium(), tmp_path / "profile")
    try:
        browser.open_page()
        browser.call("Page.navigate", url=files.html.as_uri())
        browser.wait_for_event("Page.loadEventFired")
        cells = browser.evaluate(
            "Array.from(document.querySelectorAll('figure.heat-strip g.heat-cell')).map(g => [g.dataset.node, "
            "Array.from(g.querySelectorAll('text')).map(t => t.textContent).join(' '), "
            "g.querySelector('rect').getBBox().width, getComputedStyle(g.querySelector('rect')).fill])")
        assert [(node, text) for node, text, _, _ in cells] == [
            ("node0", "node0 0.99x"), ("node1", "node1 1.01x"), ("node2", "node2 1.31x")]  # node3 measured nothing
        assert all(width > 50 for _, _, width, _ in cells) and len({fill for *_, fill in cells}) == 3
        assert browser.errors() == []
    finally:
        browser.close()


def test_screenshot(page, tmp_path):
    browser, _ = page
    # the top of the page at half scale: verdict, run card, tables and the first charts
    clip = {"x": 0, "y": 0, "width": 1400, "height": 3600, "scale": 0.5}
    shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png", clip=clip,
                                         captureBeyondViewport=True)["data"])
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
    (tmp_path / "report.png").write_bytes(shot)
    if keep := os.environ.get("MEGAPILOT_REPORT_SCREENSHOT"):
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        Path(keep).write_bytes(shot)
