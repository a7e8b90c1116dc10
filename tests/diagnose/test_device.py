"""diagnose.device: a run counts as a CPU run when its flags or its log's arguments block name gloo."""

from __future__ import annotations

import pytest

from megapilot.diagnose.device import trained_on_cpu
from megapilot.diagnose.flags import collect_flags, run_config
from megapilot.logs import parse_text


def _arguments_block(backend: str) -> str:
    return ("------------------------ arguments ------------------------\n"
            f"  distributed_backend ............................. {backend}\n"
            "  micro_batch_size ................................ 1\n"
            "-------------------- end of arguments ---------------------\n")


@pytest.mark.parametrize(("backend", "on_cpu"), [("gloo", True), ("GLOO", True), ("nccl", False)])
def test_the_distributed_backend_flag_decides(backend, on_cpu):
    config = run_config(collect_flags(["--distributed-backend", backend, "--tensor-model-parallel-size", "1"]))
    assert trained_on_cpu(config, None) is on_cpu


@pytest.mark.parametrize(("backend", "on_cpu"), [("gloo", True), ("nccl", False)])
def test_the_logs_arguments_block_decides_without_flags(backend, on_cpu):
    assert trained_on_cpu(None, parse_text(_arguments_block(backend))) is on_cpu


def test_either_source_naming_gloo_is_enough_and_no_evidence_is_a_gpu_run():
    no_backend = run_config(collect_flags(["--tensor-model-parallel-size", "2"]))
    assert trained_on_cpu(no_backend, parse_text(_arguments_block("gloo"))) is True
    assert trained_on_cpu(no_backend, parse_text("iteration lines only, no arguments block\n")) is False
    assert trained_on_cpu(None, None) is False
