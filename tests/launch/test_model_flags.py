"""Model flags of the newer families: what core_v0.16.0 can build is written, the rest refused by field."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_model
from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import split_args
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
    with pytest.raises(MegapilotError) as err:
        model_section(get_model("gpt-oss-120b"))
    assert err.value.field == "model.rope_scaling"  # YaRN for standard attention has no CLI path in 0.16
    args = _flags("llama4-maverick", attention_chunk_size=None)
    assert args[args.index("--no-rope-freq") + 1] == "4"
