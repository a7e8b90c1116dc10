"""Goodput under failures: expected interruptions, the optimal checkpoint interval, the time lost to restarts and
recomputation, and the share of the wall clock that trains (the "effective training time").

Inputs, each with a stated default:
- A failure rate per GPU-hour. Default: the Llama 3 paper's (Dubey et al. 2024, arXiv 2407.21783, Sec. 3.3.4)
  419 unexpected interruptions in 54 days of pre-training on 16,384 H100s = 1.97e-5 per GPU-hour, 78 % of them
  hardware (GPUs, HBM, hosts, network). A job of N GPUs fails at N times that rate (independent failures): its
  mean time between interruptions is M = 1 / (rate x N).
- The checkpoint save and restore times: its size (bf16 weights + the optimizer's fp32 state, the memory model's
  bytes per parameter) over the storage bandwidth, or the times the suite's checkpoint stage measured. Default
  bandwidth: the Llama 3 cluster's storage share per GPU (2 TB/s sustained for 16,384 GPUs, Sec. 3.3.1) times
  the job's GPUs.
- The time to restart a job after an interruption (requeue, process start, NCCL init): default 10 minutes, an
  assumption, not a published figure.

The model (first order, Young 1974 / Daly 2006). With save time d, interval t between checkpoints (compute time),
restore time r and restart time R, an interruption costs R + r plus the work since the last checkpoint, on average
half an interval and its save, (t + d) / 2; checkpoints cost d every t. Over a failure-free compute time C:

    elapsed E = C (1 + d/t) + (E / M) (R + r + (t + d)/2)   =>   E = C (1 + d/t) / (1 - (R + r + (t + d)/2) / M)

and the interval that minimises E is Daly's higher-order one (for d < 2M; M itself beyond):

    t = sqrt(2 d M) (1 + sqrt(d / (2M)) / 3 + (d / (2M)) / 9) - d

(Young's sqrt(2 d M) is its first term). Effective training time = C / E.

Spare nodes: a hardware interruption takes a node out for its repair; with spares the job restarts at once on a
spare, without them it waits for the repair. The spares recommended let 99 % of hardware interruptions find one:
the node that failed, plus the nodes already in repair when it fails (Little's law: on average hardware rate x
repair time of them, Poisson; a failure sees that time average). They are set against the wait without spares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megapilot.errors import MegapilotError
from megapilot.spec.model import ModelSpec

# Llama 3 paper, Sec. 3.3.4 (Table 5): 466 interruptions in a 54-day snapshot of 405B pre-training, 47 planned and
# 419 unexpected, about 78 % of those hardware.
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_HARDWARE_SHARE = 0.78
DEFAULT_FAILURES_PER_GPU_HOUR = LLAMA3_UNEXPECTED_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
DEFAULT_FAILURE_SOURCE = (f"Llama 3 paper (arXiv 2407.21783, Sec. 3.3.4): {LLAMA3_UNEXPECTED_INTERRUPTIONS} "
                          f"unexpected interruptions in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} H100s")
# Llama 3 paper, Sec. 3.3.1: the Tectonic storage "supports a sustainable throughput of 2 TB/s" for the 16,384-GPU
# job; a default scales that share per GPU (122 MB/s, about 1 GB/s per 8-GPU node) with the job's size.
LLAMA3_STORAGE_GBPS = 2000.0
DEFAULT_CHECKPOINT_GBPS_PER_GPU = LLAMA3_STORAGE_GBPS / LLAMA3_GPUS
# Above this a checkpoint bandwidth is a slip of units (2 TB/s written in B/s, 2e12), not a storage system: the
# largest sustain tens of TB/s.
MOST_CHECKPOINT_GBPS = 1e6
DEFAULT_RESTART_S = 600.0  # requeue + start + NCCL init: an assumption, no published figure behind it
DEFAULT_REPAIR_H = 24.0  # a failed node swapped or fixed and re-validated within a day: an assumption
SPARE_COVERAGE = 0.99  # spares cover the nodes in repair at once this often


@dataclass(frozen=True)
class FailureModel:
    """How often a GPU's job is interrupted and what an interruption costs beyond the lost work."""

    failures_per_gpu_hour: float = DEFAULT_FAILURES_PER_GPU_HOUR
    source: str = DEFAULT_FAILURE_SOURCE
    hardware_share: float = LLAMA3_HARDWARE_SHARE  # the interruptions that take a node out for a repair
    restart_s: float = DEFAULT_RESTART_S
    repair_h: float = DEFAULT_REPAIR_H

    def __post_init__(self) -> None:
        for name in ("failures_per_gpu_hour", "restart_s", "repair_h"):
            if getattr(self, name) < 0 or not math.isfinite(getattr(self, name)):
                raise MegapilotError(f"must be a finite number >= 0, not {getattr(self, name)}", field=name,
                                     fix=f"pass --{name.replace('_', '-')} 0 or more")


