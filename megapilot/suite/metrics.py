"""Metrics of one combo from every node's training log: actuals (CVS names), curves and findings.

`measure_combo(node_logs, ...)` parses each node's log on its own (so every finding names its node):
- iteration lines come from the last node that prints them (Megatron prints from the last rank, which
  lives on the last node); the steady-state numbers are that log's `RunSummary` (the one warm-up rule
  of `megapilot.logs.summary`, the same for every dialect);
- error signatures, memory reports and NaN counters come from every node.

Fixed against CVS (reference: cvs_megatron_suite.md §3, §7):
- tokens/s/GPU is computed as GBS x seq / (mean step time x world size) when no line prints it (CVS's
  fallback regex never matches a Megatron iteration line);
- scaling efficiency compares tokens/s in total (tokens/s/GPU x the real world size) with the
  baseline's tokens/s scaled by node count: never a TFLOP/s figure, never 8 GPUs per node assumed;
- every node is scanned for errors (CVS reads the last node only), and `lm loss: nan` and Megatron's
  `number of nan/skipped iterations` counters become findings;
- convergence is measured on validation loss when the log has validation lines and the target metric
  is `auto` or `eval_loss`, both as "first step reaching the target" and "final loss <= target".
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from megapilot.diagnose.engine import diagnose_log
from megapilot.diagnose.findings import EXPLANATIONS, Finding, ranked
from megapilot.logs import IterationRecord, ParsedLog, ParseOptions, TimerRecord, parse_logs
from megapilot.logs.records import Evidence
from megapilot.logs.stragglers import StragglerLines
from megapilot.spec.hardware import GPUSpec
from megapilot.suite.curves import LossCurveGate, Point, loss_slope
from megapilot.suite.metric_table import MEASURED_METRICS, METRICS, measured_quantity, measured_value
from megapilot.suite.results import Curve, error_findings

PREFIX = "training."


# Metrics read from iteration lines (all missing when no node prints one).
ITERATION_METRICS: tuple[str, ...] = (
    "training.throughput_per_gpu", "training.tokens_per_gpu", "training.elapsed_time_per_iteration",
    "training.step_time_p50_ms", "training.step_time_p95_ms", "training.step_time_cv", "training.lm_loss",
    "training.lm_loss_first", "training.grad_norm", "training.nan_iterations", "training.skipped_iterations",
    "training.iterations_reached", "training.step_records",
)

CURVE_UNITS: dict[str, str] = {
    "loss": "", "eval_loss": "", "step_time_ms": "ms", "tokens_per_s_per_gpu": "tok/s/GPU",
    "tflops_per_gpu": "TFLOP/s/GPU", "grad_norm": "", "lr": "",
}

# Megatron prints TFLOP/s/GPU with one decimal, so a real 0.03 (a CPU run) is logged as 0.0: a zero is below the
# print's resolution, not a measurement (the metric table's `zero_unmeasured`, which the history reads too). The suite
# leaves it unmeasured, and so the MFU computed from it; a gate on it is SKIPPED, never FAIL or PASS on 0.
TFLOPS_BELOW_RESOLUTION = ("the iteration lines print TFLOP/s/GPU 0.0, below the one decimal Megatron prints (a CPU "
                           "run's 0.03 reads 0.0): not a measurement")

# `validation loss at iteration 10 | lm loss value: 4.5E+00 | lm loss PPL: ...` (Megatron-LM, Primus).
VALIDATION_RE = re.compile(r"validation loss at iteration\s+(\d+)\s*\|\s*lm loss value:\s*([^\s|]+)", re.I)
# The embedded trainer says its memory report is process RSS when there is no GPU.
CPU_MEMORY_NEEDLE = "memory report on CPU"


@dataclass(frozen=True)
class ScalingBaseline:
    """A reference run for scaling efficiency: its tokens/s over all GPUs, on how many nodes."""

    tokens_per_sec_total: float
    num_nodes: int = 1


class ConvergenceGate(BaseModel):
    """The convergence target (the caller maps a suite config's `convergence` block here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_metric: Literal["auto", "train_loss", "eval_loss"] = "auto"
    target_value: float = Field(default=0.0, description="<= 0 disables convergence.")
    rule: Literal["final", "first_crossing"] = Field(
        default="final", description="What passes: the final loss <= target, or any logged loss reaching it.")
    enforce: bool = True

    @property
    def enabled(self) -> bool:
        return self.target_value > 0


@dataclass(frozen=True)
class CurveTargets:
    """What a combo's curves are judged against: the loss-slope gate, the convergence target and the
    scaling reference (None: no scaling efficiency)."""

    loss_curve: LossCurveGate = field(default_factory=LossCurveGate)
    convergence: ConvergenceGate = field(default_factory=ConvergenceGate)
    scaling_baseline: ScalingBaseline | None = None


@dataclass(frozen=True)
class Convergence:
    """Both readings of convergence on one loss series."""

    series: str  # "loss" (training) or "eval_loss"
    target: float
    steps_to_target: int | None
    time_to_target_s: float | None
    final_loss: float | None
    note: str = ""

    @property
    def final_minus_target(self) -> float | None:
        return None if self.final_loss is None else self.final_loss - self.target


@dataclass
class ComboMeasurement:
    """What one combo's logs say: actuals by CVS name, their units, curves and findings."""

    actuals: dict[str, float | None]
    units: dict[str, str]
    curves: list[Curve] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)  # diagnose's findings, every node's log on its own
    record_only: dict[str, str] = field(default_factory=dict)  # metric -> why it is recorded, never gated
    why_missing: dict[str, str] = field(default_factory=dict)  # metric -> why it has no value
    # the metrics missing through no fault of the run's: printed below their resolution (a TFLOP/s/GPU of 0.0), or
    # unable to exist on the run's device (the MFU of a CPU run); a gate on one is SKIPPED (why_missing says why)
    unresolved: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    planned_iters: int | None = None
    iteration_node: int | None = None  # the node whose iteration lines were read
    timers_ms: dict[str, float] = field(default_factory=dict)  # Megatron's timers: max across ranks, median
    # every node's per-rank timing lines, as the log parser read them (the straggler gate's input)
    stragglers: StragglerLines = field(default_factory=lambda: StragglerLines([], []))

    @property
    def errors(self) -> list[Finding]:
        """What fails `gate.no_errors` (the loss's own findings go to the loss gates)."""
        return error_findings(self.findings)

    @property
    def nan_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.category == "nan_loss"]

    def curve(self, name: str) -> Curve | None:
        return next((c for c in self.curves if c.name == name), None)

    def points(self, name: str) -> list[Point]:
        found = self.curve(name)
        return list(found.points) if found else []


