"""Which GEMM precisions and FP8 recipes each GPU generation runs, and the refusals that name the alternative."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.spec import TrainingSpec


def _training(**fields: object) -> TrainingSpec:
    return TrainingSpec(seq_length=4096, global_batch_size=64, **fields)  # type: ignore[arg-type]  # test inputs


@pytest.mark.parametrize(("precision", "recipe", "flavour"), [
    ("bf16", "tensorwise", None),
    ("fp8", "delayed", "fp8-delayed"),
    ("fp8", "tensorwise", "fp8-tensorwise"),
    ("fp8", "blockwise", "fp8-blockwise"),
    ("mxfp8", "tensorwise", "mxfp8"),
    ("nvfp4", "tensorwise", "nvfp4"),
    ("mxfp4", "tensorwise", "mxfp4"),
])
def test_each_precision_and_recipe_names_one_flavour(precision: str, recipe: str, flavour: str | None) -> None:
    assert _training(precision=precision, fp8_recipe=recipe).quant_flavour == flavour


@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "nvfp4", "mxfp4"])
def test_a_recipe_other_than_the_default_needs_plain_fp8(precision: str) -> None:
    with pytest.raises(ValueError) as info:
        _training(precision=precision, fp8_recipe="blockwise")
    error = from_validation_error(info.value)
    assert error.field == "fp8_recipe" and f"not {precision}" in error.problem


@pytest.mark.parametrize(("gpu", "precision", "recipe"), [
    ("h100", "fp8", "blockwise"), ("h100", "fp8", "delayed"), ("b200", "fp8", "blockwise"),
    ("b200", "mxfp8", None), ("b200", "nvfp4", None), ("mi300x", "fp8", "tensorwise"),
    ("mi355x", "mxfp8", None), ("mi355x", "mxfp4", None), ("mi355x", "fp8", "blockwise"),
])
def test_supported_flavours_pass(gpu: str, precision: str, recipe: str | None) -> None:
    get_gpu(gpu).check_precision(precision, recipe)  # type: ignore[arg-type]  # test inputs


@pytest.mark.parametrize(("gpu", "precision", "recipe", "field", "fix"), [
    ("a100", "fp8", "tensorwise", "precision", "bf16"),
    ("h100", "mxfp8", None, "precision", "fp8_recipe blockwise"),
    ("h100", "nvfp4", None, "precision", "precision fp8"),
    ("mi300x", "mxfp8", None, "precision", "fp8_recipe blockwise"),
    ("mi355x", "nvfp4", None, "precision", "mxfp4"),
    ("b200", "mxfp4", None, "precision", "nvfp4"),
    ("h100", "mxfp4", None, "precision", "fp8"),
])
def test_missing_formats_are_refused_with_the_alternative(gpu: str, precision: str, recipe: str | None, field: str,
                                                          fix: str) -> None:
    with pytest.raises(MegapilotError, match=f"{precision} is not supported") as info:
        get_gpu(gpu).check_precision(precision, recipe)  # type: ignore[arg-type]  # test inputs
    assert info.value.field == field and fix in (info.value.fix or "")


def test_blockwise_fp8_needs_hopper_or_blackwell_not_ada() -> None:
    ada = get_gpu("h100").model_copy(update={"name": "L40S", "architecture": "ada"})
    ada.check_precision("fp8", "tensorwise")
    with pytest.raises(MegapilotError, match="Float8BlockScaling needs Hopper") as info:
        ada.check_precision("fp8", "blockwise")
    assert info.value.field == "fp8_recipe" and info.value.fix == "use one of: delayed, tensorwise"


def test_each_format_is_priced_at_its_own_datasheet_peak() -> None:
    mi355x, b300 = get_gpu("mi355x"), get_gpu("b300")
    assert mi355x.peak_tflops("mxfp4") == mi355x.mxfp4_dense_tflops
    assert b300.peak_tflops("nvfp4") == b300.nvfp4_dense_tflops
    assert b300.peak_tflops("mxfp8") == b300.mxfp8_dense_tflops
    assert b300.peak_tflops("nvfp4") > b300.peak_tflops("mxfp8") > b300.peak_tflops("bf16")
    # a GPU without a format-specific peak falls back to its bit width's peak
    h100 = get_gpu("h100")
    assert h100.peak_tflops("mxfp8") == h100.fp8_dense_tflops