# A rate learned from the run history needs this much of it: with fewer GPU-hours or interruptions, one more failure
# would move the rate by a large factor.
HISTORY_MIN_GPU_HOURS = 1000.0
HISTORY_MIN_INTERRUPTIONS = 3


def failure_model_from_history(interruptions: int, gpu_hours: float, runs: int) -> tuple[FailureModel, bool]:
    """(the failure model, whether the history set it): interruptions per GPU-hour of the history's jobs when it
    holds at least HISTORY_MIN_GPU_HOURS and HISTORY_MIN_INTERRUPTIONS, else the default, saying why."""
    if gpu_hours >= HISTORY_MIN_GPU_HOURS and interruptions >= HISTORY_MIN_INTERRUPTIONS:
        return FailureModel(failures_per_gpu_hour=interruptions / gpu_hours,
                            source=f"the run history: {interruptions} failed or hung jobs in {gpu_hours:,.0f} "
                                   f"GPU-hours of {runs} runs (an upper bound: a job failed by its configuration "
                                   "counts too)"), True
    return FailureModel(source=f"{DEFAULT_FAILURE_SOURCE}; the history's {gpu_hours:,.0f} GPU-hours and "
                               f"{interruptions} interruptions are too few (need {HISTORY_MIN_GPU_HOURS:,.0f} and "
                               f"{HISTORY_MIN_INTERRUPTIONS})"), False


@dataclass(frozen=True)
class CheckpointCost:
    """One checkpoint: its size and the time to save (blocking training) and to restore it."""

    size_bytes: float
    save_s: float
    load_s: float
    source: str  # "estimated: 5.68 TB at 2000 GB/s" or "measured by the suite's checkpoint stage"


def checkpoint_bytes(model: ModelSpec, optimizer: str = "adam") -> float:
    """What a Megatron checkpoint holds: every parameter's bf16 weight and the optimizer's fp32 state as the memory
    model keeps it (`memory.optimizer_gib`): Adam's master weight and two moments, 12 B; Muon's master and
    momentum, 8 B, for its 2-D weights, the embedding, output layer, norms and routers staying on Adam's 12 B."""
    # start-up: the parameter count and the memory model's byte sizes, only where a budget is costed
    from megapilot.estimate.memory import MUON_BYTES, OPTIMIZER_BYTES, PARAM_BYTES
    from megapilot.estimate.params import count_params

    counts = count_params(model)
    if optimizer == "adam":
        return counts.total * (PARAM_BYTES + OPTIMIZER_BYTES)
    on_adam = counts.embedding + counts.output_layer + counts.final_norm \
        + sum(layer.by_sharding.replicated for layer in counts.per_layer)
    return counts.total * PARAM_BYTES + on_adam * OPTIMIZER_BYTES + (counts.total - on_adam) * MUON_BYTES


def estimated_checkpoint(size_bytes: float, storage_gbps: float) -> CheckpointCost:
    """Save and restore times of a checkpoint of `size_bytes` over `storage_gbps` (GB/s, aggregate)."""
    if storage_gbps <= 0 or not math.isfinite(storage_gbps):
        raise MegapilotError(f"must be > 0, not {storage_gbps}", field="checkpoint_gbps",
                             fix="pass the storage's aggregate write bandwidth in GB/s, e.g. --checkpoint-gbps 200")
    if storage_gbps > MOST_CHECKPOINT_GBPS:
        raise MegapilotError(f"{storage_gbps:.3g} GB/s is more than {MOST_CHECKPOINT_GBPS:,.0f} GB/s (1 PB/s, beyond "
                             "any storage system): a bandwidth in B/s or MB/s?", field="checkpoint_gbps",
                             fix="pass the storage's aggregate write bandwidth in GB/s, e.g. --checkpoint-gbps 2000 "
                                 "for 2 TB/s")
    seconds = size_bytes / (storage_gbps * 1e9)
    return CheckpointCost(size_bytes, seconds, seconds,
                          f"estimated: {size_bytes / 1e12:.3g} TB at "
                          f"{f'{storage_gbps:,.0f}' if storage_gbps >= 100 else f'{storage_gbps:.3g}'} GB/s")


def daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Daly's (2006) optimal compute time between checkpoints for save time d and mean time between failures M:
    sqrt(2dM) (1 + sqrt(d/2M)/3 + (d/2M)/9) - d when d < 2M, else M. Young's sqrt(2dM) is its first term."""
    if not math.isfinite(mtbf_s):
        return math.inf
    if save_s <= 0:
        return 0.0
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    ratio = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_s


def interval_steps(interval_s: float, step_time_s: float) -> int:
    """A checkpoint interval in whole steps of `step_time_s` (Megatron saves every N iterations): the nearest
    count, at least one."""
    return max(1, round(interval_s / step_time_s))


