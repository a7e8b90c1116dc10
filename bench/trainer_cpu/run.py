"""Tokens/s of a tiny GPT under megapilot's Megatron-Core trainer vs the same model as a plain PyTorch loop.

Both train the same shapes (4 layers, hidden 64, 4 heads, seq 64, vocabulary 258 padded to 384, learned
positions, LayerNorm, GELU MLP of 4h, tied embeddings), on the same shipped corpus, with the same
batch (global 8 = micro-batch 2 × 4 accumulation steps), Adam with weight decay and grad clipping
at 1.0, fp32, one process, one thread. Steady state: iterations after the first log interval.

The ratio says what the Megatron path (schedules, DDP buffers, Megatron optimizer, CPU rewrites)
costs over bare PyTorch on CPU; on a GPU the comparison would be different. A third run puts the
plain loop inside the trainer's device-rewriting mode, to separate that mode's share of the cost.

    .venv/bin/python bench/trainer_cpu/run.py [--iters 60]   # writes bench/trainer_cpu/results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYERS, HIDDEN, HEADS, SEQ, VOCAB_PADDED = 4, 64, 4, 64, 384
MICRO_BATCH, ACCUMULATION = 2, 4
GLOBAL_BATCH = MICRO_BATCH * ACCUMULATION
LOG_INTERVAL = 10
RESULTS = Path(__file__).with_name("results.json")


def trainer_ms_per_iteration(prefix: str, iters: int) -> tuple[float, float]:
    """Run `python -m megapilot.trainer` once; steady-state ms/iteration and the final loss."""
    argv = [sys.executable, "-m", "megapilot.trainer", "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN),
            "--num-attention-heads", str(HEADS), "--seq-length", str(SEQ), "--micro-batch-size", str(MICRO_BATCH),
            "--global-batch-size", str(GLOBAL_BATCH), "--train-iters", str(iters), "--lr", "1e-3",
            "--lr-decay-style", "constant", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--eval-iters", "0", "--log-interval", str(LOG_INTERVAL), "--data-path", prefix]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    lines = [line for line in done.stdout.splitlines() if " iteration " in line and "lm loss" in line]
    elapsed = [float(re.search(r"elapsed time per iteration \(ms\): ([\d.]+)", line).group(1)) for line in lines]
    losses = [float(re.search(r"lm loss: ([\d.E+-]+)", line).group(1)) for line in lines]
    steady = elapsed[1:]  # the first interval holds warm-up
    return sum(steady) / len(steady), losses[-1]


def plain_pytorch_ms_per_iteration(prefix: str, iters: int, under_cpu_mode: bool = False) -> tuple[float, float]:
    """The same model and batch as a hand-written PyTorch training loop.

    `under_cpu_mode` runs it inside the trainer's device-rewriting TorchFunctionMode, to show what
    that mode alone costs (every torch call passes through Python)."""
    import contextlib

    import numpy
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    tokens = numpy.memmap(prefix + ".bin", dtype=numpy.uint16, mode="r")  # byte tokens fit uint16

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.attn = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class TinyGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.position = nn.Embedding(VOCAB_PADDED, HIDDEN), nn.Embedding(SEQ, HIDDEN)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.final_ln = nn.LayerNorm(HIDDEN)

        def forward(self, ids):
            mask = torch.triu(torch.full((SEQ, SEQ), float("-inf")), diagonal=1)
            x = self.embed(ids) + self.position(torch.arange(SEQ))
            for block in self.blocks:
                x = block(x, mask)
            return self.final_ln(x) @ self.embed.weight.T  # tied output layer

    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rng = numpy.random.default_rng(1234)
    times_s, loss_value = [], math.nan
    if under_cpu_mode:
        from megapilot.trainer.cpu_compat import CudaToCpuMode

        mode = CudaToCpuMode()
    else:
        mode = contextlib.nullcontext()
    with mode:
        loss_value = _train_loop(model, optimizer, tokens, rng, iters, times_s)
    steady = times_s[LOG_INTERVAL:]
    return 1000 * sum(steady) / len(steady), loss_value


def _train_loop(model, optimizer, tokens, rng, iters: int, times_s: list[float]) -> float:
    import numpy
    import torch
    from torch import nn

    loss_value = math.nan
    for _ in range(iters):
        started = time.perf_counter()
        optimizer.zero_grad()
        for _ in range(ACCUMULATION):
            starts = rng.integers(0, len(tokens) - SEQ - 1, size=MICRO_BATCH)
            window = torch.from_numpy(numpy.stack([tokens[s:s + SEQ + 1] for s in starts]).astype(numpy.int64))
            logits = model(window[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB_PADDED), window[:, 1:].reshape(-1))
            (loss / ACCUMULATION).backward()
            loss_value = loss.item()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        times_s.append(time.perf_counter() - started)
    return loss_value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    args = parser.parse_args()
    from megapilot.trainer.corpus import default_dataset_prefix

    with tempfile.TemporaryDirectory() as cache:
        prefix = default_dataset_prefix(cache)
        trainer_ms, trainer_loss = trainer_ms_per_iteration(prefix, args.iters)
        plain_ms, plain_loss = plain_pytorch_ms_per_iteration(prefix, args.iters)
        moded_ms, _ = plain_pytorch_ms_per_iteration(prefix, args.iters, under_cpu_mode=True)
    tokens_per_iteration = GLOBAL_BATCH * SEQ
    trainer_tps, plain_tps = tokens_per_iteration / (trainer_ms / 1000), tokens_per_iteration / (plain_ms / 1000)
    import torch

    results = {
        "what": "tiny GPT tokens/s, one CPU process, one thread: megapilot trainer (Megatron-Core) vs plain PyTorch",
        "model": {"layers": LAYERS, "hidden": HIDDEN, "heads": HEADS, "seq_length": SEQ, "vocab_padded": VOCAB_PADDED,
                  "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH},
        "iterations": args.iters, "steady_state_rule": f"iterations after the first {LOG_INTERVAL}",
        "trainer": {"ms_per_iteration": round(trainer_ms, 2), "tokens_per_s": round(trainer_tps, 1),
                    "final_loss": trainer_loss},
        "plain_pytorch": {"ms_per_iteration": round(plain_ms, 2), "tokens_per_s": round(plain_tps, 1),
                          "final_loss": round(plain_loss, 4)},
        "trainer_over_plain_tokens_per_s": round(trainer_tps / plain_tps, 3),
        "plain_under_cpu_compat_mode": {"ms_per_iteration": round(moded_ms, 2),
                                        "tokens_per_s": round(tokens_per_iteration / (moded_ms / 1000), 1),
                                        "note": "the same plain loop inside the trainer's device-rewriting mode"},
        "cpu_compat_mode_over_plain_tokens_per_s": round(plain_ms / moded_ms, 3),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d")},
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
