"""Primus experiment: overrides carry exactly the Megatron arguments, typed, under Megatron's names."""

from __future__ import annotations

from pathlib import Path

import yaml

from megapilot.launch import LaunchOptions, render_launch
from megapilot.launch.megatron_args import pinned_flags
from megapilot.launch.primus import primus_overrides
from megapilot.spec import ModelSpec, SavedPlan, TrainingSpec
from tests.launch.plans import GOLDEN_PLANS, LLAMA31_8B, MIXTRAL_8X7B, make_plan
from tests.launch.variants import HYBRID_MAMBA, PAIRED_VARIANTS, VARIANT_PLANS

# Keys Primus reads itself; every other key must be a Megatron argument's destination, or Primus drops it.
PRIMUS_ONLY_KEYS = {"finetune", "model_type"}
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
    assert set(o) - PRIMUS_ONLY_KEYS <= {f.dest for f in pinned_flags().values()}


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
                assert flags[arg].dest in overrides, arg


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


# ---- the experiment as Primus trains it: its base config (tests/data/primus, Primus v26.5.1) under the overrides
PRIMUS_CONFIGS = Path(__file__).parents[1] / "data" / "primus" / "configs"


def _deep_merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _deep_merge(merged[key], value) \
            if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def _with_extends(path: Path) -> dict:
    """A Primus YAML with its `extends` chain merged beneath it, bases in order."""
    config = yaml.safe_load(path.read_text()) or {}
    merged: dict = {}
    for base in config.pop("extends", None) or []:
        merged = _deep_merge(merged, _with_extends((path.parent / base).resolve()))
    return _deep_merge(merged, config)


def _primus_base() -> dict:
    """pre_trainer.yaml with language_model.yaml: the module's keys win, as Primus merges them."""
    module = _with_extends(PRIMUS_CONFIGS / "modules" / "megatron" / "pre_trainer.yaml")
    model = _with_extends(PRIMUS_CONFIGS / "models" / "megatron" / "language_model.yaml")
    return model | module


def _as_primus_trains(plan: SavedPlan, options: LaunchOptions = OPTIONS) -> dict:
    experiment = yaml.safe_load(render_launch(plan, options).files["/exp/run.yaml"])
    return _deep_merge(_primus_base(), experiment["modules"]["pre_trainer"]["overrides"])


# Where Primus's base departs from Megatron's defaults in a way that changes training, and Megatron's value.
MEGATRON_VALUES = {
    "add_position_embedding": True,  # off in the base: Megatron refuses that for learned absolute positions
    "eval_iters": 100,
    "dataloader_type": "single",
    "override_opt_param_scheduler": False,
    "manual_gc_eval": True,
    "bf16": True,
}


def test_primus_trains_as_megatrons_own_defaults_where_its_base_departs_from_them() -> None:
    base = _primus_base()
    trained = _as_primus_trains(VARIANT_PLANS["llama3.1-8b_1node"])
    for key, megatron_value in MEGATRON_VALUES.items():
        assert trained[key] == megatron_value, key
        assert key == "bf16" or base[key] != megatron_value, f"{key}: the base no longer departs; drop the pin"


def test_learned_positions_keep_their_embedding_under_primus() -> None:
    trained = _as_primus_trains(VARIANT_PLANS["fp16_gpt2"])
    assert trained["position_embedding_type"] == "learned_absolute" and trained["add_position_embedding"] is True
    assert trained["fp16"] is True and trained["bf16"] is False


def test_keys_are_the_destinations_of_the_release_the_image_runs() -> None:
    plan = VARIANT_PLANS["llama3.1-8b_1node"]
    for release, key in (("core_v0.14.0", "norm_epsilon"), ("core_v0.16.0", "layernorm_epsilon")):
        options = OPTIONS.model_copy(update={"megatron_version": release})
        overrides = yaml.safe_load(render_launch(plan, options).files["/exp/run.yaml"])["modules"]["pre_trainer"][
            "overrides"]
        assert overrides[key] == 1e-5, release
        assert {"norm_epsilon", "layernorm_epsilon"} - {key} - set(overrides), release


def test_arguments_that_take_many_values_stay_lists_even_with_one() -> None:
    o = _overrides("mixtral-8x7b_ep8")
    assert o["moe_aux_loss_coeff"] == [0.01] and o["moe_router_load_balancing_type"] == ["aux_loss"]
    assert o["data_path"] == ["/d/corpus_text_document"]


def test_a_hybrid_takes_primus_mamba_model_type() -> None:
    hybrid = make_plan(HYBRID_MAMBA, "mi300x", 1, TrainingSpec(seq_length=4096, global_batch_size=64), tp=2,
                       ep=4, etp=1, sequence_parallel=True)
    assert _as_primus_trains(hybrid)["model_type"] == "mamba"
    assert "model_type" not in _overrides("llama3.1-8b_1node")


def test_muon_momentum_is_megatrons_only_where_muon_runs() -> None:
    muon = next(plan for plan, _ in PAIRED_VARIANTS if plan.training.optimizer == "dist_muon")
    assert _as_primus_trains(muon)["muon_momentum"] == 0.9 != _primus_base()["muon_momentum"]
    assert "muon_momentum" not in _overrides("llama3.1-8b_1node")
