"""The training run, top to bottom: set up the process groups, build model, optimizer and data,
load a checkpoint, loop over iterations (forward-backward through Megatron's pipeline schedule,
optimizer step, learning-rate step, logs, evaluation, checkpoints), and finish.

Logs follow Megatron-LM's formats (see `logfmt`): iteration lines from the last rank, memory reports
from data-parallel rank 0 of each model-parallel position, checkpoint lines from rank 0.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import psutil
import torch

from megapilot.errors import MegapilotError
from megapilot.execute.process import free_port
from megapilot.trainer import cpu_compat, logfmt
from megapilot.trainer.args import parse_flags
from megapilot.trainer.config import TrainerConfig, build_config
from megapilot.trainer.flops import flops_per_iteration, padded_vocab_size

if TYPE_CHECKING:
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.distributed import DistributedDataParallel

    from megapilot.trainer.cpu_compat import RewriteLog

Batch = dict[str, torch.Tensor]
# What a forward step hands Megatron's schedule: the output and the loss function to call on it.
LossReport = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
# One micro-batch stream, or one per virtual pipeline stage.
BatchStreams = Iterator[Batch] | list[Iterator[Batch]]


# ----------------------------------------------------------------------------- printing
def log(line: str, *, rank_zero_only: bool = False, last_rank_only: bool = False) -> None:
    """Print one log line from the ranks Megatron-LM prints it from (all ranks if no filter)."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if rank_zero_only and rank != 0:
        return
    if last_rank_only and rank != world - 1:
        return
    emit(line)


def emit(line: str) -> None:
    """Write one line in one write: ranks share the log, and print()'s separate write of the newline (unbuffered
    stdout, PYTHONUNBUFFERED) lets another rank's line land between a line and its end."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- process groups
def init_distributed(config: TrainerConfig, on_gpu: bool) -> None:
    """Join the torchrun process group (or make a one-process group when started without torchrun)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    backend = config.distributed_backend or ("nccl" if on_gpu else "gloo")
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend=backend,
                                         timeout=timedelta(minutes=config.distributed_timeout_minutes))


def init_model_parallel(config: TrainerConfig) -> None:
    # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(
        **config.parallel_sizes(), distributed_timeout_minutes=config.distributed_timeout_minutes
    )
    # Megatron-LM's seeding: a different seed per pipeline stage, streams per TP/EP rank.
    seed = config.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


