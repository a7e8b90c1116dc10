"""The run deck: `megatron_run_deck.json`, a machine-readable summary of a suite run for dashboards and CI.

Keys follow CVS's Megatron Run Deck where they mean the same thing (`schema_version`, `suite_id`,
`generated_at`, `overall_status`, `run_card_display`, `provenance`, `lifecycle`, `cells[]` with
`cell_id`/`mbs`/`gbs`/`precision`/`tp`/`pp`/`metrics`/`actuals`/`loss_curve`/`throughput_curve`/
`tokens_curve`, `results_table`), so a tool that reads CVS decks reads these. megapilot adds what CVS
lacks: `predicted` (the estimator against the measurement), `regressions` (against the run history),
`findings` (error signatures with evidence lines) and per-cell job outcomes.

The models below are the schema: `run_deck_json_schema()` derives the JSON Schema (draft 2020-12) from
them, and the copy shipped in `schema/run_deck.schema.json` is checked against it by the tests.
Status words are CVS's: pass / fail / record / skip for a metric, pass / fail / record / na for a cell
and the run; megapilot adds `interrupted` for the cell (and stage) a run was stopped in and for the run itself,
and `warn` for a run whose gates passed but regressed. NaN or infinite numbers (a diverged loss) are written as
null; curves drop such points.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from megapilot.report import measures
from megapilot.report.log_copies import LogLink
from megapilot.suite.budget import BudgetProjection
from megapilot.suite.config import CPU_GPU_NAME
from megapilot.suite.metric_table import metric_info
from megapilot.suite.outcome import RunOutcome, run_outcome
from megapilot.suite.outcome import RunStatus as Outcome
from megapilot.suite.predicted import components_ms
from megapilot.suite.results import SUITE_RESULT_NAME, ComboResult, Finding, MetricRow, SuiteResult, Verdict

RUN_DECK_SCHEMA_VERSION: Literal[1] = 1
RUN_DECK_NAME = "megatron_run_deck.json"
SCHEMA_RESOURCE = "schema/run_deck.schema.json"
SCHEMA_ID = "urn:megapilot:run-deck:1"

MetricStatus = Literal["pass", "fail", "record", "skip"]
RunStatus = Literal["pass", "fail", "record", "na", "interrupted"]
OverallStatus = Literal["pass", "warn", "fail", "record", "na", "interrupted"]
Point = tuple[int, float]

_METRIC_STATUS: dict[Verdict, MetricStatus] = {
    Verdict.PASS: "pass", Verdict.FAIL: "fail", Verdict.RECORD: "record", Verdict.SKIPPED: "skip",
    Verdict.INTERRUPTED: "skip"}  # a metric is never measured by a job that was stopped
_RUN_STATUS: dict[Verdict, RunStatus] = {
    Verdict.PASS: "pass", Verdict.FAIL: "fail", Verdict.RECORD: "record", Verdict.SKIPPED: "na",
    Verdict.INTERRUPTED: "interrupted"}


class _Strict(BaseModel):
    # Every field is written, so the schema lists every field as required (a reader never guesses a default).
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class DeckReport(_Strict):
    """Titles for a deck viewer (CVS `report`)."""

    title: str = Field(description="Headline of the deck: suite name and model.")
    subtitle: str = Field(description="GPU, nodes and layout.")
    headline_metric: str = Field(description="The metric a dashboard leads with: training.throughput_per_gpu "
                                             "(CVS's) where a cell measured TFLOP/s, else training.tokens_per_gpu, "
                                             "else training.elapsed_time_per_iteration (a CPU run prints no TFLOP/s).")


class DeckProvenance(_Strict):
    """Where the run came from and where its files are (paths relative to the run directory)."""

    megapilot_version: str = Field(description="megapilot version that ran the suite.")
    git_commit: str | None = Field(description="Commit of the megapilot checkout that ran the suite, when known.")
    config_file: str = Field(description="The suite config file.")
    cluster_file: str | None = Field(description="The cluster file, when one was given.")
    threshold_file: str | None = Field(description="The threshold file, when one was given.")
    config_hash: str = Field(description="sha256 of the resolved config, secrets excluded.")
    megatron_version: str | None = Field(description="Megatron-Core / Megatron-LM version of the run, when known.")
    torch_version: str | None = Field(description="PyTorch version of the run, when known.")
    python_version: str = Field(description="Python version of the run.")
    host: str = Field(description="Host the suite ran from.")
    executor: str = Field(description="local, slurm or ssh.")
    backend: str = Field(description="megatron-lm, primus or megapilot (the embedded trainer).")
    report_href: str = Field(description="The HTML report, relative to the run directory.")
    junit_href: str = Field(description="The JUnit XML, relative to the run directory.")
    suite_json_href: str = Field(description="The suite result the deck was rendered from.")


class DeckStage(_Strict):
    """One lifecycle stage in the order it ran (CVS keeps only `lifecycle{label: seconds}`)."""

    label: str = Field(description="Stage name, with the cell in brackets for per-cell stages.")
    stage: str = Field(description="Stage name (prepare, preflight, smoke, train, checkpoint, ...).")
    cell_id: str | None = Field(description="The cell of a per-cell stage; null for run-wide stages.")
    status: RunStatus = Field(description="pass, fail, record, na (skipped) or interrupted (the run was stopped in "
                                          "it).")
    duration_s: float = Field(description="Seconds the stage took.")
    started_at: datetime | None = Field(description="When the stage started (ISO 8601).")
    reason: str = Field(description="Why the stage failed or was skipped; empty when it passed.")


class DeckMetric(_Strict):
    """A metric's verdict panel row (CVS `metrics[]`)."""

    label: str = Field(description="Human name of the metric.")
    metric: str = Field(description="CVS-style metric name, e.g. training.throughput_per_gpu.")
    actual: float | None = Field(description="Measured value; null when missing or not finite.")
    unit: str = Field(description="Unit of actual (TFLOP/s, tokens/s, ms, GiB; empty for a ratio or loss).")
    spec: str | None = Field(description="The gate as text ('>= 100', '<= 500 ms'); null when not gated.")
    kind: str | None = Field(description="Threshold kind (min, max_ms, within, baseline, ...); null when not gated.")
    status: MetricStatus = Field(description="pass, fail, record (measured, not gated) or skip (not measured).")
    margin: float | None = Field(description="Percent inside (+) or outside (-) the gate.")
    reason: str = Field(description="Why the metric failed, was skipped or only recorded.")
    enforced: bool = Field(description="False when thresholds are recorded but not enforced.")


