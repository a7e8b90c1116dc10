"""Hybrid Mamba-2 presets against what Megatron-Core 0.16.1's MambaModel builds from the same spec on CPU.

Each hybrid preset (Nemotron-H 8B/56B, Nemotron 3 Nano) is shrunk to a few layers of its own hybrid pattern and
small widths, keeping every other field (its layer kinds, GQA, squared-ReLU MLP, shared expert, sigmoid router with
expert bias, untied head), and built by Megatron-Core's MambaModel in a subprocess. Megatron-Core 0.16.1 builds
the Mamba stack only from Transformer Engine modules and imports mamba_ssm and triton kernels, none of which run
without a GPU; the script stands in for exactly those, each named where it is installed, with the same parameter
shapes: TE's fused norm+linear is split into Megatron's local norm and linear, mamba_ssm's gated RMSNorm and TE's
final norm are plain weight-only norms. Every other parameter (the mixer's in_proj, conv1d, dt_bias, A_log, D,
out_proj; attention; MLP; experts; router; embedding; head) is Megatron-Core's own.

Megatron-Core keeps the aux-loss-free expert bias as a buffer, the Hugging Face checkpoint (and megapilot's count)
as a weight: the comparison adds it back, as tests/launch does for DeepSeek-V3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from megapilot.catalog import get_model
from megapilot.estimate.params import count_params
from megapilot.spec.model import MambaSpec, ModelSpec

pytest.importorskip("megatron.core")

_MEGATRON_MAMBA = r'''
import json, sys, types, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.nn.functional as F

# Named fakes for the GPU-only parts the Mamba modules import or build (parameter shapes unchanged): the
# inference-only triton kernels module (never run here), mamba_ssm's gated RMSNorm (weight of d_inner, no bias, as
# mamba_ssm.ops.triton.layernorm_gated.RMSNorm) and Transformer Engine's final norm (weight of h).
kernels = types.ModuleType("megatron.core.inference.contexts.attention_context.triton.tensor_ops")
kernels.tensor_get_slice_after = kernels.tensor_masked_update = kernels.tensor_merge = None
sys.modules[kernels.__name__] = kernels

from megatron.core import parallel_state
from megatron.core.ssm import mamba_mixer, mamba_block
from megatron.core.transformer.torch_norm import WrappedTorchNorm

class GatedRMSNorm(torch.nn.Module):
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

mamba_mixer.ExtendedRMSNorm = GatedRMSNorm
mamba_mixer.HAVE_MAMBA_SSM = True
mamba_mixer.HAVE_EINOPS = True
from megatron.core.ssm import mamba_context_parallel
mamba_context_parallel.HAVE_EINOPS = True  # einops is used in forward only
mamba_block.TENorm = WrappedTorchNorm
from megapilot.trainer import cpu_compat  # the CPU trainer's own rewrites: CUDA devices and RNG tracker on the CPU

cpu_compat.enable_cpu_mode()

from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.models.mamba import MambaModel
from megatron.core.ssm.mamba_block import MambaStack, MambaStackSubmodules
from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
from megatron.core.ssm.mlp_layer import MLPLayer
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import (
    MoETransformerLayer, TransformerLayer, TransformerLayerSubmodules)

# mamba_stack_spec with local modules: TE's LayerNormColumnParallelLinear is a norm then a linear, here split.
LOCAL_STACK = ModuleSpec(module=MambaStack, submodules=MambaStackSubmodules(
    mamba_layer=ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
        norm=WrappedTorchNorm,
        mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
            in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)),
        mamba_bda=get_bias_dropout_add)),
    attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
        input_layernorm=WrappedTorchNorm,
        self_attention=ModuleSpec(module=SelfAttention, params={"attn_mask_type": AttnMaskType.causal},
                                  submodules=SelfAttentionSubmodules(linear_qkv=ColumnParallelLinear,
                                                                     core_attention=DotProductAttention,
                                                                     linear_proj=RowParallelLinear)),
        self_attn_bda=get_bias_dropout_add)),
    mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                            linear_fc2=RowParallelLinear)),
        mlp_bda=get_bias_dropout_add)),
    moe_layer=ModuleSpec(module=MoETransformerLayer, submodules=TransformerLayerSubmodules(
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=get_moe_module_spec(use_te=False, num_experts=8, moe_grouped_gemm=False),
        mlp_bda=get_bias_dropout_add)),
))

def build(spec):
    mamba, moe = spec["mamba"], spec["moe"]
    config = dict(
        num_layers=spec["num_layers"], hidden_size=spec["hidden_size"], ffn_hidden_size=spec["ffn_hidden_size"],
        num_attention_heads=spec["num_attention_heads"], num_query_groups=spec["num_query_groups"],
        kv_channels=spec["kv_channels"], activation_func=lambda x: F.relu(x) ** 2, gated_linear_unit=False,
        normalization="RMSNorm", add_bias_linear=False, is_hybrid_model=True,
        mamba_state_dim=mamba["state_dim"], mamba_head_dim=mamba["head_dim"], mamba_num_groups=mamba["num_groups"],
        mamba_num_heads=mamba["num_heads"], use_cpu_initialization=True, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False)
    if moe:
        config.update(num_moe_experts=moe["num_experts"], moe_router_topk=moe["router_topk"],
                      moe_ffn_hidden_size=moe["moe_ffn_hidden_size"],
                      moe_shared_expert_intermediate_size=moe["shared_expert_ffn_hidden_size"] or None,
                      moe_router_score_function=moe["router_score_function"],
                      moe_router_enable_expert_bias=moe["router_expert_bias"])
    multiple = spec["make_vocab_size_divisible_by"]
    model = MambaModel(config=TransformerConfig(**config), mamba_stack_spec=LOCAL_STACK,
                       vocab_size=-(-spec["vocab_size"] // multiple) * multiple,
                       max_sequence_length=spec["max_position_embeddings"],
                       hybrid_override_pattern=spec["hybrid_override_pattern"],
                       share_embeddings_and_output_weights=spec["tie_embeddings"], position_embedding_type="none")
    return sum(p.numel() for p in model.parameters())

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
model_parallel_cuda_manual_seed(0)
print(json.dumps({name: build(spec) for name, spec in json.load(sys.stdin).items()}))
parallel_state.destroy_model_parallel()
dist.destroy_process_group()
'''

HYBRID_PRESETS = ["nemotron-h-8b", "nemotron-h-56b", "nemotron3-nano-30b-a3b"]


def _small(name: str, layers: int = 8) -> ModelSpec:
    """The preset with its first `layers` hybrid layers and widths a CPU builds in a second."""
    spec = get_model(name)
    pattern = (spec.hybrid_override_pattern or "")[:layers]
    moe = spec.moe.model_copy(update={"num_experts": 4, "router_topk": 2, "moe_ffn_hidden_size": 32,
                                      "shared_expert_ffn_hidden_size": 64 if spec.moe.shared_expert_ffn_hidden_size
                                      else 0}) if spec.moe else None
    return spec.model_copy(update={
        "num_layers": len(pattern), "hybrid_override_pattern": pattern, "hidden_size": 64, "ffn_hidden_size": 96,
        "num_attention_heads": 4, "num_query_groups": 2, "kv_channels": 16, "vocab_size": 1000,
        "max_position_embeddings": 128, "moe": moe,
        "mamba": MambaSpec(state_dim=16, head_dim=8, num_groups=2, num_heads=8, conv_kernel=4),
    })


def _expert_bias_buffers(spec: ModelSpec) -> int:
    return spec.num_moe_layers * spec.moe.num_experts if spec.moe and spec.moe.router_expert_bias else 0


@pytest.mark.slow  # a Megatron-Core import and build in a subprocess: about 30 s on two cores
def test_hybrid_presets_count_what_megatron_cores_mamba_model_builds():
    variants = {name: _small(name) for name in HYBRID_PRESETS}
    kinds = {name: set(spec.hybrid_override_pattern or "") for name, spec in variants.items()}
    assert kinds["nemotron-h-8b"] == kinds["nemotron-h-56b"] == {"M", "-", "*"}
    assert kinds["nemotron3-nano-30b-a3b"] == {"M", "E", "*"}
    payload = json.dumps({name: spec.model_dump(mode="json") for name, spec in variants.items()})
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _MEGATRON_MAMBA], input=payload, capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {name: count_params(spec, padded_vocab=True).total - _expert_bias_buffers(spec)
            for name, spec in variants.items()}
    assert ours == built
