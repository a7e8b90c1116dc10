"""Hugging Face `config.json` → `ModelSpec`.

Supported (by `architectures[0]`, else `model_type`):

- Llama-style dense: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (QKV bias),
  Qwen3ForCausalLM (q/k norm), GemmaForCausalLM and Gemma2ForCausalLM (gated GELU, tied head);
- MoE: MixtralForCausalLM, Qwen2MoeForCausalLM (gated shared expert), Qwen3MoeForCausalLM;
- DeepSeek MLA + MoE (+ MTP): DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, and DeepseekV32ForCausalLM (V3 with
  DeepSeek Sparse Attention: its lightning indexer's `index_n_heads`, `index_head_dim`, `index_topk`), and
  DeepseekV4ForCausalLM (window + compressed-KV attention per `compress_ratios`, hash-routed first layers, the
  grouped output projection, hyper-connections; counted and estimated, its script refused by release);
- GLM-4.5 (Glm4MoeForCausalLM): GQA with QKV bias, optional q/k norm and RoPE on half the head, DeepSeek-V3's
  MoE (dense first layers, a shared expert, sigmoid routing with an expert bias) and MTP modules;
- GPT2LMHeadModel (LayerNorm, GELU, learned positions, biases, tied head);
- newer families: Phi3ForCausalLM, GptOssForCausalLM, Llama4ForConditionalGeneration (its text model),
  NemotronHForCausalLM (Nemotron-H and Nemotron 3 Mamba-2 hybrids, Nemotron 3 Super's latent MoE and its
  hybrid MTP modules included), DeciLMForCausalLM (Llama-Nemotron: one block shape imports as a Llama, per-layer
  `block_configs` as a Llama with `layer_blocks`), and Qwen3NextForCausalLM (Gated DeltaNet on three layers of
  four, gated attention, zero-centred norms).

Every field that changes the model and that Megatron can express is read: RoPE scaling (llama3,
YaRN and its `truncate`, linear), a sliding window over every layer (Mistral/Mixtral), biases, tied embeddings,
q/k norms, MLA and its latent norms, MTP depth, Llama 4's `moe_layers`, NoPE interval and q/k L2 norm
(`use_qk_norm`), and the router's meaning (score function, pre-softmax vs renormalised top-k from `norm_topk_prob`,
`routed_scaling_factor`, group-limited routing, aux-loss-free expert bias, the fp32 gate of DeepSeek) and its
aux-loss weight (`router_aux_loss_coef`, DeepSeek's `aux_loss_alpha`). A config saved by transformers >= 5 reads the
same as its older form: RoPE in one `rope_parameters` object, a hybrid's layers as `layers_block_type` lists. A key the
config leaves out takes the default of its family's configuration class in transformers (`_ABSENT_KEY_DEFAULTS`:
norm epsilon, context, KV heads, head size, RoPE base, activation, routed and shared experts, router, aux-loss
weight, ...), as transformers would build the model; a key the import requires is refused when absent; a value of
the wrong JSON type, NaN/Infinity or out of range is refused by its field. Only an absent or null key takes a
default (a null keeps the meaning transformers gives it where it has one: `_NULL_IS_A_VALUE`): a 0 (or an empty
string) is the config's own value, refused by its key where the model cannot run it (an epsilon, a width, a kernel,
a layer step, a RoPE factor), and kept where transformers gives it a meaning (DeepSeek's `mscale_all_dim: 0`; a
YaRN `beta_fast: 0`, which transformers reads as 32).

What a ModelSpec does not model is either refused with a `MegapilotError` naming the field (a
Qwen sliding window on some layers only, MoE layer placements Megatron cannot express, attention-only
biases, RoPE scalings and routing rules Megatron has no equivalent for) or stated here: Gemma 2's
local/global alternation and logit soft-capping are not modelled (attention is costed as global,
exact while seq_length <= sliding_window), and Gemma 2's two extra sandwich norms per layer (2·h
parameters) are not counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from megapilot.errors import MegapilotError, from_validation_error
from megapilot.spec.model import (
    CompressedAttentionSpec,
    CompressRatio,
    DSASpec,
    GatedDeltaNetSpec,
    LayerBlock,
    LinearRopeScaling,
    Llama3RopeScaling,
    MambaSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    RopeScaling,
    YarnRopeScaling,
    runs_own_indexer,
)

HFConfig = dict[str, Any]

# architectures[0] → family; model_type → the same families, for configs without `architectures`.
_ARCHITECTURE_FAMILY: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GPT2LMHeadModel": "gpt2",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Phi3ForCausalLM": "phi3",
    "GptOssForCausalLM": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4",
    "Qwen3NextForCausalLM": "qwen3_next",
    "NemotronHForCausalLM": "nemotron_h",
    "DeciLMForCausalLM": "nemotron-nas",
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_ARCHITECTURE_FAMILY)
_SUPPORTED_HINT = "supported architectures: " + ", ".join(SUPPORTED_ARCHITECTURES)
_NAME_THE_FAMILY = ('add "model_type" (one of ' + ", ".join(dict.fromkeys(_ARCHITECTURE_FAMILY.values()))
                    + ') or "architectures" (e.g. ["LlamaForCausalLM"]) as the model\'s hub page has it')


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face `config.json` (or a directory holding one) into a ModelSpec named after it."""
    config_path = Path(path).expanduser()
    if config_path.is_dir():
        config_path = config_path / "config.json"
    if not config_path.is_file():
        raise MegapilotError(
            f"no Hugging Face config at {config_path}", field="model",
            fix="pass a preset name (see `megapilot models`), a config.json, or a directory containing one",
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MegapilotError(
            f"cannot read {config_path} as JSON ({exc})", field="model",
            fix="pass a valid Hugging Face config.json",
        ) from exc
    if not isinstance(config, dict):
        raise MegapilotError(
            f"{config_path} holds a JSON {type(config).__name__}, not an object", field="model",
            fix="pass a Hugging Face config.json (a JSON object)",
        )
    name = config_path.parent.name if config_path.name == "config.json" else config_path.stem
    return from_hf_config(config, name or "model")


def from_hf_config(config: HFConfig, name: str) -> ModelSpec:
    """Map a Hugging Face config dict onto a ModelSpec (Megatron-Core's vocabulary)."""
    config = _with_rope_parameters_read(config)
    family = _family(config)
    config = _with_absent_keys(config, family)
    architecture = (config.get("architectures") or [None])[0] or config.get("model_type")
    try:
        fields = _FAMILY_MAPPERS[family](config)
        return ModelSpec(name=name, hf_architecture=architecture, **fields)
    except ValidationError as exc:
        raise _config_value_error(exc, config) from exc


# The config.json keys that set a ModelSpec field, per family spelling, for naming a refused value by its key.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "ffn_hidden_size": ("intermediate_size", "n_inner"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads",),
    "kv_channels": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "norm_epsilon": ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_epsilon"),
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "router_topk": ("num_experts_per_tok",),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_head_dim": ("qk_nope_head_dim",),
    "qk_pos_emb_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "mtp_num_layers": ("num_nextn_predict_layers", "num_mtp_layers"),
    "aux_loss_coeff": ("router_aux_loss_coef", "aux_loss_alpha"),
    "layer_blocks": ("block_configs",),
    "hybrid_override_pattern": ("hybrid_override_pattern", "layers_block_type", "layer_types"),
    "full_attention_freq": ("full_attention_interval", "layer_types"),
}


def _config_value_error(exc: ValidationError, config: HFConfig) -> MegapilotError:
    """A value the config.json gives that a ModelSpec refuses, named by its config key where one sets it."""
    error = from_validation_error(exc, prefix="model")
    spec_field = (error.field or "model").removeprefix("model.")
    if spec_field == "model":  # a rule over several fields: name them as the config.json does
        named = [field for field in re.findall(r"\b([a-z_]+)\b", error.problem) if field in _HF_KEYS]
        key = next((key for key in (_stated_key(config, *_HF_KEYS[field]) for field in named) if key), None)
        if key is not None:
            problem = re.sub(r"\b[a-z_]+\b", lambda word: _config_key(config, word.group()), error.problem)
            return MegapilotError(f"in the config.json, {problem}", field=key,
                                  fix=f"set {key!r} and the keys it must agree with to the values the model card "
                                      "gives")
    key = _stated_key(config, *_HF_KEYS.get(spec_field.rsplit(".", 1)[-1], ()))  # a null key set nothing
    if key is not None:
        return MegapilotError(f"{key}={config[key]!r} in the config.json: {error.problem}", field=key,
                              fix=f"set {key!r} to the value the model card gives")
    return MegapilotError(f"the config.json gives Megatron's {spec_field} a value it refuses: {error.problem}",
                          field=error.field, fix=f"correct the key that sets {spec_field} in the config.json, or "
                                                 "write the model as a ModelSpec YAML file")


def _config_key(config: HFConfig, word: str) -> str:
    """`word`, a ModelSpec field, as the config.json names it (the key it states, else the family's usual one)."""
    keys = _HF_KEYS.get(word)
    return word if not keys else _stated_key(config, *keys) or keys[0]


def _family(config: HFConfig) -> str:
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise MegapilotError(f"architectures={architectures!r} is not a list of class names", field="architectures",
                             fix='write it as on the model\'s hub page, e.g. ["LlamaForCausalLM"]')
    if architectures:
        family = _ARCHITECTURE_FAMILY.get(architectures[0])
        if family is None:
            raise MegapilotError(
                f"architecture {architectures[0]!r} is not supported", field="architectures",
                fix=_SUPPORTED_HINT,
            )
        return family
    model_type = config.get("model_type")
    if model_type is None:
        companion = _companion_file(config)
        if companion is not None:
            raise companion
        raise MegapilotError(
            "this Hugging Face config names neither a model_type nor architectures, so its family is unknown",
            field="model_type", fix=_NAME_THE_FAMILY,
        )
    if isinstance(model_type, str) and model_type in _ARCHITECTURE_FAMILY.values():
        return model_type
    raise MegapilotError(
        f"model_type {model_type!r} is not supported (and no `architectures` given)", field="model_type",
        fix=_SUPPORTED_HINT,
    )


# Keys only a Hugging Face config.json holds (none is a ModelSpec field): a file with one of them and no
# model_type/architectures is a config.json that lost its family, not a ModelSpec file missing num_layers.
_HF_ONLY_KEYS = frozenset({
    "num_hidden_layers", "intermediate_size", "num_key_value_heads", "n_layer", "n_embd", "n_head", "hidden_act",
    "rms_norm_eps", "rope_theta", "rope_parameters", "torch_dtype", "dtype", "transformers_version",
    "tie_word_embeddings",
})


def looks_like_hf_config(data: dict[str, Any]) -> bool:
    """Whether a mapping read from a model file is a Hugging Face config.json (it names its model_type or
    architectures, or holds a key only such a config has), or another JSON file of a checkpoint folder (refused
    naming what it is), rather than ModelSpec fields."""
    return ("architectures" in data or "model_type" in data or not _HF_ONLY_KEYS.isdisjoint(data)
            or _companion_file(data) is not None)