class DeckComparison(_Strict):
    """One predicted quantity against its measurement."""

    quantity: str = Field(description="step_time_ms, tokens_per_s_per_gpu, tflops_per_gpu, mfu_pct or memory_gib.")
    label: str = Field(description="Human name of the quantity.")
    unit: str = Field(description="Unit of predicted and measured.")
    predicted: float = Field(description="The estimator's value.")
    measured: float | None = Field(description="null when the cell did not measure it (e.g. it failed first).")
    error_pct: float | None = Field(description="(measured - predicted) / predicted x 100.")


class DeckPredicted(_Strict):
    """What megapilot's estimator predicted for the cell, next to what was measured."""

    note: str = Field(description="What the prediction assumed (convention, peak used).")
    comparisons: list[DeckComparison] = Field(description="One entry per predicted quantity.")
    device: str = Field(description="The GPU (or this machine's CPU, measured) the prediction modelled.")
    components_ms: dict[str, float] = Field(
        description="The predicted step in components, ms: compute, exposed_comm, pipeline_bubble, fixed_overheads.")
    timers_ms: dict[str, float] = Field(description="Megatron's timers as measured, ms per iteration.")
    uncalibrated_step_time_ms: float | None = Field(description="The step before calibration on the cluster's runs.")
    calibration: str = Field(description="How the prediction was calibrated on the cluster's runs, or why not.")
    calibration_runs: list[str] = Field(description="The runs the calibration used.")
    band_pct: float | None = Field(description="Error band: p90 of the held-out |error| of the calibration, %.")
    departure: str = Field(description="By how much, and in which component, the measurement departs.")


