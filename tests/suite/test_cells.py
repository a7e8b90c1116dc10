"""Sweep keys, typed train params, precision skip reasons, smoke defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.catalog.gpus import get_gpu
from megapilot.execute.base import COMBO_NAME_PATTERN
from megapilot.suite.cells import (
    TrainParams,
    default_cell,
    parse_cell_key,
    precision_skip_reason,
    smoke_cell,
    sweep_cell,
)

PARAMS = TrainParams(model_name="llama3.1_8B", sequence_length="8192", recompute="1", fsdp=0,
                     tensor_parallelism="2", pipeline_parallelism=1, training_iterations="20", name="x")


def test_keys_parse_to_a_canonical_key_and_a_directory_safe_slug() -> None:
    key = parse_cell_key(" MBS=4,GBS=128,PRECISION=fp8")
    assert key.key == "MBS=4,GBS=128,PRECISION=FP8"
    assert key.slug == "MBS4_GBS128_FP8" and COMBO_NAME_PATTERN.match(key.slug)


@pytest.mark.parametrize("bad", ["MBS=4,GBS=128", "MBS=a,GBS=1,PRECISION=BF16", "MBS=0,GBS=1,PRECISION=BF16",
                                 "MBS=1,GBS=1,PRECISION=FP32", "GBS=1,MBS=1,PRECISION=BF16"])
def test_bad_keys_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cell_key(bad)


def test_strings_and_numbers_both_parse() -> None:
    assert (PARAMS.sequence_length, PARAMS.recompute, PARAMS.fsdp, PARAMS.tensor_parallelism) == (8192, True, False, 2)
    assert PARAMS.extras() == {"name": "x"}
    with pytest.raises(ValidationError):
        TrainParams(model_name="m", sequence_length="8k", training_iterations=1)
    with pytest.raises(ValidationError):
        TrainParams(model_name="m", sequence_length=1, training_iterations=1, recompute="maybe")


@pytest.mark.parametrize("precision, gpu, expected", [
    ("MXFP4", "mi300x", "MXFP4 is not supported on MI300X (cdna3 runs BF16, FP16, FP8)"),
    ("FP8", "a100", "FP8 is not supported on A100-SXM4-80GB (ampere runs BF16, FP16)"),
    ("NVFP4", "h100", "NVFP4 is not supported on H100-SXM5-80GB (hopper runs BF16, FP16, FP8)"),
    ("MXFP8", "mi355x", None), ("NVFP4", "b200", None), ("FP8", "h100", None),
])
def test_precision_skip_reasons(precision: str, gpu: str, expected: str | None) -> None:
    assert precision_skip_reason(precision, get_gpu(gpu)) == expected


def test_cpu_runs_bf16_and_fp16_only() -> None:
    assert precision_skip_reason("BF16", None) is None
    assert "CPU" in precision_skip_reason("FP8", None)


def test_sweep_cell_merges_the_key_and_flags_a_precision_the_gpu_lacks() -> None:
    params = PARAMS.model_copy(update={"training_iterations": 5})
    cell = sweep_cell(parse_cell_key("MBS=1,GBS=64,PRECISION=MXFP4"), params, get_gpu("mi300x"))
    assert (cell.layout.mbs, cell.gbs, cell.precision, cell.layout.tp, cell.train_iters) == (1, 64, "MXFP4", 2, 5)
    assert cell.layout.recompute == "full" and not cell.layout.fsdp and cell.skip_reason.startswith("MXFP4")


def test_default_and_smoke_cells() -> None:
    assert default_cell(PARAMS, None, nodes=1).key == "default"
    assert default_cell(PARAMS, None, nodes=1).gbs == 8
    one = smoke_cell(PARAMS, iters=10, mbs=1, gbs=None, precision="BF16", gpu=None, nodes=1)
    many = smoke_cell(PARAMS, iters=10, mbs=1, gbs=None, precision="BF16", gpu=None, nodes=4)
    assert (one.gbs, many.gbs, one.train_iters, one.slug) == (8, 16, 10, "smoke")
