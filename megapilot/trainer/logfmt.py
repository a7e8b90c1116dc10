"""Megatron-LM's training-log lines, formatted exactly as `pretrain_gpt.py` prints them (core ≥ v0.16).

Pure string formatting (no torch) so the formats are unit-tested against the reference layout and
the project's own log parser reads the trainer's output and Megatron-LM's alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


def timestamp(now: datetime | None = None) -> str:
    """`2026-01-01 00:10:00.123456`: the core ≥ v0.16 timestamp with microseconds."""
    return (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")


@dataclass(frozen=True)
class IterationStats:
    """The values of one iteration line (averages over the last log interval)."""

    iteration: int
    train_iters: int
    consumed_samples: int
    elapsed_ms_per_iteration: float
    throughput_tflops_per_gpu: float | None
    learning_rate: float | None
    global_batch_size: int
    losses: dict[str, float]
    loss_scale: float
    grad_norm: float | None
    skipped_iterations: int
    nan_iterations: int
    #: MoE router metrics (e.g. load_balancing_loss), printed after the losses with 2 decimals.
    moe_metrics: dict[str, float] = field(default_factory=dict)


def iteration_line(stats: IterationStats, now: datetime | None = None) -> str:
    """The per-iteration line of Megatron-LM's `training_log` (printed by the last rank)."""
    parts = [f" [{timestamp(now)}] iteration {stats.iteration:8d}/{stats.train_iters:8d} |",
             f" consumed samples: {stats.consumed_samples:12d} |",
             f" elapsed time per iteration (ms): {stats.elapsed_ms_per_iteration:.1f} |"]
    if stats.throughput_tflops_per_gpu is not None:
        parts.append(f" throughput per GPU (TFLOP/s/GPU): {stats.throughput_tflops_per_gpu:.1f} |")
    if stats.learning_rate is not None:
        parts.append(f" learning rate: {stats.learning_rate:.6E} |")
    parts.append(f" global batch size: {stats.global_batch_size:5d} |")
    for key, value in stats.losses.items():
        if value >= 0 or math.isnan(value):
            parts.append(f" {key}: {value:.6E} |")
    for key, value in stats.moe_metrics.items():
        parts.append(f" {key}: {value:.2f} |")
    parts.append(f" loss scale: {stats.loss_scale:.1f} |")
    if stats.grad_norm is not None:
        parts.append(f" grad norm: {stats.grad_norm:.3f} |")
    parts.append(f" number of skipped iterations: {stats.skipped_iterations:3d} |")
    parts.append(f" number of nan iterations: {stats.nan_iterations:3d} |")
    return "".join(parts)


def memory_line(rank: int, iteration: int, allocated_mib: float, max_allocated_mib: float,
                reserved_mib: float, max_reserved_mib: float) -> str:
    """`report_memory`'s line (values in MiB, 2 decimals as in core ≥ v0.16)."""
    return (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | allocated: {allocated_mib:.2f} | "
            f"max allocated: {max_allocated_mib:.2f} | reserved: {reserved_mib:.2f} | "
            f"max reserved: {max_reserved_mib:.2f}")


def _ranks_part(tp_rank: int, tp_size: int, pp_rank: int, pp_size: int) -> str:
    return f"[ t {tp_rank + 1}/{tp_size}, p {pp_rank + 1}/{pp_size} ]"


def saving_checkpoint_line(iteration: int, directory: str, now: datetime | None = None) -> str:
    return f"[{timestamp(now)}] saving checkpoint at iteration {iteration:7d} to {directory} in torch_dist format"


def saved_checkpoint_line(iteration: int, directory: str, tp_rank: int, tp_size: int, pp_rank: int,
                          pp_size: int, now: datetime | None = None) -> str:
    return (f"  [{timestamp(now)}] successfully saved checkpoint from iteration {iteration:7d} to {directory} "
            f"{_ranks_part(tp_rank, tp_size, pp_rank, pp_size)}")


def loading_checkpoint_line(directory: str, iteration: int) -> str:
    return f" loading distributed checkpoint from {directory} at iteration {iteration}"


def loaded_checkpoint_line(directory: str, iteration: int, tp_rank: int, tp_size: int, pp_rank: int,
                           pp_size: int) -> str:
    return (f"  successfully loaded checkpoint from {directory} "
            f"{_ranks_part(tp_rank, tp_size, pp_rank, pp_size)} at iteration {iteration}")


def no_checkpoint_lines(directory: str) -> list[str]:
    return [f"WARNING: could not find the metadata file {directory}/latest_checkpointed_iteration.txt",
            "    will not load any checkpoints and will start from random"]


def timers_lines(title: str, min_max_ms: dict[str, tuple[float, float]]) -> list[str]:
    """`Timers.log` in its (min, max) form: names padded with dots to 48 characters."""
    lines = [title]
    for name, (low, high) in min_max_ms.items():
        lines.append(f"    {(name + ' ').ljust(48, '.')}: ({low:.2f}, {high:.2f})")
    return lines


def rank_compute_line(compute_ms: list[float], node_of_rank: list[int]) -> str:
    """Each rank's compute time per iteration before it enters the gradient collectives, with the node it runs on
    (`rank@node=ms`). In synchronous data parallelism every rank's *step* takes as long as the slowest rank's, so the
    step time cannot name a straggler; the time before the collective wait can (megapilot.logs.stragglers)."""
    pairs = enumerate(zip(compute_ms, node_of_rank, strict=True))
    cells = " ".join(f"{rank}@{node}={ms:.2f}" for rank, (ms, node) in pairs)
    return f" compute time before collectives per rank (ms) [rank@node]: {cells}"


def validation_lines(iteration: int, losses: dict[str, float]) -> list[str]:
    """The validation block of `evaluate_and_print_results`."""
    text = f" validation loss at iteration {iteration} | "
    for key, value in losses.items():
        ppl = math.exp(min(20.0, value))
        text += f"{key} value: {value:.6E} | {key} PPL: {ppl:.6E} | "
    rule = "-" * (len(text) + 1)
    return [rule, text, rule]


def parameter_count_line(tp_rank: int, pp_rank: int, count: int) -> str:
    return f" > number of parameters on (tensor, pipeline) model parallel rank ({tp_rank}, {pp_rank}): {count}"


def version_line(megatron_core: str, torch_version: str) -> str:
    """The release that trains, once at start: Megatron-LM prints none, and a log without it leaves `diagnose` to
    guess the release from the arguments block, which this trainer prints only in part (its own flags)."""
    return f"megatron-core version {megatron_core} (megapilot's embedded trainer, torch {torch_version})"


def datetime_line(label: str, now: datetime | None = None) -> str:
    """`print_datetime`: e.g. `[after training is done] datetime: 2026-01-01 00:10:00.123456 `."""
    return f"[{label}] datetime: {timestamp(now)} "


def arguments_lines(values: Mapping[str, object], title: str = "arguments") -> list[str]:
    """`_print_args`: the start-up block of every argument, `  name .... value` with the name and dots
    48 characters wide, sorted case-insensitively by the whole line, between two dashed rules."""
    body = sorted((f"  {name} {'.' * (48 - len(name))} {value}" for name, value in values.items()), key=str.lower)
    return [f"------------------------ {title} ------------------------", *body,
            f"-------------------- end of {title} ---------------------"]
