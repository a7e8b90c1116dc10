"""Regressions against the run history, and the one table of metric directions that compare shares.

A suite run's headline metrics (tokens/s/GPU, TFLOP/s/GPU, step time mean and p50, memory) are set
against the median of the last N passing runs of the same model, layout, GPU and cell. A move of more
than `threshold_pct` is reported with its sign as measured and whether it is worse for that metric
(step time up is worse, tokens/s down is worse), e.g. "tokens/s/GPU −8.3 % vs the median of the last 5
runs". The median, not the last run, so that one noisy run neither hides nor fakes a regression.

The band is `threshold_pct` or, when the history holds at least `NOISE_MIN_RUNS` runs, `NOISE_SIGMAS` times
those runs' own relative spread, whichever is wider: a shared or busy machine whose healthy runs swing 12 % must
not raise a "regression" at 6 %, while a quiet cluster keeps the tight fixed band. A metric that is a mean over the
run's steps (tokens/s, TFLOP/s, step time) is also held to the noise of its own steps (`step_noise_pct`): with one
or two runs in the history there is no spread to measure, but the run's own steps say how far its mean can move.
A median over the steps (step time p50) moves further than their mean by the same spread: its band is sqrt(pi / 2)
times as wide (`MEDIAN_SE_FACTOR`).
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Literal

from megapilot.suite.metric_table import HEADLINE_METRICS, METRICS, Direction, MetricInfo, metric_info

if TYPE_CHECKING:
    from megapilot.store.history import BaselineStats, History
    from megapilot.suite.gates import BaselineLookup
    from megapilot.suite.results import ComboResult, Regression, RunCard, SuiteResult

# The metric table and the judging of a change are read by every history command (`history compare`); the suite's
# results and gates (0.4 CPU-s to import: the findings, the layout types, the estimator) only by a suite run's
# regression check and baseline gates, which import them themselves.

NOISE_SIGMAS = 3.0  # a healthy run lands beyond 3 sigma of its own history about 0.3 % of the time
NOISE_MIN_RUNS = 3  # below three runs a spread says nothing
_MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a normal distribution is 0.6745 sigma
# the standard error of the median of n normal draws over that of their mean, for large n: sqrt(pi / 2) = 1.2533
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)
# B against A: no move at all, a move inside the metric's regression band (noise), or a real move either way.
Change = Literal["better", "worse", "within band", "unchanged", "unknown"]


def change_pct(value: float, reference: float) -> float | None:
    """(value - reference) / reference x 100; None when the reference is zero."""
    if reference == 0:
        return None
    return (value - reference) / abs(reference) * 100.0


def judge(name: str, delta_pct: float | None) -> Change:
    """Whether a change of delta_pct in this metric is unchanged, within its band, better or worse (by its
    direction); unknown without a direction or a percentage."""
    if delta_pct == 0:
        return "unchanged"
    info = metric_info(name)
    direction = info.direction
    if delta_pct is None or direction is None:
        return "unknown"
    if abs(delta_pct) <= info.band_pct:
        return "within band"
    went_up = delta_pct > 0
    return "better" if went_up == (direction == "higher") else "worse"


def combo_layout(combo: ComboResult) -> str:
    """A cell's parallel layout as history keys it: 'TP=1,PP=1,CP=1,EP=1,DP=8' (',VPP=n' when interleaved)."""
    held = combo.layout
    model_parallel = held.tp * held.pp * held.cp
    dp = max(combo.nodes * combo.gpus_per_node // model_parallel, 1)
    layout = f"TP={held.tp},PP={held.pp},CP={held.cp},EP={held.ep},DP={dp}"
    return f"{layout},VPP={held.vpp}" if held.vpp else layout


def find_regressions(result: SuiteResult, history: History, *, last_n: int = 5,
                     threshold_pct: float | None = None) -> list[Regression]:
    """Headline metrics of every combo that moved beyond their band from their history median (each metric's
    `band_pct` of the metric table, or `threshold_pct` for all).

    Both directions are returned (`worse` tells them apart), regressions first. The run itself is
    left out of its own baseline, so this can be called before or after `history.record(result)`.
    """
    # start-up: the suite's cell keys load the spec (see the imports above)
    from megapilot.suite.cells import SMOKE_CELL_KEY

    # The smoke run's few steps are recorded to calibrate the sweep's predictions, not to be compared: run to run
    # they move by more than any band a benchmark would be held to.
    found = [regression for combo in result.combos if combo.key != SMOKE_CELL_KEY
             for regression in _combo_regressions(result, combo, history, last_n=last_n, threshold_pct=threshold_pct)]
    return sorted(found, key=lambda r: (not r.worse, -abs(r.change_pct)))


def _combo_regressions(result: SuiteResult, combo: ComboResult, history: History, *, last_n: int,
                       threshold_pct: float | None) -> list[Regression]:
    # start-up: the suite's results, only where a regression is built (see the imports above)
    from megapilot.suite.results import Regression

    regressions = []
    own_noise = step_noise_pct(combo)  # the combo's, shared by every metric paced by its steps
    for row in combo.metrics:
        if row.name not in HEADLINE_METRICS or row.value is None:
            continue
        fixed_pct = METRICS[row.name].band_pct if threshold_pct is None else threshold_pct
        stats = history.baseline(row.name, model=result.card.model, layout=combo_layout(combo), gpu=result.card.gpu,
                                 combo_key=combo.key, last_n=last_n, exclude_run=result.run_id)
        if stats is None:
            continue
        delta = change_pct(row.value, stats.median)
        history_band = regression_band_pct(stats, fixed_pct)
        own_band = steps_band_pct(METRICS[row.name], own_noise)
        band = max(history_band, own_band)
        if delta is None or abs(delta) <= band:
            continue
        message = regression_message(row.name, delta, stats.count)
        if band == own_band and band > fixed_pct:
            message += f" (beyond the \u00b1{band:.1f} % its own steps' spread allows)"
        elif band > fixed_pct:
            message += f" (beyond their own \u00b1{band:.1f} % spread)"
        regressions.append(Regression(
            combo=combo.key, metric=row.name, value=row.value, baseline_median=stats.median, change_pct=delta,
            runs_compared=stats.count, worse=judge(row.name, delta) == "worse", message=message))
    return regressions


def step_noise_pct(combo: ComboResult) -> float:
    """How far a mean over this run's steps may move by the steps' own spread alone, in %: NOISE_SIGMAS standard
    errors of the difference of two such means (this run's and its baseline's, taken alike), CV x sqrt(2 / n) over
    its n steady step records. A busy or small machine (a 2-core CPU run's steps spread 15 %) moves 8 % from one run
    to the next with nothing changed; a GPU run's steps (CV 1 %, hundreds of them) leave the fixed band in charge. 0
    when the run measured no spread."""
    values = {row.name: row.value for row in combo.metrics}
    # n is the records the CV and the means are taken over (after the warm-up; each record a log interval's average),
    # not the iterations reached: those overstate n by the warm-up, and by the log interval (results before the
    # records were counted fall back to them)
    cv = values.get("training.step_time_cv")
    steps = values.get("training.step_records") or values.get("training.iterations_reached")
    if cv is None or not steps or steps < 2:
        return 0.0
    return NOISE_SIGMAS * cv * math.sqrt(2.0 / steps) * 100.0


def steps_band_pct(info: MetricInfo, noise_pct: float) -> float:
    """The band a metric's own steps allow, in %, from the run's `step_noise_pct` (which is a mean's): that for a
    mean over the steps, MEDIAN_SE_FACTOR times it for a median over them, 0 for a metric not paced by the steps."""
    if not info.paced_by_steps:
        return 0.0
    return noise_pct * MEDIAN_SE_FACTOR if info.median_of_steps else noise_pct


def regression_band_pct(stats: BaselineStats, threshold_pct: float) -> float:
    """How far from the median a value may move before it is reported: the fixed threshold, widened to
    NOISE_SIGMAS robust standard deviations (1.4826 x the median absolute deviation) of the compared runs when
    there are enough of them. Robust, so that one bad run in the history does not widen the band for all."""
    if stats.count < NOISE_MIN_RUNS or stats.median == 0:
        return threshold_pct
    mad = statistics.median(abs(value - stats.median) for value in stats.values)
    robust_sigma = _MAD_TO_SIGMA * mad
    return max(threshold_pct, NOISE_SIGMAS * robust_sigma / abs(stats.median) * 100.0)


class HistoryBaselines:
    """The suite's `BaselineSource` (megapilot.suite.baseline) on the run history: `baseline` gates ask it."""

    def __init__(self, history: History):
        self._history = history

    def lookup_for(self, card: RunCard, combo: ComboResult, *, run_id: str, last_n: int) -> BaselineLookup:
        """A lookup for one combo: metric name -> median of its last passing runs (None without history)."""
        # start-up: the suite's gates, only where a baseline gate asks (see the imports above)
        from megapilot.suite.gates import BaselineStats as GateBaseline

        layout = combo_layout(combo)

        def lookup(metric: str) -> GateBaseline | None:
            stats = self._history.baseline(metric, model=card.model, layout=layout, gpu=card.gpu, combo_key=combo.key,
                                           last_n=last_n, exclude_run=run_id)
            return None if stats is None else GateBaseline(median=stats.median, runs=stats.count)

        return lookup


def regression_message(name: str, delta_pct: float, runs: int) -> str:
    """'tokens/s/GPU −8.3 % vs the median of the last 5 runs' (a true minus sign; 'the last run' for one)."""
    sign = "+" if delta_pct > 0 else "\u2212"
    against = "the last run" if runs == 1 else f"the median of the last {runs} runs"
    return f"{metric_info(name).label} {sign}{abs(delta_pct):.1f} % vs {against}"


__all__ = [
    "HEADLINE_METRICS",
    "METRICS",
    "Change",
    "Direction",
    "HistoryBaselines",
    "MetricInfo",
    "change_pct",
    "combo_layout",
    "find_regressions",
    "judge",
    "metric_info",
    "regression_band_pct",
    "regression_message",
    "step_noise_pct",
    "steps_band_pct",
]
