"""Regressions against the run history: direction-aware, over the median of the last passing runs, with the
message the report shows; the metric-direction table that compare shares; the suite's baseline source."""

from __future__ import annotations

import pytest

from megapilot.store.history import open_history
from megapilot.store.regress import (
    HEADLINE_METRICS,
    METRICS,
    HistoryBaselines,
    combo_layout,
    find_regressions,
    judge,
    regression_message,
)
from megapilot.suite.results import MetricRow, Verdict
from tests.store.test_history import CELL, STEP, TFLOPS, TOKENS, make_combo, make_suite_result


@pytest.fixture
def history(tmp_path):
    with open_history(str(tmp_path / "history.sqlite")) as opened:
        yield opened


def record_runs(history, *readings: tuple[float, float]) -> None:
    """One passing run per (tokens/s/GPU, step ms), an hour apart."""
    for hour, (tokens, step_ms) in enumerate(readings):
        history.record(make_suite_result(f"run-{hour}", hour=hour, combos=[make_combo(tokens=tokens, step_ms=step_ms)]))


def test_third_run_slower_is_flagged_with_its_sign_and_message(history):
    record_runs(history, (1000.0, 800.0), (1000.0, 800.0))
    slower = make_suite_result("run-2", hour=2, combos=[make_combo(tokens=917.0, step_ms=872.0)])
    regressions = find_regressions(slower, history)
    by_metric = {r.metric: r for r in regressions}
    assert set(by_metric) == {TOKENS, STEP}  # TFLOP/s did not move
    tokens = by_metric[TOKENS]
    assert tokens.worse and tokens.change_pct == pytest.approx(-8.3) and tokens.runs_compared == 2
    assert (tokens.combo, tokens.value, tokens.baseline_median) == (CELL, 917.0, 1000.0)
    assert tokens.message == "tokens/s/GPU \u22128.3 % vs the median of the last 2 runs"
    step = by_metric[STEP]
    assert step.worse and step.change_pct == pytest.approx(9.0)
    assert step.message == "step time (mean) +9.0 % vs the median of the last 2 runs"


def test_a_faster_run_is_reported_as_not_worse_after_the_regressions(history):
    record_runs(history, (1000.0, 800.0), (1000.0, 800.0), (1000.0, 800.0))
    mixed = make_suite_result("now", hour=5, combos=[make_combo(tokens=1100.0, step_ms=880.0)])
    first, second = find_regressions(mixed, history)
    assert (first.metric, first.worse) == (STEP, True)  # slower steps: a regression, listed first
    assert (second.metric, second.worse) == (TOKENS, False)  # more tokens/s: better
    assert second.change_pct == pytest.approx(10.0) and "+10.0 %" in second.message


def test_moves_within_the_threshold_are_not_reported(history):
    record_runs(history, (1000.0, 800.0))
    steady = make_suite_result("now", hour=5, combos=[make_combo(tokens=960.0, step_ms=830.0)])
    assert find_regressions(steady, history, threshold_pct=5.0) == []
    assert {r.metric for r in find_regressions(steady, history, threshold_pct=3.0)} == {TOKENS, STEP}


def test_the_median_ignores_one_outlier_and_failed_runs(history):
    record_runs(history, (1000.0, 800.0), (400.0, 2000.0), (1000.0, 800.0))  # one bad run among good ones
    history.record(make_suite_result("failed", hour=4, verdict=Verdict.FAIL, combos=[make_combo(tokens=10.0)]))
    current = make_suite_result("now", hour=5, combos=[make_combo(tokens=1000.0, step_ms=800.0)])
    assert find_regressions(current, history) == []


def test_only_the_last_n_runs_make_the_median(history):
    record_runs(history, (2000.0, 400.0), (2000.0, 400.0), (2000.0, 400.0), (1000.0, 800.0), (1000.0, 800.0))
    current = make_suite_result("now", hour=9, combos=[make_combo(tokens=1000.0, step_ms=800.0)])
    assert find_regressions(current, history, last_n=2) == []
    worse = {r.metric: r for r in find_regressions(current, history, last_n=5) if r.worse}
    assert set(worse) == {TOKENS, STEP}
    assert (worse[TOKENS].runs_compared, worse[TOKENS].baseline_median) == (5, 2000.0)
    assert worse[STEP].baseline_median == 400.0


def test_no_history_means_no_regressions_and_the_run_is_not_its_own_baseline(history):
    current = make_suite_result("now", combos=[make_combo(tokens=1.0)])
    assert find_regressions(current, history) == []
    history.record(current)  # recorded before the check: still no earlier run to compare with
    assert find_regressions(current, history) == []


def test_only_headline_metrics_are_watched(history):
    def with_loss(run_id: str, hour: int, loss: float):
        combo = make_combo()
        combo.metrics.append(MetricRow(name="training.lm_loss", value=loss, verdict=Verdict.RECORD))
        return make_suite_result(run_id, hour=hour, combos=[combo])

    history.record(with_loss("a", 0, 2.0))
    assert find_regressions(with_loss("b", 1, 9.0), history) == []