# ----------------------------------------------------------------------------- one step
def _loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> LossReport:
    """Token-averaged LM loss; reports (sum, tokens) so the log averages over tokens like Megatron-LM."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.float().view(-1)
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    # The schedule divides `loss` in place; report a detached clone.
    report = torch.cat([loss.clone().detach().view(1), num_tokens.float().view(1)])
    return loss, num_tokens, {"lm loss": report}


def _forward_step(
    on_gpu: bool, data_iterator: Iterator[Batch], model: DistributedDataParallel
) -> tuple[torch.Tensor, Callable[[torch.Tensor], LossReport]]:
    batch = next(data_iterator)
    if on_gpu:
        batch = {key: value.cuda(non_blocking=True) for key, value in batch.items()}
    # The loss mask reaches the model too: MTP modules weigh their own losses with it.
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"],
                   loss_mask=batch["loss_mask"])
    return output, partial(_loss_func, batch["loss_mask"])


def _reduce_reported_loss(losses_reduced: list[dict[str, torch.Tensor]]) -> float | None:
    """Token-weighted mean loss over micro-batches and data-parallel ranks (last pipeline stage only)."""
    # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
    from megatron.core import parallel_state

    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return None
    totals = torch.stack([entry["lm loss"] for entry in losses_reduced]).sum(dim=0)
    torch.distributed.all_reduce(totals, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return (totals[0] / totals[1].clamp(min=1)).item()


@dataclass
class IntervalTotals:
    """What the iteration line averages over one log interval."""

    iterations: int = 0
    loss_sum: float = 0.0
    grad_norm: float | None = None
    skipped: int = 0
    nan: int = 0
    forward_backward_s: float = 0.0
    compute_s: float = 0.0  # forward-backward up to the gradient collectives (see `_wire_schedule_hooks`)
    optimizer_s: float = 0.0
    moe_sums: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)


@dataclass
class RunState:
    iteration: int = 0
    totals: IntervalTotals = field(default_factory=IntervalTotals)
    memory_reported: bool = False


class Trainer:
    """Holds what a run builds once; `run()` is the training loop."""

    def __init__(self, config: TrainerConfig, on_gpu: bool):
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from megapilot.trainer import data_loading
        from megapilot.trainer import model as model_lib

        self.config = config
        self.on_gpu = on_gpu
        self.world_size = torch.distributed.get_world_size()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.num_microbatches = config.num_microbatches(self.world_size)
        self.tokenizer = data_loading.build_tokenizer(config)
        self.vocab_size_padded = padded_vocab_size(self.tokenizer.vocab_size, config.make_vocab_size_divisible_by,
                                                   config.tensor_model_parallel_size)
        self.model = model_lib.build_model(config, self.vocab_size_padded, on_gpu)
        self.optimizer, self.scheduler = model_lib.build_optimizer(config, self.model)
        self._compute_done_at: float | None = None
        self._param_gather_wait_s = 0.0
        self._wire_schedule_hooks()
        self.datasets = data_loading.build_datasets(config, self.tokenizer, self.dp_size)
        self.forward_backward = get_forward_backward_func()
        self.flops_per_iteration = flops_per_iteration(config, self.vocab_size_padded)
        self._report_parameter_count(model_lib.count_parameters(self.model))

    def _wire_schedule_hooks(self) -> None:
        """The hooks Megatron-LM's `train()` sets on the model config before the loop."""
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.utils import get_model_config

        model_config = get_model_config(self.model[0])
        model_config.grad_scale_func = self.optimizer.scale_loss

        def finalize_timed(*args: Any, **kwargs: Any) -> Any:
            # The moment a rank reaches its gradient collectives: what it did before is its own compute (a
            # straggler's is long), what follows includes waiting for the slowest rank.
            self._compute_done_at = time.monotonic()
            return finalize_model_grads(*args, **kwargs)

        model_config.finalize_model_grads_func = finalize_timed
        if self.config.overlap_grad_reduce:
            no_sync = [chunk.no_sync for chunk in self.model]
            grad_sync = [chunk.start_grad_sync for chunk in self.model]
            model_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
            model_config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync
        if self.config.overlap_param_gather:
            param_sync = [chunk.start_param_sync for chunk in self.model]
            model_config.param_sync_func = param_sync[0] if len(param_sync) == 1 else param_sync
            self._time_param_gather_waits()

    def _time_param_gather_waits(self) -> None:
        """With the parameter all-gather overlapped, the forward's first use of a bucket waits for the gather the
        last optimizer step launched, that is for the slowest rank to finish its step: that wait is not this rank's
        compute. Timed here and taken out, a fast rank beside a straggler no longer looks as slow as it."""
        for chunk in self.model:
            for group in chunk.bucket_groups + chunk.expert_parallel_bucket_groups:
                finish = group.finish_param_sync

                def timed(*args: Any, _finish: Any = finish, **kwargs: Any) -> Any:
                    started = time.monotonic()
                    try:
                        return _finish(*args, **kwargs)
                    finally:
                        if self._compute_done_at is None:  # waits after the gradient collectives are not compute
                            self._param_gather_wait_s += time.monotonic() - started

                group.finish_param_sync = timed

    def _report_parameter_count(self, count: int) -> None:
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megatron.core import parallel_state

        if self.dp_rank == 0:
            emit(logfmt.parameter_count_line(parallel_state.get_tensor_model_parallel_rank(),
                                             parallel_state.get_pipeline_model_parallel_rank(), count))

    # ------------------------------------------------------------------ data
    def _iterators(self, dataset: GPTDataset, first_sample: int) -> BatchStreams:
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megapilot.trainer.data_loading import microbatches

        def make() -> Iterator[Batch]:
            return microbatches(dataset, self.config, self.dp_rank, self.dp_size, first_sample)

        # Each virtual stage pulls its own copy of the micro-batch stream.
        return make() if len(self.model) == 1 else [make() for _ in self.model]

    # ------------------------------------------------------------------ step
    def train_step(self, data_iterator: BatchStreams) -> tuple[float | None, bool, float | None]:
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        started = time.monotonic()
        self._compute_done_at, self._param_gather_wait_s = None, 0.0
        losses_reduced = self.forward_backward(
            forward_step_func=partial(_forward_step, self.on_gpu), data_iterator=data_iterator, model=self.model,
            num_microbatches=self.num_microbatches, seq_length=self.config.seq_length,
            micro_batch_size=self.config.micro_batch_size, forward_only=False)
        forward_backward_s = time.monotonic() - started
        compute_s = (self._compute_done_at - started) if self._compute_done_at is not None else forward_backward_s
        compute_s = max(compute_s - self._param_gather_wait_s, 0.0)
        started = time.monotonic()
        update_successful, grad_norm, _ = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=self.config.global_batch_size)
        optimizer_s = time.monotonic() - started
        loss = _reduce_reported_loss(losses_reduced)
        self._last_timings_s = (forward_backward_s, optimizer_s, compute_s)
        return loss, bool(update_successful), grad_norm

    def evaluate(self, data_iterator: BatchStreams) -> float | None:
        for chunk in self.model:
            chunk.eval()
        totals: list[dict[str, torch.Tensor]] = []
        with torch.no_grad():
            for _ in range(self.config.eval_iters):
                totals += self.forward_backward(
                    forward_step_func=partial(_forward_step, self.on_gpu), data_iterator=data_iterator,
                    model=self.model, num_microbatches=self.num_microbatches, seq_length=self.config.seq_length,
                    micro_batch_size=self.config.micro_batch_size, forward_only=True)
        for chunk in self.model:
            chunk.train()
        return _reduce_reported_loss(totals) if totals else None

    # ------------------------------------------------------------------ logging
    def _learning_rate(self) -> float:
        # torch types a param group as a dict of Any; the learning rate in it is a float
        return float(next(group["lr"] for group in self.optimizer.param_groups if group["params"]))

    def _log_iteration(self, state: RunState) -> None:
        totals = state.totals
        elapsed_s = time.monotonic() - totals.started
        per_iteration_s = elapsed_s / max(1, totals.iterations + totals.skipped)
        throughput = (self.flops_per_iteration / (per_iteration_s * 1e12 * self.world_size)
                      if self.config.log_throughput else None)
        counted = max(1, totals.iterations)
        stats = logfmt.IterationStats(
            iteration=state.iteration, train_iters=self.config.train_iters,
            consumed_samples=state.iteration * self.config.global_batch_size,
            elapsed_ms_per_iteration=per_iteration_s * 1000.0, throughput_tflops_per_gpu=throughput,
            learning_rate=self._learning_rate(), global_batch_size=self.config.global_batch_size,
            losses={"lm loss": totals.loss_sum / counted} if totals.iterations else {},
            loss_scale=float(self.optimizer.get_loss_scale().item()), grad_norm=totals.grad_norm,
            skipped_iterations=totals.skipped, nan_iterations=totals.nan,
            moe_metrics={key: value / counted for key, value in totals.moe_sums.items()})
        log(logfmt.iteration_line(stats), last_rank_only=True)
        self._log_timers(totals)
        if not state.memory_reported:
            self._report_memory(state.iteration)
            state.memory_reported = True

    def _log_timers(self, totals: IntervalTotals) -> None:
        if self.config.timing_log_level < 1:
            return
        counted = max(1, totals.iterations + totals.skipped)
        local = torch.tensor([totals.forward_backward_s, totals.optimizer_s], dtype=torch.float64) * 1000 / counted
        low, high = local.clone(), local.clone()
        torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
        torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
        timers = {"forward-backward": (low[0].item(), high[0].item()), "optimizer": (low[1].item(), high[1].item())}
        for line in logfmt.timers_lines("(min, max) time across ranks (ms):", timers):
            log(line, last_rank_only=True)
        if self.world_size > 1:
            self._log_rank_compute(totals.compute_s * 1000 / counted)

    def _log_rank_compute(self, compute_ms: float) -> None:
        """Every rank's compute before its collectives, gathered on the rank that prints (collective)."""
        mine = torch.tensor([compute_ms, float(os.environ.get("GROUP_RANK", "0"))], dtype=torch.float64)
        gathered = [torch.zeros(2, dtype=torch.float64) for _ in range(self.world_size)]
        torch.distributed.all_gather(gathered, mine)
        log(logfmt.rank_compute_line([float(t[0]) for t in gathered], [int(t[1]) for t in gathered]),
            last_rank_only=True)

    def _report_memory(self, iteration: int) -> None:
        """Megatron's memory report; on CPU the values are this process's RSS (current and peak)."""
        if self.dp_rank != 0:
            return
        rank = torch.distributed.get_rank()
        if self.on_gpu:
            mib = 1024 * 1024
            values = (torch.cuda.memory_allocated() / mib, torch.cuda.max_memory_allocated() / mib,
                      torch.cuda.memory_reserved() / mib, torch.cuda.max_memory_reserved() / mib)
        else:
            rss_mib = psutil.Process().memory_info().rss / (1024 * 1024)
            peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # ru_maxrss is KiB on Linux
            peak_mib = max(peak_mib, rss_mib)
            values = (rss_mib, peak_mib, rss_mib, peak_mib)
            if rank == 0:
                emit("memory report on CPU: allocated/reserved = process RSS, max = peak RSS (no CUDA allocator)")
        emit(logfmt.memory_line(rank, iteration, *values))

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megapilot.trainer import checkpoint

        config = self.config
        state = RunState()
        if config.load:
            loaded = checkpoint.load_checkpoint(config.load, self.model, self.optimizer, self.scheduler,
                                                with_optimizer=not config.no_load_optim,
                                                with_rng=not config.no_load_rng, finetune=config.finetune,
                                                log=log, step=config.ckpt_step)
            state.iteration = loaded.iteration if loaded else 0
        train_iterator = self._iterators(self.datasets.train, state.iteration * config.global_batch_size)
        valid_iterator = self._iterators(self.datasets.valid, 0) if self.datasets.valid is not None else None
        for chunk in self.model:
            chunk.train()
        log(logfmt.datetime_line("before the start of training step"), rank_zero_only=True)
        state.totals = IntervalTotals()
        while state.iteration < config.train_iters:
            self._one_iteration(state, train_iterator)
            paused_at = time.monotonic()
            if valid_iterator is not None and state.iteration % config.eval_interval == 0:
                self._log_validation(state.iteration, valid_iterator)
            saved = False
            if config.save and config.save_interval and state.iteration % config.save_interval == 0:
                self._save(state.iteration)
                saved = True
            # As Megatron-LM's interval timer: evaluation and checkpointing are not iteration time.
            state.totals.started += time.monotonic() - paused_at
            if config.exit_interval and state.iteration % config.exit_interval == 0:
                if config.save and not saved:
                    self._save(state.iteration)
                log(f"exiting program at iteration {state.iteration}", rank_zero_only=True)
                break
        else:
            if config.save and not (config.save_interval and state.iteration % config.save_interval == 0):
                self._save(state.iteration)
        torch.distributed.barrier()
        log(logfmt.datetime_line("after training is done"), rank_zero_only=True)

    def _one_iteration(self, state: RunState, train_iterator: BatchStreams) -> None:
        loss, update_successful, grad_norm = self.train_step(train_iterator)
        state.iteration += 1
        totals = state.totals
        if update_successful:
            totals.iterations += 1
        else:
            totals.skipped += 1
        if loss is not None:
            if math.isnan(loss) or math.isinf(loss):
                totals.nan += 1
            elif update_successful:  # as Megatron-LM: skipped iterations do not enter the average
                totals.loss_sum += loss
        totals.grad_norm = grad_norm
        for key, value in self._moe_metrics(state.iteration).items():
            totals.moe_sums[key] = totals.moe_sums.get(key, 0.0) + value
        totals.forward_backward_s += self._last_timings_s[0]
        totals.optimizer_s += self._last_timings_s[1]
        totals.compute_s += self._last_timings_s[2]
        # Megatron-LM logs every `log_interval` iterations; the final iteration is logged too so that a
        # run's end can be read from its log.
        if state.iteration % self.config.log_interval == 0 or state.iteration == self.config.train_iters:
            self._log_iteration(state)
            state.totals = IntervalTotals()

    def _moe_metrics(self, iteration: int) -> dict[str, float]:
        """Megatron's MoE router metrics of this iteration, averaged over MoE layers (collective)."""
        if not self.config.is_moe:
            return {}
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megatron.core.transformer.moe.moe_utils import track_moe_metrics

        names = ["load_balancing_loss"] if "aux_loss" in self.config.moe_router_load_balancing_type else []
        if not names:
            return {}
        metrics: dict[str, torch.Tensor] = {}
        track_moe_metrics(loss_scale=1.0 / self.num_microbatches, iteration=iteration, total_loss_dict=metrics,
                          force_initialize=True, track_names=names, num_layers=self.config.num_layers,
                          moe_layer_freq=freq if isinstance(freq := self.config.moe_layer_freq, int) else list(freq))
        return {key: float(value) for key, value in metrics.items()}

    def _log_validation(self, iteration: int, valid_iterator: BatchStreams) -> None:
        loss = self.evaluate(valid_iterator)
        if loss is not None:
            for line in logfmt.validation_lines(iteration, {"lm loss": loss}):
                log(line, last_rank_only=True)

    def _save(self, iteration: int) -> None:
        # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
        from megapilot.trainer import checkpoint

        assert self.config.save is not None  # the loop saves only when --save is given
        checkpoint.save_checkpoint(self.config.save, iteration, self.model, self.optimizer, self.scheduler,
                                   with_optimizer=not self.config.no_save_optim, log=log)