# The other JSON files of a checkpoint folder, by a key each has and a model's config.json has not: (key, what the
# file is). Read only where a file names neither model_type nor architectures (an old config.json may also carry
# generation keys such as temperature).
_COMPANION_FILE_KEYS: tuple[tuple[str, str], ...] = (
    ("tokenizer_class", "a tokenizer config (tokenizer_config.json)"),
    ("added_tokens_decoder", "a tokenizer config (tokenizer_config.json)"),
    ("model_max_length", "a tokenizer config (tokenizer_config.json)"),
    ("chat_template", "a tokenizer config (tokenizer_config.json)"),
    ("pre_tokenizer", "a tokenizer (tokenizer.json)"),
    ("added_tokens", "a tokenizer (tokenizer.json)"),
    ("_from_model_config", "a generation config (generation_config.json)"),
    ("peft_type", "an adapter config (adapter_config.json)"),
    ("weight_map", "a weight index (model.safetensors.index.json)"),
    ("image_processor_type", "a preprocessor config (preprocessor_config.json)"),
    ("feature_extractor_type", "a preprocessor config (preprocessor_config.json)"),
    ("processor_class", "a processor config"),
)
_GENERATION_KEYS = frozenset({"do_sample", "temperature", "top_p", "top_k", "max_new_tokens", "num_beams",
                              "repetition_penalty"})
_CHECKPOINT_CONFIG_FIX = "pass the checkpoint's config.json (the file of that name beside it), or the folder holding it"


def _companion_file(config: HFConfig) -> MegapilotError | None:
    """The refusal of a checkpoint's other JSON file (tokenizer, generation, adapter or preprocessor config, weight
    index, a native params.json) passed for its config.json; None for anything else."""
    if "model_type" in config or "architectures" in config:
        return None
    if "dim" in config and "n_layers" in config:  # the original (Meta, Mistral) checkpoint format
        return MegapilotError(
            "this is a native params.json (dim, n_layers), not a Hugging Face config.json", field="model",
            fix="pass the config.json of the model's Hugging Face checkpoint (its hub page has one), or a preset")
    key, what = next(((key, what) for key, what in _COMPANION_FILE_KEYS if key in config), (None, None))
    if key is None and not _GENERATION_KEYS.isdisjoint(config) and not {"hidden_size", "n_embd"} & set(config):
        key, what = sorted(_GENERATION_KEYS & set(config))[0], "a generation config (generation_config.json)"
    if key is None and config and all(str(k).endswith("_token") or k == "additional_special_tokens" for k in config):
        key, what = next(iter(config)), "a tokenizer's special tokens (special_tokens_map.json)"
    if key is None:
        return None
    fix = _CHECKPOINT_CONFIG_FIX
    if key == "peft_type":
        base = config.get("base_model_name_or_path")
        fix = (f"pass the base model instead (--model {base}, or its config.json); an adapter trains on top of it"
               if isinstance(base, str) and base else "pass the base model's config.json; an adapter trains on top "
                                                      "of it")
    return MegapilotError(f"this is {what}, not a model's config.json (it has {key!r})", field="model", fix=fix)


# Keys of a transformers >= 5 `rope_parameters` object that older configs keep at the top level.
_ROPE_TOP_LEVEL_KEYS = ("rope_theta", "partial_rotary_factor")


def _with_rope_parameters_read(config: HFConfig) -> HFConfig:
    """The config with its `rope_parameters` (how transformers >= 5 writes RoPE: base, rotary share and scaling
    in one object) also read as the top-level `rope_theta`, `partial_rotary_factor` and `rope_scaling` that
    older configs carry, so a config saved by either reads the same; a multimodal `text_config` likewise."""
    config = _rope_parameters_as_top_level(config)
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, "text_config": _rope_parameters_as_top_level(text)}
    return config


def _rope_parameters_as_top_level(config: HFConfig) -> HFConfig:
    parameters = _optional_object(config, "rope_parameters", "set rope_parameters to the object the model card "
                                                             "gives, or drop it")
    if parameters is None:
        return config
    per_layer_type = [value for value in parameters.values() if isinstance(value, dict)]
    if per_layer_type:  # one object per attention kind (sliding / full): they must agree to be one Megatron RoPE
        if any(value != per_layer_type[0] for value in per_layer_type):
            raise _refuse("rope_parameters", "its attention kinds use different RoPE (base or scaling); Megatron "
                                             "applies one RoPE to every layer")
        parameters = per_layer_type[0]
    read = dict(config)
    for key in _ROPE_TOP_LEVEL_KEYS:
        if read.get(key) is None and parameters.get(key) is not None:
            read[key] = parameters[key]
    kind = _stated(parameters, "rope_type", "type", default="default")
    if read.get("rope_scaling") is None:  # plain RoPE stated as such: not a family's default scaling (GPT-OSS's)
        read["rope_scaling"] = ({k: v for k, v in parameters.items() if k not in _ROPE_TOP_LEVEL_KEYS}
                                if kind != "default" else {"rope_type": "default"})
    return read


# ---- field access ------------------------------------------------------------------------------