def test_other_layouts_gpus_and_models_are_separate_histories(history):
    history.record(make_suite_result("tp2", combos=[make_combo(tokens=2000.0, tp=2)]))
    history.record(make_suite_result("h100", gpu="H100", combos=[make_combo(tokens=2000.0)]))
    history.record(make_suite_result("70b", model="llama3.1-70b", combos=[make_combo(tokens=2000.0)]))
    assert find_regressions(make_suite_result("now", hour=1), history) == []


def test_direction_table_judges_changes_for_compare_and_regress():
    assert judge(STEP, 6.0) == "worse" and judge(STEP, -6.0) == "better"
    assert judge(TOKENS, -6.0) == "worse" and judge(TFLOPS, 6.0) == "better"
    assert judge("training.max_allocated_gib", 6.0) == "worse"
    # inside a metric's regression band (5 %) a move is noise, neither better nor worse
    assert judge("training.max_allocated_gib", -0.2) == "within band" and judge(TOKENS, 5.0) == "within band"
    assert judge(TOKENS, 0.0) == "unchanged"
    assert judge("training.grad_norm", 50.0) == "unknown"  # no direction: neither better nor worse
    assert judge(TOKENS, None) == "unknown"
    assert all(METRICS[name].direction for name in HEADLINE_METRICS)


def test_message_for_a_single_earlier_run():
    assert regression_message(TOKENS, -12.34, 1) == "tokens/s/GPU \u221212.3 % vs the last run"


def test_combo_layout_derives_data_parallel_size():
    assert combo_layout(make_combo(nodes=2, gpus_per_node=8, tp=4, pp=2)) == "TP=4,PP=2,CP=1,EP=1,DP=2"
    assert combo_layout(make_combo(tp=2, vpp=4, ep=8)) == "TP=2,PP=1,CP=1,EP=8,DP=4,VPP=4"


def test_history_baselines_serve_the_suites_baseline_gates(history):
    record_runs(history, (1000.0, 800.0), (1200.0, 700.0), (1100.0, 750.0))
    current = make_suite_result("now", hour=9)
    lookup = HistoryBaselines(history).lookup_for(current.card, current.combos[0], run_id="now", last_n=5)
    stats = lookup(TOKENS)
    assert stats is not None and (stats.median, stats.runs) == (1100.0, 3)
    assert lookup("training.not_measured") is None


def test_a_noisy_history_widens_the_band_to_its_own_spread(history):
    # healthy runs on a busy machine swinging about 10 %: a 12 % move is within their own noise, a 40 % one is not
    record_runs(history, (1000.0, 800.0), (900.0, 880.0), (1100.0, 720.0), (1000.0, 800.0), (950.0, 840.0))
    within_noise = make_suite_result("now", hour=9, combos=[make_combo(tokens=880.0, step_ms=800.0)])
    assert [r.metric for r in find_regressions(within_noise, history)] == []
    slowed = make_suite_result("slow", hour=9, combos=[make_combo(tokens=600.0, step_ms=800.0)])
    (tokens,) = find_regressions(slowed, history)
    assert tokens.worse and "spread" in tokens.message


