"""`python -m megapilot.trainer.op_probe`: what one op, and one element of element-wise work, cost the trainer's
thread on this machine, as JSON.

On a CPU each ATen op runs in line with the Python that issues it, and what that Python is matters: Megatron-Core's
modules, its autograd functions and DDP's gradient hooks spend about twice per op what a plain `torch.nn` block
does (measured on this machine's 2-core EPYC: 10.5 against 5.2 us). So the op cost is measured on the trainer's
own code path: the model it builds (`trainer.model.build_model`, Megatron's local layer spec under the CPU mode,
wrapped in Megatron's DDP), two layers of it on tensors too small to hold work (hidden 16, 8 tokens), one
micro-batch's forward and backward at a time, on one thread. Its time over the ops it runs (counted by a dispatch
mode) is one op's cost beyond its work: `catalog.host` caches it as `ops_per_s`, and `estimate.host_ops` prices a
CPU step's ops with it.

The element-wise ops (copies, adds, masks, softmax, GELU, norms: everything but the GEMMs) are not memory-bound on
one CPU thread as a GPU's are on HBM: at the tour's sizes they run 0.3-2 ns an element (a GELU or a masked fill
several times a copy), well below the memory's stream rate. So their cost is measured on the same model at a size
where they do work: the time inside its element-wise kernels at two micro-batch sizes (the same ops, so their fixed
costs cancel), over the elements the larger writes beyond the smaller (`elements_per_s`; the mix of the trainer's
own layer, at its own proportions).

And what the process holds before a model of any size (`runtime_gib`): Python, torch, Megatron-Core and a process
group, resident; a CPU rank's memory overhead, where a GPU has its CUDA context and NCCL buffers.

Run in a process of its own: it makes a one-rank process group and Megatron's parallel state, and the CPU mode
patches torch for the whole process.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megapilot.trainer import cpu_compat
from megapilot.trainer.config import build_config
from megapilot.trainer.model import build_model
from megapilot.trainer.train import init_distributed, init_model_parallel

PROBE_FLAGS = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
               "--max-position-embeddings", "8", "--micro-batch-size", "1", "--global-batch-size", "1",
               "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "128",
               "--attention-dropout", "0", "--hidden-dropout", "0"]
PROBE_VOCAB = 128
# The same model at a size where its element-wise ops do work (tens of thousands of elements an op, the scores
# a quarter of a million), at two micro-batch sizes: their difference is element-wise work alone.
ELEMENT_PROBE_FLAGS = [*PROBE_FLAGS, "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                       "--max-position-embeddings", "128"]
ELEMENT_PROBE_MICRO_BATCHES = (2, 4)
ELEMENT_REPEATS = 8  # one pass each; the best is kept
ELEMENTS_PER_S_CEILING = 1e11  # the fastest element rate measure() reports, far above one thread's
PASSES = 10  # forward + backward passes a timing holds (about 400 ops each)
REPEATS = 5  # timings; the best is kept (other work on the machine only slows one)


# The ops whose time is priced as FLOPs at the matmul rate (`estimate.step_time`), not per element.
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
# Ops that return a tensor without touching its elements (beside the views, which ATen marks `is_view`).
NO_ELEMENT_WORK_OPS = frozenset({"_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty",
                                 "new_empty_strided", "lift_fresh", "set_", "resize_"})


class OpCounter(TorchDispatchMode):
    """Counts every op that reaches ATen while it is entered, forward and backward (CPU autograd runs the backward
    on the calling thread, so the mode sees it), and the elements the element-wise ones write (every op but the
    GEMMs, the views and the allocations: copies, adds, masks, softmax, activations, norms, the optimizer's updates);
    `bench/trainer_cpu/op_counts.py` counts the trainer's with it. `timed`: also the seconds spent inside the
    element-wise ops' kernels (the dispatch, autograd and Python around them excluded)."""

    def __init__(self, *, timed: bool = False) -> None:
        super().__init__()
        self.ops = 0
        self.element_ops = 0
        self.elements = 0
        self.element_op_s = 0.0
        self.timed = timed

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        name = func.overloadpacket.__name__
        if name in GEMM_OPS or func.is_view or name in NO_ELEMENT_WORK_OPS:
            return func(*args, **(kwargs or {}))
        started = time.perf_counter() if self.timed else 0.0
        out = func(*args, **(kwargs or {}))
        if self.timed:
            self.element_op_s += time.perf_counter() - started
        outs = out if isinstance(out, (tuple, list)) else (out,)
        self.element_ops += 1
        self.elements += sum(o.numel() for o in outs if isinstance(o, torch.Tensor))
        return out


@dataclass(frozen=True)
class HostOpRates:
    """What the trainer's thread pays beside its GEMMs: one op, and one element an element-wise op writes."""

    ops_per_micro_batch: int  # the probe's own model: what the op rate was timed over
    ops_per_s: float
    elements_per_s: float
    runtime_gib: float  # the process's peak resident memory with the tiny model trained: its runtime, the model none


def measure() -> HostOpRates:
    """One op's cost, from the trainer's model on tensors too small to hold work; then one element's: the time
    inside the element-wise kernels of the same model at a working size, at two micro-batch sizes (the same ops,
    their fixed costs cancel), over the elements the larger writes beyond the smaller."""
    torch.set_num_threads(1)
    cpu_compat.enable_cpu_mode()
    config = build_config(PROBE_FLAGS)
    init_distributed(config, on_gpu=False)
    try:
        init_model_parallel(config)
        (tiny_model,) = build_model(config, vocab_size_padded=PROBE_VOCAB, on_gpu=False)
        tiny = _timed(tiny_model, 1, config.seq_length)
        runtime_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # KiB on Linux
        best_s = float("inf")
        for _ in range(REPEATS):
            started = time.perf_counter()
            for _ in range(PASSES):
                tiny.micro_batch()
            best_s = min(best_s, (time.perf_counter() - started) / PASSES)
        work_config = build_config(ELEMENT_PROBE_FLAGS)
        (work_model,) = build_model(work_config, vocab_size_padded=PROBE_VOCAB, on_gpu=False)
        small, large = (_timed(work_model, b, work_config.seq_length) for b in ELEMENT_PROBE_MICRO_BATCHES)
        small_s, large_s = small.element_op_s(), large.element_op_s()
        # a busy machine can time the larger pass no slower than the smaller: the rate is then capped, not infinite
        extra_s = max(large_s - small_s, (large.elements - small.elements) / ELEMENTS_PER_S_CEILING)
        return HostOpRates(ops_per_micro_batch=tiny.ops, ops_per_s=tiny.ops / best_s,
                           elements_per_s=(large.elements - small.elements) / extra_s, runtime_gib=runtime_gib)
    finally:
        torch.distributed.destroy_process_group()


@dataclass(frozen=True)
class _Pass:
    """One micro-batch's forward and backward through a model: its ops and the elements its element-wise ops
    write, counted once."""

    micro_batch: Callable[[], None]
    ops: int
    elements: int

    def element_op_s(self) -> float:
        """The best time inside its element-wise kernels (the dispatch, autograd and Python around them left out)."""
        best_s = float("inf")
        for _ in range(ELEMENT_REPEATS):
            with OpCounter(timed=True) as timed:
                self.micro_batch()
            best_s = min(best_s, timed.element_op_s)
        return best_s


def _timed(model: torch.nn.Module, b: int, s: int) -> _Pass:
    tokens = torch.randint(0, PROBE_VOCAB, (b, s), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)

    def micro_batch() -> None:
        model(tokens, positions, mask, labels=tokens).sum().backward()

    micro_batch()  # the first pass allocates
    with OpCounter() as counter:
        micro_batch()
    return _Pass(micro_batch=micro_batch, ops=counter.ops, elements=counter.elements)


if __name__ == "__main__":
    sys.stdout.write(json.dumps(asdict(measure())) + "\n")
