"""A model of per-layer shapes (`ModelSpec.layer_blocks`) as Megatron-LM builds it: a JSON file of block configs.

Megatron-LM's `pretrain_gpt.py` picks its heterogeneous layer spec only when `--heterogeneous-layers-config-path`
names a file (core_v0.16.0 `gpt_builders.py`); the file is a Hugging Face Llama-Nemotron config: `block_configs`
(per layer: attention with `n_heads_in_group`, `no_op` or `replace_with_linear`; ffn likewise with its width) and
the model-wide fields `arguments.py` checks the flags against (`validate_model_config_args_from_heterogeneous_config`:
SiLU gated MLP, RMSNorm, GQA with one KV-head count across the layers that attend, RoPE over the whole head with
Llama 3 scaling, the layer count, widths, heads, tied head and RoPE base). A model those checks would refuse is
refused here, by field, before a script is written. The script writes the file next to itself (a quoted heredoc,
so every node running it has its own copy) and `script -o` saves it too.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from megapilot.errors import MegapilotError
from megapilot.spec import ModelSpec
from megapilot.spec.model import LayerBlock, Llama3RopeScaling

HEREDOC_END = "MEGAPILOT_LAYER_BLOCKS_JSON"
FLAG = "--heterogeneous-layers-config-path"
COMMENT = "# ---- the model's per-layer shapes, read by --heterogeneous-layers-config-path"


def layer_config_path(script_path: str | None) -> str:
    """Where the block configs go: beside the script (`train.sh` -> `train.layers.json`)."""
    if script_path is None:
        raise MegapilotError("a model of per-layer shapes needs its block-config file written beside the script",
                             field="output", fix="pass -o /abs/path/train.sh (the file goes next to it)")
    return str(PurePosixPath(script_path).with_suffix(".layers.json"))


def layer_config_json(model: ModelSpec) -> str:
    """The block-config file Megatron-LM reads for `model` (refused by field where Megatron would refuse)."""
    check_megatron_rules(model)
    assert model.layer_blocks is not None and isinstance(model.rope_scaling, Llama3RopeScaling)
    fields = {
        "hidden_act": "silu",
        "num_hidden_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "tie_word_embeddings": model.tie_embeddings,
        "rope_theta": model.rotary_base,
        "rope_scaling": {"factor": model.rope_scaling.factor},
    }
    # one line per field and per layer: the script stays readable at 80+ layers
    blocks = ",\n".join(f"  {json.dumps(_block_config(model, block))}" for block in model.layer_blocks)
    head = "".join(f" {json.dumps(key)}: {json.dumps(value)},\n" for key, value in fields.items())
    return "{\n" + head + ' "block_configs": [\n' + blocks + "\n ]\n}\n"


def _block_config(model: ModelSpec, block: LayerBlock) -> dict[str, dict[str, object]]:
    groups = model.num_attention_heads // (block.kv_heads or model.kv_heads) if block.attention == "full" else None
    return {
        "attention": {"n_heads_in_group": groups, "no_op": block.attention == "none",
                      "replace_with_linear": block.attention == "linear"},
        "ffn": {"ffn_hidden_size": (block.ffn_hidden_size or model.ffn_hidden_size) if block.mlp == "full" else None,
                "no_op": block.mlp == "none", "replace_with_linear": block.mlp == "linear"},
    }


def check_megatron_rules(model: ModelSpec) -> None:
    """core_v0.16.0's checks of a heterogeneous config against the flags, as refusals naming the model field."""
    rules = (
        (model.mlp_activation == "swiglu", "model.mlp_activation", "the MLP must be SwiGLU (hidden_act silu)"),
        (model.normalization == "RMSNorm", "model.normalization", "the norms must be RMSNorm"),
        (model.position_embedding == "rope" and model.rotary_percent == 1.0, "model.position_embedding",
         "RoPE over the whole head is required"),
        (isinstance(model.rope_scaling, Llama3RopeScaling), "model.rope_scaling",
         "Llama 3 RoPE scaling is required (--use-rope-scaling)"),
        (model.is_gqa, "model.num_query_groups", "grouped-query attention is required"),
    )
    for holds, field, rule in rules:
        if not holds:
            raise MegapilotError(f"Megatron-LM builds per-layer shapes (layer_blocks) only for Llama-Nemotron-style "
                                 f"models: {rule}", field=field,
                                 fix="plan it as estimates allow, but train it with a framework that builds it")
    attending = {model.layer_kv_heads(i) for i in range(model.num_layers)
                 if model.layer_block(i).attention == "full"}
    if len(attending) > 1:
        raise MegapilotError(f"the layers that attend have different KV-head counts ({sorted(attending)}); "
                             "Megatron-LM asserts one count across layers", field="model.layer_blocks",
                             fix="give every attending layer the same kv_heads")
