"""A suite config's `budget:` (optional): the run's measured step time and checkpoint save/load times, projected
onto the token budget - time to train, GPU-hours, energy, cost and goodput (`megapilot.estimate.budget`).

    budget:
      tokens: 15.6T            # required; K, M, B, T suffixes
      cost_per_gpu_hour: 2.5   # optional; the rest default as `megapilot estimate --tokens` states them
      failures_per_gpu_hour: 1.97e-5
      checkpoint_gbps: 200     # only used when the checkpoint stage measured no save time
      restart_min: 10
      repair_h: 24
      phases:                  # optional; the last tokens at another shape, as `estimate --phase` takes them
        - {tokens: 100B, seq_len: 131072, cp: 16}    # or "tokens=100B,seq_len=131072,cp=16"
      rampup_batch_size: [256, 256, 1000000]         # optional; START INCREMENT SAMPLES, as --rampup-batch-size

The step time is the first passing combo's measured mean (its GBS, sequence length and GPUs are the run's);
the band is that combo's step-time spread (coefficient of variation), not an estimate's error. A phase or a
warm-up batch trains another shape, which the run did not measure: its step is the measured one scaled by the
estimator's ratio of that shape's step to the measured shape's (`megapilot.estimate.budget.layout_step_cost`),
so the estimator supplies only the relative cost. The phases and the warm-up are checked when the config is
read, against every sweep cell, by the same code that cuts the run into pieces (`segments_for`). Checkpoint
times are the checkpoint stage's `checkpoint.save_s` / `checkpoint.load_s` when it ran, else the estimated size
over the bandwidth. The projection never fails the suite: a budget it cannot project says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.estimate.budget import (
    PHASE_KEYS,
    BatchRampup,
    BudgetRequest,
    Fleet,
    Phase,
    Shape,
    ShapeCost,
    TimeBand,
    layout_step_cost,
    parse_phase,
    parse_tokens,
    phase_from_mapping,
    segments_for,
    time_to_train,
)
from megapilot.estimate.goodput import (
    DEFAULT_CHECKPOINT_GBPS_PER_GPU,
    CheckpointCost,
    FailureModel,
    checkpoint_bytes,
    estimated_checkpoint,
)
from megapilot.spec import ClusterSpec, LayoutPins
from megapilot.spec.training import Precision, TrainingSpec
from megapilot.suite.cells import recorded_layout

if TYPE_CHECKING:
    from megapilot.estimate.budget import StepCost, TimeToTrain
    from megapilot.spec import GPUSpec, ModelSpec
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.results import ComboResult, SuiteResult

PHASE_FIX = ("write each phase as {tokens: 100B, seq_len: 131072, cp: 16} or 'tokens=100B,seq_len=131072,cp=16' "
             f"(keys: {', '.join(PHASE_KEYS)})")
RAMPUP_FIX = "write START, INCREMENT and SAMPLES as --rampup-batch-size takes them, e.g. [256, 256, 1000000]"


class BudgetConfig(BaseModel):
    """The suite config's `budget:` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: float = Field(description="Token budget (15.6T, 800B, or a number).")
    cost_per_gpu_hour: float | None = Field(default=None, ge=0)
    failures_per_gpu_hour: float | None = Field(default=None, ge=0)
    checkpoint_gbps: float | None = Field(default=None, gt=0)
    restart_min: float | None = Field(default=None, ge=0)
    repair_h: float | None = Field(default=None, ge=0)
    phases: tuple[Phase, ...] = Field(
        default=(), description="The last tokens of the budget at another shape, as `--phase` takes them.")
    rampup_batch_size: tuple[int, int, int] | None = Field(
        default=None, description="Batch warm-up as Megatron's --rampup-batch-size: [START, INCREMENT, SAMPLES].")

    @property
    def rampup(self) -> BatchRampup | None:
        return None if self.rampup_batch_size is None else BatchRampup(*self.rampup_batch_size)

    @field_validator("phases", mode="before")
    @classmethod
    def _phases(cls, value: object) -> tuple[Phase, ...]:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise ValueError(f"{value!r} is not a list of phases ({PHASE_FIX})")
        return tuple(_phase(item, index) for index, item in enumerate(value, start=1))

    @field_validator("rampup_batch_size", mode="before")
    @classmethod
    def _rampup(cls, value: object) -> tuple[int, int, int] | None:
        if value is None:
            return None
        items = value.split() if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or len(items) != 3 or not all(_whole(item) for item in items):
            raise ValueError(f"{value!r} is not three whole numbers START INCREMENT SAMPLES ({RAMPUP_FIX})")
        start, increment, samples = (int(item) for item in items)
        if min(start, increment, samples) <= 0:  # the rest (START < GBS, the increment's steps) per sweep cell
            raise ValueError(f"START, INCREMENT and SAMPLES must be > 0, not {value!r} ({RAMPUP_FIX})")
        return start, increment, samples

    @model_validator(mode="after")
    def _phases_leave_a_main_run(self) -> BudgetConfig:
        phase_tokens = sum(phase.tokens for phase in self.phases)
        if self.phases and phase_tokens >= self.tokens:
            raise ValueError(f"the phases' {phase_tokens:.4g} tokens leave none of the budget's {self.tokens:.4g} "
                             "(phase tokens are part of budget.tokens: give fewer, or a larger budget)")
        return self

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: object) -> float:
        try:
            return parse_tokens(value, "budget.tokens")  # type: ignore[arg-type]  # parse_tokens refuses the rest
        except MegapilotError as exc:
            raise ValueError(f"{exc.problem} ({exc.fix})") from None


