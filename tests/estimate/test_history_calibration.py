"""Calibration from a cluster's own runs: corrections recovered from runs, shrunk when few or far, refused when
they predict held-out runs worse."""

from __future__ import annotations

import math

import pytest

from megapilot.estimate.history_calibration import (
    MIN_BAND,
    MeasuredRun,
    RunKey,
    StepComponents,
    calibrate,
    cluster_fits,
    implausible,
    miss,
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


def test_no_run_on_this_gpu_keeps_the_uncalibrated_figure_and_names_the_gpus_the_runs_are_on() -> None:
    result = calibrate(_key(), _components(1), [_run(1, gpu="B200"), _run(2, gpu="A100"), _run(4, gpu="B200")])
    assert not result.applied
    assert result.reason == "no measured run on H100 in this cluster's history (its runs are on A100, B200)"
    assert result.step_time_s == pytest.approx(_components(1).total_s)


def test_a_fit_worse_on_held_out_runs_leaves_the_model_as_it_is_checked_on_them() -> None:
    """Runs that contradict each other (the same layout measured 2x apart, predicted right on average): a fit
    predicts them worse than the model, so the model stands with no correction, calibrated on them (a suite's
    predicted gates gate with it), its band its own miss on them."""
    c = _components(1)
    runs = [MeasuredRun("slow", _key(), c, 1.5 * c.total_s), MeasuredRun("fast", _key(), c, 0.75 * c.total_s),
            MeasuredRun("right", _key(), c, c.total_s)]
    result = calibrate(_key(), c, runs)
    assert result.applied and result.runs_used == ("slow", "fast", "right")
    assert "with no correction" in result.reason and "worse than the uncalibrated model" in result.reason
    assert result.step_time_s == result.uncalibrated_step_time_s
    assert result.band == pytest.approx(result.held_out.uncalibrated_p90) and result.band > 0.3


def _cpu_runs(per_microbatch_s: float, per_token_s: float) -> list[MeasuredRun]:
    """Runs of one model at MBS 1, 2, 4 and GBS 8 on 2 ranks (4, 2, 1 micro-batches): the model prices the tokens
    (the same compute at every MBS); the machine adds a per-micro-batch cost the model does not price."""
    runs = []
    for mbs in (1, 2, 4):
        key = _key(gpu="CPU", gpus=2, mbs=mbs, gbs=8)
        predicted = StepComponents(compute_s=0.1, bubble_s=0.0, scaleup_comm_s=0.0, scaleout_comm_s=0.0, fixed_s=0.0)
        measured = per_token_s + key.microbatches * per_microbatch_s
        runs.append(MeasuredRun(f"mbs{mbs}", key, predicted, measured))
    return runs


def test_micro_batches_per_step_follow_the_layout() -> None:
    assert _key(gpus=2, mbs=1, gbs=8).microbatches == 4
    assert _key(gpus=8, tp=2, pp=2, mbs=2, gbs=64).microbatches == 16  # DP 2
    assert _key(gpus=8, mbs=4, gbs=8).microbatches == 1  # never below one


def test_runs_at_two_micro_batch_sizes_separate_the_per_micro_batch_cost_from_compute() -> None:
    # 30 ms per micro-batch (the host's work, whatever the micro-batch's size) and 0.12 s of compute per step
    runs = _cpu_runs(per_microbatch_s=0.03, per_token_s=0.12)
    history, (target,) = runs[:2], runs[2:]
    result = calibrate(target.key, target.predicted, history)
    assert result.applied, result.reason
    assert result.corrections.microbatch_overhead_s > 0.015
    assert abs(result.step_time_s / target.measured_step_time_s - 1) < 0.1
    # a single factor (all of the step scaled alike) predicts the larger micro-batch as slow as the smaller ones
    baseline = single_factor(target.key, target.predicted, history)
    assert abs(baseline / target.measured_step_time_s - 1) > 0.3


def test_runs_at_one_micro_batch_count_find_the_overhead_whichever_way_they_split_it() -> None:
    # one micro-batch per step in every run: per step and per micro-batch are the same seconds, found together
    runs = [_run(tp) for tp in (1, 2, 4, 8)]
    result = calibrate(_key(tp=2), _components(2), [r for r in runs if r.key.tp != 2])
    assert 0.15 < result.corrections.added_s(1) < 0.6  # 0.3 s, shared with a compute factor the prior holds near 1


def test_a_calibration_no_better_than_the_runs_noise_keeps_the_model_as_it_is() -> None:
    # the model predicts these runs within 2-4 %: better after calibrating on the others, but by less than the
    # noise of 3 runs (5 % / sqrt 3)
    c = _components(1)
    runs = [MeasuredRun(f"r{i}", _key(gbs=gbs), c, c.total_s * ratio)
            for i, (gbs, ratio) in enumerate(((1, 0.97), (2, 0.96), (4, 0.98)))]
    result = calibrate(_key(gbs=8), c, runs)
    assert result.applied and "with no correction" in result.reason
    assert result.step_time_s == result.uncalibrated_step_time_s and sorted(result.runs_used) == ["r0", "r1", "r2"]
    assert result.band == pytest.approx(max(MIN_BAND, result.held_out.uncalibrated_p90))


def test_one_run_has_no_held_out_calibrated_error() -> None:
    """Nothing is held out of one run: its held-out calibrated error is unknown (NaN, null in JSON), not the plain
    model's error on it, which was given as if a fit had been checked and found no better; the band is still that
    error."""
    [run] = [_run(2)]
    result = calibrate(_key(tp=4), _components(4), [run])
    assert result.applied and "one run: no held-out check" in result.reason
    assert math.isnan(result.held_out.median) and math.isnan(result.held_out.p90)
    assert result.band == pytest.approx(miss(run.predicted.total_s, run.measured_step_time_s))
    [group] = cluster_fits([run])
    assert group.runs == 1 and math.isnan(group.held_out.median)
    assert group.held_out.uncalibrated_median == pytest.approx(result.band)
    assert all(math.isnan(value) for value in group.median_by_correction.values())


def test_a_calibrated_estimate_keeps_the_published_runs_caveat_beside_the_uncalibrated_figures_not_as_a_warning(
        tmp_path, monkeypatch) -> None:
    """A CPU's estimate warns that no published run checks it; calibrated on the cluster's runs, that caveat speaks
    of figures it no longer shows: it moves to `uncalibrated` and leaves the warnings (it printed twice)."""
    import json
    from dataclasses import replace

    from megapilot.catalog import host
    from megapilot.estimate import build_case, estimate
    from megapilot.estimate.history_calibration import calibrate_estimate

    monkeypatch.setenv(host.CACHE_ENV, str(tmp_path))
    host.cache_path().write_text(json.dumps({"matmul_tflops": 0.2, "matmul_tflops_one_thread": 0.1,
                                             "memory_tbps": 0.03, "ops_per_s": 2e5, "elements_per_s": 1e9,
                                             "runtime_gib": 0.4, "measured_at": 4e9}))
    case = build_case(model="tiny", gpu="cpu", gpus=2, seq_len=128, gbs=8, mbs=1)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.calibration in result.warnings  # uncalibrated: the caveat is a warning
    components = StepComponents.from_breakdown(result.time_breakdown_s, result.step_time_s, multi_node=False)
    key = RunKey(model="tiny", family="dense", precision="bf16", gpu=case.cluster.gpu.name, gpus=2, mbs=1, gbs=8,
                 seq_len=128)
    runs = [MeasuredRun(f"run-{mbs}", replace(key, mbs=mbs), components, 3 * components.total_s) for mbs in (1, 2)]
    calibrated, about = calibrate_estimate(case, result, runs, "local")
    assert about["applied"], about["reason"]
    assert about["uncalibrated"]["calibration"] == result.calibration
    assert result.calibration not in calibrated.warnings and calibrated.calibration.startswith(
        "calibration: figures calibrated on cluster local")


def test_two_healthy_runs_2x_apart_calibrate_a_model_that_under_predicts_both() -> None:
    # a busy host moves healthy CPU runs by 2x; the model misses both by 2.5-5x: the calibration between them is the
    # better predictor, though |predicted / measured - 1| (at most 100 % for a short prediction) would say otherwise
    key = _key(model="tiny", gpu="CPU", gpus=2)
    case = StepComponents(compute_s=0.3, bubble_s=0.0, scaleup_comm_s=0.05, scaleout_comm_s=0.0, fixed_s=0.05)
    result = calibrate(key, case, [MeasuredRun("quiet", key, case, 1.0), MeasuredRun("busy", key, case, 2.0)])
    assert result.applied, result.reason
    assert 1.0 <= result.step_time_s <= 2.0
    assert result.held_out.median < result.held_out.uncalibrated_median


def test_a_step_more_than_20x_from_its_prediction_is_implausible_either_way() -> None:
    """A step given in milliseconds (1000x) or of 1e-300 s was fitted: the band became +/-84,413 %, or every
    correction NaN. Within 20x (a CPU the model misses by 2x, a slow cluster) a run still calibrates."""
    assert implausible(2.0, 2.0) is None and implausible(2.0, 4.0) is None and implausible(2.0, 0.5) is None
    assert implausible(2.0, 39.9) is None and implausible(2.0, 0.101) is None
    assert implausible(2.0, 2000.0) is not None and "1e+03 times the 2 s predicted" in str(implausible(2.0, 2000.0))
    assert implausible(2.0, 1e-300) is not None and implausible(2.0, 1e308) is not None


def test_runs_the_model_predicts_exactly_give_a_band_of_one_steps_noise_not_zero() -> None:
    """One run predicted exactly gave a band of +/-0.0 % (an 80 % interval of one point, a budget's days with no
    spread); the next run's own step still falls about one step's noise from any prediction."""
    c = _components(1)
    one = calibrate(_key(), c, [MeasuredRun("exact", _key(), c, c.total_s)])
    assert one.applied and one.band == MIN_BAND and "at least 5.0 %" in one.reason
    agreeing = [MeasuredRun(f"r{gbs}", _key(gbs=gbs), c, c.total_s * 1.001) for gbs in (1, 2, 4)]
    assert calibrate(_key(gbs=8), c, agreeing).band == MIN_BAND


def test_a_calibration_worse_by_a_hair_says_by_how_much_not_0_0_against_0_0() -> None:
    """Two runs within 0.01 % of the model: a fit predicts them a hair worse, which read "worse than the uncalibrated
    model (median 0.0 % vs 0.0 %, p90 0.0 % vs 0.0 %)"."""
    c = _components(1)
    runs = [MeasuredRun("a", _key(), c, c.total_s * 0.99999), MeasuredRun("b", _key(), c, c.total_s * 1.00002)]
    result = calibrate(_key(), c, runs)
    assert result.applied and "worse than the uncalibrated model" in result.reason
    assert "0.0 % vs 0.0 %" not in result.reason


def test_runs_too_noisy_to_calibrate_still_widen_the_interval_to_the_models_miss_on_them() -> None:
    """Two runs 2x apart around the model: a fit on one predicts the other worse than the model, so the model's
    figures stand; but it misses them by up to 60 %, and the published runs' interval must not say +/-20 %."""
    from megapilot.estimate import build_case, estimate
    from megapilot.estimate.history_calibration import calibrate_estimate

    case = build_case(model="llama3-8b", gpu="h100", gpus=8, seq_len=8192, gbs=128, mbs=1)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.tokens_per_s_per_gpu_p10 is not None and result.tokens_per_s_per_gpu_p90 is not None
    components = StepComponents.from_breakdown(result.time_breakdown_s, result.step_time_s, multi_node=False)
    key = _key(model=case.model.name, gpus=8, mbs=1, gbs=128, seq_len=8192, gpu=case.cluster.gpu.name)
    runs = [MeasuredRun(name, key, components, ratio * components.total_s) for name, ratio in (("a", 0.8), ("b", 1.6))]
    same, about = calibrate_estimate(case, result, runs, "noisy")
    assert about["applied"] and "with no correction" in about["reason"], about["reason"]
    assert same.tokens_per_s_per_gpu == pytest.approx(result.tokens_per_s_per_gpu)  # the figures are the model's
    # the model misses the runs by 25 % and 60 %; their p90 (0.565) is the band
    assert same.tokens_per_s_per_gpu_p10 == pytest.approx(result.tokens_per_s_per_gpu / 1.565, rel=0.002)
    assert same.tokens_per_s_per_gpu_p10 < result.tokens_per_s_per_gpu_p10
    assert same.tokens_per_s_per_gpu_p90 >= result.tokens_per_s_per_gpu_p90
    assert same.interval_basis is not None and "calibrated on cluster noisy: 2 run(s)" in same.interval_basis


def test_runs_none_of_which_ran_the_cases_precision_class_double_its_band() -> None:
    """An NVFP4 case calibrated on a cluster's FP8 runs: the runs' held-out misses say nothing of what the 4-bit
    GEMMs and casts cost, which no published run checks either; its band had come out +/-5 % from FP8 runs alone."""
    runs = [_run(tp, precision="fp8") for tp in (1, 2, 4, 8)]
    own = calibrate(_key(tp=2, precision="fp8"), _components(2), [r for r in runs if r.key.tp != 2])
    other = calibrate(_key(tp=2, precision="fp4"), _components(2), [r for r in runs if r.key.tp != 2])
    assert own.band is not None and other.band is not None
    assert "none of them ran" not in own.reason
    assert "none of them ran fp4: band widened x2" in other.reason
    held = other.held_out  # the band of a corrected fit, or of the model left as it is, doubled
    assert any(other.band == pytest.approx(2 * max(MIN_BAND, p90)) for p90 in (held.p90, held.uncalibrated_p90))
    mixed = calibrate(_key(tp=2, precision="fp4"), _components(2),
                      [r for r in runs if r.key.tp != 2] + [_run(2, precision="fp4")])
    assert "none of them ran" not in mixed.reason  # one run of its own class and the band is the runs' again
