"""The MoE activation model against what a Megatron-Core 0.16 MoE layer really keeps for backward.

A MoE layer is built on the CPU and run forward under `torch.autograd.graph.saved_tensors_hooks`; every
tensor autograd saves is recorded by its storage. The token-wide tensors (last dimension = hidden size)
are the router's input (counted with the layer's GEMM inputs) and whatever each routed copy keeps; the
expert intermediates are not compared (the CPU path's unfused SwiGLU keeps more than the fused GPU one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from megapilot.estimate.memory import _mlp_intermediate_bytes, routed_copy_bytes
from megapilot.spec.model import ModelSpec, MoESpec

HIDDEN, FFN, EXPERTS, TOPK, TOKENS = 256, 128, 8, 2, 512

# Megatron's alltoall dispatcher opens a CUDA stream for its host copies and records events on it; on this
# CPU-only machine both are a named fake that does nothing (the single rank has nothing to wait for).
_MEGATRON_SAVED_BYTES = r'''
import contextlib, json, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.nn.functional as F
from megapilot.trainer import cpu_compat
cpu_compat.enable_cpu_mode()
cpu_compat.install_missing_te_fixes()
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
from megatron.core.transformer.spec_utils import build_module
from megatron.core.transformer.transformer_config import TransformerConfig

class FakeStream:  # fake: no GPU here
    def wait_stream(self, *args): pass
    def synchronize(self): pass
    def record_event(self, *args): return self

MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = FakeStream()
torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
torch.cuda.current_stream = lambda *args, **kwargs: FakeStream()
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
parallel_state.initialize_model_parallel(1, 1)
h, ffn, experts, topk, tokens = (int(v) for v in sys.argv[1:6])
overrides = {k: v for k, v in cpu_compat.transformer_overrides().items() if k != "use_cpu_initialization"}
config = TransformerConfig(
    **overrides, num_layers=1, hidden_size=h, num_attention_heads=4, ffn_hidden_size=4 * h,
    num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=ffn, gated_linear_unit=True,
    activation_func=F.silu, bf16=True, params_dtype=torch.bfloat16, moe_token_dispatcher_type="alltoall",
    add_bias_linear=False, moe_router_load_balancing_type="none", hidden_dropout=0.0, attention_dropout=0.0,
    use_cpu_initialization=True, moe_router_dtype="fp32")
moe = build_module(get_gpt_decoder_block_spec(config, use_transformer_engine=False).layer_specs[0].submodules.mlp,
                   config=config).to(torch.bfloat16)
parameters = {p.untyped_storage().data_ptr() for p in moe.parameters()}
token_wide = {}  # storage -> bytes, of saved tensors one token wide

def pack(tensor):
    storage = tensor.untyped_storage()
    if storage.data_ptr() not in parameters and tensor.dim() >= 2 and tensor.shape[-1] == h:
        token_wide[storage.data_ptr()] = storage.nbytes()
    return tensor

x = torch.randn(tokens, 1, h, dtype=torch.bfloat16, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
    moe(x)
print(json.dumps(sorted(token_wide.values())))
'''


def _moe_model() -> ModelSpec:
    return ModelSpec(name="moe-probe", num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=4 * HIDDEN,
                     num_attention_heads=4, vocab_size=1000, max_position_embeddings=TOKENS,
                     moe=MoESpec(num_experts=EXPERTS, router_topk=TOPK, moe_ffn_hidden_size=FFN))


def test_a_routed_copy_keeps_the_dispatched_token_at_the_gemm_input_width_and_its_intermediates():
    model = _moe_model()
    intermediates = _mlp_intermediate_bytes(model, FFN, 2)
    assert routed_copy_bytes(model, gemm_input=2) == 2 * HIDDEN + intermediates  # bf16 token, no combine copy
    assert routed_copy_bytes(model, gemm_input=1) == HIDDEN + _mlp_intermediate_bytes(model, FFN, 1)  # FP8 input
    assert routed_copy_bytes(model, gemm_input=2, expert_tp=2) == 4 * HIDDEN + intermediates  # ETP holds the token


@pytest.mark.slow
def test_megatron_core_moe_layer_keeps_one_bf16_token_per_routed_copy_besides_the_router_input():
    if importlib.util.find_spec("megatron.core") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs the `train` extra (torch + megatron-core)")
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    args = [str(v) for v in (HIDDEN, FFN, EXPERTS, TOPK, TOKENS)]
    done = subprocess.run([sys.executable, "-c", _MEGATRON_SAVED_BYTES, *args], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(done.stdout.strip().splitlines()[-1])
    router_input = TOKENS * HIDDEN * 2
    # smaller ones are weights (the router's fp32 copy of its weight), not tokens
    routed = [size for size in saved if size > router_input]
    assert saved.count(router_input) == 1  # the router GEMM keeps its input, as any GEMM does
    # One storage of top-k copies: the dispatched tokens, fc1's input. Nothing of the combine (no fc2 output).
    model = _moe_model()
    token_part = routed_copy_bytes(model, gemm_input=2) - _mlp_intermediate_bytes(model, FFN, 2)
    assert routed == [TOKENS * TOPK * token_part]
