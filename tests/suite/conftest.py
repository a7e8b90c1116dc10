"""Shared fixtures for the suite tests: Megatron-format logs written with the trainer's own line formats,
and one real save → resume pair of embedded-trainer runs (slow; built once per session)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from megapilot.trainer import logfmt

DATA = Path(__file__).parents[1] / "data" / "suite"
START = datetime(2026, 3, 1, 12, 0, 0)


@dataclass(frozen=True)
class Step:
    """One iteration line to write: its loss and step time (the rest is derived)."""

    iteration: int
    loss: float
    elapsed_ms: float = 100.0
    nan_iterations: int = 0
    skipped_iterations: int = 0
    grad_norm: float | None = 1.5


def iteration_lines(steps: list[Step], *, train_iters: int, gbs: int = 8) -> list[str]:
    lines = []
    for step in steps:
        stats = logfmt.IterationStats(
            iteration=step.iteration, train_iters=train_iters, consumed_samples=step.iteration * gbs,
            elapsed_ms_per_iteration=step.elapsed_ms, throughput_tflops_per_gpu=2.0, learning_rate=1e-4,
            global_batch_size=gbs, losses={"lm loss": step.loss}, loss_scale=1.0, grad_norm=step.grad_norm,
            skipped_iterations=step.skipped_iterations, nan_iterations=step.nan_iterations)
        lines.append(logfmt.iteration_line(stats, START + timedelta(seconds=step.iteration)))
    return lines


def falling_steps(first: int, last: int, *, start_loss: float = 6.0, per_step: float = 0.05,
                  elapsed_ms: float = 100.0, every: int = 1) -> list[Step]:
    return [Step(i, start_loss - per_step * i, elapsed_ms)
            for i in range(first, last + 1) if i % every == 0 or i == last]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def log_file(tmp_path):
    """`log_file(name, lines)` → a log written under the test's directory."""
    return lambda name, lines: write(tmp_path / name, lines)


# ---- the real trainer --------------------------------------------------------------------------------------

TINY_GPT = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234", "--log-interval", "1",
            "--log-throughput", "--train-iters", "10", "--eval-interval", "5", "--eval-iters", "1",
            "--split", "90,10,0"]


@dataclass(frozen=True)
class TrainerRuns:
    """A save run (checkpoints at 4 and 8, trained to 10) and a run resumed from iteration 4."""

    save_log: Path
    resume_log: Path
    checkpoint_dir: Path


def _train(directory: Path, name: str, *flags: str) -> Path:
    log = directory / name / "out-node0" / "training.log"
    log.parent.mkdir(parents=True)
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with open(log, "wb") as stream:
        done = subprocess.run([sys.executable, "-m", "megapilot.trainer", *flags], stdout=stream,
                              stderr=subprocess.STDOUT, cwd=directory, env=env, timeout=240, check=False)
    assert done.returncode == 0, log.read_text()[-3000:]
    return log


@pytest.fixture(scope="session")
def trainer_runs(tmp_path_factory) -> TrainerRuns:
    pytest.importorskip("megatron.core")
    from megapilot.trainer.corpus import default_dataset_prefix

    directory = tmp_path_factory.mktemp("trainer")
    data = ["--data-path", default_dataset_prefix(directory / "corpus")]
    checkpoints = directory / "ckpt"
    save_log = _train(directory, "save", *TINY_GPT, *data, "--save", str(checkpoints), "--save-interval", "4")
    resume_log = _train(directory, "resume", *TINY_GPT, *data, "--load", str(checkpoints), "--ckpt-step", "4")
    return TrainerRuns(save_log, resume_log, checkpoints)