# ----------------------------------------------------------------------------- entry
def _announce_cpu_mode(rewrites: RewriteLog) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        emit(rewrites.summary())


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m megapilot.trainer`: returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in argv):
        parse_flags(["--help"])
    on_gpu = torch.cuda.is_available()
    try:
        config = build_config(argv, gpu_available=on_gpu)
        config.check_world_size(int(os.environ.get("WORLD_SIZE", "1")))
    except MegapilotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    # heavy: megatron-core loads only once the flags are valid (a bad flag exits 2 with torch alone loaded)
    from megapilot.trainer.model import uses_transformer_engine

    if not on_gpu:
        cpu_compat.enable_cpu_mode()
    cpu_compat.install_distributed_optimizer_fixes()
    cpu_compat.install_missing_te_fixes()
    if config.is_moe and config.add_bias_linear and not uses_transformer_engine(on_gpu):
        cpu_compat.install_biased_expert_fix()
    if cpu_compat.REWRITES.installed:
        _announce_cpu_mode(cpu_compat.REWRITES)
    init_distributed(config, on_gpu)
    try:
        init_model_parallel(config)
        # heavy: megatron-core is loaded by now (init_model_parallel); only its version is read here
        from megatron.core import __version__ as megatron_core_version

        log(logfmt.version_line(megatron_core_version, torch.__version__), rank_zero_only=True)
        # As Megatron-LM: rank 0 prints every argument once, before the model is built (the log parser
        # reads the run's shape from it: world size, sequence length, global batch size).
        arguments = config.printed_arguments(torch.distributed.get_world_size())
        log("\n".join(logfmt.arguments_lines(arguments)), rank_zero_only=True)
        Trainer(config, on_gpu).run()
        if not on_gpu and torch.distributed.get_rank() == 0:
            emit(cpu_compat.REWRITES.rewrite_summary())
        # every rank leaves together: a rank that tears its process group down while a peer on another node is still
        # in its last collective can abort in gloo's threads ("terminate called without an active exception")
        torch.distributed.barrier()
    except MegapilotError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        torch.distributed.destroy_process_group()
    return 0
