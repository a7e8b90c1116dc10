"""Every low-precision flavour renders exactly Megatron-LM's flags (and Primus's keys), or is refused by name."""

from __future__ import annotations

import pytest
import yaml

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.flags import read_flags, run_config
from megapilot.errors import MegapilotError
from megapilot.launch import LaunchOptions, check_megatron_args, render_launch, render_megatron_args
from megapilot.launch.flags import quant_flavour_of_flags
from megapilot.launch.megatron_args import flag_table
from megapilot.spec import TrainingSpec
from tests.launch.plans import LLAMA31_8B, make_plan

MOCK = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)
PRIMUS = LaunchOptions(launcher="primus", mock_data=True, primus_config_path="/exp/run.yaml",
                       check_paths_exist=False)
PRECISION_FLAGS = ("--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
                   "--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag", "--fp8-amax-history-len",
                   "--fp8-amax-compute-algo")


def _plan(gpu: str, precision: str, recipe: str = "tensorwise", **layout: object):  # type: ignore[no-untyped-def]
    training = TrainingSpec(seq_length=4096, global_batch_size=64, precision=precision,  # type: ignore[arg-type]
                            fp8_recipe=recipe)  # type: ignore[arg-type]  # test inputs
    return make_plan(LLAMA31_8B, gpu, 1, training, tp=2, **layout)


def _precision_flags(args: list[str]) -> dict[str, list[str]]:
    pairs = flag_table().split_args(args)
    return {name: values for name, values in pairs if name in PRECISION_FLAGS}


@pytest.mark.parametrize(("gpu", "precision", "recipe", "expected"), [
    ("h100", "bf16", "tensorwise", {"--bf16": []}),
    # Delayed scaling: the largest amax of 1024 steps, as Bridge's fp8_ds preset and Megatron-LM's FP8 example.
    ("h100", "fp8", "delayed", {"--bf16": [], "--fp8-format": ["hybrid"], "--fp8-recipe": ["delayed"],
                                "--fp8-amax-history-len": ["1024"], "--fp8-amax-compute-algo": ["max"]}),
    ("h100", "fp8", "tensorwise", {"--bf16": [], "--fp8-format": ["hybrid"], "--fp8-recipe": ["tensorwise"]}),
    ("h100", "fp8", "blockwise", {"--bf16": [], "--fp8-format": ["hybrid"], "--fp8-recipe": ["blockwise"]}),
    ("b200", "fp8", "blockwise", {"--bf16": [], "--fp8-format": ["hybrid"], "--fp8-recipe": ["blockwise"]}),
    ("b200", "mxfp8", "tensorwise", {"--bf16": [], "--fp8-format": ["e4m3"], "--fp8-recipe": ["mxfp8"]}),
    ("b200", "nvfp4", "tensorwise", {"--bf16": [], "--fp4-format": ["e2m1"], "--fp4-recipe": ["nvfp4"]}),
    ("mi355x", "mxfp8", "tensorwise", {"--bf16": [], "--fp8-format": ["e4m3"], "--fp8-recipe": ["mxfp8"]}),
])
def test_each_flavour_renders_megatrons_flags(gpu: str, precision: str, recipe: str,
                                              expected: dict[str, list[str]]) -> None:
    plan = _plan(gpu, precision, recipe, distributed_optimizer=False)  # no param gather: the recipe flags alone
    args = render_megatron_args(plan, MOCK)
    assert _precision_flags(args) == expected
    check_megatron_args(args, plan.cluster.gpu)  # the pinned parser takes every value


@pytest.mark.parametrize(("precision", "recipe", "gather"), [
    ("fp8", "delayed", ["--fp8-param-gather"]),
    ("fp8", "blockwise", ["--fp8-param-gather"]),
    ("mxfp8", "tensorwise", ["--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag"]),
    ("nvfp4", "tensorwise", []),
])
def test_param_gather_flags_follow_the_recipe(precision: str, recipe: str, gather: list[str]) -> None:
    args = render_megatron_args(_plan("b200", precision, recipe), MOCK)
    assert [flag for flag in _precision_flags(args) if "gather" in flag or "reuse" in flag] == gather


