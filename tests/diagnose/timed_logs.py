"""Synthetic Megatron-LM job logs with a start-up head and timestamped iteration lines, for the rules and the run
splitting that read resumes, restarts and gaps between jobs."""

from __future__ import annotations


def timed_log(numbers: range, hour: str, *, loaded: int | None = None, train_iters: int = 100) -> str:
    """A Megatron-LM (core <= v0.15) log of iterations `numbers` (log interval 10, 91 s a step interval) from 00:00
    of `hour`, after the lines a start-up prints: a checkpoint of iteration `loaded` loaded, or none found."""
    if loaded is None:
        head = ("WARNING: could not find the metadata file /ckpt/latest_checkpointed_iteration.txt\n"
                "    will not load any checkpoints and will start from random\n")
    else:
        head = (f" loading distributed checkpoint from /ckpt at iteration {loaded}\n"
                f"  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration {loaded}\n")
    lines = [head, "training ...\n"]
    for step, number in enumerate(numbers, start=1):
        clock = f"{hour}:{91 * step // 60:02d}:{91 * step % 60:02d}"
        lines.append(f" [2026-01-01 {clock}] iteration {number:8d}/{train_iters:8d} | "
                     f"consumed samples: {number * 128:12d} | elapsed time per iteration (ms): 9070.1 | learning rate: "
                     f"1.500000E-04 | global batch size:   128 | lm loss: {7 - number / 100:.6E} | loss scale: 1.0 | "
                     "grad norm: 2.345 | number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    return "".join(lines)