def _required(config: HFConfig, key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise MegapilotError(
            f"the config has no {key!r}", field=key,
            fix=f"add {key!r} to the config.json (copy it from the model's hub page)",
        )
    return value


def _required_int(config: HFConfig, key: str) -> int:
    value = _required(config, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MegapilotError(f"{key}={value!r} is not an integer", field=key, fix=f"set {key!r} to an integer")
    return value


def _optional_int(config: HFConfig, key: str) -> int | None:
    return None if config.get(key) is None else _required_int(config, key)


def _int_or(config: HFConfig, key: str, default: int) -> int:
    """An integer key, `default` only when it is absent or null: a 0 (or a negative) is the config's value, for the
    model spec to refuse by its key, not a falsy one that silently reads as the default."""
    value = _optional_int(config, key)
    return default if value is None else value


DENSE_LAYERS = "the dense layers before the first MoE one (DeepSeek-V3: 3), or 0"
SHARED_EXPERTS = "the shared experts the model card gives (DeepSeek-V3: 1), or 0"


def _count(config: HFConfig, key: str, what: str, default: int = 0) -> int:
    """A count that may be 0 but not negative (dense layers, shared experts), `default` when absent or null."""
    value = _int_or(config, key, default)
    if value < 0:
        raise MegapilotError(f"{key}={value} is negative", field=key, fix=f"set {key!r} to {what}")
    return value


def _stated_key(config: HFConfig, *keys: str) -> str | None:
    """The first of `keys` the config states: only an absent or null key is unstated, so a 0 or an empty string is
    the config's value, for its reader to judge, not a falsy one read as absent."""
    return next((key for key in keys if config.get(key) is not None), None)


def _stated(config: HFConfig, *keys: str, default: Any) -> Any:
    """The value of the first of `keys` the config states (`_stated_key`), else `default`."""
    key = _stated_key(config, *keys)
    return default if key is None else config[key]


def _optional_object(config: HFConfig, key: str, fix: str) -> dict[str, Any] | None:
    value = config.get(key)
    if value is not None and not isinstance(value, dict):
        raise MegapilotError(f"{key}={value!r} is not an object", field=key, fix=fix)
    return value


def _optional_float(config: HFConfig, key: str) -> float | None:
    """Every number the import reads that may be fractional comes through here, so a string, a boolean or a
    NaN/Infinity (Python's json accepts both) is refused by its field instead of crashing a later conversion."""
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MegapilotError(f"{key}={value!r} is not a number", field=key, fix=f"set {key!r} to a number")
    if not math.isfinite(value):
        raise MegapilotError(f"{key}={value!r} is not a finite number", field=key,
                             fix=f"set {key!r} to the finite value the model card gives")
    return float(value)


def _float_or(config: HFConfig, key: str, default: float) -> float:
    """A number key, `default` only when it is absent or null (as `_int_or`)."""
    value = _optional_float(config, key)
    return default if value is None else value


def _above_zero(key: str, value: float, what: str) -> float:
    """`value`, refused by `key` unless it is above 0; `what`: the value to set instead."""
    if value <= 0:
        raise MegapilotError(f"{key}={value!r} must be above 0", field=key, fix=f"set {key!r} to {what}")
    return value


def _flag(config: HFConfig, key: str, default: bool) -> bool:
    """A JSON boolean (null or absent: `default`). A string such as "yes" or "false" is refused: truthiness
    would read "false" as true."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise MegapilotError(f"{key}={value!r} is not a JSON boolean", field=key,
                             fix=f"set {key!r} to true or false (without quotes)")
    return value


def _at_least_one(key: str, value: int, what: str) -> None:
    if value < 1:
        raise MegapilotError(f"{key}={value} must be at least 1", field=key, fix=f"set {key!r} to {what}")


def _positive_int_or(config: HFConfig, key: str, default: int, what: str) -> int:
    """An integer key that must be at least 1 (a width, a kernel, a layer step), `default` only when it is absent or
    null: a 0 is refused by its key, not read as absent."""
    value = _int_or(config, key, default)
    _at_least_one(key, value, what)
    return value


def _norm_epsilon(config: HFConfig, keys: tuple[str, ...], default: float) -> float:
    """The norms' epsilon from the first of `keys` the config states (absent: `default`). A norm divides by
    sqrt(variance + epsilon): 0 divides an all-zero row by zero, and Megatron's --norm-epsilon must be above 0."""
    key = _stated_key(config, *keys)
    if key is None:
        return default
    return _above_zero(key, _float_or(config, key, default),
                       f"the epsilon the model card gives (e.g. 1e-05 or 1e-06), or leave it out for {default}")


def _rotary_percent(config: HFConfig, default: float) -> float:
    """`partial_rotary_factor`, the share of each head RoPE rotates (absent: `default`): above 0 and at most 1, as
    Megatron's --rotary-percent; a 0 rotates no channel at all and is refused, not read as `default`."""
    share = _float_or(config, "partial_rotary_factor", default)
    if not 0 < share <= 1:
        raise MegapilotError(f"partial_rotary_factor={share!r} must be above 0 and at most 1",
                             field="partial_rotary_factor",
                             fix="set 'partial_rotary_factor' to the share of each head RoPE rotates (e.g. 0.5), "
                                 f"or leave it out for {default}")
    return share


def _kv_heads(config: HFConfig, heads: int) -> int:
    """`num_key_value_heads` (absent: one per query head), a positive divisor of the query heads: 0 must not
    read as 'absent' and silently turn a GQA model into full multi-head attention."""
    kv_heads = _optional_int(config, "num_key_value_heads")
    if kv_heads is None:
        return heads
    what = f"the model's KV-head count, a divisor of num_attention_heads={heads}"
    _at_least_one("num_key_value_heads", kv_heads, what)
    if heads % kv_heads:
        raise MegapilotError(f"num_key_value_heads={kv_heads} does not divide num_attention_heads={heads}",
                             field="num_key_value_heads", fix=f"set 'num_key_value_heads' to {what}")
    return kv_heads


def _head_dim(config: HFConfig) -> int | None:
    """`head_dim` when stated; 0 must not read as 'hidden_size / heads'."""
    head_dim = _optional_int(config, "head_dim")
    if head_dim is not None:
        _at_least_one("head_dim", head_dim, "the per-head size the model card gives, or leave it out")
    return head_dim


def _rotary_base(config: HFConfig) -> int:
    """`rope_theta` as Megatron's integer --rotary-base (absent: 10000)."""
    theta = _optional_float(config, "rope_theta")
    if theta is None:
        return 10000
    if theta < 1:
        raise MegapilotError(f"rope_theta={theta!r} is below 1", field="rope_theta",
                             fix="set 'rope_theta' to the RoPE base the model card gives (e.g. 10000 or 500000)")
    return int(theta)


def _layer_indices(config: HFConfig, key: str) -> list[int]:
    """A list of layer numbers (absent: none)."""
    value = config.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise MegapilotError(f"{key}={value!r} is not a list of layer numbers", field=key,
                             fix=f"set {key!r} to a list of integers such as [0, 1], or []")
    return value


def _refuse(key: str, why: str) -> MegapilotError:
    return MegapilotError(
        why, field=key,
        fix=f"change {key!r} to a layout Megatron expresses, or write the model as a ModelSpec YAML file",
    )


# ---- Llama-style decoders --------------------------------------------------------------------------


def _gated_activation(config: HFConfig) -> str:
    """silu → swiglu; gelu variants → geglu (Gemma). Llama-style MLPs are always gated."""
    activation = str(_stated(config, "hidden_activation", "hidden_act", default="silu"))
    if activation in ("silu", "swish"):
        return "swiglu"
    if activation.startswith("gelu"):
        return "geglu"
    raise _refuse("hidden_act", f"hidden_act={activation!r} is not modelled (silu or gelu gated MLPs are)")


def _llama_core(config: HFConfig, *, tied_default: bool = False) -> dict[str, Any]:
    """The fields every Llama-style config shares (attention, MLP width, vocab, rope, norms)."""
    hidden = _required_int(config, "hidden_size")
    heads = _required_int(config, "num_attention_heads")
    kv_heads = _kv_heads(config, heads)
    head_dim = _head_dim(config)
    biases = _flag(config, "attention_bias", False), _flag(config, "mlp_bias", False)
    if biases == (True, False):
        raise _refuse(
            "attention_bias", "attention-only biases have no Megatron flag (add_bias_linear biases every linear)",
        )
    return {
        **_attention_dims(config, hidden, heads, kv_heads, head_dim),
        "mlp_activation": _gated_activation(config),
        "normalization": "RMSNorm",
        "norm_epsilon": _norm_epsilon(config, ("rms_norm_eps",), 1e-6),
        "position_embedding": "rope",
        "rotary_base": _rotary_base(config),
        "rotary_percent": _rotary_percent(config, 1.0),
        "rope_scaling": _rope_scaling(config),
        "tie_embeddings": _flag(config, "tie_word_embeddings", tied_default),
        "add_bias_linear": all(biases),
    }


ORIGINAL_POSITIONS = "the context length the model was pre-trained at (the model card gives it)"


def _rope_scaling(config: HFConfig) -> RopeScaling | None:
    """HF `rope_scaling` → the ModelSpec's scaling; kinds with no Megatron equivalent are refused by name."""
    scaling = _optional_object(config, "rope_scaling", "set rope_scaling to null or to the object the model card "
                                                       "gives")
    if not scaling:  # null or {}: plain RoPE
        return None
    kind = _stated(scaling, "rope_type", "type", default=None)
    if kind is None:  # transformers refuses it too; read as plain RoPE, a stated factor would vanish unsaid
        raise MegapilotError(f"rope_scaling {scaling!r} names no rope_type", field="rope_scaling.rope_type",
                             fix="add the rope_type the model card gives (llama3, yarn, linear or default)")
    if kind == "default":
        return None
    factor = _optional_float(scaling, "factor")
    if factor is None:
        raise _refuse("rope_scaling.factor", f"rope_scaling of type {kind!r} has no factor")
    _above_zero("rope_scaling.factor", factor, "the context extension the model card gives (e.g. 8.0)")
    if kind == "llama3":
        original = _int_or(scaling, "original_max_position_embeddings", 8192)
        _at_least_one("rope_scaling.original_max_position_embeddings", original, ORIGINAL_POSITIONS)
        return Llama3RopeScaling(
            factor=factor,
            # both divide the original context: 0 divides by zero in transformers and in Megatron alike
            low_freq_factor=_above_zero("rope_scaling.low_freq_factor", _float_or(scaling, "low_freq_factor", 1.0),
                                        "the model card's value (Llama 3.1: 1.0), or leave it out for 1.0"),
            high_freq_factor=_above_zero("rope_scaling.high_freq_factor",
                                         _float_or(scaling, "high_freq_factor", 4.0),
                                         "the model card's value (Llama 3.1: 4.0), or leave it out for 4.0"),
            original_max_position_embeddings=original,
        )
    if kind == "yarn":
        return _yarn_scaling(config, scaling, factor)
    if kind == "linear":
        return LinearRopeScaling(factor=factor)
    raise _refuse("rope_scaling.rope_type",
                  f"RoPE scaling of type {kind!r} has no Megatron-Core equivalent (llama3, yarn and linear have)")


def _yarn_scaling(config: HFConfig, scaling: HFConfig, factor: float) -> YarnRopeScaling:
    if scaling.get("attention_factor") is not None:
        raise _refuse("rope_scaling.attention_factor",
                      "an explicit YaRN attention_factor has no Megatron flag (mscale/mscale_all_dim have)")
    key, original = "rope_scaling.original_max_position_embeddings", _optional_int(
        scaling, "original_max_position_embeddings")
    if original is None:
        key, original = "max_position_embeddings", _required_int(config, "max_position_embeddings")
    _at_least_one(key, original, ORIGINAL_POSITIONS)
    mscale, mscale_all_dim = _yarn_mscales(scaling)
    return YarnRopeScaling(
        factor=factor, original_max_position_embeddings=original,
        beta_fast=_yarn_beta(scaling, "beta_fast", 32.0), beta_slow=_yarn_beta(scaling, "beta_slow", 1.0),
        mscale=mscale, mscale_all_dim=mscale_all_dim, truncate=_yarn_truncate(scaling),
    )


def _yarn_truncate(scaling: HFConfig) -> bool:
    """Whether YaRN rounds its correction range to whole dimensions (floor and ceil): transformers'
    `rope_parameters.get("truncate", True)` (modeling_rope_utils.py, _compute_yarn_parameters), so absent is true
    and a null, falsy there, is false; GPT-OSS states false. Megatron-Core's YarnRotaryEmbedding calls it
    correction_range_round_to_int."""
    if "truncate" in scaling and scaling["truncate"] is None:
        return False
    return _flag(scaling, "truncate", True)


def _yarn_beta(scaling: HFConfig, name: str, default: float) -> float:
    """A YaRN correction bound in rotations. transformers reads a 0 as the paper's default (its
    `rope_parameters.get(name) or default`), and so does this; a negative one has no logarithm (the correction
    dimension is log(context / (beta * 2 pi))), in transformers as in Megatron, and is refused by its key."""
    beta = _optional_float(scaling, name)
    if not beta:  # absent, null or 0: the default, as transformers reads them
        return default
    return _above_zero(f"rope_scaling.{name}", beta, f"the model card's value, or leave it out for {default}")


def _yarn_mscales(scaling: HFConfig) -> tuple[float, float]:
    """YaRN's attention temperature terms (mscale, mscale_all_dim), as transformers reads them: `mscale` over
    `mscale_all_dim` when both are non-zero, else the plain 0.1 ln(factor) + 1, which is Megatron's mscale 1 over
    mscale_all_dim 0. So an mscale_all_dim of 0 is DeepSeek's 'no term over all dims' and kept, and an mscale of 0
    beside it reads as 1. An mscale of 0 beside a non-zero mscale_all_dim has no Megatron equivalent (transformers
    drops the ratio but still scales DeepSeek's softmax by mscale_all_dim; DeepSeek's own code and Megatron take the
    0 as written) and is refused by its key, as is a negative term, which drives the temperature
    0.1 m ln(factor) + 1 toward 0."""
    mscale_all_dim = _float_or(scaling, "mscale_all_dim", 0.0)
    if mscale_all_dim < 0:
        raise MegapilotError(f"rope_scaling.mscale_all_dim={mscale_all_dim!r} is negative",
                             field="rope_scaling.mscale_all_dim",
                             fix="set 'rope_scaling.mscale_all_dim' to the model card's value (DeepSeek-V3: "
                                 "1.0), or to 0 for no softmax-scale term")
    mscale = _float_or(scaling, "mscale", 1.0)
    if mscale < 0 or (mscale == 0 and mscale_all_dim):
        why = "is negative" if mscale < 0 else (f"beside mscale_all_dim={mscale_all_dim!r} has no Megatron "
                                                "equivalent: transformers reads it as absent and drops the "
                                                "mscale/mscale_all_dim ratio, Megatron takes it as 0")
        raise MegapilotError(f"rope_scaling.mscale={mscale!r} {why}", field="rope_scaling.mscale",
                             fix="set 'rope_scaling.mscale' to the model card's value (DeepSeek-V3: 1.0, the "
                                 "same as its mscale_all_dim), or leave it out for 1.0")
    return mscale or 1.0, mscale_all_dim


def _full_sliding_window(config: HFConfig) -> dict[str, Any]:
    """Mistral/Mixtral: `sliding_window` applies to every layer (null: full attention)."""
    window = _optional_int(config, "sliding_window")
    return {"sliding_window": window} if window else {}


def _refuse_partial_sliding_window(config: HFConfig) -> None:
    """Qwen's window applies only to layers >= max_window_layers: an alternation a ModelSpec cannot hold."""
    if _flag(config, "use_sliding_window", False):
        raise _refuse(
            "use_sliding_window",
            "a sliding window on layers >= max_window_layers only (use_sliding_window=true) is not modelled",
        )


def _llama(config: HFConfig) -> dict[str, Any]:
    return _llama_core(config)


def _mistral(config: HFConfig) -> dict[str, Any]:
    return _llama_core(config) | _full_sliding_window(config)


def _qwen2(config: HFConfig) -> dict[str, Any]:
    _refuse_partial_sliding_window(config)
    return _llama_core(config) | {"add_qkv_bias": True}


def _qwen3(config: HFConfig) -> dict[str, Any]:
    _refuse_partial_sliding_window(config)
    return _llama_core(config) | {"qk_layernorm": True}


def _gemma(config: HFConfig) -> dict[str, Any]:
    return _llama_core(config, tied_default=True)


# ---- mixtures of experts ---------------------------------------------------------------------------


def _moe_placement(num_layers: int, is_moe: Callable[[int], bool], key: str) -> tuple[int, int]:
    """Find Megatron's (first_k_dense_layers, moe_layer_freq) reproducing the HF placement of MoE layers."""
    moe_layers = [i for i in range(num_layers) if is_moe(i)]
    if not moe_layers:
        raise _refuse(key, "no layer would hold experts")
    first_k_dense = moe_layers[0]
    freq = moe_layers[1] - moe_layers[0] if len(moe_layers) > 1 else num_layers
    pattern = [i for i in range(num_layers) if i >= first_k_dense and (i - first_k_dense) % freq == 0]
    if pattern == moe_layers:
        return first_k_dense, freq
    raise _refuse(key, "this placement of MoE layers is not dense-first-then-every-k-th, which Megatron needs")


def _mixtral(config: HFConfig) -> dict[str, Any]:
    """Mixtral: softmax over the top-k logits (the renormalised top-k of a full softmax), Megatron's default."""
    fields = _llama_core(config) | _full_sliding_window(config)
    fields["moe"] = MoESpec(
        num_experts=_required_int(config, "num_local_experts"),
        router_topk=_required_int(config, "num_experts_per_tok"),
        moe_ffn_hidden_size=fields["ffn_hidden_size"],
        aux_loss_coeff=_float_or(config, "router_aux_loss_coef", 0.0),
    )
    return fields


def _qwen_moe(config: HFConfig, *, shared_expert: bool) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: layer i is sparse if not in mlp_only_layers and (i+1) % decoder_sparse_step == 0."""
    _refuse_partial_sliding_window(config)
    # Qwen2-MoE's q/k/v biases follow `qkv_bias` (Qwen2MoeConfig, default true); Qwen3-Next sets its own after this
    fields = _llama_core(config) | ({"add_qkv_bias": _flag(config, "qkv_bias", True)} if shared_expert
                                    else {"qk_layernorm": True})
    # transformers' (i + 1) % decoder_sparse_step divides by zero at 0
    step = _positive_int_or(config, "decoder_sparse_step", 1, "1 (every layer MoE) or the k of MoE on every k-th "
                                                               "layer, as the model card gives it")
    dense_only = set(_layer_indices(config, "mlp_only_layers"))
    first_k_dense, freq = _moe_placement(
        fields["num_layers"], lambda i: i not in dense_only and (i + 1) % step == 0,
        "mlp_only_layers" if dense_only else "decoder_sparse_step",
    )
    fields["moe"] = MoESpec(
        num_experts=_required_int(config, "num_experts"),
        router_topk=_required_int(config, "num_experts_per_tok"),
        moe_ffn_hidden_size=_required_int(config, "moe_intermediate_size"),
        shared_expert_ffn_hidden_size=(_optional_int(config, "shared_expert_intermediate_size") or 0)
        if shared_expert else 0,
        shared_expert_gate=shared_expert,
        first_k_dense_layers=first_k_dense,
        moe_layer_freq=freq,
        aux_loss_coeff=_float_or(config, "router_aux_loss_coef", 0.0),
        # norm_topk_prob false: softmax over all experts, top-k weights kept as they are.
        router_pre_softmax=not _norm_topk_prob(config),
    )
    return fields


def _deepseek(config: HFConfig, dsa: DSASpec | None = None) -> dict[str, Any]:
    """DeepSeek V2/V3/V3.2: MLA attention (with V3.2's sparse attention, or `dsa` as another family reads it),
    dense-first MoE with shared experts, optional MTP modules."""
    if _flag(config, "attention_bias", False):
        raise _refuse("attention_bias", "MLA with attention biases is not modelled")
    fields = _llama_core(config)
    fields["num_query_groups"] = None  # MLA has no KV groups
    fields["kv_channels"] = None
    fields["mla"] = MLASpec(
        q_lora_rank=_optional_int(config, "q_lora_rank"),
        kv_lora_rank=_required_int(config, "kv_lora_rank"),
        qk_head_dim=_required_int(config, "qk_nope_head_dim"),
        qk_pos_emb_head_dim=_required_int(config, "qk_rope_head_dim"),
        v_head_dim=_required_int(config, "v_head_dim"),
        dsa=dsa or _dsa(config),
    )
    # An absent depth reads 0, not the 1 a transformers configuration class may default it to: that 1 describes
    # the checkpoint's extra layer, which transformers never builds, while Megatron would build the module and add
    # its MTP loss to a training the config did not ask for.
    fields["mtp_num_layers"] = _optional_int(config, "num_nextn_predict_layers") or 0
    experts = _optional_int(config, "n_routed_experts")
    if experts is not None:  # null: a dense MLA model, as DeepSeek's code reads it; 0 experts: refused by the spec
        first_dense = _count(config, "first_k_dense_replace", DENSE_LAYERS)
        # DeepSeek's code places MoE where layer % moe_layer_freq == 0, which divides by zero at 0
        every = _positive_int_or(config, "moe_layer_freq", 1, "1 (every layer after first_k_dense_replace MoE), as "
                                                               "DeepSeek's checkpoints give it")
        first_k_dense, freq = _moe_placement(
            fields["num_layers"], lambda i: i >= first_dense and i % every == 0,
            # the key that left no MoE layer: dense layers past the last one, else a frequency too sparse
            "first_k_dense_replace" if first_dense >= fields["num_layers"] else "moe_layer_freq",
        )
        fields["moe"] = _deepseek_moe(
            config, (first_k_dense, freq),
            # noaux_tc routing (V3) balances experts with a learned-free per-expert bias.
            router_expert_bias=config.get("topk_method") == "noaux_tc",
            load_balancing_type="seq_aux_loss" if _flag(config, "seq_aux", True) else "aux_loss",
            # V2's configs state their aux-loss weight (V2-Lite: 0.001); V3's carry none and transformers'
            # DeepseekV3Config has no such key (its router balances by the expert bias): absent, no aux loss
            aux_loss_coeff=_float_or(config, "aux_loss_alpha", 0.0),
        )
    return fields


def _deepseek_v4(config: HFConfig) -> dict[str, Any]:
    """DeepSeek-V4 (DeepseekV4ForCausalLM), as Megatron-LM dev's dsv4_hybrid attention and Megatron-Bridge's
    DeepSeek-V4 bridge build it: MLA's q LoRA over heads of `head_dim` (`qk_rope_head_dim` of them rotary) attending
    through one K=V head of `head_dim` projected from h; per layer (`compress_ratios`, the main model's then the MTP
    layers') a `sliding_window` alone (0), beside the top-`index_topk` of 4x-compressed keys an indexer of
    `index_n_heads` x `index_head_dim` picks (4), or beside all 128x-compressed keys (128), with a learned sink per
    head; the grouped output projection (`o_groups` x `o_lora_rank`); `hc_mult` hyper-connection residual streams;
    every layer MoE, the first `num_hash_layers` routed by token-id hash, the router's `sqrtsoftplus` scores with
    an expert bias (noaux_tc) and the SwiGLU clamped at `swiglu_limit`; MTP modules. Not modelled, as they change no
    count or cost: the compressed layers' own RoPE base (`compress_rope_theta`), the Sinkhorn iterations of the
    hyper-connections' mixing (`hc_sinkhorn_iters`) and the hash layers' token-to-expert table (a buffer)."""
    if _flag(config, "attention_bias", False):
        raise _refuse("attention_bias", "DeepSeek-V4's attention with biases is not modelled")
    head_dim = _required_int(config, "head_dim")
    rope = _required_int(config, "qk_rope_head_dim")
    if not 0 < rope < head_dim:
        raise _refuse("qk_rope_head_dim", f"qk_rope_head_dim={rope} must be between 0 and head_dim={head_dim}")
    experts_width = _required_int(config, "moe_intermediate_size")
    fields = _llama_core({**config, "intermediate_size": experts_width})  # every layer is MoE: no dense width
    # (an absent MTP depth reads 0, as for V3: `_deepseek`)
    layers, mtp = fields["num_layers"], _optional_int(config, "num_nextn_predict_layers") or 0
    fields.update(
        num_query_groups=None, kv_channels=None, mtp_num_layers=mtp, softmax_type="learnable",
        sliding_window=_required_int(config, "sliding_window"),
        activation_clamp=_optional_float(config, "swiglu_limit"),
        residual_streams=1 if config.get("hc_mult") is None else _required_int(config, "hc_mult"),
        mla=MLASpec(
            q_lora_rank=_required_int(config, "q_lora_rank"), kv_lora_rank=head_dim, qk_head_dim=head_dim - rope,
            qk_pos_emb_head_dim=rope, v_head_dim=head_dim,
            dsa=DSASpec(indexer_heads=_required_int(config, "index_n_heads"),
                        indexer_head_dim=_required_int(config, "index_head_dim"),
                        topk=_required_int(config, "index_topk")),
            csa=CompressedAttentionSpec(compress_ratios=_compress_ratios(config, layers, mtp),
                                        o_groups=_required_int(config, "o_groups"),
                                        o_lora_rank=_required_int(config, "o_lora_rank")),
        ),
    )
    hashed = _int_or(config, "num_hash_layers", 0)
    if not 0 <= hashed <= layers:  # the spec's own check does not run on the model_copy below
        raise _refuse("num_hash_layers", f"num_hash_layers={hashed} must be between 0 and num_hidden_layers={layers}")
    moe = _deepseek_moe(config, (0, 1), router_expert_bias=config.get("topk_method") == "noaux_tc",
                        load_balancing_type="seq_aux_loss",
                        aux_loss_coeff=_float_or(config, "aux_loss_alpha", 0.0))
    fields["moe"] = moe.model_copy(update={"num_hash_layers": hashed})
    return fields


def _compress_ratios(config: HFConfig, layers: int, mtp: int) -> tuple[CompressRatio, ...]:
    """`compress_ratios`, one per layer and then one per MTP layer (a list of the main model's alone gives the MTP
    layers window-only attention, as Megatron-Bridge reads it); each 0, 4 or 128, the ratios Megatron-LM dev
    builds."""
    ratios = _required(config, "compress_ratios")
    if not isinstance(ratios, list) or any(isinstance(r, bool) or r not in (0, 4, 128) for r in ratios):
        raise _refuse("compress_ratios", f"compress_ratios={ratios!r} must list 0 (window only), 4 (compressed "
                                         "sparse) or 128 (heavily compressed) per layer, as Megatron-LM dev builds")
    if len(ratios) == layers and mtp:
        ratios = ratios + [0] * mtp
    if len(ratios) != layers + mtp:
        raise _refuse("compress_ratios", f"compress_ratios has {len(ratios)} entries; give one per layer and MTP "
                                         f"layer ({layers} + {mtp})")
    return tuple(cast(CompressRatio, r) for r in ratios)


# transformers' DeepseekV32Config defaults, which a deepseek_v32 config.json may leave unstated.
_DSA_DEFAULTS = {"index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}


def _dsa(config: HFConfig, defaults: dict[str, int] = _DSA_DEFAULTS, **semantics: Any) -> DSASpec | None:
    """DeepSeek Sparse Attention's indexer: every deepseek_v32 and glm_moe_dsa model has one (fields it leaves out
    take transformers' defaults for its family); another DeepSeek config has one only if it states an `index_*`
    field. `semantics`: the family's indexer rules (GLM-5's RoPE, rotation and top-k sharing)."""
    if _family(config) not in ("deepseek_v32", "glm_moe_dsa") and all(config.get(n) is None for n in defaults):
        return None
    stated = {**defaults, **{name: config[name] for name in defaults if config.get(name) is not None}}
    return DSASpec(indexer_heads=_required_int(stated, "index_n_heads"),
                   indexer_head_dim=_required_int(stated, "index_head_dim"), topk=_required_int(stated, "index_topk"),
                   **semantics)


# transformers' GlmMoeDsaConfig: its indexer defaults and the top-k sharing offset it assumes when a config gives
# only `index_topk_freq`.
_GLM5_DSA_DEFAULTS = {"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048}
_GLM5_SKIP_TOPK_OFFSET = 2


def _glm_moe_dsa(config: HFConfig) -> dict[str, Any]:
    """GLM-5 (GlmMoeDsaForCausalLM), as transformers builds it and Megatron-Bridge's GLM-5 bridge maps it:
    DeepSeek-V3.2's MLA and sparse attention with GLM's indexer (interleaved RoPE, no Hadamard rotation, top-k
    shared across layers where `indexer_types` says "shared"), the first `first_k_dense_replace` layers dense
    (or as `mlp_layer_types` lists them), then MoE with DeepSeek-V3's sigmoid router and expert bias."""
    layers = _required_int(config, "num_hidden_layers")
    rope = config.get("qk_rope_head_dim")
    if config.get("qk_head_dim") is not None:  # transformers may point qk_rope_head_dim at head_dim (GLM-5.2)
        rope = _required_int(config, "qk_head_dim") - _required_int(config, "qk_nope_head_dim")
    as_deepseek = {**config, "qk_rope_head_dim": rope, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                   "first_k_dense_replace": _glm5_dense_layers(config, layers)}
    freq, offset = _glm5_topk_sharing(config, layers)
    return _deepseek(as_deepseek, _dsa(config, _GLM5_DSA_DEFAULTS, topk_freq=freq, skip_topk_offset=offset,
                                       rope_interleaved=_flag(config, "indexer_rope_interleave", True),
                                       rotate_activation=False))


def _glm5_dense_layers(config: HFConfig, layers: int) -> int:
    """The leading dense layers: `mlp_layer_types` ("dense" then "sparse") when given, else
    `first_k_dense_replace` (transformers' default 3)."""
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        first = config.get("first_k_dense_replace")
        return 3 if first is None else _required_int(config, "first_k_dense_replace")
    dense = next((i for i, kind in enumerate(kinds) if kind != "dense"), len(kinds))
    if len(kinds) != layers or any(kind != "sparse" for kind in kinds[dense:]):
        raise _refuse("mlp_layer_types", "Megatron places MoE layers after a dense prefix only; write one 'dense' "
                                         "or 'sparse' per layer, dense ones first")
    return dense


def _glm5_topk_sharing(config: HFConfig, layers: int) -> tuple[int, int]:
    """(topk_freq, skip_topk_offset) in Megatron's rule for GLM-5's per-layer indexer kinds: `indexer_types`,
    else `index_topk_pattern` ("F"/"S"), else transformers' schedule from `index_topk_freq` and
    `index_skip_topk_offset`. A pattern Megatron's rule cannot express is refused by field."""
    kinds = config.get("indexer_types")
    pattern = config.get("index_topk_pattern")
    if kinds is None and isinstance(pattern, str):
        kinds = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    if kinds is None:
        freq = _positive_int_or(config, "index_topk_freq", 1, "1 (every layer runs its own indexer) or the k of "
                                                               "an indexer on every k-th layer, as the model card "
                                                               "gives it")
        stated_offset = _optional_int(config, "index_skip_topk_offset")
        offset = _GLM5_SKIP_TOPK_OFFSET if stated_offset is None else stated_offset
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    field = "indexer_types" if config.get("indexer_types") is not None else "index_topk_freq"
    if len(kinds) != layers or set(kinds) - {"full", "shared"}:
        raise _refuse(field, "write one 'full' or 'shared' indexer kind per layer")
    full = [kind == "full" for kind in kinds]
    for freq in range(1, layers + 1):
        for offset in range(layers + 1):
            if [runs_own_indexer(i, freq, offset) for i in range(layers)] == full:
                return freq, offset
    raise _refuse(field, "this mix of indexer and shared top-k layers is not one Megatron's "
                         "--dsa-indexer-topk-freq / --dsa-indexer-skip-topk-offset can express")


def _deepseek_moe(config: HFConfig, placement: tuple[int, int], **balancing: Any) -> MoESpec:
    """DeepSeek's MoE block as V2, V3 and GLM-4.5 configs state it: `n_routed_experts` of
    `moe_intermediate_size`, `n_shared_experts` shared ones of the same width, placed as (first dense layers,
    MoE every k-th), routed by DeepSeek's MoEGate, whose logits come from fp32 copies of the input and weight;
    `balancing`: its expert bias and aux loss."""
    experts = _required_int(config, "n_routed_experts")
    moe_ffn = _required_int(config, "moe_intermediate_size")
    first_k_dense, freq = placement
    return MoESpec(
        num_experts=experts,
        router_topk=_required_int(config, "num_experts_per_tok"),
        moe_ffn_hidden_size=moe_ffn,
        shared_expert_ffn_hidden_size=_count(config, "n_shared_experts", SHARED_EXPERTS) * moe_ffn,
        first_k_dense_layers=first_k_dense,
        moe_layer_freq=freq,
        router_dtype="fp32",
        **balancing,
        **_deepseek_router(config, experts),
    )


# GLM-4.5's RoPE covers half of each head when the config does not say (transformers' Glm4MoeConfig default).
GLM4_MOE_PARTIAL_ROTARY = 0.5
# Megatron-Bridge's GLM 4.5 bridge balances the experts with a sequence aux loss of this weight beside the bias
# (the HF config has no aux-loss field: its router balances by the bias alone).
GLM4_MOE_AUX_LOSS_COEFF = 1e-3


def _glm4_moe(config: HFConfig) -> dict[str, Any]:
    """GLM-4.5 / GLM-4.5-Air (Glm4MoeForCausalLM), as Megatron-Bridge's GLM 4.5 bridge maps it: GQA attention
    whose q/k/v projections carry `attention_bias` (the output projection none: Megatron's QKV bias), q/k
    RMSNorm when `use_qk_norm`, RoPE on `partial_rotary_factor` of the head; the first `first_k_dense_replace`
    layers dense, then MoE with `n_shared_experts` shared experts of the routed width and DeepSeek-V3's router
    (sigmoid scores, an expert bias, group-limited top-k, renormalised and scaled weights); MTP modules from
    `num_nextn_predict_layers`."""
    fields = _llama_core({**config, "attention_bias": False})  # the biases are the QKV ones, read next
    fields["add_qkv_bias"] = _flag(config, "attention_bias", False)
    fields["qk_layernorm"] = _flag(config, "use_qk_norm", False)
    fields["rotary_percent"] = _rotary_percent(config, GLM4_MOE_PARTIAL_ROTARY)
    mtp_key = _stated_key(config, "num_nextn_predict_layers", "num_mtp_layers")
    # absent: no MTP module, as for DeepSeek (`_deepseek`): building one would add an MTP loss the config omits
    fields["mtp_num_layers"] = 0 if mtp_key is None else _required_int(config, mtp_key)
    first_dense = _count(config, "first_k_dense_replace", DENSE_LAYERS)
    placement = _moe_placement(fields["num_layers"], lambda i: i >= first_dense, "first_k_dense_replace")
    # The router is DeepSeek-V3's noaux_tc gate (transformers' Glm4MoeTopkRouter): read it as one.
    as_deepseek = {**config, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}
    fields["moe"] = _deepseek_moe(as_deepseek, placement, router_expert_bias=True,
                                  load_balancing_type="seq_aux_loss", aux_loss_coeff=GLM4_MOE_AUX_LOSS_COEFF)
    return fields


# What a config.json may leave out, as the family's configuration class in Hugging Face transformers takes it
# (src/transformers/models/<family>/configuration_<family>.py of transformers 5.25: the class's fields and its
# __post_init__), so an absent key reads as transformers builds the model. Listed: every key the readers take with a
# fallback of their own where the family's class has another default; the readers' fallbacks (rms_norm_eps 1e-6,
# max_position_embeddings 4096, rope_theta 10000, one KV head per query head, head_dim hidden/heads, silu, no
# attention bias, no window, no routed or shared experts, no aux loss, ...) are every other family's. Keys a reader
# requires are refused when absent, never defaulted. DeepSeek-V3's classes have no `scoring_func` or
# `topk_method`: its router is always the sigmoid gate with the noaux_tc expert bias (DeepseekV3TopkRouter; V3.2's
# and V4's routers likewise, V4 scoring with sqrtsoftplus), written here in the keys the DeepSeek reader takes.
_ABSENT_KEY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048},  # LlamaConfig
    "mistral": {"max_position_embeddings": 131072, "num_key_value_heads": 8, "sliding_window": 4096},  # MistralConfig
    "mixtral": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_key_value_heads": 8,  # MixtralConfig
                "rope_theta": 1e6, "router_aux_loss_coef": 0.001},  # (rope_theta: its default_theta)
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32},  # Qwen2Config
    "qwen2_moe": {"max_position_embeddings": 32768, "num_key_value_heads": 16,  # Qwen2MoeConfig
                  "shared_expert_intermediate_size": 5632, "router_aux_loss_coef": 0.001, "norm_topk_prob": False},
    "qwen3": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},  # Qwen3Config
    "qwen3_moe": {"max_position_embeddings": 32768, "num_key_value_heads": 4,  # Qwen3MoeConfig
                  "router_aux_loss_coef": 0.001, "norm_topk_prob": False},
    "qwen3_next": {"max_position_embeddings": 32768, "num_key_value_heads": 2, "head_dim": 256,  # Qwen3NextConfig
                   "partial_rotary_factor": 0.25, "shared_expert_intermediate_size": 512,
                   "router_aux_loss_coef": 0.001, "norm_topk_prob": True},
    "deepseek_v2": {"max_position_embeddings": 2048, "q_lora_rank": 1536, "n_routed_experts": 64,  # DeepseekV2Config
                    "n_shared_experts": 2, "norm_topk_prob": False},
    "deepseek_v3": {"q_lora_rank": 1536, "n_routed_experts": 256, "n_shared_experts": 1,  # DeepseekV3Config
                    "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 8,
                    "topk_group": 4, "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "deepseek_v32": {"max_position_embeddings": 163840, "q_lora_rank": 1536,  # DeepseekV32Config
                     "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3,
                     "routed_scaling_factor": 2.5, "norm_topk_prob": True, "n_group": 8, "topk_group": 4,
                     "scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "deepseek_v4": {"max_position_embeddings": 1048576, "n_shared_experts": 1,  # DeepseekV4Config
                    "routed_scaling_factor": 1.5, "norm_topk_prob": True, "scoring_func": "sqrtsoftplus",
                    "topk_method": "noaux_tc", "swiglu_limit": 10.0, "hc_mult": 4,
                    "num_hash_layers": 3},  # (num_hash_layers: its default_num_hash_layers)
    "glm4_moe": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_key_value_heads": 8,  # Glm4MoeConfig
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "norm_topk_prob": True},
    "glm_moe_dsa": {"rms_norm_eps": 1e-5, "max_position_embeddings": 202752, "q_lora_rank": 2048,  # GlmMoeDsaConfig
                    "n_routed_experts": 256, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                    "norm_topk_prob": True},
    "gemma": {"max_position_embeddings": 8192, "num_key_value_heads": 16, "head_dim": 256,  # GemmaConfig
              "hidden_act": "gelu_pytorch_tanh"},
    "gemma2": {"max_position_embeddings": 8192, "num_key_value_heads": 4, "head_dim": 256,  # Gemma2Config
               "hidden_activation": "gelu_pytorch_tanh"},
    "phi3": {"rms_norm_eps": 1e-5},  # Phi3Config
    "gpt_oss": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_key_value_heads": 8,  # GptOssConfig
                "head_dim": 64, "rope_theta": 150000.0, "attention_bias": True, "swiglu_limit": 7.0,
                "router_aux_loss_coef": 0.9,
                # its __post_init__'s RoPE when the config states none
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 4096}},
    "llama4": {"rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "num_key_value_heads": 8,  # Llama4TextConfig
               "head_dim": 128, "rope_theta": 500000.0, "intermediate_size_mlp": 16384,
               "attention_chunk_size": 8192, "router_aux_loss_coef": 0.001, "use_qk_norm": True},
    "nemotron_h": {"num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,  # NemotronHConfig
                   "moe_shared_expert_intermediate_size": 7688},
}

