"""Predicted vs measured in every output: the step's components and where the measurement departs, in JUnit
properties, the run deck and the HTML report."""

from __future__ import annotations

from megapilot.report import render_report
from megapilot.report.junit import build_junit
from megapilot.report.run_deck import build_run_deck
from megapilot.spec import Prediction
from tests.report.factory import PASSING, suite_result

SENTENCE = "step 7 % slower than predicted; the measured data-parallel time is 2.0x its prediction"


def _result(tmp_path):
    result = suite_result(tmp_path)
    combo = result.combo(PASSING)
    assert combo is not None
    prediction = Prediction(step_time_ms=1050.0, tokens_per_s_per_gpu=3900.0, memory_gib=49.0, device="H100-SXM5-80GB",
                            components_ms={"compute": 850.0, "tp_comm": 0.0, "dp_comm": 100.0, "pp_bubble": 0.0,
                                           "optimizer": 60.0, "fixed": 40.0},
                            uncalibrated_step_time_ms=980.0, calibration="calibrated on 2 run(s)",
                            calibration_runs=["a/x", "b/x"], band_pct=4.5)
    result.combos[0] = combo.model_copy(update={"predicted": prediction,
                                                "timers_ms": {"forward-backward": 860.0, "all-grads-sync": 200.0}})
    return result


def test_junit_carries_prediction_components_and_departure(tmp_path):
    xml = build_junit(_result(tmp_path))
    for name, value in (("predicted_step_time_ms", "1050"), ("measured_step_time_ms", "1122"),
                        ("predicted_compute_ms", "850"), ("predicted_exposed_comm_ms", "100"),
                        ("predicted_pipeline_bubble_ms", "0"), ("predicted_fixed_overheads_ms", "100"),
                        ("measured_timer_all-grads-sync_ms", "200"), ("uncalibrated_step_time_ms", "980"),
                        ("prediction_departure", SENTENCE)):
        assert f'<property name="{name}" value="{value}"' in xml, name


def test_run_deck_and_report_say_where_the_step_departs(tmp_path):
    result = _result(tmp_path)
    deck = build_run_deck(result, {}, report_href="report.html", junit_href="junit.xml")
    cell = next(c for c in deck.cells if c.cell_id == PASSING)
    assert cell.predicted is not None and cell.predicted.departure == SENTENCE
    assert cell.predicted.components_ms["exposed_comm"] == 100.0 and cell.predicted.calibration_runs == ["a/x", "b/x"]
    html = render_report(result, tmp_path).html.read_text(encoding="utf-8")
    assert SENTENCE in html and "Exposed communication" in html and "band +/-4.5 %" in html


def test_the_note_of_a_prediction_calibrated_in_the_run_reads_as_a_sentence(tmp_path):
    from megapilot.report.html import _prediction_note

    result = _result(tmp_path)
    combo = result.combos[0]
    assert combo.predicted is not None
    in_run = combo.model_copy(update={"predicted": combo.predicted.model_copy(update={"calibrated_in_run": True})})
    assert "calibrated on 2 of this run's own earlier runs, band +/-4.5 %" in _prediction_note(in_run)
    assert "calibrated on 2 run(s) of this cluster, band +/-4.5 %" in _prediction_note(combo)