@dataclass
class _NodeLog:
    """One node's parsed log plus what the line parser does not read (validation losses, CPU memory)."""

    index: int
    path: Path
    parsed: ParsedLog | None
    eval_losses: dict[int, float] = field(default_factory=dict)
    eval_evidence: dict[int, Evidence] = field(default_factory=dict)
    cpu_memory_report: bool = False


def measure_combo(
    node_logs: list[Path], *, gpu: GPUSpec | None, world_size: int, gpus_per_node: int, nodes: int,
    seq_length: int | None, gbs: int | None, train_iters: int | None, model_flops_per_token: float | None = None,
    precision: str = "bf16", targets: CurveTargets | None = None, cpu: bool = False,
) -> ComboMeasurement:
    """Measure a combo from its node logs (index = node rank).

    `gpu` None means no GPU (a CPU run) or an unknown one: no MFU and no fraction of HBM.
    `model_flops_per_token`: training FLOPs per token (forward + backward, Megatron's convention); without
    it MFU uses the TFLOP/s/GPU the log prints. `precision` picks the GPU's dense peak for MFU.
    `targets`: the curve gates and scaling reference (None: the defaults, no scaling reference).
    `cpu`: the run's device is the CPU, where a metric the table marks `gpu_only` cannot exist (not measured, and no
    fault of the run's: `unresolved`).
    """
    targets = targets or CurveTargets()
    logs = _parse_nodes(node_logs, world_size=world_size, seq_length=seq_length, gbs=gbs)
    measurement = ComboMeasurement(actuals={name: None for name in MEASURED_METRICS},
                                   units={name: METRICS[name].unit for name in MEASURED_METRICS})
    measurement.findings = _findings(logs, gpu)
    source = _iteration_node(logs)
    records = _counted(source.parsed.iterations) if source and source.parsed else []
    measurement.iteration_node = source.index if source else None
    measurement.planned_iters = train_iters or (source.parsed.summary.train_iters if source and source.parsed
                                                and source.parsed.summary else None)
    shape = _Shape.resolve(logs, records, world_size=world_size, seq_length=seq_length, gbs=gbs)
    _step_metrics(measurement, source, records, shape)
    measurement.timers_ms = timers_ms(source.parsed.timers if source and source.parsed else [])
    for node in logs:
        if node.parsed is not None:
            measurement.stragglers.rank_times += node.parsed.rank_times
            measurement.stragglers.reports += node.parsed.straggler_reports
    _memory_metrics(measurement, logs, gpu)
    _mfu(measurement, gpu, precision, model_flops_per_token)
    _loss_metrics(measurement, logs, source, records)
    measurement.curves = _curves(records, shape, _eval_losses(logs))
    _scaling(measurement, targets.scaling_baseline, world_size=world_size, nodes=nodes)
    _curve_metrics(measurement, targets.loss_curve, targets.convergence)
    if cpu:
        _not_on_cpu(measurement)
    if gpus_per_node * nodes != world_size:
        measurement.notes.append(f"world size {world_size} is not nodes x GPUs per node ({nodes} x {gpus_per_node}); "
                                 "per-GPU figures use the world size")
    return measurement


