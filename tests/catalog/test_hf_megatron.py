"""Llama-Nemotron (DeciLM `block_configs`) against what Megatron-Core 0.16.1 builds from the same blocks on CPU.

Megatron-Core reads DeciLM block configs itself (HeterogeneousTransformerConfig, the heterogeneous GPT layer
spec with local modules), so the importer's reading of each block (KV heads from n_heads_in_group, MLP width from
ffn_mult), its per-layer model and its Llama for one-shape models are checked against the model Megatron-Core
builds, in a subprocess (one gloo process group, CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megapilot.catalog.hf import _decilm_block_shape, from_hf_config
from megapilot.estimate.params import count_params

pytest.importorskip("megatron.core")

_MEGATRON_HETEROGENEOUS = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.heterogeneous.heterogeneous_layer_specs import get_gpt_heterogeneous_layer_spec
from megatron.core.transformer.heterogeneous.heterogeneous_config import HeterogeneousTransformerConfig

def build(hf):
    config = HeterogeneousTransformerConfig(
        num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"],
        num_attention_heads=hf["num_attention_heads"], ffn_hidden_size=4 * hf["hidden_size"],
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", add_bias_linear=False,
        heterogeneous_layers_config_encoded_json=json.dumps(hf), use_cpu_initialization=True,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_heterogeneous_layer_spec(config, use_te=False),
                     vocab_size=hf["vocab_size"], max_sequence_length=hf["max_position_embeddings"],
                     position_embedding_type="rope", share_embeddings_and_output_weights=False)
    return {"params": sum(p.numel() for p in model.parameters()),
            "blocks": [[p.attention.num_query_groups, p.mlp.ffn_hidden_size] for p in config.per_block_parameters]}

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
parallel_state.initialize_model_parallel(1, 1)
print(json.dumps({name: build(hf) for name, hf in json.load(sys.stdin).items()}))
parallel_state.destroy_model_parallel()
dist.destroy_process_group()
'''


def _block(kv_group: int | None, ffn_mult: float, *, attention_no_op: bool = False) -> dict:
    return {"attention": {"n_heads_in_group": kv_group, "no_op": attention_no_op, "replace_with_linear": False},
            "ffn": {"ffn_mult": ffn_mult, "no_op": False, "replace_with_linear": False}}


def _small_decilm(blocks: list[dict]) -> dict:
    """A Llama-3.3-Nemotron-Super-49B-shaped config (its top-level fields), small enough to build on a CPU."""
    return {"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 128,
            "num_attention_heads": 8, "num_hidden_layers": len(blocks), "intermediate_size": None,
            "num_key_value_heads": None, "vocab_size": 1024, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False, "block_configs": blocks}


# Super-49B's own mix of blocks: 8 KV heads (n_heads_in_group 8 of 64 -> here 1 of 8), attention no-ops, and
# ffn_mult 2.625 / 5.25 / 3.28125 (widths rounded up to multiples of 256 by Megatron-Core's rule).
PER_LAYER = _small_decilm([_block(1, 2.625), _block(2, 5.25), _block(None, 3.28125, attention_no_op=True),
                           _block(4, 1.3125)])
ONE_SHAPE = _small_decilm([_block(2, 5.25)] * 3)


def _megatron_builds(configs: dict[str, dict]) -> dict[str, dict]:
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _MEGATRON_HETEROGENEOUS], input=json.dumps(configs),
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a Megatron-Core import and build in a subprocess: about 30 s on two cores
def test_decilm_blocks_read_as_megatron_core_builds_them():
    built = _megatron_builds({"per_layer": PER_LAYER, "one_shape": ONE_SHAPE})
    heads, hidden = PER_LAYER["num_attention_heads"], PER_LAYER["hidden_size"]
    ours = [list(_decilm_block_shape(block, i, heads, hidden)) for i, block in enumerate(PER_LAYER["block_configs"])]
    megatron = [[kv if kv is not None else "no-op", width] for kv, width in built["per_layer"]["blocks"]]
    assert ours == megatron == [[8, 256], [4, 512], ["no-op", 512], [2, 256]]
    # The per-layer model imports with its blocks, and counts what Megatron-Core builds from them.
    per_layer = from_hf_config(PER_LAYER, "per-layer")
    assert per_layer.layer_blocks is not None
    assert count_params(per_layer, padded_vocab=True).total == built["per_layer"]["params"]
    # One shape for every block: the Llama the importer makes has exactly the parameters Megatron-Core builds.
    llama = from_hf_config(ONE_SHAPE, "one-shape")
    assert count_params(llama, padded_vocab=True).total == built["one_shape"]["params"]