def _phase(item: object, index: int) -> Phase:
    """One `budget.phases` item, read as `--phase` is (`megapilot.estimate.budget.phase_from_mapping`)."""
    if isinstance(item, Phase):
        return item
    field_name = f"budget.phases[{index - 1}]"
    try:
        if isinstance(item, str):
            return parse_phase(item, field_name)
        if isinstance(item, Mapping):  # a key written as null is a key not given (a dumped config reads back)
            return phase_from_mapping({str(k): v for k, v in item.items() if v is not None}, field_name)
    except MegapilotError as exc:
        raise ValueError(f"phase {index}: {exc.problem} ({PHASE_FIX})") from None
    raise ValueError(f"phase {index}: {item!r} is not a phase ({PHASE_FIX})")


def _whole(item: object) -> bool:
    if isinstance(item, bool):
        return False
    if isinstance(item, int):
        return True
    if isinstance(item, float):
        return item.is_integer()
    return isinstance(item, str) and item.strip().lstrip("-").isdigit()


class BudgetSegment(BaseModel):
    """One piece of the projected run (`megapilot.estimate.budget.Segment`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="main, batch warm-up <GBS>, or phase <n>: <what changes>.")
    tokens: float = Field(description="Tokens trained in this piece.")
    seq_len: int = Field(description="Its sequence length, tokens.")
    gbs: int = Field(description="Its global batch size, sequences.")
    iterations: int = Field(description="Its steps: tokens / (seq_len x gbs), rounded up to whole steps (Megatron "
                                        "trains whole steps, and a budget is the least to train); a batch warm-up's "
                                        "as Megatron's ramp-up runs them, from the samples consumed before each step.")
    step_time_s: float = Field(description="Measured (main), or measured x the estimator's ratio (other shapes).")
    days: float = Field(description="Failure-free wall-clock days of this piece.")
    fits: bool = Field(description="False: the estimate says this shape does not fit in GPU memory.")

    @field_validator("iterations", mode="before")
    @classmethod
    def _whole_steps_of_earlier_results(cls, value: object) -> object:
        """suite.json of an earlier run (read by `suite report` and `suite run --resume`) may hold a piece's steps
        as a fraction, tokens / (seq_len x gbs) as they were counted then: read as the whole steps counted now,
        the part step rounded up. A count already whole reads as it is, and anything else is left to the int."""
        if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
            return math.ceil(value)
        return value


class BudgetProjection(BaseModel):
    """What the run measured, projected onto the budget: the report's section and the run deck's `budget`."""

    model_config = ConfigDict(extra="forbid")

    tokens: float = Field(description="The budget, tokens.")
    combo: str | None = Field(default=None, description="The combo whose step time was projected.")
    gpus: int | None = Field(default=None, description="GPUs the combo ran on (the projection's fleet).")
    step_time_s: float | None = Field(default=None, description="The combo's measured mean step time, seconds.")
    checkpoint_save_s: float | None = Field(default=None, description="Checkpoint save time used, seconds.")
    checkpoint_load_s: float | None = Field(default=None, description="Checkpoint restore time used, seconds.")
    checkpoint_source: str = Field(default="", description="Measured by the checkpoint stage, or estimated.")
    days: float | None = Field(default=None, description="Expected wall-clock days, failures included.")
    days_band: tuple[float, float] | None = Field(default=None, description="Low and high days (step-time spread).")
    gpu_hours: float | None = Field(default=None, description="Expected GPU-hours, failures included.")
    energy_mwh: float | None = Field(default=None, description="GPU-hours x the GPU's TDP, MWh (null: no TDP).")
    cost: float | None = Field(default=None, description="GPU-hours x the config's price (null: no price).")
    expected_interruptions: float | None = Field(default=None, description="Interruptions expected over the run.")
    checkpoint_interval_s: float | None = Field(default=None, description="Daly's optimal checkpoint interval, s.")
    checkpoint_interval_iters: int | None = Field(default=None, description="That interval in steps.")
    effective_training_time_pct: float | None = Field(
        default=None, description="Failure-free training time over the expected elapsed time, percent.")
    segments: list[BudgetSegment] = Field(
        default_factory=list, description="The run in pieces: batch warm-up steps, the main run, each phase.")
    notes: list[str] = Field(default_factory=list, description="Where each input came from, or why no projection.")


def project_budget(budget: BudgetConfig | None, model: ModelSpec, gpu: GPUSpec | None,
                   result: SuiteResult) -> BudgetProjection | None:
    """The projection for a suite with a budget (None without one); never raises for missing measurements."""
    if budget is None:
        return None
    combo = next((c for c in result.combos if c.key != "smoke" and c.verdict.value == "PASS"
                  and _step_ms(c) is not None and c.gbs and c.seq_length), None)
    if combo is None:
        return BudgetProjection(tokens=budget.tokens, notes=["no passing combo measured a step time: nothing to "
                                                             "project"])
    try:
        run = _run(budget, model, gpu, result, combo)
    except (MegapilotError, ValueError) as exc:  # a projection never costs the suite its result
        return BudgetProjection(tokens=budget.tokens, combo=combo.key, notes=[f"no projection: {exc}"])
    g, step_s = run.goodput, _step_s(combo)
    notes = [f"step time: combo {combo.key}, measured mean {step_s:.4g} s "
             f"(GBS {combo.gbs}, seq {combo.seq_length}, {run.gpus} GPUs); band: {run.band.source}",
             f"checkpoint: {g.checkpoint.source}", f"failures: {g.failure.source}"]
    if len(run.segments) > 1:
        notes.append("phases and batch warm-up: the measured step x the estimator's ratio of each shape's step to "
                     "the measured shape's")
    notes += [f"{s.name}: does not fit in GPU memory by the estimate" for s in run.segments if not s.fits]
    energy, cost = run.energy_mwh, run.cost
    return BudgetProjection(
        tokens=budget.tokens, combo=combo.key, gpus=run.gpus, step_time_s=step_s,
        checkpoint_save_s=g.checkpoint.save_s, checkpoint_load_s=g.checkpoint.load_s,
        checkpoint_source=g.checkpoint.source, days=run.days.value, days_band=(run.days.low, run.days.high),
        gpu_hours=run.gpu_hours.value, energy_mwh=energy.value if energy else None,
        cost=cost.value if cost else None, expected_interruptions=g.expected_interruptions,
        checkpoint_interval_s=g.checkpoint_interval_s, checkpoint_interval_iters=g.checkpoint_interval_iters,
        effective_training_time_pct=g.effective_training_time_pct, notes=notes,
        segments=[BudgetSegment(name=s.name, tokens=s.tokens, seq_len=s.shape.seq_len, gbs=s.shape.gbs,
                                iterations=s.iterations, step_time_s=s.step_time_s, days=s.seconds / 86400,
                                fits=s.fits) for s in run.segments])


def _step_ms(combo: ComboResult) -> float | None:
    return combo.actual("training.elapsed_time_per_iteration") or combo.actual("training.step_time_p50_ms")


def _step_s(combo: ComboResult) -> float:
    return (_step_ms(combo) or 0.0) / 1000


def _run(budget: BudgetConfig, model: ModelSpec, gpu: GPUSpec | None, result: SuiteResult,
         combo: ComboResult) -> TimeToTrain:
    step_s = _step_s(combo)
    gpus = combo.nodes * combo.gpus_per_node
    defaults = FailureModel()
    failure = FailureModel(
        failures_per_gpu_hour=defaults.failures_per_gpu_hour if budget.failures_per_gpu_hour is None
        else budget.failures_per_gpu_hour,
        source=defaults.source if budget.failures_per_gpu_hour is None else "the suite config's budget",
        restart_s=defaults.restart_s if budget.restart_min is None else budget.restart_min * 60,
        repair_h=defaults.repair_h if budget.repair_h is None else budget.repair_h)
    size = checkpoint_bytes(model)
    estimated = estimated_checkpoint(size, budget.checkpoint_gbps or DEFAULT_CHECKPOINT_GBPS_PER_GPU * gpus)
    save_s, load_s = _measured_checkpoint(result)
    measured = None if save_s is None else CheckpointCost(
        size, save_s, load_s if load_s is not None else save_s,
        "measured by the checkpoint stage" + ("" if load_s is not None else " (save; load taken equal)"))
    request = BudgetRequest(tokens=budget.tokens, phases=budget.phases, rampup=budget.rampup,
                            cost_per_gpu_hour=budget.cost_per_gpu_hour, failure=failure, measured_checkpoint=measured)
    training = TrainingSpec(seq_length=combo.seq_length or 1, global_batch_size=combo.gbs or 1)
    spread = combo.actual("training.step_time_cv") or 0.0
    return time_to_train(request, training, Fleet(gpus, combo.gpus_per_node, gpu.tdp_w if gpu else None),
                         _measured_cost(budget, model, gpu, combo, step_s), checkpoint=estimated,
                         band=TimeBand.symmetric(spread, "the measured steps' coefficient of variation"))


def _measured_checkpoint(result: SuiteResult) -> tuple[float | None, float | None]:
    stage = next((s for s in result.stages if s.name == "checkpoint"), None)
    if stage is None:
        return None, None
    values = {row.name: row.value for row in stage.checks}
    return values.get("checkpoint.save_s"), values.get("checkpoint.load_s")


class _Shape(Protocol):
    """What a sweep cell and a finished combo both say of their shape."""

    @property
    def gbs(self) -> int | None: ...
    @property
    def seq_length(self) -> int | None: ...
    @property
    def precision(self) -> str | None: ...


def _measured_cost(budget: BudgetConfig, model: ModelSpec, gpu: GPUSpec | None, combo: ComboResult,
                   step_s: float) -> StepCost:
    """The measured step for the measured shape; another shape (a phase, a warm-up batch) scaled by the
    estimator's ratio of its step to the measured shape's. Without phases or a warm-up the estimator is not asked."""
    if not budget.phases and budget.rampup is None:
        return lambda _shape: ShapeCost(step_s, True)
    estimated = _estimated_cost(model, gpu, combo.layout, combo, combo.nodes, combo.gpus_per_node)
    measured_shape = Shape(combo.seq_length or 1, combo.gbs or 1)
    scale = step_s / estimated(measured_shape).step_time_s

    def cost(shape: Shape) -> ShapeCost:
        if shape == measured_shape:
            return ShapeCost(step_s, True)
        found = estimated(shape)
        return ShapeCost(found.step_time_s * scale, found.fits, found.layout_label)

    return cost


def _estimated_cost(model: ModelSpec, gpu: GPUSpec | None, layout: LayoutPins, shape: _Shape, nodes: int,
                    gpus_per_node: int) -> StepCost:
    """The estimator's StepCost for a cell's or combo's layout (a CPU suite: the stand-in GPU the render uses)."""
    from megapilot.suite.render import CPU_STAND_IN_GPU  # cycle: suite.render imports config, which imports budget

    cluster = ClusterSpec(gpu=gpu or get_gpu(CPU_STAND_IN_GPU), num_nodes=nodes, gpus_per_node=gpus_per_node)
    precisions: tuple[Precision, ...] = get_args(Precision)
    ran: Precision = next((p for p in precisions if gpu is not None and p == (shape.precision or "").lower()), "bf16")
    training = TrainingSpec(seq_length=shape.seq_length or 1, global_batch_size=shape.gbs or 1, precision=ran)
    # what a combo records of its layout, for a cell too: both are estimated alike (the rest at ParallelConfig's
    # defaults)
    parallel = recorded_layout(layout).config(cluster.world_size, sequence_parallel=layout.tp > 1)
    return layout_step_cost(model, cluster, training, parallel)