class DeckJob(_Strict):
    """How the cell's training job ended."""

    executor: str = Field(description="Executor that ran the job.")
    job_id: str = Field(description="Executor's job id (PID, SLURM job id, ...).")
    state: str = Field(description="COMPLETED, FAILED, HUNG, TIMEOUT, CANCELLED, ...")
    exit_code: int | None = Field(description="Exit code, when the job exited.")
    reason: str | None = Field(description="Why the job ended as it did, when not COMPLETED.")
    iterations_reached: int | None = Field(description="Last training iteration logged.")
    train_iters: int | None = Field(description="Iterations the job was launched for.")
    duration_s: float = Field(description="Seconds from launch to end.")


class DeckCell(_Strict):
    """One sweep cell (CVS `cells[]`) with its gates, curves, prediction, findings and logs."""

    cell_id: str = Field(description="The cell key, e.g. 'MBS=4,GBS=128,PRECISION=FP8'.")
    label: str = Field(description="Display label of the cell.")
    subtitle: str = Field(description="Backend, GPUs and layout of the cell.")
    status: RunStatus = Field(description="pass, fail, record, na (not run) or interrupted (the run was stopped while "
                                          "it trained: its job, iterations reached and partial log are kept).")
    reason: str = Field(description="Why the cell failed, was not run or was interrupted (where).")
    model: str = Field(description="Model name.")
    gpu: str = Field(description="GPU type.")
    host: str = Field(description="CVS's host label; 'cluster' for every cell.")
    backend: str = Field(description="megatron-lm, primus or megapilot.")
    nodes: int = Field(description="Nodes the cell ran on.")
    gpus_per_node: int = Field(description="GPUs per node.")
    mbs: int | None = Field(description="Micro-batch size.")
    gbs: int | None = Field(description="Global batch size.")
    precision: str | None = Field(description="BF16, FP8, ...")
    seq_length: int | None = Field(description="Sequence length in tokens.")
    tp: int = Field(description="Tensor-parallel size.")
    pp: int = Field(description="Pipeline-parallel size.")
    cp: int = Field(description="Context-parallel size.")
    ep: int = Field(description="Expert-parallel size.")
    vpp: int | None = Field(description="Virtual pipeline stages per rank; null when not interleaved.")
    planned_steps: int | None = Field(description="train_iters the cell was launched with.")
    metrics: list[DeckMetric] = Field(description="The cell's metric verdicts.")
    actuals: dict[str, float | None] = Field(description="Metric name to measured value (CVS `actuals`).")
    cell_lifecycle: dict[str, float] = Field(description="Per-cell stage name to seconds.")
    loss_curve: list[Point] = Field(description="[[iteration, lm loss], ...]")
    learning_rate_curve: list[Point] = Field(description="[[iteration, learning rate], ...]")
    grad_norm_curve: list[Point] = Field(description="[[iteration, gradient norm], ...]")
    throughput_curve: list[Point] = Field(description="[[iteration, TFLOP/s per GPU], ...]")
    tokens_curve: list[Point] = Field(description="[[iteration, tokens/s per GPU], ...]")
    step_time_curve: list[Point] = Field(description="[[iteration, step time ms], ...]")
    predicted: DeckPredicted | None = Field(
        description="The estimator's prediction against the measurement; null when nothing was predicted.")
    findings: list[Finding] = Field(description="diagnose's findings in the cell's logs (`megapilot diagnose`'s).")
    job: DeckJob | None = Field(description="How the job ended; null when it never started.")
    log_files: list[str] = Field(description="Copied node logs, relative to the run directory (logs/...).")
    log_tail: list[str] = Field(description="Last lines of the last node's log when the cell failed.")
    duration_s: float = Field(description="Seconds the cell took.")


class DeckResultsTable(_Strict):
    """The full results table (CVS `results_table`): one row per cell, cells as display strings."""

    headers: list[str] = Field(description="Column names.")
    rows: list[list[str]] = Field(description="One row of display strings per cell, in the order of headers.")


class DeckRegression(_Strict):
    """A metric that moved against the run history."""

    cell_id: str = Field(description="The cell the metric belongs to.")
    metric: str = Field(description="Metric name.")
    value: float = Field(description="This run's value.")
    baseline_median: float = Field(description="Median of the earlier runs compared.")
    change_pct: float = Field(description="(value - median) / median x 100, sign as measured.")
    runs_compared: int = Field(description="How many earlier runs made the median.")
    worse: bool = Field(description="True when the change is in the bad direction for this metric.")
    message: str = Field(description="The change in words, e.g. 'tokens/s -8.3 % vs the median of the last 5 runs'.")


