"""The token-budget options of `estimate`, `plan` and `script` (`--tokens 15.6T`, phases, batch warm-up, price,
failure inputs), declared once as the fields of `BudgetFlags`, and the budget's table.

Their meaning is `megapilot.estimate.budget` and `megapilot.estimate.goodput`; this module only reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from megapilot.cli.layout_options import _flag_options
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.estimate.budget import BudgetRequest, TimeToTrain
    from megapilot.plan.budget import BudgetedPlan
    from megapilot.spec import GPUSpec, SavedPlan


@dataclass(frozen=True)
class RunBudgetFlags:
    """The run's budget; nothing given = no budget (the command answers for one step). `script` takes these (its
    own `--train-iters` sets the steps); `estimate` and `plan` take `BudgetFlags`, with `--train-iters` too."""

    tokens: Annotated[str | None, typer.Option(
        metavar="COUNT",
        help="Token budget, e.g. 15.6T (K, M, B, T): prints days, GPU-hours, energy, cost and goodput.")] = None
    phase: Annotated[list[str] | None, typer.Option(
        metavar="KEY=VALUE,...",
        help="The last tokens of the budget at another shape, repeatable: tokens=800B,seq_len=131072,cp=16 "
             "(keys: tokens, seq_len, gbs, tp, pp, vpp, cp, mbs).")] = None
    rampup_batch_size: Annotated[tuple[int, int, int] | None, typer.Option(
        help="Batch warm-up as Megatron's: START INCREMENT SAMPLES.")] = None
    cost_per_gpu_hour: Annotated[float | None, typer.Option(help="Price of one GPU-hour, for the cost.")] = None
    failures_per_gpu_hour: Annotated[float | None, typer.Option(
        help="Interruptions per GPU-hour (default 1.97e-5: Llama 3's 419 in 54 days on 16,384 H100s; 0 = none).")] \
        = None
    failures_from_history: Annotated[bool, typer.Option(
        "--failures-from-history", help="Learn the failure rate from the run history's failed and hung jobs on this "
        "GPU (at least 1,000 GPU-hours; else the default, said so).")] = False
    checkpoint_gbps: Annotated[float | None, typer.Option(
        help="Storage bandwidth for checkpoints, GB/s aggregate (default: Llama 3's 2 TB/s for 16,384 GPUs, "
             "pro rata).")] = None
    restart_min: Annotated[float | None, typer.Option(
        help="Minutes to restart after an interruption (default 10, an assumption).")] = None
    repair_h: Annotated[float | None, typer.Option(
        help="Hours to repair a failed node, for the spare-node advice (default 24, an assumption).")] = None

    @property
    def given(self) -> bool:
        return any(getattr(self, item.name) not in (None, item.default) for item in fields(self))

    def request(self, train_iters: int | None = None, gpu: GPUSpec | None = None) -> BudgetRequest | None:
        """The budget asked for, or None when no budget option was given (a failure option alone is refused);
        `gpu`: whose history `--failures-from-history` reads."""
        from megapilot.estimate.budget import BatchRampup, BudgetRequest, parse_phase, parse_tokens
        from megapilot.estimate.goodput import FailureModel

        iters = getattr(self, "train_iters", None) if train_iters is None else train_iters
        if self.tokens is None and iters is None:
            if self.given:
                raise MegapilotError("the budget options need a budget", field="tokens",
                                     fix="add --tokens 15.6T (or --train-iters N)")
            return None
        if self.tokens is not None and iters is not None:
            raise MegapilotError("--tokens and --train-iters both give the budget", field="tokens",
                                 fix="pass one of them")
        # named as typed: --restart-min is minutes here and seconds in the failure model
        for flag, value, most in (("--restart-min", self.restart_min, MOST_RESTART_MIN),
                                  ("--repair-h", self.repair_h, MOST_REPAIR_H),
                                  ("--failures-per-gpu-hour", self.failures_per_gpu_hour, math.inf)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise MegapilotError(f"must be a finite number >= 0, not {value}", field=flag[2:].replace("-", "_"),
                                     fix=f"pass {flag} 0 or more")
            if value is not None and value > most:
                raise MegapilotError(f"{value:g} is more than {most:,g} ({MOST_SAYS[flag]})",
                                     field=flag[2:].replace("-", "_"), fix=f"pass {flag} of at most {most:,g}")
        changes: dict[str, Any] = {"failures_per_gpu_hour": self.failures_per_gpu_hour, "repair_h": self.repair_h,
                                   "restart_s": None if self.restart_min is None else self.restart_min * 60}
        if self.failures_per_gpu_hour is not None:
            changes["source"] = "given (--failures-per-gpu-hour)"
        if self.failures_from_history:
            if self.failures_per_gpu_hour is not None:
                raise MegapilotError("--failures-from-history and --failures-per-gpu-hour both set the rate",
                                     field="failures_per_gpu_hour", fix="pass one of them")
            changes |= _history_rate(gpu)
        failure = replace(FailureModel(), **{k: v for k, v in changes.items() if v is not None})
        return BudgetRequest(
            tokens=None if self.tokens is None else parse_tokens(self.tokens), train_iters=iters,
            phases=tuple(parse_phase(text) for text in self.phase or ()),
            rampup=BatchRampup(*self.rampup_batch_size) if self.rampup_batch_size else None,
            cost_per_gpu_hour=self.cost_per_gpu_hour, failure=failure, checkpoint_gbps=self.checkpoint_gbps)


@dataclass(frozen=True)
class BudgetFlags(RunBudgetFlags):
    """The budget options with `--train-iters` (the budget as steps)."""

    train_iters: Annotated[int | None, typer.Option(help="The budget as steps at the GBS (instead of --tokens).")] \
        = None


def _history_rate(gpu: GPUSpec | None) -> dict[str, Any]:
    """The failure rate and its source from the run history's jobs on this GPU: every FAILED or HUNG job an
    interruption, every job's duration x GPUs its exposure."""
    from megapilot.estimate.goodput import failure_model_from_history
    from megapilot.store.history import open_history

    names = {gpu.name.lower(), gpu.alias} if gpu is not None else set()
    interruptions, gpu_hours, runs = 0, 0.0, 0
    with open_history(read_only=True) as history:
        for row in history.runs(limit=HISTORY_RUNS_READ):
            if row.gpu.lower() not in names:
                continue
            runs += 1
            for combo in history.run(row.run_id).combos:
                gpu_hours += combo.duration_s * combo.nodes * combo.gpus_per_node / 3600
                interruptions += combo.job_state in ("FAILED", "HUNG")
    model, _learned = failure_model_from_history(interruptions, gpu_hours, runs)
    return {"failures_per_gpu_hour": model.failures_per_gpu_hour, "source": model.source}


