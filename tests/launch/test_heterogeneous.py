"""A model of per-layer shapes: the block-config file and flags `script` writes, read by Megatron-Core 0.16.1.

Megatron-Core builds the layers from the file (HeterogeneousTransformerConfig and the heterogeneous GPT layer spec,
on the meta device); the built parameters must equal megapilot's count, and the flags must pass the checks
Megatron-LM's arguments.py makes against the file (validate_model_config_args_from_heterogeneous_config, restated).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.hf import load_hf_config
from megapilot.errors import MegapilotError
from megapilot.estimate.params import count_params
from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.model import LayerBlock, Llama3RopeScaling
from tests.launch.test_model_flags_megatron import one_process_group  # noqa: F401  # a fixture

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
SCRIPT = "/opt/runs/nas/train.sh"
OPTIONS = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False,
                        script_path=SCRIPT)
def _tiny() -> ModelSpec:
    """Four layers of four shapes: a wide MLP, no attention, both sublayers replaced by linears, no MLP."""
    return ModelSpec(
        name="tiny-nas", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=8,
        num_query_groups=2, vocab_size=1024, rope_scaling=Llama3RopeScaling(factor=8.0), tie_embeddings=False,
        layer_blocks=(LayerBlock(ffn_hidden_size=768), LayerBlock(attention="none", ffn_hidden_size=256),
                      LayerBlock(attention="linear", mlp="linear"), LayerBlock(mlp="none")),
    )


def _plan(model: ModelSpec, gpus: int = 1, tp: int = 1) -> SavedPlan:
    return SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=gpus),
                     training=TrainingSpec(seq_length=128, global_batch_size=gpus, train_iters=1),
                     parallel=ParallelConfig.for_world(gpus, tp=tp, mbs=1, recompute="none"))


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_the_script_writes_the_block_configs_it_names_and_passes_megatrons_checks_of_them():
    launch = render_launch(_plan(_tiny()), OPTIONS)
    path = "/opt/runs/nas/train.layers.json"
    assert _flag(launch.megatron_args, "--heterogeneous-layers-config-path") == path
    config = json.loads(launch.files[path])
    assert f"cat > {shlex.quote(path)} <<'MEGAPILOT_LAYER_BLOCKS_JSON'" in launch.script
    end = "MEGAPILOT_LAYER_BLOCKS_JSON"
    heredoc = launch.script.split(f"<<'{end}'\n", 1)[1].split(f"\n{end}", 1)[0]
    assert json.loads(heredoc) == config
    assert [b["attention"]["no_op"] for b in config["block_configs"]] == [False, True, False, False]
    assert [b["ffn"]["ffn_hidden_size"] for b in config["block_configs"]] == [768, 256, None, None]
    # Megatron-LM's arguments.py: the flags must say what the file says.
    args = launch.megatron_args
    kv_groups = {b["attention"]["n_heads_in_group"] for b in config["block_configs"]} - {None}
    assert config["hidden_act"] == "silu" and "--swiglu" in args
    assert _flag(args, "--normalization") == "RMSNorm" and "--group-query-attention" in args
    assert _flag(args, "--position-embedding-type") == "rope" and "--use-rope-scaling" in args
    assert float(_flag(args, "--rope-scaling-factor") or 8.0) == config["rope_scaling"]["factor"]
    assert int(_flag(args, "--num-layers")) == config["num_hidden_layers"]
    assert int(_flag(args, "--hidden-size")) == config["hidden_size"]
    assert int(_flag(args, "--num-attention-heads")) == config["num_attention_heads"]
    assert ("--untie-embeddings-and-output-weights" in args) == (not config["tie_word_embeddings"])
    assert float(_flag(args, "--rotary-base")) == config["rope_theta"]
    assert len(kv_groups) == 1 and int(_flag(args, "--num-query-groups")) == 8 // kv_groups.pop()


@pytest.mark.usefixtures("one_process_group")
def test_megatron_core_builds_from_the_file_the_parameters_megapilot_counts() -> None:
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs import get_gpt_heterogeneous_layer_spec
    from megatron.core.transformer.heterogeneous.heterogeneous_config import HeterogeneousTransformerConfig

    model = _tiny()
    launch = render_launch(_plan(model), OPTIONS)
    [text] = launch.files.values()
    config = HeterogeneousTransformerConfig(
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.kv_heads, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", add_bias_linear=False,
        heterogeneous_layers_config_encoded_json=text, use_cpu_initialization=True,
    )
    vocab = model.padded_vocab_size(1)
    with torch.device("meta"):
        gpt = GPTModel(config, get_gpt_heterogeneous_layer_spec(config, use_te=False), vocab_size=vocab,
                       max_sequence_length=128, position_embedding_type="rope",
                       share_embeddings_and_output_weights=model.tie_embeddings)
    built = sum(p.numel() for p in gpt.parameters())
    assert built == count_params(model, padded_vocab=True).total


def test_llama_nemotron_super_49b_imports_with_its_blocks_and_counts_its_published_size():
    """The checkpoint's 49,867,145,216 parameters (the Hub's safetensors count): 31 of its 80 layers keep no
    attention, and its MLPs run 6 widths."""
    model = load_hf_config(HF_CONFIGS / "Llama-3_3-Nemotron-Super-49B-v1.json")
    assert model.layer_blocks is not None
    assert sum(block.attention == "none" for block in model.layer_blocks) == 31
    assert len({model.layer_ffn_hidden_size(i) for i in range(80)}) == 6
    assert count_params(model).total == 49_867_145_216


def test_a_heterogeneous_model_megatron_would_refuse_is_refused_by_field():
    uneven_kv = _tiny().model_copy(update={"layer_blocks": (
        LayerBlock(kv_heads=4), LayerBlock(), LayerBlock(), LayerBlock())})
    with pytest.raises(MegapilotError) as refused:
        render_launch(_plan(uneven_kv), OPTIONS)
    assert refused.value.field == "model.layer_blocks"
    gelu = _tiny().model_copy(update={"mlp_activation": "gelu"})
    with pytest.raises(MegapilotError) as refused:
        render_launch(_plan(gelu), OPTIONS)
    assert refused.value.field == "model.mlp_activation"
    with pytest.raises(MegapilotError) as refused:
        render_launch(_plan(_tiny()), OPTIONS.model_copy(update={"script_path": None}))
    assert refused.value.field == "output"