# ---- reading the nodes --------------------------------------------------------------------------------

def timers_ms(records: list[TimerRecord]) -> dict[str, float]:
    """Each timer's per-iteration time (ms, max across ranks): the median over the log's intervals, the first one
    (warm-up: compilation, first allocations) left out when there are more."""
    by_name: dict[str, list[float]] = {}
    for record in records:
        by_name.setdefault(record.name, []).append(record.max_ms)
    return {name: round(statistics.median(values[1:] if len(values) > 1 else values), 4)
            for name, values in by_name.items()}


def _parse_nodes(paths: list[Path], *, world_size: int, seq_length: int | None, gbs: int | None) -> list[_NodeLog]:
    """Each node on its own, node 0 first: rank 0's arguments block gives the shape to later nodes."""
    logs: list[_NodeLog] = []
    arguments = None
    for index, path in enumerate(paths):
        path = Path(path)
        if not path.is_file():
            logs.append(_NodeLog(index, path, None))
            continue
        options = ParseOptions(seq_length=seq_length or (arguments.seq_length if arguments else None),
                               world_size=world_size,
                               global_batch_size=gbs or (arguments.global_batch_size if arguments else None))
        parsed = parse_logs([path], options=options)
        arguments = arguments or parsed.arguments
        node = _NodeLog(index, path, parsed)
        _scan_extra_lines(node)
        logs.append(node)
    return logs


def _scan_extra_lines(node: _NodeLog) -> None:
    """Validation losses and the CPU memory note: lines the log parser has no record for."""
    with open(node.path, encoding="utf-8", errors="replace") as stream:
        for line_no, text in enumerate(stream, start=1):
            if "validation loss" in text:
                found = VALIDATION_RE.search(text)
                value = _float(found.group(2)) if found else None
                if found and value is not None:
                    step = int(found.group(1))
                    node.eval_losses[step] = value
                    node.eval_evidence[step] = Evidence(file=str(node.path), line=line_no, text=text.rstrip("\n"))
            elif CPU_MEMORY_NEEDLE in text:
                node.cpu_memory_report = True


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _iteration_node(logs: list[_NodeLog]) -> _NodeLog | None:
    """The last node whose log has iteration lines (Megatron's last rank prints them)."""
    with_iterations = [n for n in logs if n.parsed is not None and n.parsed.iterations]
    return with_iterations[-1] if with_iterations else None


def _counted(records: list[IterationRecord]) -> list[IterationRecord]:
    """Each iteration once, as the steady-state rule counts them (higher than every one counted before)."""
    counted: list[IterationRecord] = []
    for record in records:
        if not counted or record.iteration > counted[-1].iteration:
            counted.append(record)
    return counted