# Keys whose null is a value of its own, not 'absent': the model transformers (or, for n_routed_experts, DeepSeek's
# own code) builds from a None differs from the default's. Every other listed key reads a null as absent, as
# transformers does where its class replaces a None (GPT-OSS's rope_scaling) and as the house rule has it where a None
# would not build (an epsilon, a width, a clamp).
_NULL_IS_A_VALUE = frozenset({
    "n_routed_experts",  # a dense MLA model
    "q_lora_rank",  # queries projected without a low-rank step (DeepSeek-V2-Lite)
    "norm_topk_prob",  # falsy: the top-k weights are not renormalised
    "sliding_window",  # full attention (Mistral v0.2 and later, Mixtral)
    "attention_chunk_size",  # no chunked attention
    "num_key_value_heads",  # one KV head per query head
    "head_dim",  # hidden_size / num_attention_heads
})


def _with_absent_keys(config: HFConfig, family: str) -> HFConfig:
    """The config with the keys it leaves out at its family's transformers defaults (`_ABSENT_KEY_DEFAULTS`): an
    absent key, or a null one unless its null has a meaning (`_NULL_IS_A_VALUE`). Llama 4's go into the text model's
    `text_config` where the checkpoint is multimodal."""
    defaults = _ABSENT_KEY_DEFAULTS.get(family, {})
    if family == "llama4" and isinstance(config.get("text_config"), dict):
        return {**config, "text_config": _with_defaults(config["text_config"], defaults)}
    return _with_defaults(config, defaults)


