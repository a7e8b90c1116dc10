"""Real Megatron-Core training of a tiny GPT on 2 CPU cores, one test per parallel layout.

Each run starts `torchrun ... -m megapilot.trainer` (its whole process tree stopped in `finally`)
on the shipped corpus, reads the log with the project's log parser and checks that the loss falls
for a real reason: below ln(256), what a model that knew nothing about the bytes would score.
Start-up (torch + megatron.core ≈ 9 s per process) dominates, so each run checks several things.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from megapilot.execute.process import free_port
from megapilot.logs import ParsedLog, parse_logs
from megapilot.logs.stragglers import read_straggler_lines
from megapilot.trainer.corpus import default_dataset_prefix
from tests.e2e.process_tree import run_tree

UNIFORM_BYTE_LOSS = math.log(256)
#: Resumed losses must equal the uninterrupted run's at each step to this relative tolerance
#: (observed: identical to the 7 printed digits).
RESUME_RELATIVE_TOLERANCE = 1e-4

TINY_GPT = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "3",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--eval-iters", "0", "--seed", "1234"]


@dataclass
class TrainRun:
    returncode: int
    log_path: Path
    output: str
    parsed: ParsedLog

    def losses(self) -> dict[int, float]:
        return {r.iteration: r.lm_loss for r in self.parsed.iterations if r.lm_loss is not None}


@pytest.fixture(scope="module")
def corpus_prefix(tmp_path_factory) -> str:
    return default_dataset_prefix(tmp_path_factory.mktemp("corpus"))


def train(tmp_path: Path, name: str, nproc: int, *flags: str, timeout_s: float = 240) -> TrainRun:
    """Run the trainer under torchrun; the whole process tree (workers too) is stopped whatever happens."""
    log_path = tmp_path / f"{name}.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "megapilot.trainer", *flags]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    returncode = run_tree(argv, log_path=log_path, cwd=tmp_path, env=env, timeout_s=timeout_s)
    output = log_path.read_text()
    return TrainRun(returncode, log_path, output, parse_logs([log_path]))


def assert_learned(run: TrainRun, iterations: int) -> None:
    assert run.returncode == 0, run.output[-3000:]
    losses = run.losses()
    assert max(losses) == iterations, sorted(losses)
    first, last = losses[min(losses)], losses[iterations]
    assert last < first - 0.5, losses
    assert last < UNIFORM_BYTE_LOSS - 0.5, f"final loss {last:.3f} is no better than uniform bytes"
    assert "[after training is done]" in run.output


def layout_flags(corpus_prefix: str, iterations: int, *extra: str) -> list[str]:
    return [*TINY_GPT, "--data-path", corpus_prefix, "--train-iters", str(iterations), *extra]




@pytest.mark.slow
def test_tp2_learns_and_logs_every_megatron_line_kind(tmp_path, corpus_prefix, cli):
    run = train(tmp_path, "tp2", 2, *layout_flags(
        corpus_prefix, 30, "--tensor-model-parallel-size", "2", "--log-interval", "5", "--log-throughput",
        "--timing-log-level", "1", "--eval-interval", "15", "--eval-iters", "2", "--split", "90,10,0"))
    assert_learned(run, 30)
    assert [r.iteration for r in run.parsed.iterations] == [5, 10, 15, 20, 25, 30]
    assert all(r.tflops_per_gpu is not None and r.tflops_per_gpu >= 0 for r in run.parsed.iterations)
    assert {m.rank for m in run.parsed.memory} == {0, 1}, run.output[-3000:]  # one report per TP rank (DP rank 0)
    assert any(t.name == "forward-backward" for t in run.parsed.timers)
    # every rank's compute time before its collectives, each log interval (what names a straggler)
    rank_times = read_straggler_lines("tp2.log", run.output.splitlines()).rank_times
    assert len(rank_times) == 6 and all(len(t.compute_ms) == 2 and min(t.compute_ms) > 0 for t in rank_times)
    assert run.output.count("validation loss at iteration") == 2
    # The CPU rewrites are announced at start and counted at the end.
    assert "cpu-compat: installed" in run.output
    assert any(line.startswith("cpu-compat: ") and " rewrites (" in line for line in run.output.splitlines())

    result = cli("logs", "parse", str(run.log_path), "--json")  # the user-facing parser agrees
    assert result.exit_code == 0
    assert [r["iteration"] for r in result.json()["iterations"]] == [5, 10, 15, 20, 25, 30]


@pytest.mark.slow
def test_pp2_one_f_one_b_learns(tmp_path, corpus_prefix):
    run = train(tmp_path, "pp2", 2, *layout_flags(corpus_prefix, 30, "--pipeline-model-parallel-size", "2",
                                                    "--log-interval", "5"))
    assert_learned(run, 30)
    assert {m.rank for m in run.parsed.memory} == {0, 1}, run.output[-3000:]  # one report per pipeline stage


@pytest.mark.slow
def test_pp2_interleaved_virtual_pipeline_learns(tmp_path, corpus_prefix):
    run = train(tmp_path, "vpp", 2, *layout_flags(corpus_prefix, 30, "--pipeline-model-parallel-size", "2",
                                                    "--num-layers-per-virtual-pipeline-stage", "1",
                                                    "--log-interval", "5"))
    assert_learned(run, 30)
    assert all(r.grad_norm < 20 for r in run.parsed.iterations), "exploding gradients: p2p mix-up"


@pytest.mark.slow
def test_dp2_distributed_optimizer_resume_matches_the_uninterrupted_run(tmp_path, corpus_prefix):
    # Dropout on: the resumed run matches only if the checkpoint restored every RNG stream too.
    common = layout_flags(corpus_prefix, 30, "--use-distributed-optimizer", "--overlap-grad-reduce",
                          "--log-interval", "1", "--attention-dropout", "0.1", "--hidden-dropout", "0.1")
    whole = train(tmp_path, "whole", 2, *common)
    assert_learned(whole, 30)

    checkpoints = tmp_path / "ckpt"
    first = train(tmp_path, "first", 2, *common, "--save", str(checkpoints), "--exit-interval", "15")
    assert first.returncode == 0, first.output[-3000:]
    assert max(first.losses()) == 15
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "15"

    resumed = train(tmp_path, "resumed", 2, *common, "--load", str(checkpoints))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert sorted(resumed.losses()) == list(range(16, 31))
    for iteration, loss in resumed.losses().items():
        assert loss == pytest.approx(whole.losses()[iteration], rel=RESUME_RELATIVE_TOLERANCE), iteration
    [save] = [op for op in first.parsed.checkpoints if op.kind == "save"]
    [load] = [op for op in resumed.parsed.checkpoints if op.kind == "load"]
    assert save.iteration == load.iteration == 15 and save.completed and load.completed


@pytest.mark.slow
def test_tp2_pp2_four_processes_learn_and_their_checkpoint_resumes_on_one_process(tmp_path, corpus_prefix):
    checkpoints = tmp_path / "ckpt"
    common = layout_flags(corpus_prefix, 30, "--use-distributed-optimizer", "--log-interval", "1")
    run = train(tmp_path, "tp2pp2", 4, *common, "--tensor-model-parallel-size", "2",
                "--pipeline-model-parallel-size", "2", "--save", str(checkpoints), "--save-interval", "20",
                timeout_s=300)
    assert_learned(run, 30)
    assert {m.rank for m in run.parsed.memory} == {0, 1, 2, 3}

    # The fully_reshardable checkpoint of iteration 20 loads into TP=1, PP=1; the padded vocabulary
    # must stay 512 (128 × TP=2 before, 256 × TP=1 now) and the RNG streams belong to the old layout.
    resumed = train(tmp_path, "tp1pp1", 1, *common, "--load", str(checkpoints), "--ckpt-step", "20",
                    "--no-load-rng", "--make-vocab-size-divisible-by", "256")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert sorted(resumed.losses()) == list(range(21, 31))
    for iteration, loss in resumed.losses().items():
        assert loss == pytest.approx(run.losses()[iteration], rel=RESUME_RELATIVE_TOLERANCE), iteration


@pytest.mark.slow
def test_moe_with_expert_parallel_2_learns(tmp_path, corpus_prefix):
    run = train(tmp_path, "moe", 2, *layout_flags(
        corpus_prefix, 30, "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
        "--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "0.01", "--log-interval", "10"))
    assert_learned(run, 30)
    # The router's load-balancing loss is ~1 when tokens spread evenly over the experts.
    balance = [r.losses["load_balancing_loss"] for r in run.parsed.iterations]
    assert len(balance) == 3 and all(0.9 < value < 2.0 for value in balance), balance


@pytest.mark.slow
def test_one_process_llama_style_bf16_with_recompute_learns(tmp_path, corpus_prefix):
    """SwiGLU, RMSNorm, RoPE, GQA, untied output, no biases, bf16 and full recompute in one run."""
    run = train(tmp_path, "llama", 1, *layout_flags(
        corpus_prefix, 30, "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
        "--disable-bias-linear", "--bf16", "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1", "--log-interval", "10"))
    assert_learned(run, 30)


def _trainer_exit(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.trainer", *flags], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=os.environ | {"PYTHONWARNINGS": "ignore"})


def test_context_parallel_on_cpu_exits_2_saying_it_needs_a_gpu(tmp_path):
    done = _trainer_exit(tmp_path, *TINY_GPT, "--mock-data", "--train-iters", "2", "--context-parallel-size", "2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "--context-parallel-size" in done.stderr and "needs a GPU" in done.stderr


def test_unknown_flag_exits_2_naming_it(tmp_path):
    done = _trainer_exit(tmp_path, *TINY_GPT, "--mock-data", "--train-iters", "2", "--fp8-format", "hybrid")
    assert done.returncode == 2 and "--fp8-format" in done.stderr and "Traceback" not in done.stderr
