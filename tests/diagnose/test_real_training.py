"""End to end on real Megatron-Core training (CPU): a healthy run has no finding, a refused
configuration is a config_error, and a learning rate of 1e4 really diverges into NaN and is caught.

Each run is `torchrun -m megapilot.trainer` on 1 CPU process (its whole tree stopped in `finally`);
start-up (~9 s of imports) dominates.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from megapilot.diagnose import diagnose
from megapilot.execute.process import free_port
from megapilot.logs import parse_logs
from megapilot.trainer.corpus import default_dataset_prefix
from tests.e2e.process_tree import run_tree, started_tree

pytestmark = pytest.mark.slow

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-3",
        "--train-iters", "12", "--log-interval", "1", "--eval-iters", "0", "--seed", "1234"]


@pytest.fixture(scope="module")
def data_prefix(tmp_path_factory) -> str:
    return default_dataset_prefix(tmp_path_factory.mktemp("corpus"))


def _signal_tree(pid: int, signum: int) -> None:
    """Signal the launcher and every descendant: torchrun starts each worker in its own session, so
    signalling the launcher's process group alone would miss them."""
    import psutil

    try:
        family = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for child in family:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def train(tmp_path: Path, name: str, *flags: str) -> Path:
    log_path = tmp_path / f"{name}.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "-m", "megapilot.trainer", *flags]
    run_tree(argv, log_path=log_path, cwd=tmp_path, timeout_s=240,
             env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
    return log_path


def test_healthy_run_parses_fully_and_has_no_finding(tmp_path: Path, data_prefix: str):
    log_path = train(tmp_path, "ok", *TINY, "--data-path", data_prefix)
    log = parse_logs([log_path])
    assert [r.iteration for r in log.iterations] == list(range(1, 13))
    assert log.summary.final_loss < log.summary.first_loss
    assert log.memory and log.memory[0].rank == 0
    assert any(m.marker == "training_done" for m in log.markers)
    assert diagnose([log_path], flags=" ".join(TINY)).findings == []


def test_refused_configuration_is_a_config_error_and_the_crash_its_consequence(tmp_path: Path, data_prefix: str):
    log_path = train(tmp_path, "bad", *TINY, "--data-path", data_prefix, "--num-attention-heads", "3")
    findings = diagnose([log_path]).findings
    assert [f.category for f in findings] == ["config_error", "process_crash"]
    assert "divisible" in findings[0].evidence[0].text and findings[1].severity == "warning"


def test_huge_learning_rate_diverges_into_nan_and_is_diagnosed(tmp_path: Path, data_prefix: str):
    flags = [*TINY, "--data-path", data_prefix, "--lr", "1e4"]
    log_path = train(tmp_path, "nan", *flags)
    (finding,) = diagnose([log_path], flags=" ".join(flags)).findings
    assert finding.category == "nan_loss" and finding.severity == "critical"
    fixes = {f.flag: f.value for f in finding.fixes}
    assert fixes["--lr"] == "5.00e+03" and "--lr-warmup-iters" in fixes
    summary = parse_logs([log_path]).summary
    assert summary.nan_iterations and summary.min_loss > 1.0, "the 0.0 printed in NaN intervals is not a loss"


def test_follow_raises_a_hang_when_real_training_is_frozen(tmp_path: Path, data_prefix: str):
    """SIGSTOP the training process group mid-run: the follower must report `hang` from the wall clock."""
    from megapilot.logs import follow_log
    from megapilot.logs.records import ErrorRecord, IterationRecord

    log_path = tmp_path / "frozen.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "-m", "megapilot.trainer", *TINY, "--train-iters", "100000",
            "--data-path", data_prefix]
    seen: dict[str, object] = {"iterations": 0, "hang": None}

    def on_record(record: object) -> None:
        if isinstance(record, IterationRecord):
            seen["iterations"] = int(seen["iterations"]) + 1  # type: ignore[arg-type]  # the count starts as an int
            if seen["iterations"] == 5:
                _signal_tree(process.pid, signal.SIGSTOP)
        if isinstance(record, ErrorRecord) and record.category == "hang":
            seen["hang"] = record

    with started_tree(argv, log_path=log_path, cwd=tmp_path,
                      env=os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}) as process:
        follow_log(log_path, poll_s=0.1, timeout_s=180, hang_factor=10, hang_floor_s=3.0,
                   on_record=on_record, should_stop=lambda: seen["hang"] is not None)
    hang = seen["hang"]
    assert isinstance(hang, ErrorRecord), "no hang reported within the timeout"
    assert int(hang.details["last_iteration"]) >= 5 and float(hang.details["silent_s"]) >= 3.0