class DeckSummary(_Strict):
    mode: Literal["sweep", "single"] = Field(description="sweep (several cells) or single.")
    total_cells: int = Field(description="Cells in the run.")
    passed: int = Field(description="Cells that passed.")
    failed: int = Field(description="Cells that failed.")
    recorded: int = Field(description="Cells measured but not gated.")
    not_run: int = Field(description="Cells skipped.")
    interrupted: int = Field(description="Cells the run was stopped in (0 or 1).")
    not_started: int = Field(description="Cells an interrupted run never started (listed in not_started).")


class RunDeck(_Strict):
    """The whole deck, written as `<run_dir>/megatron_run_deck.json`."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True,
                              title="megapilot run deck")

    schema_version: Literal[1] = Field(default=RUN_DECK_SCHEMA_VERSION,
        description="Version of this schema; a reader refuses versions it does not know.")
    suite_id: str = Field(description="The suite's name (CVS writes 'megatron').")
    run_id: str = Field(description="The suite run's id.")
    generated_at: datetime = Field(description="When the deck was rendered (ISO 8601).")
    megapilot_version: str = Field(description="megapilot version that rendered the deck.")
    overall_status: OverallStatus = Field(description="pass, warn (gates passed, a regression not enforced), fail, "
                                                      "record, na or interrupted (the run did not finish) for the "
                                                      "whole run: the verdict's word.")
    overall_reason: str = Field(description="Why the run failed (or what to know about it).")
    verdict: str = Field(description="The run's one verdict: PASS, WARN, FAIL, RECORD, SKIPPED or INTERRUPTED; the "
                                     "banner, the terminal and JUnit say the same.")
    exit_code: int = Field(description="The exit code `megapilot suite run` gave (0, 1, or 128 + the signal when "
                                       "interrupted: 130 for Ctrl-C, 143 for SIGTERM).")
    finished: bool = Field(description="False when the suite was interrupted or is still running.")
    started_at: datetime = Field(description="When the suite run started.")
    ended_at: datetime | None = Field(description="When it ended; null while running or when interrupted.")
    duration_s: float = Field(description="Seconds the suite run took.")
    report: DeckReport = Field(description="Titles for a viewer.")
    run_card_display: list[tuple[str, str, bool]] = Field(description="[label, value, is_link] rows of the run card.")
    run_card_notes: list[str] = Field(description="What the user should know about the run.")
    provenance: DeckProvenance = Field(description="Where the run came from, and its files.")
    lifecycle: dict[str, float] = Field(description="Stage label to seconds (CVS `lifecycle`).")
    lifecycle_stages: list[DeckStage] = Field(description="Every stage in the order it ran.")
    cells: list[DeckCell] = Field(description="One entry per sweep cell that ran or was skipped, the one an "
                                              "interrupted run was stopped in included.")
    not_started: list[str] = Field(description="Cell ids an interrupted run never started, in order.")
    results_table: DeckResultsTable = Field(description="The full results table.")
    regressions: list[DeckRegression] = Field(description="Metrics that moved against the run history.")
    findings: dict[str, list[Finding]] = Field(description="Cell id to its findings, for every cell with one.")
    summary: DeckSummary = Field(description="Counts of cells by status.")
    budget: BudgetProjection | None = Field(
        default=None, description="The config's token budget projected from what the run measured: days, GPU-hours, "
                                  "energy, cost, goodput (null without a budget).")


# ---- building a deck from a SuiteResult ---------------------------------------------------------------------

def build_run_deck(result: SuiteResult, log_links: dict[str, list[LogLink]], *, report_href: str,
                   junit_href: str, generated_at: datetime | None = None) -> RunDeck:
    """The run deck of a suite result; `log_links` are the copied node logs by combo key."""
    card = result.card
    outcome = run_outcome(result)
    capacity = measures.gpu_capacity_gib(card.gpu)
    cells = [_cell(result, combo, log_links.get(combo.key, []), capacity) for combo in result.combos]
    return RunDeck(
        suite_id=card.suite_name, run_id=result.run_id,
        generated_at=generated_at or datetime.now(timezone.utc), megapilot_version=card.megapilot_version,
        overall_status=_overall_status(outcome), overall_reason=outcome.summary, verdict=outcome.status.value,
        exit_code=outcome.exit_code, finished=result.finished,
        started_at=result.started_at, ended_at=result.ended_at, duration_s=result.duration_s,
        report=DeckReport(title=f"{card.suite_name}: {card.model}", subtitle=_subtitle(result),
                          headline_metric=_headline_metric(result, capacity)),
        run_card_display=run_card_rows(result), run_card_notes=list(result.notes),
        provenance=_provenance(result, report_href, junit_href),
        lifecycle={_stage_label(stage.name, stage.combo): stage.duration_s for stage in result.stages},
        lifecycle_stages=[DeckStage(label=_stage_label(s.name, s.combo), stage=s.name, cell_id=s.combo,
                                    status=_RUN_STATUS[s.verdict], duration_s=s.duration_s, started_at=s.started_at,
                                    reason=s.reason) for s in result.stages],
        cells=cells,
        not_started=result.not_started(),
        results_table=_results_table(result, capacity),
        regressions=[DeckRegression(cell_id=r.combo, metric=r.metric, value=r.value, baseline_median=r.baseline_median,
                                    change_pct=r.change_pct, runs_compared=r.runs_compared, worse=r.worse,
                                    message=r.message) for r in result.regressions],
        findings={cell.cell_id: cell.findings for cell in cells if cell.findings},
        summary=_summary(result),
        budget=result.budget,
    )


_OVERALL: dict[Outcome, OverallStatus] = {Outcome.PASS: "pass", Outcome.WARN: "warn", Outcome.FAIL: "fail",
                                          Outcome.RECORD: "record", Outcome.SKIPPED: "na",
                                          Outcome.INTERRUPTED: "interrupted"}


# What a dashboard leads with, the first of these any cell measured: CVS's TFLOP/s/GPU; a CPU run (whose log prints
# TFLOP/s 0.0, not a measurement) or a log without --log-throughput leads with what it did measure.
HEADLINE_QUANTITIES = (measures.TFLOPS_PER_GPU, measures.TOKENS_PER_S_PER_GPU, measures.STEP_TIME_MS)


def _headline_metric(result: SuiteResult, capacity: float | None) -> str:
    for quantity in HEADLINE_QUANTITIES:
        if any(measures.measured(combo, quantity, capacity) for combo in result.combos):  # a 0.0 is not measured
            return quantity.metrics[0]
    return HEADLINE_QUANTITIES[0].metrics[0]  # nothing measured: CVS's


def _overall_status(outcome: RunOutcome) -> OverallStatus:
    """The verdict's word for the run: CVS's, `warn` for a regression that was not enforced (never `pass`), and
    `interrupted` for a run that did not finish (never what its finished part said: a dashboard reading only this
    word must not show it green)."""
    return _OVERALL[outcome.status]


def run_card_rows(result: SuiteResult) -> list[tuple[str, str, bool]]:
    """The run card as (label, value, is_link) rows, the shape CVS's `run_card_display` has; the HTML shows the same."""
    card = result.card
    rows: list[tuple[str, str, bool]] = [
        ("Model", f"{card.model} ({card.model_family})" if card.model_family else card.model, False),
        ("GPU", card.gpu, False),
        ("Nodes", f"{card.nodes} x {card.gpus_per_node} {per_node_unit(card.gpu)}", False),
        ("Parallelism", card.layout or "-", False),
        ("Device", card.device or "-", False),
        ("Precision", card.precision or "-", False),
        ("Backend", card.backend, False),
        ("Executor", card.executor, False),
        ("megapilot", card.megapilot_version or "-", False),
        ("Git commit", card.git_commit or "-", False),
        ("Megatron", card.megatron_version or "-", False),
        ("PyTorch", card.torch_version or "-", False),
        ("Python", card.python_version or "-", False),
        ("Host", card.host or "-", False),
        ("Config", card.config_file or "-", False),
        ("Cluster", card.cluster_file or "-", False),
        ("Thresholds", card.threshold_file or "-", False),
        ("Thresholds enforced", "yes" if card.enforce_thresholds else "no (recorded only)", False),
        ("Config hash", card.config_hash or "-", False),
    ]
    return rows


