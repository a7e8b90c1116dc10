"""A suite.json written before a combo's layout was one field (flat tp/pp/cp/ep/vpp/mbs) reads into the same
combos and re-renders the same report, run deck and JUnit as the same run written now (tests/store/test_history.py
records it into SQLite and PostgreSQL). The fixture is such a run directory, written by the version before
(tests/data/suite_results/README.md)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from megapilot.report.render import render_report
from megapilot.spec import LayoutPins
from megapilot.suite.results import ComboResult, Verdict, read_suite_result, recorded_layout

EARLIER = Path(__file__).resolve().parents[1] / "data" / "suite_results" / "flat_layout"
PASSING = "MBS=1,GBS=8,PRECISION=BF16"
FAILING = "MBS=2,GBS=16,PRECISION=FP8"
WHEN = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)


@pytest.fixture
def earlier(tmp_path) -> Path:
    """A copy of the earlier run directory (a report is written into it)."""
    return Path(shutil.copytree(EARLIER, tmp_path / "earlier"))


def test_the_earlier_file_has_flat_fields_and_reads_into_one_layout_per_combo(earlier):
    stored = json.loads((earlier / "suite.json").read_text())["combos"]
    assert "layout" not in stored[0] and stored[0]["pp"] == 2 and stored[1]["ep"] == 2  # the fixture is the old form
    result = read_suite_result(earlier)
    assert result.combo(PASSING).layout == LayoutPins(tp=1, pp=2, cp=1, ep=1, vpp=2, mbs=1)
    assert result.combo(FAILING).layout == LayoutPins(tp=2, pp=1, cp=1, ep=2, mbs=2)
    assert (result.combo(FAILING).gbs, result.combo(FAILING).precision) == (16, "FP8")  # the rest as it was


def test_written_again_it_holds_the_layout_once_and_reads_back_the_same(earlier, tmp_path):
    result = read_suite_result(earlier)
    result.write(tmp_path / "now")
    stored = json.loads((tmp_path / "now" / "suite.json").read_text())["combos"]
    assert stored[1]["layout"] == {"tp": 2, "pp": 1, "cp": 1, "ep": 2, "mbs": 2}  # unset pins are not written
    assert not {"tp", "pp", "cp", "ep", "vpp", "mbs"} & set(stored[1])
    assert read_suite_result(tmp_path / "now") == result


def test_the_report_run_deck_and_junit_of_the_earlier_file_are_those_of_the_run_written_now(earlier, tmp_path):
    now = Path(shutil.copytree(EARLIER, tmp_path / "now"))
    read_suite_result(earlier).write(now)
    before = render_report(read_suite_result(earlier), earlier, generated_at=WHEN)
    after = render_report(read_suite_result(now), now, generated_at=WHEN)
    for name in ("html", "run_deck", "junit"):
        assert getattr(before, name).read_text() == getattr(after, name).read_text(), name
    deck = json.loads(before.run_deck.read_text())
    text = json.dumps(deck)
    assert '"tp": 2' in text and '"ep": 2' in text and '"vpp": 2' in text
    html = before.html.read_text()
    assert "TP=1 PP=2 CP=1 EP=1 VPP=2" in html and "TP=2 PP=1 CP=1 EP=2" in html


def test_a_combo_with_its_layout_and_a_flat_field_beside_it_is_refused():
    with pytest.raises(ValidationError, match="tp"):
        ComboResult.model_validate({"key": "A", "directory": "A", "verdict": "PASS", "backend": "megapilot",
                                    "layout": {"tp": 2}, "tp": 4})


def test_a_combo_without_a_layout_ran_on_one_device_as_before():
    combo = ComboResult(key="A", directory="A", verdict=Verdict.PASS, backend="megapilot")
    assert combo.layout == LayoutPins(tp=1, pp=1, cp=1, ep=1)


def test_the_recorded_layout_is_the_launched_sizes_with_the_cells_micro_batch():
    from megapilot.spec import ParallelConfig

    launched = ParallelConfig(tp=2, pp=2, vpp=2, dp=2, mbs=1, recompute="full")
    assert recorded_layout(launched, mbs=None) == LayoutPins(tp=2, pp=2, cp=1, ep=1, vpp=2)


def test_a_result_read_back_in_either_form_is_one_model():
    flat = {"key": "A", "directory": "A", "verdict": "PASS", "backend": "megapilot", "tp": 4, "vpp": 2}
    held = {"key": "A", "directory": "A", "verdict": "PASS", "backend": "megapilot",
            "layout": {"tp": 4, "pp": 1, "cp": 1, "ep": 1, "vpp": 2}}
    assert ComboResult.model_validate(flat) == ComboResult.model_validate(held)
