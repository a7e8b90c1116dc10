"""`sweep.repeats`: one verdict from N runs of a combo, read on its median run, with the spread and a CV gate."""

from __future__ import annotations

import statistics

from megapilot.suite.repeats import combine_repeats, cv_pct, median_run, repeat_directory
from megapilot.suite.results import ComboResult, JobSummary, MetricRow, Verdict


def _run(index: int, step_ms: float | None, *, state: str = "COMPLETED", tokens: float = 100.0) -> ComboResult:
    rows = [MetricRow(name="training.tokens_per_gpu", value=tokens, unit="tokens/s", threshold=">= 50",
                      verdict=Verdict.PASS)]
    if step_ms is not None:
        rows.append(MetricRow(name="training.step_time_p50_ms", value=step_ms, unit="ms", verdict=Verdict.RECORD))
    completed = state == "COMPLETED"
    return ComboResult(key="MBS=1", directory=repeat_directory("MBS1", index), backend="megapilot",
                       verdict=Verdict.PASS if completed else Verdict.FAIL, metrics=rows if completed else [],
                       reason="" if completed else "rank 0 exited with 1", duration_s=10.0,
                       job=JobSummary(executor="local", job_id=str(index), state=state, duration_s=10.0))


def _rows(combo: ComboResult) -> dict[str, MetricRow]:
    return {r.name: r for r in combo.metrics}


def test_the_verdict_reads_the_median_run_and_the_rows_show_the_spread():
    runs = [_run(0, 110.0, tokens=91.0), _run(1, 100.0, tokens=100.0), _run(2, 104.0, tokens=96.0)]
    assert median_run(runs) is runs[2] and repeat_directory("MBS1", 2) == "MBS1-repeat3"
    combo = combine_repeats(runs, max_cv_pct=5.0, cpu=False)
    rows = _rows(combo)
    assert combo.directory == "MBS1-repeat3" and combo.verdict is Verdict.PASS and combo.duration_s == 30.0
    assert rows["training.step_time_p50_ms"].value == 104.0  # the median run's own rows
    spread = rows["repeat.training.step_time_p50_ms"]
    assert spread.value == round(statistics.fmean([110.0, 100.0, 104.0]), 4) and "100..110" in spread.reason
    cv = statistics.pstdev([110.0, 100.0, 104.0]) / statistics.fmean([110.0, 100.0, 104.0]) * 100
    assert rows["repeat.cv"].value == round(cv, 3) and rows["repeat.cv"].verdict is Verdict.PASS
    assert rows["repeat.completed"].verdict is Verdict.PASS and rows["repeat.completed"].value == 3


def test_a_spread_above_the_gate_fails_the_combo_on_a_gpu_run_and_is_recorded_on_cpu():
    runs = [_run(0, 100.0), _run(1, 130.0), _run(2, 101.0)]
    combo = combine_repeats(runs, max_cv_pct=5.0, cpu=False)
    assert combo.verdict is Verdict.FAIL and "repeat.cv" in combo.reason and _rows(combo)["repeat.cv"].value > 5
    on_cpu = _rows(combine_repeats(runs, max_cv_pct=5.0, cpu=True))["repeat.cv"]
    assert on_cpu.verdict is Verdict.RECORD and on_cpu.reason.startswith("CPU run: recorded, not gated (would FAIL)")


def test_a_failed_repeat_loses_nothing_of_the_others():
    runs = [_run(0, 100.0), _run(1, None, state="FAILED"), _run(2, 102.0)]
    combo = combine_repeats(runs, max_cv_pct=5.0, cpu=False)
    rows = _rows(combo)
    assert rows["repeat.completed"].verdict is Verdict.FAIL and rows["repeat.completed"].value == 2
    assert "repeat 2 FAILED: rank 0 exited with 1" in rows["repeat.completed"].reason
    assert "mean of 2 of 3 repeats" in rows["repeat.training.step_time_p50_ms"].reason
    assert combo.verdict is Verdict.FAIL and rows["training.tokens_per_gpu"].verdict is Verdict.PASS


def test_no_spread_from_one_timed_run():
    assert cv_pct([100.0]) is None
    combo = combine_repeats([_run(0, 100.0), _run(1, None, state="HUNG")], max_cv_pct=5.0, cpu=False)
    assert _rows(combo)["repeat.cv"].verdict is Verdict.SKIPPED