def per_node_unit(gpu: str) -> str:
    """What runs on each node: a CPU suite's processes are CPU ranks, not GPUs."""
    return "CPU ranks" if gpu == CPU_GPU_NAME else "GPUs"


def _subtitle(result: SuiteResult) -> str:
    card = result.card
    layout = f", {card.layout}" if card.layout else ""
    return f"{card.gpu}, {card.nodes} node(s) x {card.gpus_per_node} {per_node_unit(card.gpu)}{layout}"


def _provenance(result: SuiteResult, report_href: str, junit_href: str) -> DeckProvenance:
    card = result.card
    return DeckProvenance(
        megapilot_version=card.megapilot_version, git_commit=card.git_commit, config_file=card.config_file,
        cluster_file=card.cluster_file, threshold_file=card.threshold_file, config_hash=card.config_hash,
        megatron_version=card.megatron_version, torch_version=card.torch_version, python_version=card.python_version,
        host=card.host, executor=card.executor, backend=card.backend, report_href=report_href, junit_href=junit_href,
        suite_json_href=SUITE_RESULT_NAME)


def _stage_label(name: str, combo: str | None) -> str:
    return f"{name} [{combo}]" if combo else name


def metric_label(name: str) -> str:
    """'training.tokens_per_gpu' -> 'tokens/s/GPU': the metric table's label (a built-in gate: its name)."""
    return metric_info(name).label


