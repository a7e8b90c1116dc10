"""The one metric table: every metric's name, label, unit, which way is better and its regression band.

The gates (units, the log line a missing metric comes from), the run history (directions, headline metrics,
regression bands, the predicted quantity a metric is measured against), the run deck and the report (labels)
all read this table. A metric the suite measures has `expected_line`; the others are the names other dialects
and older suites use for the same quantities, known to history only, except those with `same_as`: another name of a
measured metric (CVS's `training.time_to_target_seconds`), whose gate is that metric's gate (`measured_name`).

One rule about zeros lives here too: a row with `zero_unmeasured` is printed rounded (Megatron prints TFLOP/s/GPU
with one decimal, so a CPU run's 0.03 reads 0.0), or computed from such a print (the MFU), and a zero of it is below
the print's resolution, not a measurement. The suite leaves it unmeasured when it reads the log (and its gate
SKIPPED), the history reads a stored zero as missing (`measured_value`): both ask this table. And a row with
`gpu_only` cannot exist on a CPU run (the MFU needs a GPU peak): missing there through no fault of the run's, its gate
is SKIPPED with that reason, and `suite check` says so of a CPU suite before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower"]
DEFAULT_BAND_PCT = 5.0  # a move within 5 % of the history median is noise on a quiet cluster


@dataclass(frozen=True)
class MetricInfo:
    """One metric: what a person calls it, its unit, which way is better, how far it may move unnoticed."""

    name: str
    label: str
    unit: str
    direction: Direction | None  # None: a change is neither better nor worse
    band_pct: float = DEFAULT_BAND_PCT  # regression band against the history median, in %
    headline: bool = False  # watched for regressions against the history
    quantity: str | None = None  # the prediction it is measured against, for calibration
    expected_line: str | None = None  # the log line the suite measures it from (None: not measured by the suite)
    # a zero is below the resolution of the print it comes from (or is computed from): missing, not measured
    zero_unmeasured: bool = False
    gpu_only: str | None = None  # why a CPU run cannot have it (None: measured on any device)
    # a mean over the run's steps: the steps' own spread over their count is noise it carries (store.regress)
    paced_by_steps: bool = False
    # of those, a median over the steps, not a mean: its standard error is sqrt(pi / 2) times the mean's for
    # near-normal steps, so the noise it carries is that much wider (store.regress)
    median_of_steps: bool = False
    # the range no measurement leaves (None: unbounded that way): a gate past it settles every verdict before a run
    # (megapilot.suite.thresholds); rates, times, counts, memory and losses are never below 0
    floor: float | None = 0.0
    # never at its floor either (a step takes time): a ceiling at the floor fails every run, as one below it does
    above_floor: bool = False
    ceiling: float | None = None
    # a rate of the GPU's own FLOPs: never above its dense peak at the cell's precision, the ceiling `suite check`
    # holds a gate to where it knows the suite's GPU (megapilot.suite.thresholds.Peak)
    peak_bound: bool = False
    # another name of this measured metric: a threshold file's gate on it reads and gates that one (`measured_name`)
    same_as: str | None = None


_STEP_TIME_LINE = "iteration lines with `elapsed time per iteration (ms): X`"
_LOSS_LINE = "iteration lines with `lm loss: X`"

_TABLE = (
    # measured by the suite (megapilot.suite.metrics), in the order its rows are shown
    MetricInfo("training.throughput_per_gpu", "TFLOP/s/GPU", "TFLOP/s/GPU", "higher", headline=True,
               paced_by_steps=True, quantity="tflops_per_gpu", zero_unmeasured=True, peak_bound=True,
               expected_line="iteration lines with `throughput per GPU (TFLOP/s/GPU): X` "
                             "(Megatron's --log-throughput)"),
    MetricInfo("training.tokens_per_gpu", "tokens/s/GPU", "tok/s/GPU", "higher", headline=True, paced_by_steps=True,
               quantity="tokens_per_s_per_gpu",
               expected_line="iteration lines with `tokens/s/GPU`, or a step time plus GBS and sequence length "
                             "(arguments block or the combo's settings)"),
    MetricInfo("training.elapsed_time_per_iteration", "step time (mean)", "ms", "lower", headline=True,
               paced_by_steps=True, quantity="step_time_ms", above_floor=True, expected_line=_STEP_TIME_LINE),
    MetricInfo("training.step_time_p50_ms", "step time p50", "ms", "lower", headline=True, paced_by_steps=True,
               median_of_steps=True, quantity="step_time_ms", above_floor=True,
               expected_line=_STEP_TIME_LINE),
    MetricInfo("training.step_time_p95_ms", "step time p95", "ms", "lower", above_floor=True,
               expected_line=_STEP_TIME_LINE),
    MetricInfo("training.step_time_cv", "step time CV", "", "lower", expected_line=_STEP_TIME_LINE),
    # the steady-state records (iteration lines after the warm-up) the step figures above are taken over: how much
    # their mean and median may move by the steps' own spread (store.regress)
    MetricInfo("training.step_records", "steady step records", "records", None, expected_line=_STEP_TIME_LINE),
    MetricInfo("training.mem_usage", "memory (fraction)", "fraction", "lower", headline=True, ceiling=1.0,
               gpu_only="a CPU run has no GPU memory to take a fraction of (its memory report is the process RSS)",
               expected_line="iteration lines with `mem usages: X` (or Primus `hip mem usage/...`), or a "
                             "`[Rank r] (after N iterations) memory (MB)` report on a known GPU"),
    MetricInfo("training.max_allocated_gib", "memory (max allocated GiB)", "GiB", "lower", headline=True,
               quantity="memory_gib", expected_line="a `[Rank r] (after N iterations) memory (MB) | max allocated: X` "
                                                    "report"),
    MetricInfo("training.mfu_pct", "MFU %", "%", "higher", quantity="mfu_pct", zero_unmeasured=True, ceiling=100.0,
               gpu_only="a CPU run has no GPU peak to compute MFU from",
               expected_line="a step time on a known GPU (`--gpu`), with TFLOP/s or the model's FLOPs/token"),
    MetricInfo("training.lm_loss", "LM loss", "", "lower", expected_line=_LOSS_LINE),
    MetricInfo("training.lm_loss_first", "first LM loss", "", None, expected_line=_LOSS_LINE),
    MetricInfo("training.grad_norm", "grad norm", "", None, expected_line="iteration lines with `grad norm: X`"),
    MetricInfo("training.nan_iterations", "NaN iterations", "iterations", "lower",
               expected_line="iteration lines with `number of nan iterations: N`"),
    MetricInfo("training.skipped_iterations", "skipped iterations", "iterations", "lower",
               expected_line="iteration lines with `number of skipped iterations: N`"),
    MetricInfo("training.iterations_reached", "iterations reached", "iterations", "higher",
               expected_line="an `iteration N/M |` line"),
    MetricInfo("training.scaling_efficiency_pct", "scaling efficiency %", "%", "higher",
               expected_line="tokens/s/GPU and a scaling baseline (tokens_per_sec_total > 0)"),
    MetricInfo("training.loss_slope", "loss slope", "loss/iteration", "lower", floor=None,
               expected_line="at least 2 sampled `lm loss` points after the warm-up"),
    MetricInfo("training.steps_to_target", "steps to target", "iterations", "lower",
               expected_line="a loss at or below the convergence target"),
    MetricInfo("training.time_to_target_s", "time to target", "s", "lower",
               expected_line="a loss at or below the convergence target, with step times"),
    MetricInfo("training.final_loss_vs_target", "final loss - target", "loss", "lower", floor=None,
               expected_line="a final loss and a convergence target (> 0)"),
    # the names other dialects give a measured metric: a gate on one is that metric's gate (CVS's Megatron code
    # computes the time to target as `time_to_target_seconds`)
    MetricInfo("training.time_to_target_seconds", "time to target", "s", "lower",
               same_as="training.time_to_target_s"),
    # the same quantities under the names other dialects and older suites use (history only)
    MetricInfo("training.tokens_per_s_per_gpu", "tokens/s/GPU", "tok/s/GPU", "higher", headline=True,
               quantity="tokens_per_s_per_gpu"),
    MetricInfo("training.tflops_per_gpu", "TFLOP/s/GPU", "TFLOP/s/GPU", "higher", headline=True,
               quantity="tflops_per_gpu", zero_unmeasured=True),
    MetricInfo("training.step_time_ms", "step time (mean)", "ms", "lower", headline=True, quantity="step_time_ms",
               above_floor=True),
    MetricInfo("training.memory_gib", "memory GiB", "GiB", "lower", headline=True, quantity="memory_gib"),
    MetricInfo("training.peak_memory_gib", "memory GiB", "GiB", "lower", headline=True, quantity="memory_gib"),
    MetricInfo("training.hip_mem_usage_ratio", "HIP memory ratio", "fraction", "lower"),
    MetricInfo("training.rocm_mem_usage_ratio", "ROCm memory ratio", "fraction", "lower"),
)
METRICS: dict[str, MetricInfo] = {info.name: info for info in _TABLE}
MEASURED_METRICS: tuple[str, ...] = tuple(info.name for info in _TABLE if info.expected_line is not None)
HEADLINE_METRICS: tuple[str, ...] = tuple(info.name for info in _TABLE if info.headline)


def metric_info(name: str) -> MetricInfo:
    """The table's entry, or a neutral one named after the metric (no direction, no unit)."""
    return METRICS.get(name) or MetricInfo(name, name.removeprefix("training.").replace("_", " "), "", None)