HISTORY_RUNS_READ = 1000  # the newest runs the history rate reads
# Beyond these a figure is a slip of units, not a cluster: 1e308 minutes overflowed to an internal "restart_s"
# error, and 1e308 repair hours printed a spare-node count of 300 digits.
MOST_RESTART_MIN = 7 * 24 * 60
MOST_REPAIR_H = 365 * 24
MOST_SAYS = {"--restart-min": "a week: a job that waits longer to restart is stopped, not restarting",
             "--repair-h": "a year: a node out longer is replaced, not repaired"}
NO_BUDGET = BudgetFlags()
NO_RUN_BUDGET = RunBudgetFlags()


def budget_options(cls: type[RunBudgetFlags] = BudgetFlags) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Replace a command's `budget: BudgetFlags` parameter by the options of `cls`, in field order."""
    return _flag_options(cls, "budget", "", None)  # type: ignore[arg-type]  # any flag dataclass serves


def print_budget(run: TimeToTrain, title: str = "") -> None:
    """The whole run: its pieces, the headline figures with their bands, and goodput."""
    from rich.markup import escape
    from rich.table import Table

    from megapilot.cli.common import console
    from megapilot.estimate.units import format_duration

    table = Table(title=title or f"time to train {run.tokens / 1e9:,.0f} B tokens on {run.gpus:,} GPUs")
    for column in ("piece", "tokens", "steps", "step", "days"):
        table.add_column(column, justify="left" if column == "piece" else "right")
    for s in run.segments:
        name = s.name + (f" ({s.layout_label})" if s.layout_label else "") + ("" if s.fits else " (does not fit)")
        table.add_row(escape(name), f"{s.tokens / 1e9:,.1f} B", f"{s.iterations:,.0f}", format_duration(s.step_time_s),
                      f"{s.seconds / 86400:,.2f}")
    console.print(table)
    g = run.goodput
    if g.expected_interruptions:
        lines = [f"failure-free {run.compute_s / 86400:,.1f} days; with failures {run.summary()}"]
    else:  # a rate of 0: nothing is lost to failures, and what was assumed is said, not priced as failures
        lines = [f"{run.summary()}; no interruptions assumed ({g.failure.source}): no checkpoint priced, "
                 "effective training time 100.0 %"]
    energy, cost = run.energy_mwh, run.cost
    bands = [f"days {run.days.low:,.1f}-{run.days.high:,.1f}",
             f"GPU-hours {run.gpu_hours.low / 1e6:,.3g}-{run.gpu_hours.high / 1e6:,.3g} M"]
    if energy is not None:
        bands.append(f"energy {energy.low:,.0f}-{energy.high:,.0f} MWh (GPUs at TDP {run.tdp_w:,.0f} W; no PUE)")
    if cost is not None:
        bands.append(f"cost ${cost.low:,.0f}-${cost.high:,.0f}")
    lines.append("bands: " + "; ".join(bands))
    if g.expected_interruptions:
        interval = f"{format_duration(g.checkpoint_interval_s)}" + (
            f" = every {g.checkpoint_interval_iters:,} steps" if g.checkpoint_interval_iters else "")
        main, main_interval = run.main, run.main_save_interval()
        if main is not None and main_interval is not None and main_interval != g.checkpoint_interval_iters:
            # a script trains the main phase alone: its --save-interval counts those steps, not the run's mean
            interval += (f" of the run's mean {format_duration(run.compute_s / run.iterations)} step; "
                         f"--save-interval {main_interval:,} in the main phase's {format_duration(main.step_time_s)} "
                         "steps")
        lines += [
            f"goodput: {_count(g.expected_interruptions)} expected interruptions (one every {g.mtbf_s / 3600:.3g} h; "
            f"{g.failure.source}); effective training time {g.effective_training_time_pct:.1f} %",
            f"checkpoint every {interval} (Daly's optimum for a {format_duration(g.checkpoint.save_s)} save, "
            f"{g.checkpoint.source}); lost: restarts {g.lost_restart_s / 86400:.1f} days, recomputation "
            f"{g.lost_recompute_s / 86400:.1f} days, saves {g.checkpoint_overhead_s / 86400:.1f} days",
            f"spare nodes: {g.spares.recommended} held back ({g.spares.held_share:.1%} of the GPUs) cover the "
            "repairs (the days above assume them, not in the GPU-hours above); without them, waits for repair "
            f"add {g.spares.wait_without_s / 86400:,.1f} days "
            f"({g.spares.wait_without_share:.1%}; {_count(g.spares.hardware_interruptions)} hardware interruptions x "
            f"{g.failure.repair_h:g} h); cheaper: {g.spares.cheaper}",
        ]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _count(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def budget_json(run: TimeToTrain | None) -> dict[str, Any]:
    """`{"budget": ...}` to merge into a command's JSON (empty without a budget)."""
    return {} if run is None else {"budget": run.to_json()}


def print_budget_ranking(budgeted: BudgetedPlan) -> None:
    """The candidates by time to train, and the first one's whole run."""
    from rich.table import Table

    from megapilot.cli.common import console
    from megapilot.plan.reasons import layout_label

    run = budgeted.runs[0]
    table = Table(title=f"ranked by time to train {run.tokens / 1e9:,.0f} B tokens "
                        f"(bands {run.band.words()})")
    for column in ("#", "layout", "days", "M GPU-hours", "MWh", "cost", "goodput %"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for index, (cand, r) in enumerate(zip(budgeted.plan.candidates, budgeted.runs, strict=True), start=1):
        energy, cost = r.energy_mwh, r.cost
        table.add_row(str(index), layout_label(cand.parallel), f"{r.days.value:,.1f}",
                      f"{r.gpu_hours.value / 1e6:,.3g}", "-" if energy is None else f"{energy.value:,.0f}",
                      "-" if cost is None else f"${cost.value:,.0f}", f"{r.goodput.effective_training_time_pct:.1f}")
    console.print(table)
    print_budget(run, title=f"#1: {layout_label(budgeted.plan.candidates[0].parallel)}")


def schedule_from_budget(budget: RunBudgetFlags, plan: SavedPlan, train_iters: int | None,
                         save_interval: int | None, notes: list[str], *,
                         saving: bool = True) -> tuple[int | None, int | None]:
    """`script`'s --train-iters and --save-interval from a budget: the steps of the budget's main phase, and Daly's
    checkpoint interval in the main phase's steps when the run saves (each only where not given; no budget option
    given: both as they were)."""
    if budget.tokens is not None and train_iters is not None:  # the steps written would not train the tokens asked
        raise MegapilotError("--tokens and --train-iters both give the run's length", field="tokens",
                             fix="pass one of them (--tokens sets --train-iters from the budget)")
    request = budget.request(gpu=plan.cluster.gpu) if budget.tokens is not None or budget.given else None
    if request is None:
        return train_iters, save_interval
    from megapilot.estimate.units import format_duration
    from megapilot.plan.budget import run_budget

    run = run_budget(request, plan.model, plan.cluster, plan.training, plan.parallel)
    main = run.main
    if main is None:  # the warm-up's SAMPLES take the budget: no steady step for --train-iters to count
        warm_up = sum(s.tokens for s in run.segments if s.name.startswith("batch warm-up"))
        raise MegapilotError(f"the batch warm-up trains all {warm_up / 1e9:,.3g} B tokens of the budget before the "
                             f"batch reaches GBS {plan.training.global_batch_size:,}", field="rampup_batch_size",
                             fix="give --tokens beyond the warm-up's SAMPLES x seq, or fewer warm-up SAMPLES")
    if train_iters is None:
        train_iters = main.iterations  # estimate's own count: whole steps, the last part step rounded up
        also = "; the phases and batch warm-up need their own scripts" if len(run.segments) > 1 else ""
        notes.append(f"--train-iters {train_iters:,}: the budget's main phase, {main.tokens / 1e9:,.1f} B tokens "
                     f"at GBS {main.shape.gbs:,} x seq {main.shape.seq_len:,}{also}")
    g = run.goodput
    if save_interval is None and (main_interval := run.main_save_interval()) is not None and saving:
        save_interval = main_interval
        notes.append(f"--save-interval {save_interval:,}: Daly's optimal checkpoint interval "
                     f"({format_duration(save_interval * main.step_time_s)}, in the main phase's "
                     f"{format_duration(main.step_time_s)} steps) for a {format_duration(g.checkpoint.save_s)} save "
                     f"and one interruption every {g.mtbf_s / 3600:.3g} h; effective training time "
                     f"{g.effective_training_time_pct:.1f} %")
    return train_iters, save_interval
