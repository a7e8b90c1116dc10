"""Save and load `torch_dist` checkpoints with Megatron-Core's `dist_checkpointing`.

Layout as Megatron-LM's: `<dir>/iter_0000010/` holds the sharded checkpoint and
`<dir>/latest_checkpointed_iteration.txt` names the newest iteration. The checkpoint holds the
model (one entry per virtual stage), the optimizer (unless --no-save-optim), the learning-rate
scheduler and the iteration. A `fully_reshardable` distributed-optimizer checkpoint can be loaded
under another TP/PP/DP layout.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.utils import get_attr_wrapped_model

from megapilot.errors import MegapilotError
from megapilot.trainer import cpu_compat, logfmt

if TYPE_CHECKING:  # Megatron's classes (untyped: Any to the checker); named for the reader
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.optimizer import MegatronOptimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    Model = list[DistributedDataParallel]


class RankLog(Protocol):
    """The trainer's log: one line, printed by the ranks it names."""

    def __call__(self, line: str, *, rank_zero_only: bool = False, last_rank_only: bool = False) -> None: ...

TRACKER_FILE = "latest_checkpointed_iteration.txt"


@dataclass(frozen=True)
class LoadedCheckpoint:
    iteration: int
    load_seconds: float


def iteration_dir(root: str, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def _model_key(index: int, chunks: int) -> str:
    return "model" if chunks == 1 else f"model{index}"


def _rng_state_object() -> ShardedObject:
    """This rank's RNG streams as one sharded object (as Megatron-LM saves them), so dropout resumes
    exactly. Ranks that differ only in their data-parallel position hold the same streams."""
    state = {"random_rng_state": random.getstate(), "np_rng_state": numpy.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda_rng_state"] = torch.cuda.get_rng_state()
    shape = (parallel_state.get_pipeline_model_parallel_world_size(),
             parallel_state.get_tensor_model_parallel_world_size(),
             parallel_state.get_expert_model_parallel_world_size())
    offset = (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank(),
              parallel_state.get_expert_model_parallel_rank())
    return ShardedObject("rng_state", state, shape, offset, replica_id=parallel_state.get_expert_data_parallel_rank())


def _restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random_rng_state"])
    numpy.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if "cuda_rng_state" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def _rng_layout() -> list[int]:
    return [parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size()]


def _padded_vocab_size(model: Model) -> int:
    return int(get_attr_wrapped_model(model[0], "vocab_size"))


def _sharded_state_dict(model: Model, optimizer: MegatronOptimizer, scheduler: OptimizerParamScheduler,
                        iteration: int, with_optimizer: bool, is_loading: bool,
                        with_rng: bool = True) -> dict[str, Any]:
    state: dict[str, Any] = {"iteration": iteration, "checkpoint_version": 3.0,
                             "padded_vocab_size": _padded_vocab_size(model), "rng_layout": _rng_layout()}
    if with_rng:
        state["rng_state"] = _rng_state_object()
    for index, chunk in enumerate(model):
        state[_model_key(index, len(model))] = chunk.module.sharded_state_dict()
    if with_optimizer:
        if is_loading and cpu_compat.torch_adam_fallback_in_use():
            cpu_compat.ensure_optimizer_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=is_loading,
            metadata={"distrib_optim_sharding_type": cpu_compat.DISTRIBUTED_OPTIMIZER_SHARDING_TYPE})
        state["opt_param_scheduler"] = scheduler.state_dict()
    return state


def _ranks() -> tuple[int, int, int, int]:
    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_world_size())


def _log_timer(name: str, seconds: float, log: RankLog) -> None:
    """Megatron's `(min, max) time across ranks (ms):` block for one timer (collective)."""
    times_ms = torch.tensor([seconds * 1000.0], dtype=torch.float64)
    low, high = times_ms.clone(), times_ms.clone()
    torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
    torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
    for line in logfmt.timers_lines("(min, max) time across ranks (ms):", {name: (low.item(), high.item())}):
        log(line, rank_zero_only=True)