@dataclass(frozen=True)
class SpareNodes:
    """Spares against waiting: how many cover the nodes in repair, what they hold back, and the wait without."""

    recommended: int  # the failed node + those already in repair, covered for SPARE_COVERAGE of the failures
    gpus_held: int
    held_share: float  # of the job's GPUs: what running those nodes as spares (not training) costs
    hardware_interruptions: float
    wait_without_s: float  # expected wait for repairs over the run, with no spare
    wait_without_share: float  # that wait as a share of the run's elapsed time

    @property
    def cheaper(self) -> str:
        """"spares" when holding them back costs less of the run than waiting for repairs, else "waiting"."""
        return "spares" if self.held_share < self.wait_without_share else "waiting"


@dataclass(frozen=True)
class Goodput:
    """The run under failures: interruptions, the checkpoint interval, and where the wall clock goes."""

    failure: FailureModel
    checkpoint: CheckpointCost
    gpus: int
    mtbf_s: float  # the job's mean time between interruptions
    checkpoint_interval_s: float
    checkpoint_interval_iters: int | None  # the interval in steps (None: no step time, or no failures)
    compute_s: float  # failure-free training time
    elapsed_s: float
    expected_interruptions: float
    lost_restart_s: float  # restarts and checkpoint restores
    lost_recompute_s: float  # work redone since the last checkpoint
    checkpoint_overhead_s: float  # saves
    spares: SpareNodes

    @property
    def effective_training_time_pct(self) -> float:
        return 100.0 * self.compute_s / self.elapsed_s if self.elapsed_s > 0 else 100.0

    def to_json(self) -> dict[str, object]:
        interval = None if math.isinf(self.checkpoint_interval_s) else round(self.checkpoint_interval_s, 1)
        return {
            "expected_interruptions": round(self.expected_interruptions, 1),
            "checkpoint_interval_s": interval,
            "checkpoint_interval_iters": self.checkpoint_interval_iters,
            "effective_training_time_pct": round(self.effective_training_time_pct, 2),
            "mtbf_h": None if math.isinf(self.mtbf_s) else round(self.mtbf_s / 3600, 3),
            "lost_restart_h": round(self.lost_restart_s / 3600, 2),
            "lost_recompute_h": round(self.lost_recompute_s / 3600, 2),
            "checkpoint_overhead_h": round(self.checkpoint_overhead_s / 3600, 2),
            "checkpoint": {"size_tb": round(self.checkpoint.size_bytes / 1e12, 4), "save_s": round(
                self.checkpoint.save_s, 2), "load_s": round(self.checkpoint.load_s, 2),
                "source": self.checkpoint.source},
            "failures_per_gpu_hour": self.failure.failures_per_gpu_hour,
            "failure_source": self.failure.source,
            "restart_s": self.failure.restart_s,
            "spare_nodes": {"recommended": self.spares.recommended, "gpus_held": self.spares.gpus_held,
                            "held_pct": round(100 * self.spares.held_share, 2),
                            "hardware_interruptions": round(self.spares.hardware_interruptions, 1),
                            "wait_without_days": round(self.spares.wait_without_s / 86400, 2),
                            "cheaper": self.spares.cheaper,
                            "repair_h": self.failure.repair_h},
        }


def goodput(compute_s: float, gpus: int, checkpoint: CheckpointCost, failure: FailureModel = FailureModel(), *,
            gpus_per_node: int = 8, step_time_s: float | None = None) -> Goodput:
    """The expected run of `compute_s` failure-free seconds on `gpus` GPUs, checkpointing at Daly's interval
    (rounded to whole steps when `step_time_s` is given: Megatron saves every N iterations). Spares are
    assumed held (a hardware interruption restarts at once); `spares` says what they cost and the wait without.
    """
    rate_per_s = failure.failures_per_gpu_hour * gpus / 3600
    mtbf_s = 1 / rate_per_s if rate_per_s > 0 else math.inf
    interval_s = daly_interval_s(checkpoint.save_s, mtbf_s)
    if compute_s > 0:
        # never longer than the run: past it, Daly's interval means one save at the end (a rate of 1e-300 printed an
        # interval hundreds of digits long, and a short run an interval of more steps than it has)
        interval_s = min(interval_s, compute_s)
    iters = None
    if step_time_s and math.isfinite(interval_s):
        iters = interval_steps(interval_s, step_time_s)
        interval_s = iters * step_time_s
    if math.isinf(mtbf_s):
        return Goodput(failure, checkpoint, gpus, mtbf_s, interval_s, iters, compute_s, compute_s, 0.0, 0.0, 0.0,
                       0.0, _spares(0.0, gpus, gpus_per_node, failure))
    save_s = checkpoint.save_s
    overhead_factor = 1 + (save_s / interval_s if interval_s > 0 else 0.0)
    per_failure_s = _per_failure_s(failure, checkpoint, interval_s)
    if per_failure_s >= mtbf_s:
        raise MegapilotError(
            f"a job of {gpus:,} GPUs is interrupted every {mtbf_s / 3600:.2g} h on average, sooner than it restarts "
            f"and redoes its lost work ({per_failure_s / 3600:.2g} h: restart {failure.restart_s / 3600:.2g} h, "
            f"restore {checkpoint.load_s / 3600:.2g} h, half an interval and its save "
            f"{(interval_s + save_s) / 2 / 3600:.2g} h; {checkpoint.source}): it never finishes",
            field=(cause := _never_finishes_cause(gpus, checkpoint, failure)), fix=NEVER_FINISHES_FIX[cause])
    elapsed_s = compute_s * overhead_factor / (1 - per_failure_s / mtbf_s)
    interruptions = elapsed_s / mtbf_s
    return Goodput(
        failure, checkpoint, gpus, mtbf_s, interval_s, iters, compute_s, elapsed_s, interruptions,
        lost_restart_s=interruptions * (failure.restart_s + checkpoint.load_s),
        lost_recompute_s=interruptions * (interval_s + save_s) / 2,
        checkpoint_overhead_s=compute_s * (overhead_factor - 1),
        spares=_spares(interruptions, gpus, gpus_per_node, failure, elapsed_s),
    )