def measured_name(name: str) -> str:
    """The name the suite measures a metric under: `name` itself, or the measured metric it is another name of."""
    info = METRICS.get(name)
    return info.same_as if info is not None and info.same_as is not None else name


def zero_unmeasured_metrics() -> tuple[str, ...]:
    """The metrics whose zero is below their print's resolution (`MetricInfo.zero_unmeasured`), sorted."""
    return tuple(sorted(name for name, info in METRICS.items() if info.zero_unmeasured))


def zero_unmeasured_quantities() -> tuple[str, ...]:
    """The predicted quantities (and the suite's curves of them) measured by those metrics, sorted."""
    return tuple(sorted({info.quantity for info in METRICS.values() if info.zero_unmeasured and info.quantity}))


def measured_value(name: str, value: float | None) -> float | None:
    """A metric's value as measured: None for a zero below its print's resolution (`MetricInfo.zero_unmeasured`)."""
    return None if value == 0 and metric_info(name).zero_unmeasured else value


def measured_quantity(quantity: str, value: float | None) -> float | None:
    """A quantity's value as measured (a prediction's measured side, a curve's point), by the same rule."""
    return None if value == 0 and quantity in zero_unmeasured_quantities() else value


__all__ = ["DEFAULT_BAND_PCT", "HEADLINE_METRICS", "MEASURED_METRICS", "METRICS", "Direction", "MetricInfo",
           "measured_name", "measured_quantity", "measured_value", "metric_info", "zero_unmeasured_metrics",
           "zero_unmeasured_quantities"]