def _with_defaults(config: HFConfig, defaults: dict[str, Any]) -> HFConfig:
    left_out = {key: value for key, value in defaults.items()
                if key not in config or (config[key] is None and key not in _NULL_IS_A_VALUE)}
    return config | left_out


def _norm_topk_prob(config: HFConfig) -> bool:
    """Whether the router renormalises its top-k weights: the config's JSON boolean (its family's default filled in
    where it is absent, `_with_absent_keys`)."""
    return _flag(config, "norm_topk_prob", False)


def _deepseek_router(config: HFConfig, experts: int) -> dict[str, Any]:
    """DeepSeek's MoEGate (V2 and V3 modeling code) in Megatron's router vocabulary."""
    score = str(_stated(config, "scoring_func", default="softmax"))
    scores = ("softmax", "sigmoid", "sqrtsoftplus") if _family(config) == "deepseek_v4" else ("softmax", "sigmoid")
    if score not in scores:
        raise _refuse("scoring_func", f"scoring_func={score!r} has no Megatron router for this family ("
                                      f"{' and '.join(scores)} have)")
    topk = _required_int(config, "num_experts_per_tok")
    normalised = _norm_topk_prob(config) and topk > 1
    if score != "softmax" and topk > 1 and not normalised:
        raise _refuse("norm_topk_prob", f"Megatron's {score} router always renormalises the top-k weights, "
                                        "so norm_topk_prob=false cannot be expressed")
    scaling = _float_or(config, "routed_scaling_factor", 1.0)
    if _family(config) == "deepseek_v2" and normalised:
        scaling = 1.0  # V2's gate applies routed_scaling_factor only when it does not renormalise
    _routed_scaling_above_zero(scaling)
    router: dict[str, Any] = {
        "router_score_function": score,
        "router_pre_softmax": score == "softmax" and not normalised,
        "router_topk_scaling_factor": scaling if scaling != 1.0 else None,
    }
    return router | _deepseek_groups(config, topk, experts, score, normalised)