@dataclass(frozen=True)
class _Shape:
    """What computing tokens/s/GPU needs, and where each value came from."""

    gbs: int | None
    seq_length: int | None
    world_size: int

    @classmethod
    def resolve(cls, logs: list[_NodeLog], records: list[IterationRecord], *, world_size: int,
                seq_length: int | None, gbs: int | None) -> _Shape:
        """The combo's settings first, then the arguments block, then the iteration lines' GBS."""
        arguments = next((n.parsed.arguments for n in logs if n.parsed and n.parsed.arguments), None)
        seq = seq_length or (arguments.seq_length if arguments else None)
        line_gbs = next((r.gbs for r in reversed(records) if r.gbs), None)
        batch = gbs or (arguments.global_batch_size if arguments else None) or line_gbs
        return cls(gbs=batch, seq_length=seq, world_size=world_size)

    def tokens_per_s_per_gpu(self, step_ms: float | None, gbs: int | None = None) -> float | None:
        batch = gbs or self.gbs
        if not (batch and self.seq_length and step_ms and step_ms > 0 and self.world_size > 0):
            return None
        return batch * self.seq_length / (step_ms / 1000.0 * self.world_size)


# ---- findings -----------------------------------------------------------------------------------------

def _findings(logs: list[_NodeLog], gpu: GPUSpec | None) -> list[Finding]:
    """diagnose's findings on each node's log, the node named on each; a node without a log is one too.

    The suite analyses no log itself: the NaN rule, the error signatures and the rest are diagnose's, so
    `megapilot diagnose` on a node's log says what the suite's gates read."""
    findings: list[Finding] = []
    for node in logs:
        if node.parsed is None:
            findings.append(Finding("missing_log", "critical", f"node {node.index} wrote no training log",
                                    [], f"{EXPLANATIONS['missing_log']} ({node.path})", node=node.index))
            continue
        diagnosis = diagnose_log(node.parsed, None, gpu)
        findings += [replace(f, node=node.index, rank=_first_rank(node.parsed, f)) for f in diagnosis.findings]
    return ranked(findings)


def _first_rank(log: ParsedLog, finding: Finding) -> int | None:
    """The rank of the first error record behind a finding's evidence (None when no record names one)."""
    lines = {(e.file, e.line) for e in finding.evidence}
    return next((r.rank for r in log.errors if r.rank is not None and (r.file, r.line) in lines), None)


# ---- step time, throughput, tokens --------------------------------------------------------------------

def _step_metrics(m: ComboMeasurement, source: _NodeLog | None, records: list[IterationRecord], shape: _Shape) -> None:
    actuals = m.actuals
    if source is None or source.parsed is None or source.parsed.summary is None:
        for name in ITERATION_METRICS:
            m.why_missing[name] = "no node's log has an iteration line"
        return
    summary = source.parsed.summary
    actuals["training.iterations_reached"] = max(
        (float(r.iteration) for r in records), default=None)
    tflops = summary.tflops_per_gpu_mean
    actuals["training.throughput_per_gpu"] = measured_value("training.throughput_per_gpu", tflops)
    if tflops is not None and actuals["training.throughput_per_gpu"] is None:  # 0.0: below the print's resolution
        m.why_missing["training.throughput_per_gpu"] = TFLOPS_BELOW_RESOLUTION
        m.unresolved.add("training.throughput_per_gpu")
    actuals["training.elapsed_time_per_iteration"] = summary.step_time_mean_ms
    actuals["training.step_time_p50_ms"] = summary.step_time_p50_ms
    actuals["training.step_time_p95_ms"] = summary.step_time_p95_ms
    actuals["training.step_time_cv"] = summary.step_time_cv
    actuals["training.step_records"] = float(summary.steady_iterations) if summary.steady_iterations else None
    m.notes.append(f"steady state (node {source.index}'s iteration lines): {summary.rule}; "
                   f"{summary.steady_iterations} of {summary.iterations_counted} iterations kept")
    printed = any(r.tokens_source == "printed" for r in records)
    if printed:
        actuals["training.tokens_per_gpu"] = summary.tokens_per_s_per_gpu_mean
    else:
        actuals["training.tokens_per_gpu"] = shape.tokens_per_s_per_gpu(summary.step_time_mean_ms)
        if actuals["training.tokens_per_gpu"] is not None:
            m.notes.append(f"tokens/s/GPU computed as GBS x seq / (mean step time x world) = "
                           f"{shape.gbs} x {shape.seq_length} / (step s x {shape.world_size})")
        else:
            m.why_missing["training.tokens_per_gpu"] = "not printed, and GBS or sequence length unknown"
    if actuals["training.throughput_per_gpu"] is None and "training.throughput_per_gpu" not in m.unresolved:
        m.why_missing["training.throughput_per_gpu"] = "the iteration lines print no TFLOP/s/GPU"