def test_the_band_is_the_fixed_threshold_for_a_quiet_history_or_too_few_runs():
    from megapilot.store.history import BaselineStats
    from megapilot.store.regress import regression_band_pct

    def stats(*values: float) -> BaselineStats:
        ordered = sorted(values)
        return BaselineStats(metric=TOKENS, median=ordered[len(ordered) // 2], count=len(values),
                             mean=sum(values) / len(values), stdev=None, values=list(values),
                             run_ids=[str(i) for i, _ in enumerate(values)])

    assert regression_band_pct(stats(1000.0, 1001.0, 999.0), 5.0) == 5.0  # quiet: 3 sigma is far under 5 %
    assert regression_band_pct(stats(1000.0, 1200.0), 5.0) == 5.0  # two runs: no spread is trusted
    assert regression_band_pct(stats(1000.0, 400.0, 1000.0), 5.0) == 5.0  # one bad run does not widen it
    assert regression_band_pct(stats(1000.0, 900.0, 1100.0), 5.0) == pytest.approx(3 * 1.4826 * 10.0)


def _with_step_spread(combo, cv: float, steps: float):
    """The combo with the step-time spread and step count a suite run measures beside its means."""
    extra = [MetricRow(name="training.step_time_cv", value=cv, unit="", verdict=Verdict.RECORD),
             MetricRow(name="training.iterations_reached", value=steps, unit="iterations", verdict=Verdict.PASS)]
    return combo.model_copy(update={"metrics": [*combo.metrics, *extra]})


def test_a_run_whose_own_steps_spread_widely_is_held_to_that_noise_not_the_fixed_band(history):
    """The demo's second run on a 2-core machine: 20 steps with a CV of 0.16, 8.5 % slower than the first with
    nothing changed, was a WARN. Its mean carries 3 x 0.16 x sqrt(2 / 20) = 15.2 % of its own noise; a GPU run's
    (CV 0.01 over 100 steps: 0.4 %) leaves the fixed 5 % band in charge."""
    from megapilot.store.regress import step_noise_pct

    record_runs(history, (1000.0, 800.0))
    noisy = _with_step_spread(make_combo(tokens=915.0, step_ms=874.0), cv=0.16, steps=20)
    assert step_noise_pct(noisy) == pytest.approx(3 * 0.16 * (2 / 20) ** 0.5 * 100)
    assert find_regressions(make_suite_result("now", hour=5, combos=[noisy]), history) == []
    worse = _with_step_spread(make_combo(tokens=800.0, step_ms=1000.0), cv=0.16, steps=20)
    [step, tokens] = find_regressions(make_suite_result("now", hour=5, combos=[worse]), history)
    assert {step.metric, tokens.metric} == {STEP, TOKENS} and step.worse and tokens.worse
    assert tokens.message.endswith("(beyond the \u00b115.2 % its own steps' spread allows)")
    quiet = _with_step_spread(make_combo(tokens=915.0, step_ms=874.0), cv=0.01, steps=100)
    assert step_noise_pct(quiet) < 1.0
    assert {r.metric for r in find_regressions(make_suite_result("now", hour=5, combos=[quiet]), history)} == {
        STEP, TOKENS}


def test_a_median_over_the_steps_is_held_to_the_wider_noise_a_median_carries(history):
    """The demo's second run on a 2-core machine, nothing changed: its step time p50 +10.6 % against a 10.2 % band
    (3 x CV x sqrt(2 / n), a mean's) was a WARN. A median of near-normal steps carries sqrt(pi / 2) = 1.2533 times
    the mean's standard error, so its band is 12.8 %; the mean, moving as far, is still beyond its own 10.2 %."""
    from megapilot.store.regress import MEDIAN_SE_FACTOR, step_noise_pct

    p50 = "training.step_time_p50_ms"

    def with_p50(combo, p50_ms: float):
        row = MetricRow(name=p50, value=p50_ms, unit="ms", verdict=Verdict.PASS)
        return combo.model_copy(update={"metrics": [*combo.metrics, row]})

    history.record(make_suite_result("run-0", hour=0, combos=[with_p50(make_combo(step_ms=800.0), 800.0)]))
    second = _with_step_spread(with_p50(make_combo(step_ms=884.8), 884.8), cv=0.1075, steps=20)
    assert step_noise_pct(second) == pytest.approx(10.2, abs=0.05)
    assert round(MEDIAN_SE_FACTOR, 4) == 1.2533
    [mean] = find_regressions(make_suite_result("now", hour=5, combos=[second]), history)
    assert (mean.metric, mean.change_pct) == (STEP, pytest.approx(10.6))
    assert mean.message.endswith("(beyond the \u00b110.2 % its own steps' spread allows)")
    slower = _with_step_spread(with_p50(make_combo(step_ms=800.0), 920.0), cv=0.1075, steps=20)
    [median] = find_regressions(make_suite_result("now", hour=5, combos=[slower]), history)
    assert median.metric == p50 and median.message.endswith("(beyond the \u00b112.8 % its own steps' spread allows)")



def test_the_smoke_runs_few_steps_are_never_compared(history):
    for hour in range(2):
        history.record(make_suite_result(f"run-{hour}", hour=hour, combos=[
            make_combo(tokens=1000.0, step_ms=800.0), make_combo("smoke", tokens=1000.0, step_ms=800.0)]))
    now = make_suite_result("now", hour=5, combos=[make_combo(tokens=1000.0, step_ms=800.0),
                                                    make_combo("smoke", tokens=600.0, step_ms=1300.0)])
    assert find_regressions(now, history) == []


def test_the_noise_counts_the_steady_records_the_spread_is_taken_over_not_the_iterations_reached():
    # 20 iterations logged every 4: 5 records, the first dropped as warm-up; the CV is over the 4 left, each a
    # 4-step average, and their mean's noise is CV x sqrt(2 / 4), twice a count of 20 steps would say
    from megapilot.store.regress import step_noise_pct

    logged = _with_step_spread(make_combo(tokens=915.0, step_ms=874.0), cv=0.05, steps=20)
    records = MetricRow(name="training.step_records", value=4.0, unit="records", verdict=Verdict.RECORD)
    with_records = logged.model_copy(update={"metrics": [*logged.metrics, records]})
    assert step_noise_pct(with_records) == pytest.approx(3 * 0.05 * (2 / 4) ** 0.5 * 100)
    assert step_noise_pct(logged) == pytest.approx(3 * 0.05 * (2 / 20) ** 0.5 * 100)  # an older result: no count