def _routed_scaling_above_zero(scaling: float) -> None:
    """The routing weights are multiplied by `routed_scaling_factor`: 0 silences every routed expert (and
    Megatron's --moe-router-topk-scaling-factor must be above 0), so it is refused, not read as 1."""
    _above_zero("routed_scaling_factor", scaling, "the model card's value (DeepSeek-V3: 2.5), or leave it out for 1.0")


def _deepseek_groups(config: HFConfig, topk: int, experts: int, score: str, normalised: bool) -> dict[str, Any]:
    """Group-limited routing. Megatron scores a group by the sum of its top (topk // group_topk) scores."""
    method = str(_stated(config, "topk_method", default="greedy"))
    groups, group_topk = _expert_groups(config, experts)
    if method == "greedy" or groups <= 1 or group_topk >= groups:
        return {}  # every expert is eligible: no grouping
    if method not in ("group_limited_greedy", "noaux_tc"):
        raise _refuse("topk_method", f"topk_method={method!r} has no Megatron router")
    # HF scores a group by its best expert (group_limited_greedy) or by its best two (noaux_tc).
    hf_scored = 1 if method == "group_limited_greedy" else 2
    if topk // group_topk != hf_scored:
        raise _refuse("topk_group", f"{method} scores a group by its top {hf_scored} expert(s); Megatron by its "
                                    f"top num_experts_per_tok // topk_group = {topk // group_topk}")
    if score == "softmax" and normalised:
        raise _refuse("norm_topk_prob", "group-limited softmax routing with renormalised weights picks groups "
                                        "on logits in Megatron, on probabilities in Hugging Face")
    return {"router_num_groups": groups, "router_group_topk": group_topk}


def _expert_groups(config: HFConfig, experts: int) -> tuple[int, int]:
    """(`n_group`, `topk_group`) as stated (absent: one group, all of it picked), refused by field where Megatron
    would assert: --moe-router-num-groups must divide the experts and --moe-router-group-topk must not exceed it."""
    groups = _optional_int(config, "n_group")
    group_topk = _optional_int(config, "topk_group")
    if groups is not None:
        _at_least_one("n_group", groups, f"a divisor of n_routed_experts={experts}, or 1 for no expert groups")
        if experts % groups:
            raise MegapilotError(f"n_group={groups} does not divide the {experts} routed experts", field="n_group",
                                 fix=f"set 'n_group' to a divisor of n_routed_experts={experts} (Megatron's "
                                     "--moe-router-num-groups), as the model card gives it")
    if group_topk is not None:
        _at_least_one("topk_group", group_topk, "the number of expert groups a token may pick from")
        if groups is not None and group_topk > groups:
            raise MegapilotError(f"topk_group={group_topk} exceeds n_group={groups}: a token cannot pick more "
                                 "groups than there are", field="topk_group",
                                 fix=f"set 'topk_group' to at most n_group={groups} (Megatron's "
                                     "--moe-router-group-topk)")
    groups = groups or 1
    return groups, group_topk or groups


# ---- GPT-2 -------------------------------------------------------------------------------------------


def _gpt2(config: HFConfig) -> dict[str, Any]:
    activation = str(_stated(config, "activation_function", default="gelu_new"))
    if not activation.startswith("gelu"):
        raise _refuse("activation_function", f"activation_function={activation!r} is not modelled (GELU is)")
    hidden = _required_int(config, "n_embd")
    return {
        "num_layers": _required_int(config, "n_layer"),
        "hidden_size": hidden,
        # transformers' GPT2MLP: n_inner null is 4 x n_embd; a 0 builds no MLP width, which Megatron cannot
        "ffn_hidden_size": _positive_int_or(config, "n_inner", 4 * hidden, f"the MLP width the model card gives, "
                                                                            f"or null for 4 x n_embd = {4 * hidden}"),
        "num_attention_heads": _required_int(config, "n_head"),
        "vocab_size": _required_int(config, "vocab_size"),
        "max_position_embeddings": _int_or(config, "n_positions", 1024),
        "mlp_activation": "gelu",
        "normalization": "LayerNorm",
        "norm_epsilon": _norm_epsilon(config, ("layer_norm_epsilon",), 1e-5),
        "position_embedding": "learned_absolute",
        "tie_embeddings": _flag(config, "tie_word_embeddings", True),
        "add_bias_linear": True,
    }


# ---- newer families ---------------------------------------------------------------------------------


def _phi3(config: HFConfig) -> dict[str, Any]:
    """Phi-3: Llama's shapes with fused qkv_proj and gate_up_proj (the same weights, concatenated); RoPE on
    partial_rotary_factor of each head where the config says (Phi-3.5/4-mini-style), --rotary-percent."""
    return _llama_core(config) | _full_sliding_window(config)


def _gpt_oss(config: HFConfig) -> dict[str, Any]:
    """GPT-OSS: biased attention and experts, a biased router, learned attention sinks, and sliding-window
    attention on every other layer (layer_types alternates sliding/full starting with sliding)."""
    fields = _llama_core(config | {"mlp_bias": True})  # every linear has a bias (experts and router too)
    layer_types = list(config.get("layer_types") or [])
    expected = ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(fields["num_layers"])]
    if layer_types and layer_types != expected:
        raise _refuse("layer_types", "only GPT-OSS's sliding/full alternation (Megatron --window-attn-skip-freq 2) "
                      "is modelled")
    fields |= {
        "mlp_activation": "quick_geglu",
        "glu_linear_offset": 1.0,  # GPT-OSS computes (up + 1) * quick_gelu(gate)
        "activation_clamp": _optional_float(config, "swiglu_limit"),
        "sliding_window": _required_int(config, "sliding_window"),
        "sliding_window_skip_freq": 2,
        "softmax_type": "learnable",
        "moe": MoESpec(
            num_experts=_required_int(config, "num_local_experts"),
            router_topk=_required_int(config, "num_experts_per_tok"),
            moe_ffn_hidden_size=fields["ffn_hidden_size"],
            **_gpt_oss_balancing(config),
        ),
    }
    return fields