# ---- memory -------------------------------------------------------------------------------------------

CPU_MEMORY_REASON = "CPU run: the memory report is the process RSS, not GPU memory"


def _memory_metrics(m: ComboMeasurement, logs: list[_NodeLog], gpu: GPUSpec | None) -> None:
    parsed = [n.parsed for n in logs if n.parsed is not None]
    printed_pct = [r.memory_usage_pct for p in parsed for r in p.iterations if r.memory_usage_pct is not None]
    printed_pct += [r.usage_pct for p in parsed for r in p.memory if r.usage_pct is not None]
    allocated = [r.max_allocated_gib for p in parsed for r in p.memory if r.max_allocated_gib is not None]
    used = [r.memory_used_gib for p in parsed for r in p.iterations if r.memory_used_gib is not None]
    used += [r.used_gib for p in parsed for r in p.memory if r.used_gib is not None and r.source == "device"]
    peak_gib = max(allocated) if allocated else (max(used) if used else None)
    m.actuals["training.max_allocated_gib"] = peak_gib
    on_cpu = any(n.cpu_memory_report for n in logs)
    if printed_pct:
        m.actuals["training.mem_usage"] = max(printed_pct) / 100.0
        m.notes.append("mem_usage: the highest fraction any node printed (mem usages / device usage ratio)")
    elif on_cpu:
        m.why_missing["training.mem_usage"] = CPU_MEMORY_REASON
    elif gpu is not None and allocated:
        m.actuals["training.mem_usage"] = max(allocated) / gpu.hbm_gib
        m.notes.append(f"mem_usage: max allocated over every node's memory report / {gpu.name} HBM "
                       f"({gpu.hbm_gib:g} GiB)")
    else:
        m.why_missing["training.mem_usage"] = ("no memory report" if peak_gib is None
                                               else "no GPU given: GPU memory capacity unknown")
    if on_cpu and peak_gib is not None:
        m.record_only["training.max_allocated_gib"] = CPU_MEMORY_REASON
    if peak_gib is None:
        m.why_missing["training.max_allocated_gib"] = "no memory report with a max allocated (or used) figure"


def _mfu(m: ComboMeasurement, gpu: GPUSpec | None, precision: str, model_flops_per_token: float | None) -> None:
    if gpu is None:
        m.why_missing["training.mfu_pct"] = "no GPU (CPU run or GPU not given): no peak to compare with"
        return
    tokens = m.actuals["training.tokens_per_gpu"]
    achieved_tflops: float | None
    if model_flops_per_token and tokens is not None:
        achieved_tflops = tokens * model_flops_per_token / 1e12
        basis = "tokens/s/GPU x model FLOPs/token"
    else:
        achieved_tflops = m.actuals["training.throughput_per_gpu"]
        basis = "the TFLOP/s/GPU the log prints"
    if achieved_tflops is None and "training.throughput_per_gpu" in m.unresolved:
        m.why_missing["training.mfu_pct"] = f"from TFLOP/s/GPU, which is not measured: {TFLOPS_BELOW_RESOLUTION}"
        m.unresolved.add("training.mfu_pct")
        return
    if achieved_tflops is None:
        m.why_missing["training.mfu_pct"] = "neither TFLOP/s/GPU nor tokens/s/GPU with model FLOPs/token"
        return
    peak = gpu.peak_tflops(precision.lower())  # type: ignore[arg-type]  # a CVS precision, lower-cased
    m.actuals["training.mfu_pct"] = achieved_tflops / peak * 100.0
    m.notes.append(f"MFU from {basis} over the {gpu.name} dense {precision.lower()} peak ({peak:g} TFLOP/s)")