def deck_metric(row: MetricRow) -> DeckMetric:
    return DeckMetric(label=metric_label(row.name), metric=row.name, actual=measures.finite(row.value), unit=row.unit,
                      spec=row.threshold, kind=row.kind, status=_METRIC_STATUS[row.verdict],
                      margin=measures.finite(row.margin_pct), reason=row.reason, enforced=row.enforced)


def _cell(result: SuiteResult, combo: ComboResult, links: list[LogLink], capacity: float | None) -> DeckCell:
    card = result.card
    return DeckCell(
        cell_id=combo.key, label=combo.key, subtitle=_cell_subtitle(combo, card.gpu), status=_RUN_STATUS[combo.verdict],
        reason=combo.reason, model=card.model, gpu=card.gpu, host="cluster", backend=combo.backend, nodes=combo.nodes,
        gpus_per_node=combo.gpus_per_node, mbs=combo.layout.mbs, gbs=combo.gbs, precision=combo.precision,
        seq_length=combo.seq_length, tp=combo.layout.tp, pp=combo.layout.pp, cp=combo.layout.cp, ep=combo.layout.ep,
        vpp=combo.layout.vpp,
        planned_steps=combo.train_iters,
        metrics=[deck_metric(row) for row in combo.metrics],
        actuals={row.name: measures.finite(row.value) for row in combo.metrics},
        cell_lifecycle={s.name: s.duration_s for s in result.stages if s.combo == combo.key},
        loss_curve=_points(combo, "loss"), learning_rate_curve=_points(combo, "lr"),
        grad_norm_curve=_points(combo, "grad_norm"), throughput_curve=_points(combo, "tflops_per_gpu"),
        tokens_curve=_points(combo, "tokens_per_s_per_gpu"), step_time_curve=_points(combo, "step_time_ms"),
        predicted=_predicted(combo, capacity),
        findings=list(combo.findings),
        job=DeckJob(**combo.job.model_dump(exclude={"logs"})) if combo.job else None,
        log_files=[link.href for link in links], log_tail=list(combo.log_tail), duration_s=combo.duration_s)


def _cell_subtitle(combo: ComboResult, gpu: str) -> str:
    held = combo.layout
    layout = f"TP={held.tp},PP={held.pp},CP={held.cp},EP={held.ep}"
    if held.vpp:
        layout += f",VPP={held.vpp}"
    return f"{combo.backend}, {combo.nodes} x {combo.gpus_per_node} {per_node_unit(gpu)}, {layout}"


def _points(combo: ComboResult, name: str) -> list[Point]:
    return measures.finite_points(measures.curve(combo, name))


