"""Calibration from a cluster's own runs: corrections recovered from runs, shrunk when few or far, refused when
they predict held-out runs worse."""

from __future__ import annotations

import pytest

from megapilot.estimate.history_calibration import (
    MeasuredRun,
    RunKey,
    StepComponents,
    calibrate,
    nearness,
    single_factor,
)


def _key(**changes: object) -> RunKey:
    base: dict[str, object] = {"model": "llama3-8b", "family": "dense", "precision": "bf16", "gpu": "H100",
                               "gpus": 8}
    return RunKey(**(base | changes))  # type: ignore[arg-type]


def _components(tp: int) -> StepComponents:
    # more TP: less compute per GPU, more exposed TP communication
    return StepComponents(compute_s=8.0 / tp, bubble_s=0.0, scaleup_comm_s=0.2 * tp, scaleout_comm_s=0.0,
                          fixed_s=0.1)


def _truth(c: StepComponents) -> float:
    """The cluster: compute 20 % slower, collectives 2x slower, 0.3 s of data loading per step."""
    return 1.2 * c.compute_s + 2.0 * c.scaleup_comm_s + c.fixed_s + 0.3


def _run(tp: int, **changes: object) -> MeasuredRun:
    predicted = _components(tp)
    return MeasuredRun(f"run-tp{tp}", _key(tp=tp, **changes), predicted, _truth(predicted))


def test_runs_of_several_layouts_recover_the_components() -> None:
    runs = [_run(tp) for tp in (1, 2, 4, 8)]
    case = _components(2)
    result = calibrate(_key(tp=2), case, [r for r in runs if r.key.tp != 2])
    assert result.applied, result.reason
    assert abs(result.step_time_s / _truth(case) - 1) < 0.04
    assert abs(result.uncalibrated_step_time_s / _truth(case) - 1) > 0.2
    assert result.corrections.scaleup_comm > 1.3  # the collectives' slowdown is found, not folded into compute
    assert result.runs_used == ("run-tp1", "run-tp4", "run-tp8")
    assert result.band is not None and result.band < 0.1


def test_one_run_of_the_same_model_beats_a_single_factor_on_another_layout() -> None:
    history = [_run(1)]
    case = _components(8)
    result = calibrate(_key(tp=8), case, history)
    calibrated_error = abs(result.step_time_s / _truth(case) - 1)
    uncalibrated_error = abs(case.total_s / _truth(case) - 1)
    assert result.applied and calibrated_error < uncalibrated_error
    assert single_factor(_key(tp=8), case, history) > 0


def test_far_runs_weigh_little() -> None:
    assert nearness(_key(), _key(gpu="B200")) == 0.0
    near, far = nearness(_key(), _key(tp=2)), nearness(_key(), _key(model="other", precision="fp8", tp=8))
    assert near > 10 * far
    # a single far run hardly moves the estimate; the same run, near, moves it most of the way
    far_run = _run(1, model="other", precision="fp8", family="moe")
    moved_far = calibrate(_key(tp=1), _components(1), [far_run]).factor
    moved_near = calibrate(_key(tp=1), _components(1), [_run(1)]).factor
    assert abs(moved_far - 1) < 0.05 < abs(moved_near - 1)


def test_no_run_on_this_gpu_keeps_the_uncalibrated_figure() -> None:
    result = calibrate(_key(), _components(1), [_run(1, gpu="B200")])
    assert not result.applied and "no measured run on H100" in result.reason
    assert result.step_time_s == pytest.approx(_components(1).total_s)


def test_a_calibration_worse_on_held_out_runs_is_not_applied() -> None:
    # runs that contradict each other: the same layout measured 2x apart, predicted exactly right on average
    c = _components(1)
    runs = [MeasuredRun("slow", _key(), c, 1.5 * c.total_s), MeasuredRun("fast", _key(), c, 0.75 * c.total_s),
            MeasuredRun("right", _key(), c, c.total_s)]
    result = calibrate(_key(), c, runs)
    assert not result.applied
    assert "worse than the uncalibrated model" in result.reason
    assert result.step_time_s == result.uncalibrated_step_time_s
