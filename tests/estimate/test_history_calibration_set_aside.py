"""Runs of the history the calibration sets aside: a measured step more than 20x from its layout's prediction (a unit
slip, a run that measured one warm-up step, another machine) stays in the history but calibrates nothing, and the
calibration names it and says why. `history import` refuses such a run; suite combos and `megapilot run` record
theirs without that check, so the calibration checks every run it reads."""

from __future__ import annotations

import pytest

from megapilot.estimate.history_calibration import (
    MAX_MISS_RATIO,
    MeasuredRun,
    SetAside,
    StepComponents,
    calibrate,
    cluster_fits,
    plausible,
)
from tests.estimate.test_history_calibration import _components, _key


def _run(tp: int, factor: float = 1.3, run_id: str | None = None, **changes: object) -> MeasuredRun:
    predicted = _components(tp)
    return MeasuredRun(run_id or f"run-tp{tp}", _key(tp=tp, **changes), predicted, factor * predicted.total_s)


HEALTHY = [_run(1), _run(4), _run(8)]


@pytest.mark.parametrize("factor", [MAX_MISS_RATIO * 1.5, 1000.0, 1 / (MAX_MISS_RATIO * 1.5), 1e-300])
def test_a_run_more_than_20x_from_its_prediction_is_set_aside_named_and_does_not_move_the_estimate(
        factor: float) -> None:
    bad = _run(2, factor, run_id="run/warmup@1", gbs=2)
    clean = calibrate(_key(tp=2), _components(2), HEALTHY)
    result = calibrate(_key(tp=2), _components(2), [*HEALTHY, bad])
    assert "run/warmup@1" not in result.runs_used
    assert result.runs_used == clean.runs_used and result.step_time_s == pytest.approx(clean.step_time_s)
    [aside] = result.set_aside
    assert aside.run_id == "run/warmup@1" and "times the" in aside.why and "predicted for its layout" in aside.why
    assert "set aside" in result.reason and "run/warmup@1" in result.reason


def test_a_run_within_20x_still_calibrates() -> None:
    near_limit = _run(2, MAX_MISS_RATIO * 0.9, run_id="slow")
    result = calibrate(_key(tp=2), _components(2), [*HEALTHY, near_limit])
    assert "slow" in result.runs_used and result.set_aside == ()
    assert "set aside" not in result.reason


def test_only_implausible_runs_of_the_case_s_gpu_leave_it_uncalibrated_and_say_why() -> None:
    result = calibrate(_key(), _components(1), [_run(1, 1000.0, run_id="ms-for-s")])
    assert not result.applied and result.runs_used == ()
    assert result.set_aside == (SetAside("ms-for-s", result.set_aside[0].why),)
    assert "ms-for-s" in result.reason and "set aside" in result.reason


def test_an_implausible_run_of_another_gpu_is_not_named_for_this_case() -> None:
    result = calibrate(_key(tp=2), _components(2), [*HEALTHY, _run(2, 1000.0, run_id="b200-run", gpu="B200")])
    assert result.set_aside == () and "b200-run" not in result.reason


def test_a_run_without_a_positive_step_or_prediction_is_set_aside() -> None:
    zero = MeasuredRun("zero", _key(), _components(1), 0.0)
    unpredicted = MeasuredRun("unpredicted", _key(), StepComponents(0.0, 0.0, 0.0, 0.0, 0.0), 1.0)
    nan = MeasuredRun("nan", _key(), _components(1), float("nan"))
    kept, aside = plausible([*HEALTHY, zero, unpredicted, nan])
    assert kept == HEALTHY and [a.run_id for a in aside] == ["zero", "unpredicted", "nan"]
    result = calibrate(_key(), _components(1), [*HEALTHY, zero, unpredicted, nan])
    assert result.applied and {a.run_id for a in result.set_aside} == {"zero", "unpredicted", "nan"}


def test_history_calibration_fits_without_the_implausible_run_and_names_it() -> None:
    bad = _run(2, 1000.0, run_id="ms-for-s")
    [clean] = cluster_fits(HEALTHY)
    [group] = cluster_fits([*HEALTHY, bad])
    assert group.runs == len(HEALTHY) and group.corrections == clean.corrections
    assert [a.run_id for a in group.set_aside] == ["ms-for-s"]


def test_an_estimate_calibrated_on_a_cluster_names_the_run_it_set_aside_in_its_calibration_object() -> None:
    from megapilot.estimate import build_case, estimate
    from megapilot.estimate.history_calibration import calibrate_estimate

    case = build_case(model="llama3-8b", gpu="h100", gpus=8, seq_len=8192, gbs=128, mbs=1)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    components = StepComponents.from_breakdown(result.time_breakdown_s, result.step_time_s, multi_node=False)
    key = _key(model=case.model.name, mbs=1, gbs=128, seq_len=8192, gpu=case.cluster.gpu.name)
    runs = [MeasuredRun("healthy", key, components, 1.1 * components.total_s),
            MeasuredRun("ms-for-s", key, components, 1000 * components.total_s)]
    calibrated, about = calibrate_estimate(case, result, runs, "lab")
    assert [run["id"] for run in about["runs_used"]] == ["healthy"]
    assert [aside["id"] for aside in about["runs_set_aside"]] == ["ms-for-s"]
    assert "1e+03 times the" in about["runs_set_aside"][0]["why"]
    assert about["applied"] and "ms-for-s" in calibrated.calibration