def _not_on_cpu(m: ComboMeasurement) -> None:
    """A CPU run's missing metrics that need a GPU (the metric table's `gpu_only`): they cannot exist on its device,
    so they are missing through no fault of the run's, with that reason."""
    for name in MEASURED_METRICS:
        reason = METRICS[name].gpu_only
        if reason is not None and m.actuals.get(name) is None:
            m.why_missing[name] = reason
            m.unresolved.add(name)


# ---- losses, counters, curves -------------------------------------------------------------------------

def _loss_metrics(m: ComboMeasurement, logs: list[_NodeLog], source: _NodeLog | None,
                  records: list[IterationRecord]) -> None:
    summaries = [n.parsed.summary for n in logs if n.parsed is not None and n.parsed.summary is not None]
    if source is not None and source.parsed is not None and source.parsed.summary is not None:
        m.actuals["training.lm_loss"] = source.parsed.summary.final_loss
        m.actuals["training.lm_loss_first"] = source.parsed.summary.first_loss
    last_norm = next((r.grad_norm for r in reversed(records) if r.grad_norm is not None), None)
    m.actuals["training.grad_norm"] = last_norm
    # The counters are printed on iteration lines; a node that prints them repeats the same totals.
    for name, attribute in (("training.nan_iterations", "nan_iterations"),
                            ("training.skipped_iterations", "skipped_iterations")):
        values = [getattr(s, attribute) for s in summaries if getattr(s, attribute) is not None]
        m.actuals[name] = float(max(values)) if values else None


def _eval_losses(logs: list[_NodeLog]) -> dict[int, float]:
    losses: dict[int, float] = {}
    for node in logs:
        losses.update(node.eval_losses)
    return dict(sorted(losses.items()))


def _curves(records: list[IterationRecord], shape: _Shape, eval_losses: dict[int, float]) -> list[Curve]:
    """One point per counted iteration line; non-finite values left out (their finding reports them), and a
    zero below its print's resolution (a TFLOP/s/GPU of 0.0: TFLOPS_BELOW_RESOLUTION)."""
    series: dict[str, list[Point]] = {name: [] for name in CURVE_UNITS}
    for record in records:
        tokens = record.tokens_per_s_per_gpu
        if record.tokens_source != "printed":
            tokens = shape.tokens_per_s_per_gpu(record.elapsed_ms, record.gbs)
        for name, value in (("loss", record.lm_loss), ("step_time_ms", record.elapsed_ms),
                            ("tokens_per_s_per_gpu", tokens), ("tflops_per_gpu", record.tflops_per_gpu),
                            ("grad_norm", record.grad_norm), ("lr", record.lr)):
            if value is not None and math.isfinite(value) and measured_quantity(name, value) is not None:
                series[name].append((record.iteration, float(value)))
    series["eval_loss"] = [(step, loss) for step, loss in eval_losses.items() if math.isfinite(loss)]
    return [Curve(name=name, unit=CURVE_UNITS[name], points=points) for name, points in series.items() if points]


def _scaling(m: ComboMeasurement, baseline: ScalingBaseline | None, *, world_size: int, nodes: int) -> None:
    name = "training.scaling_efficiency_pct"
    m.actuals[name] = scaling_efficiency_pct(m.actuals["training.tokens_per_gpu"], world_size=world_size,
                                             nodes=nodes, baseline=baseline)
    if m.actuals[name] is None and (baseline is None or baseline.tokens_per_sec_total <= 0):
        # CVS's "0.0 = disabled (record-only)": a gate on it (CVS ships `min 85` beside a 0 baseline) is SKIPPED,
        # not failed on every run for a metric the config turned off
        m.why_missing[name] = SCALING_DISABLED
        m.unresolved.add(name)
    elif m.actuals[name] is None:
        m.why_missing[name] = "no tokens/s/GPU"


SCALING_DISABLED = "no scaling baseline: scaling_baseline.tokens_per_sec_total is 0 (disabled, record-only)"


