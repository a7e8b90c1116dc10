"""Model flags of the newer families: what core_v0.16.0 can build is written, the rest refused by field."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.catalog.models import load_presets
from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import flag_table, split_args
from megapilot.launch.model_flags import model_section, training_script


def _flags(model_name: str, **changes: object) -> list[str]:
    model = get_model(model_name)
    return model_section(model.model_copy(update=changes)).args


def test_a_hybrid_mamba_model_trains_with_pretrain_mamba_and_its_stack_spec():
    args = _flags("nemotron3-nano")
    assert training_script(get_model("nemotron3-nano")) == "pretrain_mamba.py"
    assert training_script(get_model("llama3.1-8b")) == "pretrain_gpt.py"
    spec = args.index("--spec")
    assert args[spec + 1:spec + 3] == ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
    pattern = args[args.index("--hybrid-override-pattern") + 1]
    assert len(pattern) == 52 and set(pattern) == {"M", "E", "*"}
    assert args[args.index("--mamba-num-heads") + 1] == "64"
    assert "--is-hybrid-model" in args and "--position-embedding-type" in args
    split_args(args)  # every flag exists in the pinned core_v0.16.0 parser and takes what it is given


def test_gpt_oss_semantics_map_to_megatron_flags_once_its_yarn_is_dropped():
    args = _flags("gpt-oss-20b", rope_scaling=None)
    for flag, value in (("--window-size", "127,0"), ("--window-attn-skip-freq", "2"), ("--softmax-type", "learnable"),
                        ("--glu-linear-offset", "1.0"), ("--activation-func-clamp-value", "7.0")):
        assert args[args.index(flag) + 1] == value
    assert "--quick-geglu" in args and "--disable-bias-linear" not in args
    split_args(args)


def test_what_core_v0_16_cannot_build_is_refused_naming_the_field():
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("llama4-scout"))
    assert err.value.field == "model.attention_chunk_size"
    # no release has the flag: the refusal names none, where a script checked against core_v0.19.0 is refused
    assert "core_v0" not in str(err.value)
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("gpt-oss-120b"), flag_table("core_v0.18.0"))
    # YaRN for standard attention: 0.18 takes the type but fills none of its settings, 0.16 asserts rope
    assert err.value.field == "megatron_version" and "--megatron-version core_v0.19.0" in (err.value.fix or "")
    args = _flags("llama4-maverick", attention_chunk_size=None)
    assert args[args.index("--no-rope-freq") + 1] == "4"


def test_yarn_under_standard_attention_is_written_with_every_setting_from_core_v0_19():
    # GPT-OSS: YaRN factor 32 over a 4,096 context, its correction range not rounded
    args = model_section(get_model("gpt-oss-20b"), flag_table("core_v0.19.0")).args
    written = {flag: args[args.index(flag) + 1] for flag in ("--position-embedding-type", "--rotary-scaling-factor",
                                                             "--yarn-original-max-position-embeddings",
                                                             "--yarn-beta-fast", "--yarn-beta-slow", "--mscale",
                                                             "--mscale-all-dim")}
    assert written == {"--position-embedding-type": "yarn", "--rotary-scaling-factor": "32.0",
                       "--yarn-original-max-position-embeddings": "4096", "--yarn-beta-fast": "32.0",
                       "--yarn-beta-slow": "1.0", "--mscale": "1.0", "--mscale-all-dim": "0.0"}
    assert "--no-yarn-correction-range-round-to-int" in args and "--rope-type" not in args
    split_args(args, table=flag_table("core_v0.19.0"))
    rounded = _flags("gpt-oss-20b", rope_scaling=get_model("gpt-oss-20b").rope_scaling.model_copy(
        update={"truncate": True}))
    assert "--no-yarn-correction-range-round-to-int" not in rounded  # Megatron rounds unless told not to
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("gpt-oss-20b"), cpu=True)
    assert err.value.field == "model.rope_scaling" and "drop --cpu" in (err.value.fix or "")


def test_qk_l2_norm_is_written_where_megatron_builds_it_and_refused_beside_nope_layers():
    # Megatron-LM's --qk-l2-norm normalises every layer; Llama 4 leaves its NoPE layers unnormalised
    args = _flags("llama4-maverick", attention_chunk_size=None, no_rope_freq=None, qk_l2_norm=True)
    assert "--qk-l2-norm" in args and "--qk-layernorm" not in args
    split_args(args, table=flag_table("core_v0.14.0"))  # in every release megapilot has a table for
    assert "--qk-l2-norm" not in _flags("llama4-maverick", attention_chunk_size=None)  # Maverick has none
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("llama4-scout").model_copy(update={"attention_chunk_size": None}))
    assert err.value.field == "model.qk_l2_norm" and "Megatron-Bridge" in (err.value.fix or "")
    assert "--no-rope-freq 4" in str(err.value)


def test_deepseek_v32_writes_sparse_attention_with_what_megatron_needs_to_start_it():
    args = _flags("deepseek-v3.2")
    for flag, value in (("--experimental-attention-variant", "dsa"), ("--dsa-indexer-n-heads", "64"),
                        ("--dsa-indexer-head-dim", "128"), ("--dsa-indexer-topk", "2048"),
                        ("--dsa-indexer-loss-coeff", "0.01")):  # no default: None fails at the first step
        assert args[args.index(flag) + 1] == value
    assert "--no-rope-fusion" in args and "--dsa-indexer-use-sparse-loss" in args and "--multi-latent-attention" in args
    split_args(args, table=flag_table("core_v0.16.0"))  # every flag exists in core_v0.16.0 and takes its value
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("deepseek-v3.2"), cpu=True)  # Transformer Engine only
    assert err.value.field == "model.mla.dsa"


def test_glm5_writes_its_indexer_semantics_which_core_v0_16_has_no_flags_for():
    args = _flags("glm-5")
    assert {"--dsa-indexer-rope-interleaved", "--no-dsa-indexer-rotate-activation"} <= set(args)
    assert args[args.index("--dsa-indexer-k-norm-epsilon") + 1] == "1e-06"  # GLM's norms use 1e-5, its key norm not
    shared = get_model("glm-5")
    assert shared.dsa is not None
    args = model_section(shared.model_copy(update={"mla": shared.mla.model_copy(update={"dsa": shared.dsa.model_copy(
        update={"topk_freq": 4, "skip_topk_offset": 3})})})).args
    assert args[args.index("--dsa-indexer-topk-freq") + 1] == "4"
    assert args[args.index("--dsa-indexer-skip-topk-offset") + 1] == "3"
    split_args(args, table=flag_table("core_v0.19.0"))
    with pytest.raises(MegapilotError) as err:
        split_args(args, table=flag_table("core_v0.16.0"))
    assert "core_v0.19.0" in str(err.value)


# ---- rope scaling, router and MLA semantics (core_v0.16.0's pretrain_gpt.py) ----------------------------------
def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_llama31_scaling_deepseek_router_and_yarn_reach_their_flags():
    llama = _flags("llama3.1-8b")
    assert "--use-rope-scaling" in llama and _value(llama, "--rope-scaling-factor") == "8.0"
    v3 = _flags("deepseek-v3")
    for flag, value in (("--rope-type", "yarn"), ("--rotary-scaling-factor", "40.0"), ("--mscale-all-dim", "1.0"),
                        ("--moe-router-score-function", "sigmoid"), ("--moe-router-topk-scaling-factor", "2.5"),
                        ("--moe-router-num-groups", "8"), ("--moe-router-group-topk", "4"),
                        ("--moe-router-dtype", "fp32"), ("--mtp-num-layers", "1"),
                        ("--mtp-loss-scaling-factor", "0.1")):
        assert _value(v3, flag) == value, flag
    assert {"--qk-layernorm", "--moe-router-enable-expert-bias"} <= set(v3)
    assert "--moe-router-pre-softmax" in _flags("deepseek-v2-lite")
    mla_plain = _flags("deepseek-v2-lite", rope_scaling=None)
    assert _value(mla_plain, "--rope-type") == "rope"  # stated, not left to MLATransformerConfig's yarn default
    split_args(v3)


@pytest.mark.parametrize(("model_name", "scaling", "field"), [
    # gpt_builders.py passes --use-rope-scaling but not --rope-scaling-factor: GPTModel's 8 holds.
    ("llama3.1-8b", {"type": "llama3", "factor": 32.0}, "model.rope_scaling.factor"),
    ("llama3.1-8b", {"type": "llama3", "factor": 8.0, "high_freq_factor": 2.0}, "model.rope_scaling.high_freq_factor"),
    ("llama3.1-8b", {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 4096},
     "model.rope_scaling.original_max_position_embeddings"),
    ("llama3.1-8b", {"type": "linear", "factor": 2.0}, "model.rope_scaling"),
    ("deepseek-v3", {"type": "llama3", "factor": 8.0}, "model.rope_scaling.type"),
    ("deepseek-v3", {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 8192},
     "model.rope_scaling.original_max_position_embeddings"),
    # MLA's YaRN always rounds its correction range (no correction_range_round_to_int reaches it)
    ("deepseek-v3", {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "truncate": False},
     "model.rope_scaling.truncate"),
])
def test_rope_scalings_pretrain_gpt_cannot_build_are_refused_by_field(model_name, scaling, field):
    from megapilot.spec.model import ModelSpec

    model = get_model(model_name)
    changed = ModelSpec(**(model.model_dump() | {"rope_scaling": scaling}))
    with pytest.raises(MegapilotError) as err:
        model_section(changed)
    assert err.value.field == field


@pytest.mark.parametrize("release", ["0.16.0", "0.19.0"])
def test_unrounded_yarn_under_mla_is_refused_for_every_release_naming_why_0_19s_flag_does_not_reach_it(release):
    # core_v0.19.0 parses --no-yarn-correction-range-round-to-int, but only GPTModel's standard-attention YaRN reads
    # the field it sets; multi-latent attention builds its YaRN without it, so writing it would train the rounded one
    from megapilot.launch import LaunchOptions
    from megapilot.launch.flags import megatron_arg_sections
    from megapilot.spec import TrainingSpec
    from tests.launch.plans import DEEPSEEK_V2_LITE, make_plan

    assert DEEPSEEK_V2_LITE.rope_scaling is not None
    unrounded = DEEPSEEK_V2_LITE.model_copy(update={
        "rope_scaling": DEEPSEEK_V2_LITE.rope_scaling.model_copy(update={"truncate": False})})
    options = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False,
                            megatron_version=release)
    plan = make_plan(unrounded, "h100", 1, TrainingSpec(seq_length=4096, global_batch_size=64), ep=8)
    with pytest.raises(MegapilotError) as err:
        megatron_arg_sections(plan, options)
    assert err.value.field == "model.rope_scaling.truncate"
    assert "--no-yarn-correction-range-round-to-int" in str(err.value) and "core_v0.19.0" in str(err.value)
    assert "Megatron-Bridge" not in (err.value.fix or "")  # its MLA builds the same rounded YaRN
    rounded = make_plan(DEEPSEEK_V2_LITE, "h100", 1, TrainingSpec(seq_length=4096, global_batch_size=64), ep=8)
    assert "--rope-type" in [arg for section in megatron_arg_sections(rounded, options) for arg in section.args]


@pytest.mark.parametrize("name", sorted(load_presets()))
def test_the_flags_read_back_to_the_same_model(name, tmp_path):
    """What `script` writes, read by `diagnose`'s flag reader, is the model that was planned (one model for
    estimate, script and diagnose): hybrids' patterns and mixers, and per-layer shapes from the block-config file
    the script writes, included."""
    from pathlib import Path

    from megapilot.catalog.gpus import get_gpu
    from megapilot.diagnose.flags import collect_flags, run_config
    from megapilot.launch import LaunchOptions, heterogeneous, render_megatron_args
    from megapilot.spec import ClusterSpec, ParallelConfig, SavedPlan, TrainingSpec

    model = load_presets()[name].spec
    plan = SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=8),
                     training=TrainingSpec(seq_length=4096, global_batch_size=64),
                     parallel=ParallelConfig.for_world(8))
    script = str(tmp_path / "train.sh")
    try:
        args = render_megatron_args(plan, LaunchOptions(mock_data=True, megatron_path="/opt/M",
                                                        check_paths_exist=False, script_path=script))
    except MegapilotError as refused:  # refused by field, tested above
        assert refused.field and refused.field.startswith("model.")
        return
    if model.layer_blocks is not None:  # the block-config file the script writes beside itself
        Path(heterogeneous.layer_config_path(script)).write_text(heterogeneous.layer_config_json(model))
    read_back = run_config(collect_flags(args)).model
    assert read_back is not None
    ignored = {"name", "hf_architecture", "vocab_size"}  # mock data gives the vocabulary as NullTokenizer's size
    assert read_back.model_dump(exclude=ignored) == model.model_dump(exclude=ignored)