def _per_failure_s(failure: FailureModel, checkpoint: CheckpointCost, interval_s: float) -> float:
    """What one interruption costs: the restart, the restore, and on average half an interval and its save redone."""
    return failure.restart_s + checkpoint.load_s + (interval_s + checkpoint.save_s) / 2


NEVER_FINISHES_FIX = {
    "failures_per_gpu_hour": "check --failures-per-gpu-hour (per GPU-hour: the default is "
                             f"{DEFAULT_FAILURES_PER_GPU_HOUR:.3g})".replace("e-0", "e-"),
    "restart_min": f"check --restart-min (minutes: the default is {DEFAULT_RESTART_S / 60:g})",
    "checkpoint_gbps": f"check --checkpoint-gbps (GB/s, aggregate: the default is {LLAMA3_STORAGE_GBPS:,.0f} GB/s "
                       f"for {LLAMA3_GPUS:,} GPUs, pro rata)",
}


def _never_finishes_cause(gpus: int, checkpoint: CheckpointCost, failure: FailureModel) -> str:
    """The input to name when a run never finishes: the rate where it is above the default and the run would
    finish at the default's, else the larger of what an interruption costs, the restart or the checkpoint."""
    if failure.failures_per_gpu_hour > DEFAULT_FAILURES_PER_GPU_HOUR:
        default_mtbf_s = 3600 / (DEFAULT_FAILURES_PER_GPU_HOUR * gpus)
        if _per_failure_s(failure, checkpoint, daly_interval_s(checkpoint.save_s, default_mtbf_s)) < default_mtbf_s:
            return "failures_per_gpu_hour"
    return "restart_min" if failure.restart_s > checkpoint.load_s + checkpoint.save_s else "checkpoint_gbps"


def expected_interruptions(gpus: int, elapsed_s: float, failure: FailureModel = FailureModel()) -> float:
    """Interruptions a job of `gpus` GPUs meets over `elapsed_s` of wall clock (independent failures)."""
    return failure.failures_per_gpu_hour * gpus * elapsed_s / 3600


def _spares(interruptions: float, gpus: int, gpus_per_node: int, failure: FailureModel,
            elapsed_s: float = 0.0) -> SpareNodes:
    hardware = interruptions * failure.hardware_share
    in_repair = hardware / elapsed_s * failure.repair_h * 3600 if elapsed_s > 0 else 0.0  # Little's law
    # the quantile alone covers the nodes already out, not the one failing now: it said "0 held back cover the
    # repairs" for a job that waits out every repair
    recommended = 1 + _poisson_quantile(in_repair, SPARE_COVERAGE) if hardware > 0 else 0
    held = recommended * gpus_per_node
    wait_s = hardware * failure.repair_h * 3600
    return SpareNodes(recommended, held, held / gpus if gpus else 0.0, hardware, wait_without_s=wait_s,
                      wait_without_share=wait_s / elapsed_s if elapsed_s > 0 else 0.0)


def _poisson_quantile(mean: float, coverage: float) -> int:
    """The smallest k with P(Poisson(mean) <= k) >= coverage."""
    if mean <= 0:
        return 0
    if mean > 100:  # exp(-mean) would underflow; the normal approximation is close there (z_0.99 = 2.326)
        return math.ceil(mean + 2.326 * math.sqrt(mean))
    k, term = 0, math.exp(-mean)
    total = term
    while total < coverage:
        k += 1
        term *= mean / k
        total += term
    return k