def scaling_efficiency_pct(tokens_per_gpu: float | None, *, world_size: int, nodes: int,
                           baseline: ScalingBaseline | None) -> float | None:
    """tokens/s in total (tokens/s/GPU x world size) over the baseline's tokens/s x nodes / baseline nodes, in %."""
    if (baseline is None or baseline.tokens_per_sec_total <= 0 or baseline.num_nodes <= 0 or tokens_per_gpu is None
            or world_size <= 0 or nodes <= 0):
        return None
    expected_total = baseline.tokens_per_sec_total * nodes / baseline.num_nodes
    return tokens_per_gpu * world_size / expected_total * 100.0


def _curve_metrics(m: ComboMeasurement, loss_curve: LossCurveGate, convergence: ConvergenceGate) -> None:
    slope, sampled = loss_slope(m.points("loss"), loss_curve, m.planned_iters)
    m.actuals["training.loss_slope"] = slope
    if slope is None:
        m.why_missing["training.loss_slope"] = (f"{sampled} sampled loss point(s) after the warm-up: "
                                                "increase training_iterations")
    if not convergence.enabled:
        for name in ("training.steps_to_target", "training.time_to_target_s", "training.final_loss_vs_target"):
            m.why_missing[name] = "no convergence target (target_value <= 0)"
        return
    result = measure_convergence(m.points("loss"), m.points("eval_loss"), m.points("step_time_ms"), convergence)
    m.actuals["training.steps_to_target"] = None if result.steps_to_target is None else float(result.steps_to_target)
    m.actuals["training.time_to_target_s"] = result.time_to_target_s
    m.actuals["training.final_loss_vs_target"] = result.final_minus_target
    if result.note:
        m.notes.append(result.note)
    if result.steps_to_target is None:
        reason = f"no {result.series} at or below {result.target:g}"
        m.why_missing["training.steps_to_target"] = m.why_missing["training.time_to_target_s"] = reason


def measure_convergence(train_loss: list[Point], eval_loss: list[Point], step_time_ms: list[Point],
                        target: ConvergenceGate) -> Convergence:
    """Steps and time to the target (first logged loss <= target) and the final loss, on the chosen series.

    Time counts every iteration: a line logged every L iterations prints the mean step time of those L,
    so each line adds step time x the iterations since the line before.
    """
    use_eval = target.target_metric in ("auto", "eval_loss") and bool(eval_loss)
    note = ""
    if target.target_metric == "eval_loss" and not eval_loss:
        note = "convergence on eval_loss asked, but the log has no validation loss line: training loss used"
    series, name = (eval_loss, "eval_loss") if use_eval else (train_loss, "loss")
    finite = [(step, loss) for step, loss in series if math.isfinite(loss)]
    first = next((step for step, loss in finite if loss <= target.target_value), None)
    elapsed = _time_at_step(step_time_ms, first) if first is not None else None
    final = finite[-1][1] if finite else None
    return Convergence(series=name, target=target.target_value, steps_to_target=first, time_to_target_s=elapsed,
                       final_loss=final, note=note)


def _time_at_step(step_time_ms: list[Point], step: int) -> float | None:
    """Seconds of training up to and including `step` (the last logged line at or before it)."""
    if not step_time_ms:
        return None
    total_ms = 0.0
    reached = False
    for index, (iteration, elapsed) in enumerate(step_time_ms):
        if iteration > step:
            break
        total_ms += elapsed * _span(step_time_ms, index)
        reached = True
    return total_ms / 1000.0 if reached else None


def _span(points: list[Point], index: int) -> int:
    """Iterations a logged line stands for: the gap to the line before; for the first line the log interval
    (the gap to the next line, capped by its own number, so a resumed run does not count the earlier steps)."""
    iteration = points[index][0]
    if index > 0:
        return max(1, iteration - points[index - 1][0])
    if len(points) > 1:
        return max(1, min(iteration, points[1][0] - iteration))
    return 1


__all__ = [
    "TFLOPS_BELOW_RESOLUTION",
    "ComboMeasurement",
    "Convergence",
    "ConvergenceGate",
    "ScalingBaseline",
    "measure_combo",
    "measure_convergence",
    "scaling_efficiency_pct",
    "timers_ms",
]
