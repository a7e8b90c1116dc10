"""`python -m megapilot.trainer.op_probe`: what one op costs the trainer's thread on this machine, as JSON.

On a CPU each ATen op runs in line with the Python that issues it, and what that Python is matters: Megatron-Core's
modules, its autograd functions and DDP's gradient hooks spend about twice per op what a plain `torch.nn` block
does (measured on this machine's 2-core EPYC: 10.5 against 5.2 us). So the op cost is measured on the trainer's
own code path: the model it builds (`trainer.model.build_model`, Megatron's local layer spec under the CPU mode,
wrapped in Megatron's DDP), two layers of it on tensors too small to hold work (hidden 16, 8 tokens), one
micro-batch's forward and backward at a time, on one thread. Its time over the ops it runs (counted by a dispatch
mode) is one op's cost beyond its work: `catalog.host` caches it as `ops_per_s`, and `estimate.host_ops` prices a
CPU step's ops with it.

Run in a process of its own: it makes a one-rank process group and Megatron's parallel state, and the CPU mode
patches torch for the whole process.
"""

from __future__ import annotations

import json
import sys
import time

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
PASSES = 10  # forward + backward passes a timing holds (about 400 ops each)
REPEATS = 5  # timings; the best is kept (other work on the machine only slows one)


class OpCounter(TorchDispatchMode):
    """Counts every op that reaches ATen while it is entered, forward and backward (CPU autograd runs the backward
    on the calling thread, so the mode sees it); `bench/trainer_cpu/op_counts.py` counts the trainer's with it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def measure() -> tuple[int, float]:
    """The ATen ops one micro-batch of the trainer's model runs (forward and backward), and how many a second one
    thread runs of them, their work negligible."""
    torch.set_num_threads(1)
    cpu_compat.enable_cpu_mode()
    config = build_config(PROBE_FLAGS)
    init_distributed(config, on_gpu=False)
    try:
        init_model_parallel(config)
        (model,) = build_model(config, vocab_size_padded=128, on_gpu=False)
        s = config.seq_length
        tokens = torch.randint(0, 128, (1, s), generator=torch.Generator().manual_seed(0))
        positions = torch.arange(s).unsqueeze(0)
        mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)

        def micro_batch() -> None:
            model(tokens, positions, mask, labels=tokens).sum().backward()

        micro_batch()  # the first pass allocates
        with OpCounter() as counter:
            micro_batch()
        best_s = float("inf")
        for _ in range(REPEATS):
            started = time.perf_counter()
            for _ in range(PASSES):
                micro_batch()
            best_s = min(best_s, time.perf_counter() - started)
        return counter.ops, counter.ops * PASSES / best_s
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    ops, rate = measure()
    sys.stdout.write(json.dumps({"ops_per_s": rate, "ops_per_micro_batch": ops}) + "\n")