def save_checkpoint(root: str, iteration: int, model: Model, optimizer: MegatronOptimizer,
                    scheduler: OptimizerParamScheduler, *, with_optimizer: bool, log: RankLog) -> float:
    """Save at `iteration` into `root`; returns the seconds taken. Collective: every rank calls it."""
    rank = torch.distributed.get_rank()
    target = iteration_dir(root, iteration)
    log(logfmt.saving_checkpoint_line(iteration, root), rank_zero_only=True)
    started = time.monotonic()
    if rank == 0:
        target.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    # Every rank sees the same directory, so all raise together (no rank is left in a collective).
    for stale in target.iterdir():
        raise MegapilotError(f"{target} is not empty ({stale.name})", field="--save",
                             fix="use an empty checkpoint directory or remove the old iteration")
    state = _sharded_state_dict(model, optimizer, scheduler, iteration, with_optimizer, is_loading=False)
    dist_checkpointing.save(state, str(target))
    torch.distributed.barrier()
    if rank == 0:
        tracker = Path(root) / TRACKER_FILE
        tracker.with_suffix(".tmp").write_text(f"{iteration}\n")
        os.replace(tracker.with_suffix(".tmp"), tracker)
    torch.distributed.barrier()
    log(logfmt.saved_checkpoint_line(iteration, root, *_ranks()), rank_zero_only=True)
    seconds = time.monotonic() - started
    _log_timer("save-checkpoint", seconds, log)
    return seconds


def latest_iteration(root: str) -> int | None:
    tracker = Path(root) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not (text.isascii() and text.isdigit()):  # str.isdigit also takes "²", which int() refuses
        raise MegapilotError(f"{tracker} holds {text!r}, not an iteration number", field="--load",
                             fix="point --load at a directory written by --save")
    return int(text)


def _check_compatible(root: str, iteration: int, model: Model, load_rng: bool) -> None:
    """Refuse, naming the flag, the mismatches dist_checkpointing would load silently or cryptically."""
    common = dist_checkpointing.load_common_state_dict(str(iteration_dir(root, iteration)))
    saved_vocab, vocab = common.get("padded_vocab_size"), _padded_vocab_size(model)
    if saved_vocab is not None and saved_vocab != vocab:
        raise MegapilotError(
            f"the checkpoint's padded vocabulary is {saved_vocab}, this run pads to {vocab} (the padding is a "
            "multiple of --make-vocab-size-divisible-by × TP)", field="--make-vocab-size-divisible-by",
            fix=f"choose it so that the vocabulary pads to {saved_vocab} under this TP")
    saved_layout = common.get("rng_layout")
    if load_rng and saved_layout is not None and list(saved_layout) != _rng_layout():
        raise MegapilotError(
            f"the checkpoint's RNG streams are for PP×TP×EP = {saved_layout}, this run is {_rng_layout()}",
            field="--no-load-rng", fix="add --no-load-rng to resume under another parallel layout")


def load_checkpoint(root: str, model: Model, optimizer: MegatronOptimizer, scheduler: OptimizerParamScheduler,
                    *, with_optimizer: bool, with_rng: bool, finetune: bool, log: RankLog,
                    step: int | None = None) -> LoadedCheckpoint | None:
    """Load iteration `step` (default: the newest) under `root`; None (and Megatron's warning) when
    there is no checkpoint."""
    iteration = latest_iteration(root) if step is None else step
    if step is not None and not iteration_dir(root, step).is_dir():
        raise MegapilotError(f"{iteration_dir(root, step)} does not exist", field="--ckpt-step",
                             fix="name an iteration that was saved under --load")
    if iteration is None:
        for line in logfmt.no_checkpoint_lines(root):
            log(line, rank_zero_only=True)
        return None
    log(logfmt.loading_checkpoint_line(root, iteration), rank_zero_only=True)
    started = time.monotonic()
    load_optimizer = with_optimizer and not finetune
    load_rng = with_rng and not finetune
    _check_compatible(root, iteration, model, load_rng)
    state = _sharded_state_dict(model, optimizer, scheduler, iteration, load_optimizer, is_loading=True,
                                with_rng=load_rng)
    loaded = dist_checkpointing.load(state, str(iteration_dir(root, iteration)))
    if load_rng:
        _restore_rng_state(loaded["rng_state"])
    for index, chunk in enumerate(model):
        chunk.module.load_state_dict(loaded[_model_key(index, len(model))])
    if load_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
        scheduler.load_state_dict(loaded["opt_param_scheduler"])
    torch.distributed.barrier()
    log(logfmt.loaded_checkpoint_line(root, iteration, *_ranks()), rank_zero_only=True)
    seconds = time.monotonic() - started
    _log_timer("load-checkpoint", seconds, log)
    return LoadedCheckpoint(iteration=0 if finetune else int(loaded["iteration"]), load_seconds=seconds)