@pytest.mark.parametrize(("gpu", "precision", "recipe", "field", "problem"), [
    ("h100", "mxfp8", "tensorwise", "precision", "mxfp8 is not supported on H100"),
    ("h100", "nvfp4", "tensorwise", "precision", "nvfp4 is not supported on H100"),
    ("mi300x", "mxfp8", "tensorwise", "precision", "mxfp8 is not supported on MI300X"),
    ("mi355x", "mxfp4", "tensorwise", "precision", "mxfp4 has no Megatron-LM recipe"),
    ("mi355x", "fp8", "blockwise", "fp8_recipe", "Primus-Turbo"),
])
def test_flavours_the_gpu_or_launcher_lacks_are_refused(gpu: str, precision: str, recipe: str, field: str,
                                                         problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem) as info:
        render_launch(_plan(gpu, precision, recipe), MOCK)
    assert info.value.field == field and info.value.fix


def _primus_overrides(gpu: str, precision: str, recipe: str = "tensorwise") -> dict[str, object]:
    launch = render_launch(_plan(gpu, precision, recipe), PRIMUS)
    overrides: dict[str, object] = yaml.safe_load(launch.files["/exp/run.yaml"])["modules"]["pre_trainer"]["overrides"]
    return overrides


def test_primus_trains_mxfp4_with_its_own_keys_and_bf16_megatron_args() -> None:
    overrides = _primus_overrides("mi355x", "mxfp4")
    assert (overrides["fp4"], overrides["fp4_recipe"], overrides["use_turbo_gemm"]) == ("e2m1", "mxfp4", False)
    assert overrides["bf16"] is True and "fp8" not in overrides


@pytest.mark.parametrize(("gpu", "precision", "recipe", "fp8", "fp8_recipe", "turbo_gemm"), [
    ("mi355x", "mxfp8", "tensorwise", "e4m3", "mxfp8", True),
    ("mi300x", "fp8", "blockwise", "hybrid", "blockwise", True),
    ("mi300x", "fp8", "tensorwise", "hybrid", "tensorwise", None),  # TE's own per-tensor GEMMs
])
def test_primus_fp8_keys_and_the_turbo_gemm_they_need(gpu: str, precision: str, recipe: str, fp8: str,
                                                      fp8_recipe: str, turbo_gemm: bool | None) -> None:
    overrides = _primus_overrides(gpu, precision, recipe)
    assert (overrides["fp8"], overrides["fp8_recipe"]) == (fp8, fp8_recipe)
    assert overrides.get("use_turbo_gemm") == turbo_gemm


@pytest.mark.parametrize(("args", "problem"), [
    (["--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--fp8-param-gather",
      "--reuse-grad-buf-for-mxfp8-param-ag", "--use-distributed-optimizer"], "is for --fp8-recipe mxfp8"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], "mxfp8 is not supported on H100"),
    (["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"], "nvfp4 is not supported on H100"),
])
def test_hand_written_precision_flags_are_checked(args: list[str], problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem):
        check_megatron_args(["--mock-data", *args], get_gpu("h100"))


def test_blockwise_fp8_is_refused_on_ada_by_the_flag_check() -> None:
    ada = get_gpu("h100").model_copy(update={"name": "L40S", "architecture": "ada"})
    with pytest.raises(MegapilotError, match="Float8BlockScaling") as info:
        check_megatron_args(["--mock-data", "--fp8-format", "hybrid", "--fp8-recipe", "blockwise"], ada)
    assert info.value.field == "fp8_recipe"


