"""The one prediction type: what it derives, what it refuses, and how it crosses suite.json."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from megapilot.spec import Prediction


def test_fits_needs_both_figures_and_the_memory_within_the_capacity() -> None:
    assert Prediction(memory_gib=70.0, capacity_gib=80.0).fits
    assert Prediction(memory_gib=80.0, capacity_gib=80.0).fits  # exactly full still fits
    assert not Prediction(memory_gib=80.5, capacity_gib=80.0).fits
    assert not Prediction(memory_gib=10.0).fits and not Prediction(capacity_gib=80.0).fits  # unknown: not claimed


def test_step_time_in_seconds_and_mfu_as_a_fraction() -> None:
    prediction = Prediction(step_time_ms=1250.0, mfu_pct=42.0)
    assert prediction.step_time_s == pytest.approx(1.25)
    assert prediction.mfu == pytest.approx(0.42)
    assert Prediction().step_time_s is None and Prediction().mfu is None


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="step_time_s"):
        Prediction.model_validate({"step_time_s": 1.0})  # a property, not a field: the file says ms


def test_nan_and_infinity_survive_the_json_round_trip() -> None:
    prediction = Prediction(step_time_ms=math.inf, mfu_pct=math.nan, components_ms={"compute": 10.0, "pp_bubble": 2.5},
                            calibration_runs=["run-1"], band_pct=8.0)
    text = prediction.model_dump_json()
    assert json.loads(text)["step_time_ms"] == "Infinity" and json.loads(text)["mfu_pct"] == "NaN"  # not null
    back = Prediction.model_validate_json(text)
    assert back.step_time_ms == math.inf and back.mfu_pct is not None and math.isnan(back.mfu_pct)
    assert back.components_ms == {"compute": 10.0, "pp_bubble": 2.5} and back.calibration_runs == ["run-1"]


def test_each_prediction_has_its_own_components_and_runs() -> None:
    first, second = Prediction(), Prediction()
    first.components_ms["compute"] = 1.0
    first.calibration_runs.append("run-1")
    assert second.components_ms == {} and second.calibration_runs == []
