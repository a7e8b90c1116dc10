"""Primus experiment: overrides carry exactly the Megatron arguments, typed, under Megatron's names."""

from __future__ import annotations

import yaml

from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.megatron_args import pinned_flags
from megapilot.launch.primus import primus_overrides
from megapilot.spec import ModelSpec, TrainingSpec
from tests.launch.plans import GOLDEN_PLANS, LLAMA31_8B, MIXTRAL_8X7B, make_plan
from tests.launch.variants import VARIANT_PLANS

OPTIONS = LaunchOptions(launcher="primus", data_path="/d/corpus_text_document", tokenizer_model="/t/llama3",
                        save="/ckpt", primus_config_path="/exp/run.yaml", check_paths_exist=False)


def _overrides(plan_name: str) -> dict:
    plan = VARIANT_PLANS[plan_name]
    launch = render_launch(plan, OPTIONS)
    experiment = yaml.safe_load(launch.files["/exp/run.yaml"])
    assert experiment["modules"]["pre_trainer"]["framework"] == "megatron"
    return experiment["modules"]["pre_trainer"]["overrides"]


def test_overrides_are_typed_megatron_destinations() -> None:
    o = _overrides("llama3.3-70b_8nodes")
    assert o["num_layers"] == 80 and o["tensor_model_parallel_size"] == 8 and o["lr"] == 3e-4
    assert o["sequence_parallel"] is True and o["add_bias_linear"] is False and o["bf16"] is True
    assert o["data_path"] == ["/d/corpus_text_document"] and o["split"] == "99,1,0"
    assert o["norm_epsilon"] == 1e-5  # Primus names it after the flag, not Megatron's layernorm_epsilon
    dests = {f.dest for f in pinned_flags().values()} | {"norm_epsilon"}
    assert set(o) <= dests


def test_switches_off_in_the_plan_are_written_false() -> None:
    o = _overrides("fp16_gpt2")
    assert o["fp16"] is True and o["bf16"] is False  # Primus's base config has bf16 on
    assert o["swiglu"] is False and o["add_bias_linear"] is True and o["sequence_parallel"] is False


def test_resuming_from_an_empty_load_directory_does_not_exit() -> None:
    assert _overrides("llama3.1-8b_1node")["exit_on_missing_checkpoint"] is False


def test_every_megatron_argument_appears_in_the_overrides() -> None:
    for plan in GOLDEN_PLANS.values():
        launch = render_launch(plan, OPTIONS)
        overrides = primus_overrides(launch.megatron_args)
        flags = pinned_flags()
        for arg in launch.megatron_args:
            if arg.startswith("--") and arg in flags:
                dest = flags[arg].dest
                assert {"layernorm_epsilon": "norm_epsilon"}.get(dest, dest) in overrides, arg


def test_primus_for_an_nvidia_plan_says_it_targets_amd() -> None:
    nvidia = render_launch(GOLDEN_PLANS["llama3.1-8b_1node"], OPTIONS)
    amd = render_launch(GOLDEN_PLANS["deepseek-v2-lite_mla"], OPTIONS)
    assert any("Primus targets AMD" in n for n in nvidia.notes)
    assert not any("Primus targets AMD" in n for n in amd.notes)


def _amd_overrides(model: ModelSpec, gpu: str, **layout: object) -> dict:
    plan = make_plan(model, gpu, 1, TrainingSpec(seq_length=4096, global_batch_size=64), **layout)
    experiment = yaml.safe_load(render_launch(plan, OPTIONS).files["/exp/run.yaml"])
    return experiment["modules"]["pre_trainer"]["overrides"]


def test_pretraining_is_never_a_finetune_so_a_requeued_job_resumes() -> None:
    for name in ("llama3.3-70b_8nodes", "mixtral-8x7b_ep8", "deepseek-v2-lite_mla"):
        assert _overrides(name)["finetune"] is False


def test_primus_turbo_where_amds_own_configs_switch_it_on() -> None:
    mi300x_moe = _amd_overrides(MIXTRAL_8X7B, "mi300x", ep=8, etp=1)
    assert mi300x_moe["enable_primus_turbo"] is True and mi300x_moe["use_turbo_attention"] is True
    assert mi300x_moe["use_turbo_grouped_gemm"] is True
    mi355x_dense = _amd_overrides(LLAMA31_8B, "mi355x")
    assert mi355x_dense["enable_primus_turbo"] is True
    assert mi355x_dense["use_turbo_attention"] is False  # AMD's MI355X configs leave Turbo attention off
    assert "use_turbo_grouped_gemm" not in mi355x_dense  # no experts
    nvidia = _overrides("llama3.3-70b_8nodes")
    assert not {"enable_primus_turbo", "use_turbo_attention", "use_turbo_grouped_gemm"} & set(nvidia)