def _predicted(combo: ComboResult, capacity: float | None) -> DeckPredicted | None:
    if combo.predicted is None:
        return None
    comparisons = [DeckComparison(quantity=check.quantity.key, label=check.quantity.label, unit=check.quantity.unit,
                                  predicted=check.predicted, measured=check.measured, error_pct=check.error_pct)
                   for check in measures.prediction_checks(combo, capacity) if check.predicted is not None]
    predicted = combo.predicted
    return DeckPredicted(note=predicted.note, comparisons=comparisons, device=predicted.device,
                         components_ms=components_ms(predicted) if predicted.components_ms else {},
                         timers_ms=dict(combo.timers_ms), uncalibrated_step_time_ms=predicted.uncalibrated_step_time_ms,
                         calibration=predicted.calibration, calibration_runs=list(predicted.calibration_runs),
                         band_pct=predicted.band_pct, departure=measures.departure_sentence(combo))


RESULTS_HEADERS = ["Cell", "Status", "Nodes", "MBS", "GBS", "Precision", "TFLOP/s/GPU", "Tokens/s/GPU",
                   "Step time (ms)", "Memory (GiB)", "LM loss", "Reason"]


def results_rows(result: SuiteResult, capacity: float | None) -> list[list[str]]:
    """One display row per combo under RESULTS_HEADERS (the HTML and the deck show the same table)."""
    rows = []
    for combo in result.combos:
        values = [measures.measured(combo, q, capacity) for q in (measures.TFLOPS_PER_GPU,
                  measures.TOKENS_PER_S_PER_GPU, measures.STEP_TIME_MS, measures.MEMORY_GIB, measures.LM_LOSS)]
        rows.append([combo.key, combo.verdict.value, str(combo.nodes), _text(combo.layout.mbs), _text(combo.gbs),
                     combo.precision or "-", *(format_number(value) for value in values), combo.reason])
    return rows


def _results_table(result: SuiteResult, capacity: float | None) -> DeckResultsTable:
    return DeckResultsTable(headers=list(RESULTS_HEADERS), rows=results_rows(result, capacity))


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_number(value: float | None) -> str:
    """A measured number for display: 3 significant digits past the point for small values, grouped for large."""
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _summary(result: SuiteResult) -> DeckSummary:
    verdicts = [combo.verdict for combo in result.combos]
    not_started = len(result.not_started())
    # a sweep by the cells it was to run: one stopped after its first combo is still a sweep
    return DeckSummary(mode="sweep" if len(verdicts) + not_started > 1 else "single", total_cells=len(verdicts),
                       passed=verdicts.count(Verdict.PASS), failed=verdicts.count(Verdict.FAIL),
                       recorded=verdicts.count(Verdict.RECORD), not_run=verdicts.count(Verdict.SKIPPED),
                       interrupted=verdicts.count(Verdict.INTERRUPTED), not_started=not_started)


# ---- the JSON Schema -----------------------------------------------------------------------------------------

def run_deck_json_schema() -> dict[str, object]:
    """The deck's JSON Schema (draft 2020-12), derived from the models above."""
    schema = RunDeck.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema,
            "description": "megatron_run_deck.json as megapilot writes it: CVS Megatron Run Deck keys where they "
                           "mean the same thing, plus predicted, regressions and findings."}


def shipped_schema_text() -> str:
    """The schema file shipped in the package (what users validate decks against)."""
    return resources.files("megapilot.report").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")


def schema_file_text() -> str:
    """What `schema/run_deck.schema.json` should hold: the derived schema, pretty-printed."""
    return json.dumps(run_deck_json_schema(), indent=2) + "\n"


def write_schema_file() -> Path:
    """Regenerate the shipped schema after changing the models (the tests say when it is due)."""
    target = Path(__file__).with_name("schema") / "run_deck.schema.json"
    target.parent.mkdir(exist_ok=True)
    target.write_text(schema_file_text(), encoding="utf-8")
    return target


def deck_json(deck: RunDeck) -> str:
    return deck.model_dump_json(indent=2) + "\n"


__all__ = [
    "RESULTS_HEADERS", "RUN_DECK_NAME", "RUN_DECK_SCHEMA_VERSION", "DeckCell", "DeckMetric", "RunDeck",
    "build_run_deck", "deck_json", "deck_metric", "format_number", "metric_label", "results_rows", "run_card_rows",
    "run_deck_json_schema", "schema_file_text", "shipped_schema_text", "write_schema_file",
]
