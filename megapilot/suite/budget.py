"""A suite config's `budget:` (optional): the run's measured step time and checkpoint save/load times, projected
onto the token budget - time to train, GPU-hours, energy, cost and goodput (`megapilot.estimate.budget`).

    budget:
      tokens: 15.6T            # required; K, M, B, T suffixes
      cost_per_gpu_hour: 2.5   # optional; the rest default as `megapilot estimate --tokens` states them
      failures_per_gpu_hour: 1.97e-5
      checkpoint_gbps: 200     # only used when the checkpoint stage measured no save time
      restart_min: 10
      repair_h: 24

The step time is the first passing combo's measured mean (its GBS, sequence length and GPUs are the run's);
the band is that combo's step-time spread (coefficient of variation), not an estimate's error. Checkpoint
times are the checkpoint stage's `checkpoint.save_s` / `checkpoint.load_s` when it ran, else the estimated size
over the bandwidth. The projection never fails the suite: a budget it cannot project says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.estimate.budget import TimeToTrain
    from megapilot.spec import GPUSpec, ModelSpec
    from megapilot.suite.results import ComboResult, SuiteResult


class BudgetConfig(BaseModel):
    """The suite config's `budget:` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: float = Field(description="Token budget (15.6T, 800B, or a number).")
    cost_per_gpu_hour: float | None = Field(default=None, ge=0)
    failures_per_gpu_hour: float | None = Field(default=None, ge=0)
    checkpoint_gbps: float | None = Field(default=None, gt=0)
    restart_min: float | None = Field(default=None, ge=0)
    repair_h: float | None = Field(default=None, ge=0)

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: object) -> float:
        from megapilot.estimate.budget import parse_tokens

        try:
            return parse_tokens(value, "budget.tokens")  # type: ignore[arg-type]  # parse_tokens refuses the rest
        except MegapilotError as exc:
            raise ValueError(f"{exc.problem} ({exc.fix})") from None


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
    g = run.goodput
    notes = [f"step time: combo {combo.key}, measured mean {run.segments[0].step_time_s:.4g} s "
             f"(GBS {combo.gbs}, seq {combo.seq_length}, {run.gpus} GPUs); band: {run.band_source}",
             f"checkpoint: {g.checkpoint.source}", f"failures: {g.failure.source}"]
    energy, cost = run.energy_mwh, run.cost
    return BudgetProjection(
        tokens=budget.tokens, combo=combo.key, gpus=run.gpus, step_time_s=run.segments[0].step_time_s,
        checkpoint_save_s=g.checkpoint.save_s, checkpoint_load_s=g.checkpoint.load_s,
        checkpoint_source=g.checkpoint.source, days=run.days.value, days_band=(run.days.low, run.days.high),
        gpu_hours=run.gpu_hours.value, energy_mwh=energy.value if energy else None,
        cost=cost.value if cost else None, expected_interruptions=g.expected_interruptions,
        checkpoint_interval_s=g.checkpoint_interval_s, checkpoint_interval_iters=g.checkpoint_interval_iters,
        effective_training_time_pct=g.effective_training_time_pct, notes=notes)


def _step_ms(combo: ComboResult) -> float | None:
    return combo.actual("training.elapsed_time_per_iteration") or combo.actual("training.step_time_p50_ms")


def _run(budget: BudgetConfig, model: ModelSpec, gpu: GPUSpec | None, result: SuiteResult,
         combo: ComboResult) -> TimeToTrain:
    from megapilot.estimate.budget import BudgetRequest, Fleet, ShapeCost, time_to_train
    from megapilot.estimate.goodput import (
        DEFAULT_CHECKPOINT_GBPS_PER_GPU,
        CheckpointCost,
        FailureModel,
        checkpoint_bytes,
        estimated_checkpoint,
    )
    from megapilot.estimate.params import count_params
    from megapilot.spec.training import TrainingSpec

    step_s = (_step_ms(combo) or 0.0) / 1000
    gpus = combo.nodes * combo.gpus_per_node
    defaults = FailureModel()
    failure = FailureModel(
        failures_per_gpu_hour=defaults.failures_per_gpu_hour if budget.failures_per_gpu_hour is None
        else budget.failures_per_gpu_hour,
        source=defaults.source if budget.failures_per_gpu_hour is None else "the suite config's budget",
        restart_s=defaults.restart_s if budget.restart_min is None else budget.restart_min * 60,
        repair_h=defaults.repair_h if budget.repair_h is None else budget.repair_h)
    size = checkpoint_bytes(count_params(model).total)
    estimated = estimated_checkpoint(size, budget.checkpoint_gbps or DEFAULT_CHECKPOINT_GBPS_PER_GPU * gpus)
    save_s, load_s = _measured_checkpoint(result)
    measured = None if save_s is None else CheckpointCost(
        size, save_s, load_s if load_s is not None else save_s,
        "measured by the checkpoint stage" + ("" if load_s is not None else " (save; load taken equal)"))
    request = BudgetRequest(tokens=budget.tokens, cost_per_gpu_hour=budget.cost_per_gpu_hour, failure=failure,
                            measured_checkpoint=measured)
    training = TrainingSpec(seq_length=combo.seq_length or 1, global_batch_size=combo.gbs or 1)
    spread = combo.actual("training.step_time_cv") or 0.0
    return time_to_train(request, training, Fleet(gpus, combo.gpus_per_node, gpu.tdp_w if gpu else None),
                         lambda _shape: ShapeCost(step_s, True), checkpoint=estimated,
                         band=(spread, "the measured steps' coefficient of variation"))


def _measured_checkpoint(result: SuiteResult) -> tuple[float | None, float | None]:
    stage = next((s for s in result.stages if s.name == "checkpoint"), None)
    if stage is None:
        return None, None
    values = {row.name: row.value for row in stage.checks}
    return values.get("checkpoint.save_s"), values.get("checkpoint.load_s")
