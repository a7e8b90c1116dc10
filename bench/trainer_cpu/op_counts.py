"""How many ATen ops the embedded trainer (Megatron-Core's local layers on CPU) runs, per layer, micro-batch and step.

On a GPU the host queues kernels ahead of the device and a kernel's launch cost is priced per kernel
(`latency.layer_kernels`). On a CPU every op runs in line on the rank's one thread, so each op's dispatch (the
Python call, the trainer's device-rewriting mode, the dispatcher, autograd's bookkeeping) adds to the step. The
estimator prices a CPU step's dispatch as the op counts measured here times one op's cost, which the host probe
measures on this machine (`catalog.host`).

Each variant is trained in one process (world size 1, one thread) under a `TorchDispatchMode` that counts every op
reaching ATen, forward and backward (CPU autograd runs the backward on the calling thread, so the mode sees it).
Counts are taken at 2 and 4 training steps (their difference is two steps: start-up and model building cancel), at 2
and 4 layers and at 4 and 8 micro-batches a step, and solved for

    ops a step = micro-batches x (per_layer_micro_batch x layers + per_micro_batch) + per_step + per_layer_step x layers

(exact: four shapes, four unknowns; a fifth shape checks the form). The variants toggle the layer's features one at a
time from the tiny GPT (LayerNorm, GELU, biases, learned positions, MHA) so each feature's ops are its own row.

The same runs count the elements the element-wise ops write (`OpCounter.elements`: every op but the GEMMs, the views
and the allocations), solved in the same form. The shape variants (hidden size, FFN width, sequence length, heads,
each changed alone) say how those elements grow with the dimensions; the op counts must not move with them.

    .venv/bin/python bench/trainer_cpu/op_counts.py     # writes bench/trainer_cpu/op_counts.json (a few minutes)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HIDDEN, FFN, HEADS, SEQ, VOCAB = 64, 256, 4, 64, 256
RESULTS = Path(__file__).with_name("op_counts.json")
STEPS = (2, 4)
SHAPES = ((2, 4), (4, 4), (2, 8), (4, 8))  # (layers, micro-batches a step)
CHECK_SHAPE = (3, 6)

#: feature toggles from the tiny GPT, each the trainer's own flags
VARIANTS: dict[str, list[str]] = {
    "gpt": [],
    "rmsnorm": ["--normalization", "RMSNorm"],
    "swiglu": ["--swiglu"],
    "no_bias": ["--disable-bias-linear"],
    "rope": ["--position-embedding-type", "rope"],
    "gqa": ["--group-query-attention", "--num-query-groups", "2"],
    # the tiny GPT with one dimension changed (later flags win): how the element counts scale
    "hidden": ["--hidden-size", str(2 * HIDDEN)],
    "ffn": ["--ffn-hidden-size", str(2 * FFN)],
    "seq": ["--seq-length", str(2 * SEQ), "--max-position-embeddings", str(2 * SEQ)],
    "heads": ["--num-attention-heads", str(2 * HEADS)],
}

COUNTER = r"""
import atexit, os, runpy, sys
from megapilot.trainer.op_probe import OpCounter

mode = OpCounter()
mode.__enter__()
atexit.register(lambda: os.write(1, f"\nOPCOUNT {mode.ops} {mode.elements}\n".encode()))
sys.argv = ["megapilot.trainer", *sys.argv[1:]]
runpy.run_module("megapilot.trainer", run_name="__main__")
"""


def count(prefix: str, variant: list[str], layers: int, micro_batches: int, steps: int) -> tuple[int, int]:
    """The ops and the element-wise elements of a whole training run."""
    argv = [sys.executable, "-c", COUNTER, "--num-layers", str(layers), "--hidden-size", str(HIDDEN),
            "--ffn-hidden-size", str(FFN), "--num-attention-heads", str(HEADS), "--seq-length", str(SEQ),
            "--max-position-embeddings", str(SEQ), "--micro-batch-size", "1",
            "--global-batch-size", str(micro_batches), "--train-iters", str(steps), "--lr", "1e-3",
            "--lr-decay-style", "constant", "--attention-dropout", "0", "--hidden-dropout", "0",
            "--eval-iters", "0", "--log-interval", "1", "--data-path", prefix, *variant]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OPCOUNT ")]
    if done.returncode != 0 or not lines:
        name = " ".join(variant) or "gpt"
        raise SystemExit(f"trainer failed ({name}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    _, ops, elements = lines[-1].split()
    return int(ops), int(elements)


def per_step(prefix: str, variant: list[str], layers: int, micro_batches: int) -> tuple[float, float]:
    """The ops and the elements of one training step (two runs' difference: start-up and model building cancel)."""
    (low_ops, low_elements), (high_ops, high_elements) = (count(prefix, variant, layers, micro_batches, steps)
                                                          for steps in STEPS)
    steps = STEPS[1] - STEPS[0]
    return (high_ops - low_ops) / steps, (high_elements - low_elements) / steps


def solve(p: dict[tuple[int, int], float]) -> dict[str, float]:
    """The four unknowns from the four shapes of SHAPES (see the module docstring)."""
    per_layer_micro_batch = ((p[4, 8] - p[2, 8]) - (p[4, 4] - p[2, 4])) / 8
    per_layer_step = ((p[4, 4] - p[2, 4]) - 8 * per_layer_micro_batch) / 2
    per_micro_batch = ((p[2, 8] - p[2, 4]) - 8 * per_layer_micro_batch) / 4
    per_step_fixed = p[2, 4] - 4 * (2 * per_layer_micro_batch + per_micro_batch) - 2 * per_layer_step
    return {"per_layer_micro_batch": per_layer_micro_batch, "per_micro_batch": per_micro_batch,
            "per_step": per_step_fixed, "per_layer_step": per_layer_step}


def predicted(row: dict[str, float], layers: int, micro_batches: int) -> float:
    return (micro_batches * (row["per_layer_micro_batch"] * layers + row["per_micro_batch"]) + row["per_step"]
            + row["per_layer_step"] * layers)


def main() -> None:
    import torch

    from megapilot.trainer.corpus import default_dataset_prefix

    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as cache:
        prefix = default_dataset_prefix(cache)
        for name, variant in VARIANTS.items():
            shapes = {shape: per_step(prefix, variant, *shape) for shape in SHAPES}
            check = per_step(prefix, variant, *CHECK_SHAPE)
            row = solve({shape: ops for shape, (ops, _) in shapes.items()})
            row["check_shape_measured"] = check[0]
            row["check_shape_predicted"] = predicted(row, *CHECK_SHAPE)
            elements = solve({shape: counted for shape, (_, counted) in shapes.items()})
            elements["check_shape_measured"] = check[1]
            elements["check_shape_predicted"] = predicted(elements, *CHECK_SHAPE)
            results[name] = row | {"elements": elements}
            print(name, json.dumps(results[name]), flush=True)
    RESULTS.write_text(json.dumps({
        "what": "ATen ops a training step of the embedded trainer runs on CPU (one rank), by layer, micro-batch, step;"
                " under 'elements', the elements its element-wise ops write, in the same form",
        "shape": {"hidden": HIDDEN, "ffn_hidden": FFN, "heads": HEADS, "seq_length": SEQ, "micro_batch_size": 1},
        "form": "micro_batches * (per_layer_micro_batch * layers + per_micro_batch) + per_step"
                " + per_layer_step * layers",
        "check_shape": {"layers": CHECK_SHAPE[0], "micro_batches": CHECK_SHAPE[1]},
        "variants": {name: VARIANTS[name] for name in VARIANTS},
        "counts": results,
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