def _gpt_oss_balancing(config: HFConfig) -> dict[str, Any]:
    """GPT-OSS's load balancing: the stated `router_aux_loss_coef` (GptOssConfig: 0.9), read as every family's
    aux-loss key is, as the loss's weight; the loss itself only where `output_router_logits` is true, the one case
    transformers adds it to the training loss. Otherwise none, as the published recipes train and Megatron-Bridge's
    GPT-OSS bridge builds it (load balancing 'none', its coefficient still mapped from the key): Megatron weighs
    no loss by the coefficient then, so it is carried but changes nothing."""
    trained = _flag(config, "output_router_logits", False)
    return {"load_balancing_type": "aux_loss" if trained else "none",
            "aux_loss_coeff": _float_or(config, "router_aux_loss_coef", 0.0)}


def _llama4(config: HFConfig) -> dict[str, Any]:
    """Llama 4 (text model): MoE on the `moe_layers` (else every `interleave_moe_layer_step`-th layer) with a shared
    expert, sigmoid top-1 router, dense layers of width intermediate_size_mlp, chunked attention and (`use_qk_norm`)
    a weightless L2 norm of q and k on RoPE layers, NoPE every `no_rope_layer_interval`-th (4), as Llama4TextConfig
    places them."""
    text = config.get("text_config") or config
    fields = _llama_core(text)
    first_k_dense, freq = _llama4_moe_placement(text, fields["num_layers"])
    expert_width = _required_int(text, "intermediate_size")
    fields |= {
        "ffn_hidden_size": _positive_int_or(text, "intermediate_size_mlp", expert_width,
                                            "the dense layers' MLP width the model card gives (Scout: 16384)"),
        "attention_chunk_size": _optional_int(text, "attention_chunk_size"),
        "no_rope_freq": _llama4_no_rope_freq(text, fields["num_layers"]),
        # transformers' Llama4TextL2Norm on q and k of the RoPE layers only (Scout: true, Maverick: false)
        "qk_l2_norm": _flag(text, "use_qk_norm", False),
        "moe": MoESpec(
            num_experts=_required_int(text, "num_local_experts"),
            router_topk=_required_int(text, "num_experts_per_tok"),
            moe_ffn_hidden_size=expert_width,
            shared_expert_ffn_hidden_size=expert_width,
            first_k_dense_layers=first_k_dense,
            moe_layer_freq=freq,
            router_score_function="sigmoid",
            aux_loss_coeff=_float_or(text, "router_aux_loss_coef", 0.0),
        ),
    }
    return fields


def _llama4_moe_placement(text: HFConfig, layers: int) -> tuple[int, int]:
    """Llama4TextConfig's MoE layers: `moe_layers` when stated (transformers then ignores the step), else
    range(interleave_moe_layer_step - 1, layers, step); as Megatron's (first dense layers, MoE every k-th)."""
    if text.get("moe_layers") is not None:
        moe_layers = set(_layer_indices(text, "moe_layers"))
        return _moe_placement(layers, lambda i: i in moe_layers, "moe_layers")
    # transformers' range(step - 1, layers, step) has no step 0
    step = _positive_int_or(text, "interleave_moe_layer_step", 1, "1 (every layer MoE) or the k of MoE on every "
                                                                   "k-th layer, as the model card gives it")
    return _moe_placement(layers, lambda i: (i + 1) % step == 0, "interleave_moe_layer_step")


def _llama4_no_rope_freq(text: HFConfig, layers: int) -> int:
    """Every how many layers Llama 4 drops RoPE (Megatron's --no-rope-freq): `no_rope_layers` (1 = RoPE) when
    stated, else every `no_rope_layer_interval`-th layer (Llama4TextConfig: 4)."""
    no_rope = list(text.get("no_rope_layers") or [])  # transformers: an empty list is the interval's pattern
    if not no_rope:
        return _positive_int_or(text, "no_rope_layer_interval", 4, "the k of NoPE on every k-th layer (4), or "
                                                                     "leave it out for 4")
    first_nope = next((i for i, rope in enumerate(no_rope) if not rope), None)
    every = len(no_rope) + 1 if first_nope is None else first_nope + 1
    if every > layers or no_rope != [int((i + 1) % every != 0) for i in range(layers)]:
        raise _refuse("no_rope_layers", "only NoPE on every k-th layer (Megatron --no-rope-freq k) is modelled")
    return every


def llama4_vision_params(config: HFConfig) -> int:
    """Parameters of a Llama 4 checkpoint outside its text model: the vision encoder, its pixel-shuffle adapter
    and the projector into the text width (Hugging Face modeling_llama4.py). Published Llama 4 totals (109B, 400B)
    count them; Megatron's pretrain_gpt.py builds the text model only, so a like-for-like comparison adds them."""
    vision = _required(config, "vision_config")
    hidden, width = _required_int(vision, "hidden_size"), _required_int(vision, "intermediate_size")
    patch = _required_int(vision, "patch_size")
    channels = _positive_int_or(vision, "num_channels", 3, "the image channels (3), or leave it out")
    positions = (_required_int(vision, "image_size") // patch) ** 2 + 1  # the patches and the class token
    layer = 4 * (hidden * hidden + hidden) + (hidden * width + width) + (width * hidden + hidden) + 2 * 2 * hidden
    encoder = (channels * patch * patch * hidden  # unfold-convolution patch embedding, no bias
               + hidden + positions * hidden  # class embedding and learned positions
               + 2 * 2 * hidden  # LayerNorms before and after the encoder
               + _required_int(vision, "num_hidden_layers") * layer)
    adapter = (width * _required_int(vision, "projector_input_dim")
               + _required_int(vision, "projector_output_dim") ** 2)
    text_hidden = _required_int(config.get("text_config") or {}, "hidden_size")
    return encoder + adapter + _required_int(vision, "vision_output_dim") * text_hidden


def _nemotron_h(config: HFConfig) -> dict[str, Any]:
    """Nemotron-H / Nemotron 3: a Mamba-2 hybrid (`hybrid_override_pattern` over M, *, -, E), squared-ReLU MLPs,
    attention without position embeddings, and (Nemotron 3) MoE layers with a shared expert and a sigmoid router
    with DeepSeek's aux-loss-free expert bias."""
    pattern = _hybrid_layer_pattern(config, "hybrid_override_pattern", ("layers_block_type", "layer_types"))
    if pattern is None:
        raise MegapilotError("the config has neither 'hybrid_override_pattern' nor 'layers_block_type'",
                             field="hybrid_override_pattern",
                             fix="copy the layer pattern from the model's config.json on its hub page")
    stated_layers = _optional_int(config, "num_hidden_layers")
    if pattern == config.get("hybrid_override_pattern") and stated_layers not in (None, len(pattern)):
        # the checkpoint's NemotronHConfig asserts the two agree: one of them was cut or pasted from another model
        raise MegapilotError(
            f"hybrid_override_pattern has {len(pattern)} layers but num_hidden_layers={stated_layers}",
            field="hybrid_override_pattern",
            fix="copy hybrid_override_pattern and num_hidden_layers together from the model's config.json (one "
                "letter per layer)")
    # transformers >= 5 counts the layers from their list (its num_hidden_layers is deprecated and ignored)
    config = {**config, "num_hidden_layers": len(pattern)}
    heads = _required_int(config, "num_attention_heads")
    kv_heads = _kv_heads(config, heads)
    hidden = _required_int(config, "hidden_size")
    head_dim = _head_dim(config)
    activation = _stated(config, "mlp_hidden_act", "hidden_act", default="relu2")
    if activation != "relu2":
        raise _refuse("mlp_hidden_act", f"mlp_hidden_act={activation!r} is not modelled for Nemotron-H (relu2 is)")
    if any(_flag(config, key, False) for key in ("mamba_proj_bias", "use_bias", "attention_bias", "mlp_bias")):
        raise _refuse("use_bias", "linear biases in a Mamba hybrid are not modelled")
    fields: dict[str, Any] = {
        **_hybrid_mtp(config),
        **_attention_dims(config, hidden, heads, kv_heads, head_dim),
        "mlp_activation": "squared_relu",
        "normalization": "RMSNorm",
        "norm_epsilon": _norm_epsilon(config, ("layer_norm_epsilon", "norm_eps"), 1e-5),
        "position_embedding": "none",
        "tie_embeddings": _flag(config, "tie_word_embeddings", False),
        "hybrid_override_pattern": pattern,
        "mamba": MambaSpec(
            state_dim=_required_int(config, "ssm_state_size"),
            head_dim=_required_int(config, "mamba_head_dim"),
            num_groups=_required_int(config, "n_groups"),
            num_heads=_optional_int(config, "mamba_num_heads"),
            conv_kernel=_positive_int_or(config, "conv_kernel", 4, "the model card's conv width (4), or leave it "
                                                                   "out for 4"),
        ),
    }
    if "E" in pattern:
        shared = (_optional_int(config, "moe_shared_expert_intermediate_size") or 0) * (
            _count(config, "n_shared_experts", SHARED_EXPERTS, default=1) or 1)
        latent = _optional_int(config, "moe_latent_size")  # null: experts in hidden_size; 0 would be no width
        if latent is not None:
            _at_least_one("moe_latent_size", latent, "the latent width the model card gives (Nemotron 3 Super: "
                                                     "1024), or null for experts in hidden_size")
        scaling = _optional_float(config, "routed_scaling_factor")
        if scaling is not None:
            _routed_scaling_above_zero(scaling)
        fields["moe"] = MoESpec(
            num_experts=_required_int(config, "n_routed_experts"),
            router_topk=_required_int(config, "num_experts_per_tok"),
            moe_ffn_hidden_size=_required_int(config, "moe_intermediate_size"),
            shared_expert_ffn_hidden_size=shared,
            router_score_function="sigmoid",
            router_expert_bias=True,
            router_topk_scaling_factor=scaling,
            load_balancing_type="seq_aux_loss",
            aux_loss_coeff=1e-4,
            router_dtype="fp32",
            latent_size=latent,  # Nemotron 3 Super's latent MoE
        )
    return fields


def _hybrid_mtp(config: HFConfig) -> dict[str, Any]:
    """Nemotron 3 Super's MTP: `num_nextn_predict_layers` modules, each the layers of `mtp_hybrid_override_pattern`
    (its checkpoint: '*E', attention then MoE) between the eh-projection and the final norm. Megatron-Bridge
    refuses a depth without a pattern, and so does this."""
    depth = _optional_int(config, "num_nextn_predict_layers") or 0
    if not depth:
        return {}
    pattern = _hybrid_layer_pattern(config, "mtp_hybrid_override_pattern",
                                    ("mtp_layers_block_type", "mtp_layer_types"))
    if not pattern:
        raise MegapilotError(
            f"num_nextn_predict_layers={depth} but no mtp_hybrid_override_pattern says what an MTP module holds",
            field="mtp_hybrid_override_pattern",
            fix="copy mtp_hybrid_override_pattern from the checkpoint's config.json (Nemotron 3 Super: \"*E\"), "
                "or set num_nextn_predict_layers to 0 to plan the main model alone")
    return {"mtp_num_layers": depth, "mtp_hybrid_pattern": pattern}


# transformers >= 5 writes a hybrid's layers as a list of kinds (`layers_block_type`); older configs as a string
# over M, *, -, E. Both the legacy kind names and transformers' current ones.
_LAYER_KIND_SYMBOLS = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                       "moe": "E"}