def budget_problems(suite: LoadedSuite) -> list[tuple[str, str, str]]:
    """(path, problem, fix) for the budget's phases and warm-up that a sweep cell's run could not be cut into, by
    the code that cuts the projected run (`segments_for`): a warm-up START not below the cell's GBS or not a
    step of INCREMENT below it, a phase layout that does not divide the GPUs, a phase shape the estimator refuses.
    A cell whose own layout the estimator cannot cost is left to the projection to say."""
    budget = suite.config.budget
    if budget is None or (not budget.phases and budget.rampup is None):
        return []
    # the warm-up and the phases cut separately, so that a shape the estimator refuses is pinned on the right key
    requests = {"budget.rampup_batch_size": BudgetRequest(tokens=budget.tokens, rampup=budget.rampup),
                "budget.phases": BudgetRequest(tokens=budget.tokens, phases=budget.phases)}
    problems: dict[str, tuple[str, str, str]] = {}
    for cell in (c for c in suite.cells if not c.skip_reason):
        try:
            cost = _estimated_cost(suite.model, suite.gpu, cell.layout, cell, suite.nodes, suite.gpus_per_node)
            cost(Shape(cell.seq_length, cell.gbs))
        except (MegapilotError, ValueError):
            continue  # the cell's own layout: its render or the projection says what is wrong with it
        training = TrainingSpec(seq_length=cell.seq_length, global_batch_size=cell.gbs)
        for path, request in requests.items():
            try:
                segments_for(request, training, cost)
            except MegapilotError as exc:
                fix = RAMPUP_FIX if "--rampup-batch-size" in (exc.fix or "") else exc.fix  # not the CLI's words
                problems.setdefault(path, (path, f"{exc.problem} (combo {cell.key})", fix or ""))
    return list(problems.values())