@pytest.mark.parametrize(("args", "problem"), [
    (["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather", "--use-distributed-optimizer",
      "--optimizer-cpu-offload"], "needs --fp8-recipe delayed, not tensorwise"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--first-last-layers-bf16"], "first and last layers"),
    (["--fp8-format", "hybrid", "--num-experts", "8", "--moe-grouped-gemm", "--recompute-modules", "core_attn",
      "moe_act"], "does not recompute moe_act"),
    (["--recompute-granularity", "selective", "--num-experts", "8", "--recompute-modules", "moe_act"],
     "moe_act needs --moe-grouped-gemm"),
    (["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"],
     "mla_up_proj needs --multi-latent-attention"),
    (["--fp4-param-gather"], "--fp4-param-gather without FP4 training"),
    (["--cpu-offloading-num-layers", "4", "--pipeline-model-parallel-size", "2"], "no support for Pipeline"),
    (["--cpu-offloading-num-layers", "4", "--recompute-activations"], "does not work when activation recomputation"),
])
def test_megatrons_per_recipe_refusals(args: list[str], problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem) as info:
        check_megatron_args(["--mock-data", *args], get_gpu("b200"))
    assert info.value.fix


@pytest.mark.parametrize("args", [
    ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-param-gather", "--use-distributed-optimizer",
     "--optimizer-cpu-offload"],
    ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16"],
    ["--cpu-offloading-num-layers", "4", "--use-distributed-optimizer"],
    ["--fp8-format", "hybrid", "--fp8-recipe", "blockwise", "--num-experts", "8", "--moe-grouped-gemm",
     "--recompute-modules", "moe_act", "layernorm"],
])
def test_the_combinations_megatron_takes_pass(args: list[str]) -> None:
    check_megatron_args(["--mock-data", *args], get_gpu("b200"))


@pytest.mark.parametrize(("gpu", "precision", "recipe"), [
    ("h100", "bf16", "tensorwise"), ("h100", "fp8", "delayed"), ("h100", "fp8", "tensorwise"),
    ("h100", "fp8", "blockwise"), ("b200", "mxfp8", "tensorwise"), ("b200", "nvfp4", "tensorwise"),
    ("mi355x", "mxfp8", "tensorwise"),
])
def test_a_rendered_launch_reads_back_as_the_precision_it_was_written_for(gpu: str, precision: str,
                                                                          recipe: str) -> None:
    """`optimize` and `diagnose` price a script by what its flags say: an MXFP8 or NVFP4 launch read as FP8 with
    per-tensor scaling (or as bf16) would be priced with the wrong GEMM rates and casts."""
    plan = _plan(gpu, precision, recipe)
    config = run_config(read_flags(flags=" ".join(render_megatron_args(plan, MOCK))), gpu=get_gpu(gpu), gpus=8)
    assert config.training is not None
    assert (config.training.precision, config.training.fp8_recipe) == (precision, recipe)


@pytest.mark.parametrize(("flags", "flavour"), [
    ("--fp8-format hybrid", "fp8-delayed"),  # Megatron's default recipe, not ours
    ("--fp8-format e4m3 --fp8-recipe mxfp8", "mxfp8"),
    ("--fp4-format e2m1", "nvfp4"),
    ("--fp8-format hybrid --fp8-recipe custom", "custom"),
    ("--fp8-format hybrid --fp8-recipe Fp8Recipe.blockwise", "fp8-blockwise"),  # an arguments block's enum
    ("--bf16", None),
])
def test_a_format_flag_without_its_recipe_runs_megatrons_default(flags: str, flavour: str | None) -> None:
    words = flags.split()
    value = {name: words[i + 1] for i, name in enumerate(words[:-1]) if not words[i + 1].startswith("--")}
    assert quant_flavour_of_flags(value.get("--fp8-format"), value.get("--fp8-recipe"), value.get("--fp4-format"),
                                  value.get("--fp4-recipe")) == flavour


def test_a_recipe_megatron_has_no_choice_of_is_refused_by_its_flag() -> None:
    with pytest.raises(MegapilotError, match="--fp8-recipe foo is not one of") as raised:
        quant_flavour_of_flags("hybrid", "foo", None, None)
    assert raised.value.field == "--fp8-recipe" and "blockwise" in (raised.value.fix or "")
    with pytest.raises(MegapilotError, match="--fp4-recipe"):
        quant_flavour_of_flags(None, None, "e2m1", "mxfp4")