def _hybrid_layer_pattern(config: HFConfig, pattern_key: str, list_keys: tuple[str, ...]) -> str | None:
    """A hybrid's layer pattern from its string (`pattern_key`) or its list of layer kinds (`list_keys`)."""
    pattern = config.get(pattern_key)
    if isinstance(pattern, str) and pattern:
        return pattern
    for key in list_keys:
        kinds = config.get(key)
        if kinds is None:
            continue
        if not isinstance(kinds, list):
            raise _refuse(key, f"{key}={kinds!r} is not a list of layer kinds")
        unknown = sorted({str(kind) for kind in kinds if kind not in _LAYER_KIND_SYMBOLS})
        if unknown:
            known = ", ".join(_LAYER_KIND_SYMBOLS)
            raise _refuse(key, f"layer kinds {', '.join(unknown)} are not modelled (known: {known})")
        return "".join(_LAYER_KIND_SYMBOLS[kind] for kind in kinds) or None
    return None


def _nemotron_nas(config: HFConfig) -> dict[str, Any]:
    """Llama-Nemotron (DeciLM, `nemotron-nas`): a Llama whose `block_configs` give each layer its own attention
    (GQA width, no-op or a linear replacement) and MLP width (`ffn_mult`). One shape for every layer imports as a
    Llama; per-layer shapes (Llama-3.3-Nemotron-Super-49B, -Ultra-253B) as a Llama with `layer_blocks`, as
    Megatron-Core builds them (--heterogeneous-layers-config-path). The model-wide KV heads and MLP width are
    the most common full layer's."""
    hidden = _required_int(config, "hidden_size")
    heads = _required_int(config, "num_attention_heads")
    shapes = _decilm_shapes(_required(config, "block_configs"), heads, hidden)
    kv_heads = _most_common([kv for kv, _ in shapes if isinstance(kv, int)]) or heads
    ffn_hidden_size = _most_common([width for _, width in shapes if isinstance(width, int)]) or hidden
    fields = _llama_core(config | {"num_key_value_heads": kv_heads, "intermediate_size": ffn_hidden_size})
    if any(shape != (kv_heads, ffn_hidden_size) for shape in shapes):
        fields["layer_blocks"] = _layer_blocks(shapes, kv_heads, ffn_hidden_size)
    return fields


def layer_blocks_from_block_configs(blocks: Any, num_attention_heads: int, hidden_size: int, kv_heads: int,
                                    ffn_hidden_size: int) -> tuple[LayerBlock, ...]:
    """Llama-Nemotron `block_configs` (a checkpoint's, or the file Megatron-LM reads through
    --heterogeneous-layers-config-path) as one LayerBlock per layer, each stating only what differs from the
    model-wide `kv_heads` and `ffn_hidden_size`; refused by field when malformed."""
    return _layer_blocks(_decilm_shapes(blocks, num_attention_heads, hidden_size), kv_heads, ffn_hidden_size)


def _decilm_shapes(blocks: Any, heads: int, hidden: int) -> list[tuple[int | str, int | str]]:
    if not isinstance(blocks, list) or not blocks:
        raise MegapilotError(f"block_configs={blocks!r} is not a list of layer blocks", field="block_configs",
                             fix="copy block_configs from the model's config.json")
    return [_decilm_block_shape(block, i, heads, hidden) for i, block in enumerate(blocks)]


def _most_common(values: list[int]) -> int | None:
    return max(values, key=values.count) if values else None


def _layer_blocks(shapes: list[tuple[int | str, int | str]], kv_heads: int,
                  ffn_hidden_size: int) -> tuple[LayerBlock, ...]:
    """DeciLM block shapes as LayerBlocks ('no-op' -> none, 'linear' -> linear, a number -> full), a block
    stating a KV-head count or width only where it differs from the model-wide one."""
    return tuple(LayerBlock(
        attention="none" if kv == "no-op" else "linear" if kv == "linear" else "full",
        kv_heads=kv if isinstance(kv, int) and kv != kv_heads else None,
        mlp="none" if width == "no-op" else "linear" if width == "linear" else "full",
        ffn_hidden_size=width if isinstance(width, int) and width != ffn_hidden_size else None,
    ) for kv, width in shapes)


def _decilm_block_shape(block: Any, index: int, heads: int, hidden: int) -> tuple[int | str, int | str]:
    """(KV heads or 'no-op'/'linear', MLP width or 'no-op'/'linear') of one DeciLM block, by Megatron-Core's rules
    (heterogeneous_config.py: KV heads = heads // n_heads_in_group; width = int(2 * ffn_mult * hidden / 3) rounded
    up to a multiple of 256)."""
    attention = block.get("attention") if isinstance(block, dict) else None
    mlp = (block.get("ffn") or block.get("mlp")) if isinstance(block, dict) else None
    if not isinstance(attention, dict) or not isinstance(mlp, dict):
        raise MegapilotError(f"block_configs[{index}]={block!r} has no attention and ffn objects",
                             field=f"block_configs[{index}]", fix="copy block_configs from the model's config.json")
    kv: int | str = "no-op" if attention.get("no_op") else "linear" if attention.get("replace_with_linear") else 0
    width: int | str = "no-op" if mlp.get("no_op") else "linear" if mlp.get("replace_with_linear") else 0
    if kv == 0:
        stated = _optional_int(attention, "n_heads_in_group")
        group = 1 if stated is None else stated  # 0 must not read as 'absent' (one KV head per query head)
        if group < 1:
            raise _refuse(f"block_configs[{index}].attention.n_heads_in_group",
                          f"n_heads_in_group={group} must be at least 1")
        if heads % group:
            raise _refuse(f"block_configs[{index}].attention.n_heads_in_group",
                          f"n_heads_in_group={group} does not divide num_attention_heads={heads}")
        kv = heads // group
    if width == 0 and mlp.get("ffn_hidden_size") is not None:  # Megatron's own key, beside HF's ffn_mult
        width = _required_int(mlp, "ffn_hidden_size")
        _at_least_one(f"block_configs[{index}].ffn.ffn_hidden_size", width, "the layer's MLP width, or mark the MLP "
                                                                            "no_op")
    if width == 0:
        multiplier = _optional_float(mlp, "ffn_mult")
        if multiplier is None:
            raise _refuse(f"block_configs[{index}].ffn.ffn_mult", f"layer {index}'s MLP has no ffn_mult")
        _above_zero(f"block_configs[{index}].ffn.ffn_mult", multiplier,
                    "the layer's MLP multiplier from the model's config.json, or mark the MLP no_op")
        width = -(-int(2 * multiplier * hidden / 3) // 256) * 256
    return kv, width


def _qwen3_next(config: HFConfig) -> dict[str, Any]:
    """Qwen3-Next: Qwen's MoE with a gated shared expert, Gated DeltaNet on all layers but every
    full_attention_interval-th, gated attention (a sigmoid output gate projected with Q) with per-head q/k norms
    and no QKV bias, RoPE on partial_rotary_factor of each head, zero-centred RMSNorm scales (1 + weight)."""
    fields = _qwen_moe(config, shared_expert=True)
    fields.update(
        add_qkv_bias=_flag(config, "attention_bias", False), qk_layernorm=True, attention_output_gate=True,
        norm_zero_centered=True,
        gated_delta_net=GatedDeltaNetSpec(
            key_heads=_required_int(config, "linear_num_key_heads"),
            value_heads=_required_int(config, "linear_num_value_heads"),
            key_head_dim=_required_int(config, "linear_key_head_dim"),
            value_head_dim=_required_int(config, "linear_value_head_dim"),
            conv_kernel=_positive_int_or(config, "linear_conv_kernel_dim", 4, "the model card's conv width (4), "
                                                                              "or leave it out for 4"),
            full_attention_freq=_full_attention_interval(config),
        ),
    )
    return fields


def _full_attention_interval(config: HFConfig) -> int:
    """Every how many layers Qwen3-Next runs full attention: `full_attention_interval`, or (a config saved by
    transformers >= 5, which drops it) read off `layer_types`, which must repeat that way for Megatron's
    --linear-attention-freq to express it."""
    interval = _optional_int(config, "full_attention_interval")
    if interval is not None:
        return interval
    kinds = config.get("layer_types")
    if not isinstance(kinds, list) or "full_attention" not in kinds:
        raise MegapilotError("the config has neither 'full_attention_interval' nor 'layer_types'",
                             field="full_attention_interval",
                             fix="copy it from the model's config.json (Qwen3-Next: 4)")
    every = kinds.index("full_attention") + 1
    if kinds != ["linear_attention" if (i + 1) % every else "full_attention" for i in range(len(kinds))]:
        raise _refuse("layer_types", "full attention does not come every k-th layer, which Megatron's "
                                     "--linear-attention-freq needs")
    return every


_FAMILY_MAPPERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = {
    "nemotron-nas": _nemotron_nas,
    "phi3": _phi3,
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "qwen3_next": _qwen3_next,
    "nemotron_h": _nemotron_h,
    "llama": _llama,
    "mistral": _mistral,
    "gemma": _gemma,
    "gemma2": _gemma,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mixtral": _mixtral,
    "qwen2_moe": lambda config: _qwen_moe(config, shared_expert=True),
    "qwen3_moe": lambda config: _qwen_moe(config, shared_expert=False),
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "deepseek_v32": _deepseek,
    "deepseek_v4": _deepseek_v4,
    "glm_moe_dsa": _glm_moe_dsa,
    "glm4_moe": _glm4_moe,
    "gpt2": _gpt2,
}


def _attention_dims(config: dict[str, Any], hidden: int, heads: int, kv_heads: int,
                    head_dim: int | None) -> dict[str, Any]:
    """The dimensions every decoder config states the same way: layers, widths, heads, GQA groups, head size
    (only when it is not hidden/heads), vocabulary and positions (4096 when the config has none)."""
    return {
        "num_layers": _required_int(config, "num_hidden_layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": _required_int(config, "intermediate_size"),
        "num_attention_heads": heads,
        "num_query_groups": kv_heads if kv_heads != heads else None,
        "kv_channels": head_dim if head_dim and head_dim * heads != hidden else None,
        "vocab_size": _required_int(config, "vocab_size"),
        "max_position_embeddings": _int_or(config, "max_position_embeddings", 4096),
    }
