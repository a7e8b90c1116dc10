from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megapilot.catalog.hf import from_hf_config, load_hf_config
from megapilot.errors import MegapilotError
from megapilot.estimate.params import (
    LayerParams,
    count_params,
    layer_params,
    most_loaded_stage,
    stage_layer_indices,
    stage_params,
)
from megapilot.spec import MLASpec, ModelSpec, MoESpec

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def _tiny(**overrides) -> ModelSpec:
    """h=8, ffn=16, 2 heads of dim 4, one KV group, vocab 10, 2 layers."""
    base = dict(name="hand", num_layers=2, hidden_size=8, ffn_hidden_size=16, num_attention_heads=2,
                num_query_groups=1, vocab_size=10)
    return ModelSpec(**(base | overrides))


# ---- hand-worked numbers -----------------------------------------------------------------------


def test_hand_worked_gqa_swiglu_rmsnorm_layer_and_model():
    # q 8x8 + k 8x4 + v 8x4 + out 8x8 = 192; SwiGLU 3x8x16 = 384; two RMSNorms 2x8 = 16.
    assert layer_params(_tiny(), 0) == LayerParams(192, 384, 0, 0, 0, 0, 16)
    breakdown = count_params(_tiny())
    assert (breakdown.embedding, breakdown.output_layer, breakdown.final_norm) == (80, 80, 8)
    assert breakdown.layers == 2 * 592
    assert breakdown.total == breakdown.active == 80 + 80 + 2 * 592 + 8


def test_hand_worked_gpt_style_biases_layernorm_gelu_learned_positions_tied():
    model = _tiny(num_query_groups=None, mlp_activation="gelu", normalization="LayerNorm", add_bias_linear=True,
                  position_embedding="learned_absolute", max_position_embeddings=6, tie_embeddings=True)
    # qkv 8x24 + 24, out 8x8 + 8 = 288; fc1 8x16 + 16, fc2 16x8 + 8 = 280; two LayerNorms 2x(8+8) = 32.
    assert layer_params(model, 1) == LayerParams(288, 280, 0, 0, 0, 0, 32)
    breakdown = count_params(model)
    assert breakdown.embedding == (10 + 6) * 8 and breakdown.output_layer == 0 and breakdown.final_norm == 16
    assert breakdown.total == 128 + 2 * 600 + 16


def test_qkv_bias_and_qk_layernorm_add_their_own_terms():
    plain = layer_params(_tiny(), 0)
    assert layer_params(_tiny(add_qkv_bias=True), 0).attention == plain.attention + 8 + 4 + 4
    assert layer_params(_tiny(qk_layernorm=True), 0).norms == plain.norms + 2 * 4


def test_hand_worked_moe_layer_counts_all_and_topk_experts():
    moe = MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=4, shared_expert_ffn_hidden_size=8,
                  first_k_dense_layers=1)
    model = _tiny(moe=moe)
    assert layer_params(model, 0).mlp == 384 and layer_params(model, 0).routed_experts == 0
    layer = layer_params(model, 1)
    # each expert 3x8x4 = 96; shared 3x8x8 = 192; router 8x4 = 32.
    assert (layer.mlp, layer.routed_experts, layer.active_routed_experts) == (0, 384, 192)
    assert (layer.shared_experts, layer.router) == (192, 32)
    assert layer.total - layer.active == 2 * 96


def test_moe_gate_and_expert_bias_options():
    moe = dict(num_experts=4, router_topk=2, moe_ffn_hidden_size=4, shared_expert_ffn_hidden_size=8)
    base = layer_params(_tiny(moe=MoESpec(**moe)), 0)
    gated = layer_params(_tiny(moe=MoESpec(**moe, shared_expert_gate=True, router_expert_bias=True,
                                           router_score_function="sigmoid")), 0)
    assert gated.shared_experts == base.shared_experts + 8 and gated.router == base.router + 4


def test_hand_worked_mla_with_and_without_q_lora():
    mla = MLASpec(kv_lora_rank=6, qk_head_dim=4, qk_pos_emb_head_dim=2, v_head_dim=3)
    full_rank = layer_params(_tiny(num_query_groups=None, mla=mla), 0)
    # q 8x(2x6)=96; kv-down 8x(6+2)=64; kv-up 6x2x(4+3)=84; out 2x3x8=48; kv norm 6.
    assert full_rank.attention == 96 + 64 + 84 + 48
    assert full_rank.norms == 16 + 6
    lora = layer_params(_tiny(num_query_groups=None, mla=mla.model_copy(update={"q_lora_rank": 5})), 0)
    # q-down 8x5 + q-up 5x12 = 100 replaces the 96; one more norm of 5.
    assert lora.attention == full_rank.attention - 96 + 100
    assert lora.norms == full_rank.norms + 5


def test_mtp_module_is_last_layer_plus_three_norms_and_eh_projection():
    model = _tiny(mtp_num_layers=2)
    breakdown = count_params(model)
    assert breakdown.mtp == 2 * (592 + 3 * 8 + 2 * 8 * 8)
    assert breakdown.main_model == count_params(_tiny()).total
    assert breakdown.active == count_params(_tiny()).active  # MTP is training-only


def test_padded_vocab_follows_megatron_padding_for_tp():
    model = _tiny(vocab_size=1000)  # pads to 1024 at tp=1, 2048 at tp=16
    assert count_params(model, padded_vocab=True).embedding == 1024 * 8
    assert count_params(model, padded_vocab=True, tp=16).output_layer == 2048 * 8
    assert count_params(model).embedding == 1000 * 8


# ---- real configs against published counts ----------------------------------------------------

# file: (total, active, active_without_input_embedding) from tests/data/hf_configs/README.md (exact counts).
PUBLISHED = {
    "Llama-3.1-8B": (8_030_261_248, None, None),
    "Llama-3.1-70B": (70_553_706_496, None, None),
    "Llama-3.1-405B": (405_853_388_800, None, None),
    "Mixtral-8x7B-v0.1": (46_702_792_704, 12_879_925_248, None),
    "DeepSeek-V2-Lite": (15_706_484_224, None, 2_451_435_008),
    "DeepSeek-V3": (671_026_419_200, 37_552_297_472, None),
    "Qwen3-30B-A3B": (30_532_122_624, 3_353_032_704, None),
    "gpt2": (124_439_808, None, None),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_hf_config_counts_match_published_exactly(name):
    total, active, active_without_embedding = PUBLISHED[name]
    breakdown = count_params(load_hf_config(HF_CONFIGS / f"{name}.json"))
    assert breakdown.main_model == total
    if active is not None:
        assert breakdown.active == active
    if active_without_embedding is not None:
        assert breakdown.active_without_input_embedding == active_without_embedding
    assert breakdown.total == (breakdown.embedding + breakdown.output_layer + breakdown.layers
                               + breakdown.final_norm + breakdown.mtp)
    assert breakdown.layers == sum(layer.total for layer in breakdown.per_layer)


def test_llama3_8b_breakdown():
    breakdown = count_params(load_hf_config(HF_CONFIGS / "Llama-3.1-8B.json"))
    assert breakdown.embedding == breakdown.output_layer == 128_256 * 4096
    assert breakdown.final_norm == 4096
    layer = breakdown.per_layer[0]
    assert layer.attention == 4096 * (4096 + 2 * 1024) + 4096 * 4096
    assert layer.mlp == 3 * 4096 * 14_336 and layer.norms == 2 * 4096
    assert breakdown.active == breakdown.total  # dense


def test_gpt2_tied_head_and_learned_positions():
    breakdown = count_params(load_hf_config(HF_CONFIGS / "gpt2.json"))
    assert breakdown.output_layer == 0
    assert breakdown.embedding == (50_257 + 1024) * 768


def test_deepseek_v3_dense_first_layers_and_mtp_near_685b():
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json")
    breakdown = count_params(model)
    assert [layer.routed_experts > 0 for layer in breakdown.per_layer[:4]] == [False, False, False, True]
    assert breakdown.per_layer[3].router == 7168 * 256 + 256  # e_score_correction_bias counted
    # 685B is the published size with the MTP module; the HF checkpoint also stores that module's own
    # copies of the embedding and head (2 x 129280 x 7168), which Megatron shares instead.
    assert breakdown.total == pytest.approx(685e9, rel=0.005)
    with_copies = breakdown.total + 2 * breakdown.embedding
    assert with_copies == pytest.approx(685e9, rel=0.001)


# ---- pipeline stages ---------------------------------------------------------------------------


def test_interleaved_stage_holds_every_pp_th_chunk():
    model = _tiny(num_layers=8)
    assert stage_layer_indices(model, pp=2, vpp=2, stage=0) == [0, 1, 4, 5]
    assert stage_layer_indices(model, pp=2, vpp=2, stage=1) == [2, 3, 6, 7]


def test_stages_sum_to_padded_total_and_ends_hold_embedding_and_head():
    model = load_hf_config(HF_CONFIGS / "Llama-3.1-70B.json")
    loads = [stage_params(model, 4, stage=s, tp=8) for s in range(4)]
    assert sum(loads) == count_params(model, padded_vocab=True, tp=8).total
    layer = count_params(model).per_layer[0].total
    assert loads[1] == loads[2] == 20 * layer
    assert loads[0] == 20 * layer + model.padded_vocab_size(8) * 8192
    assert loads[3] == loads[0] + 8192  # + final norm
    assert most_loaded_stage(model, 4, tp=8) == 3


def test_tied_embedding_is_held_twice_across_a_pipeline():
    model = _tiny(num_layers=4, tie_embeddings=True, vocab_size=1000)
    loads = [stage_params(model, 2, stage=s) for s in range(2)]
    assert sum(loads) == count_params(model, padded_vocab=True).total + 1024 * 8
    assert stage_params(model, 1) == count_params(model, padded_vocab=True).total


def test_mtp_sits_on_the_last_stage_with_its_own_embedding_copy():
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json")
    without = model.model_copy(update={"mtp_num_layers": 0})
    embedding = count_params(model, padded_vocab=True).embedding
    extra_on_last = stage_params(model, 61, stage=60) - stage_params(without, 61, stage=60)
    assert extra_on_last == count_params(model).mtp + embedding
    assert stage_params(model, 61, stage=0) == stage_params(without, 61, stage=0)
    assert stage_params(model, 1) == count_params(model, padded_vocab=True).total  # no copies without a pipeline


@settings(max_examples=60, deadline=None)
@given(
    chunks=st.sampled_from([(1, 1), (2, 1), (4, 1), (2, 2), (4, 3)]),
    layers_per_chunk=st.integers(1, 3),
    tied=st.booleans(),
    mtp_layers=st.integers(0, 2),
    experts=st.booleans(),
)
def test_stages_always_add_up_to_the_model_plus_the_last_ranks_copies(
    chunks, layers_per_chunk, tied, mtp_layers, experts
):
    pp, vpp = chunks
    moe = MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=4, first_k_dense_layers=1) if experts else None
    model = _tiny(num_layers=pp * vpp * layers_per_chunk, tie_embeddings=tied, mtp_num_layers=mtp_layers, moe=moe)
    padded = count_params(model, padded_vocab=True)
    copies = 0
    if pp > 1:
        copies = (padded.embedding if tied else 0) + (padded.embedding if mtp_layers else 0)
    assert sum(stage_params(model, pp, vpp, stage) for stage in range(pp)) == padded.total + copies
    assert sorted(i for s in range(pp) for i in stage_layer_indices(model, pp, vpp, s)) == list(range(model.num_layers))
    assert padded.active <= padded.total - padded.mtp


def test_uneven_split_and_bad_stage_are_user_errors():
    with pytest.raises(MegapilotError, match="num_layers=2") as excinfo:
        stage_params(_tiny(), 3)
    assert excinfo.value.field == "pp"
    with pytest.raises(MegapilotError) as excinfo:
        stage_params(_tiny(), 2, stage=2)
    assert excinfo.value.field == "stage"


# ---- against Megatron-Core itself ---------------------------------------------------------------

# Builds each ModelSpec (JSON on stdin) as a real Megatron-Core GPTModel on CPU and prints its
# parameter count. Local (non-Transformer-Engine) layer specs: MLA needs Transformer Engine's
# attention, so MLA is checked against the Hugging Face counts above instead.
_MEGATRON_COUNTER = r'''
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec, get_gpt_layer_local_spec, get_gpt_mtp_block_spec)
from megatron.core.transformer.transformer_config import TransformerConfig

ACTIVATIONS = {"swiglu": F.silu, "geglu": F.gelu, "gelu": F.gelu, "squared_relu": lambda x: F.relu(x) ** 2,
               "quick_geglu": lambda x: x * torch.sigmoid(1.702 * x)}

def build(spec):
    moe = spec["moe"]
    config = dict(
        num_layers=spec["num_layers"], hidden_size=spec["hidden_size"], ffn_hidden_size=spec["ffn_hidden_size"],
        num_attention_heads=spec["num_attention_heads"], num_query_groups=spec["num_query_groups"],
        kv_channels=spec["kv_channels"],
        gated_linear_unit=spec["mlp_activation"] in ("swiglu", "geglu", "quick_geglu"),
        softmax_type=spec["softmax_type"],
        activation_func=ACTIVATIONS[spec["mlp_activation"]], normalization=spec["normalization"],
        add_bias_linear=spec["add_bias_linear"], add_qkv_bias=spec["add_qkv_bias"],
        qk_layernorm=spec["qk_layernorm"], mtp_num_layers=spec["mtp_num_layers"] or None,
        use_cpu_initialization=True, gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    if moe:
        first, freq = moe["first_k_dense_layers"], moe["moe_layer_freq"]
        config.update(
            num_moe_experts=moe["num_experts"], moe_router_topk=moe["router_topk"],
            moe_ffn_hidden_size=moe["moe_ffn_hidden_size"],
            moe_shared_expert_intermediate_size=moe["shared_expert_ffn_hidden_size"] or None,
            moe_shared_expert_gate=moe["shared_expert_gate"],
            moe_router_score_function=moe["router_score_function"], moe_router_pre_softmax=moe["router_pre_softmax"],
            moe_router_enable_expert_bias=moe["router_expert_bias"],
            moe_layer_freq=[int(i >= first and (i - first) % freq == 0) for i in range(spec["num_layers"])])
    config = TransformerConfig(**config)
    if moe:
        layers = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    else:
        layers = get_gpt_layer_local_spec(qk_layernorm=spec["qk_layernorm"], normalization=spec["normalization"])
    mtp = get_gpt_mtp_block_spec(config, layers, use_transformer_engine=False) if spec["mtp_num_layers"] else None
    multiple = spec["make_vocab_size_divisible_by"]
    return GPTModel(
        config=config, transformer_layer_spec=layers, vocab_size=-(-spec["vocab_size"] // multiple) * multiple,
        max_sequence_length=spec["max_position_embeddings"], mtp_block_spec=mtp,
        share_embeddings_and_output_weights=spec["tie_embeddings"],
        position_embedding_type=spec["position_embedding"])

# A named fake for the absent GPU: the learned attention sinks are allocated on `torch.cuda.current_device()`.
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
parallel_state.initialize_model_parallel(1, 1)
def count(model):
    """Parameters, and the expert bias Megatron keeps as a buffer but checkpoints (and megapilot counts)."""
    bias = sum(b.numel() for name, b in model.named_buffers() if name.endswith("expert_bias"))
    return sum(p.numel() for p in model.parameters()) + bias

counts = {name: count(build(spec)) for name, spec in json.load(sys.stdin).items()}
parallel_state.destroy_model_parallel()
dist.destroy_process_group()
print(json.dumps(counts))
'''


def _megatron_variants() -> dict[str, ModelSpec]:
    base = dict(num_layers=4, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, vocab_size=1000,
                max_position_embeddings=128)
    moe = dict(num_experts=4, router_topk=2, moe_ffn_hidden_size=32)
    gpt = dict(mlp_activation="gelu", normalization="LayerNorm", add_bias_linear=True,
               position_embedding="learned_absolute", tie_embeddings=True)
    variants = {
        "llama_gqa_swiglu": dict(num_query_groups=2),
        "gpt_biases_layernorm_tied": gpt,
        "qwen3_qk_norm_head_dim": dict(num_query_groups=2, qk_layernorm=True, kv_channels=32),
        "qwen2_qkv_bias": dict(num_query_groups=1, add_qkv_bias=True),
        "nemotron_squared_relu": dict(mlp_activation="squared_relu", normalization="LayerNorm", num_query_groups=2),
        "gemma_geglu_tied": dict(mlp_activation="geglu", tie_embeddings=True, num_query_groups=1),
        "mixtral_moe": dict(num_query_groups=2, moe=MoESpec(**moe)),
        "deepseek_dense_first_shared": dict(moe=MoESpec(**moe, shared_expert_ffn_hidden_size=64,
                                                        first_k_dense_layers=1)),
        "qwen2moe_gated_shared_every_2nd": dict(moe=MoESpec(**moe, shared_expert_ffn_hidden_size=64,
                                                            shared_expert_gate=True, moe_layer_freq=2)),
        "mtp_two_modules": dict(num_query_groups=2, mtp_num_layers=2),
        # GPT-OSS: biases on attention, experts and router, a learned sink per head, gated quick-GELU experts.
        "gpt_oss_biased_experts_sinks": dict(num_query_groups=2, add_bias_linear=True, softmax_type="learnable",
                                             mlp_activation="quick_geglu", sliding_window=16,
                                             sliding_window_skip_freq=2, moe=MoESpec(**moe)),
        # Llama 4 Maverick: sigmoid top-1, a shared expert, MoE on every 2nd layer after one dense layer.
        "llama4_interleaved_shared": dict(num_query_groups=2, moe=MoESpec(
            num_experts=4, router_topk=1, moe_ffn_hidden_size=32, shared_expert_ffn_hidden_size=32,
            first_k_dense_layers=1, moe_layer_freq=2, router_score_function="sigmoid")),
    }
    specs = {name: ModelSpec(name=name, **(base | fields)) for name, fields in variants.items()}
    # GLM-4.5 as the importer reads it: QKV bias, q/k norm on 32-wide heads, a dense first layer, a shared expert of
    # the routed width, sigmoid routing with an expert bias, one MTP module.
    glm = {"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "vocab_size": 1000, "max_position_embeddings": 128, "attention_bias": True, "use_qk_norm": True,
           "moe_intermediate_size": 32, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_routed_experts": 4,
           "first_k_dense_replace": 1, "norm_topk_prob": True, "num_nextn_predict_layers": 1}
    specs["glm45_qkv_bias_qk_norm_shared_mtp"] = from_hf_config(glm, "glm45_qkv_bias_qk_norm_shared_mtp")
    return specs


@pytest.mark.slow
def test_counts_equal_parameters_of_megatron_core_models_built_on_cpu():
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("megatron.core") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs the `train` extra (torch + megatron-core)")
    variants = _megatron_variants()
    payload = json.dumps({name: spec.model_dump(mode="json") for name, spec in variants.items()})
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _MEGATRON_COUNTER], input=payload, capture_output=True,
                          text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    megatron_counts = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {name: count_params(spec, padded_vocab=True).total for name, spec in variants.items()}
    assert ours == megatron_counts


# Builds the same two models as Megatron-Core pipeline chunks (pp=2, vpp=2) under torchrun and prints
# the parameters each rank holds. Megatron syncs the copies it keeps on the last stage with
# `tensor.cuda()` + all-reduce; on this CPU-only machine `Tensor.cuda` is replaced by a no-op (a named
# fake for the absent GPU).
_MEGATRON_STAGE_COUNTER = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
from megatron.core.transformer.transformer_config import TransformerConfig

torch.Tensor.cuda = lambda self, *args, **kwargs: self  # fake: no GPU here
dist.init_process_group("gloo")
PP, VPP = 2, 2
ps.initialize_model_parallel(1, PP, virtual_pipeline_model_parallel_size=VPP)
MODELS = {  # name: (normalization, biases, position embedding, tied, mtp layers)
    "llama_mtp": ("RMSNorm", False, "rope", False, 1),
    "gpt_tied": ("LayerNorm", True, "learned_absolute", True, 0),
}
held = {}
for name, (norm, bias, positions, tied, mtp_layers) in MODELS.items():
    config = TransformerConfig(
        num_layers=8, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        gated_linear_unit=True, normalization=norm, add_bias_linear=bias, mtp_num_layers=mtp_layers or None,
        pipeline_model_parallel_size=PP, virtual_pipeline_model_parallel_size=VPP, pipeline_dtype=torch.float32,
        use_cpu_initialization=True, gradient_accumulation_fusion=False, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False)
    held[name] = 0
    for vp in range(VPP):
        layers = get_gpt_layer_local_spec(normalization=norm)
        mtp = get_gpt_mtp_block_spec(config, layers, use_transformer_engine=False, vp_stage=vp) if mtp_layers else None
        chunk = GPTModel(
            config=config, transformer_layer_spec=layers, vocab_size=1024, max_sequence_length=128,
            mtp_block_spec=mtp, position_embedding_type=positions, share_embeddings_and_output_weights=tied,
            vp_stage=vp, pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp))
        held[name] += sum(p.numel() for p in chunk.parameters())
# one write of the whole line: unbuffered, print() writes each argument apart, and the ranks share one pipe
sys.stdout.write(f"STAGE {dist.get_rank()} {json.dumps(held)}\n")
sys.stdout.flush()
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_stage_params_equal_what_megatron_core_pipeline_ranks_hold(tmp_path):
    import importlib.util
    import json
    import os
    import re
    import subprocess
    import sys

    if importlib.util.find_spec("megatron.core") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs the `train` extra (torch + megatron-core)")
    script = tmp_path / "stage_counter.py"
    script.write_text(_MEGATRON_STAGE_COUNTER)
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # both ranks write to one pipe: a line may follow another's output that did not end its line
    per_rank = {int(rank): json.loads(held) for rank, held in re.findall(r"STAGE (\d) (\{[^{}]*\})", done.stdout)}
    assert set(per_rank) == {0, 1}, done.stdout[-3000:]
    shape = dict(num_layers=8, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
                 vocab_size=1024, max_position_embeddings=128)
    ours = {
        "llama_mtp": ModelSpec(name="llama_mtp", mtp_num_layers=1, **shape),
        "gpt_tied": ModelSpec(name="gpt_tied", normalization="LayerNorm", add_bias_linear=True,
                              position_embedding="learned_absolute", tie_embeddings=True, **shape),
    }
    for rank in (0, 1):
        assert per_rank[rank] == {name: stage_params(spec, 2, 2, rank) for name, spec in ours.items()}


# ---- uneven pipeline split (Megatron's --decoder-first/last-pipeline-num-layers) ----------------

LLAMA_405B_SHAPE = dict(num_layers=126, hidden_size=16384, ffn_hidden_size=53248, num_attention_heads=128,
                        num_query_groups=8, vocab_size=128256)


def test_126_layers_at_pp16_with_7_on_the_first_and_last_ranks():
    model = ModelSpec(name="405b-like", **LLAMA_405B_SHAPE)
    split = dict(first_stage_layers=7, last_stage_layers=7)
    # 126 - 7 - 7 = 112 layers over the 14 middle ranks: 8 each.
    assert stage_layer_indices(model, 16, stage=0, **split) == list(range(0, 7))
    assert stage_layer_indices(model, 16, stage=1, **split) == list(range(7, 15))
    assert stage_layer_indices(model, 16, stage=14, **split) == list(range(7 + 13 * 8, 7 + 14 * 8))  # 111..118
    assert stage_layer_indices(model, 16, stage=15, **split) == list(range(119, 126))
    layer = layer_params(model, 0).total
    embedding = 128256 * 16384  # 128256 is already a multiple of 128
    assert stage_params(model, 16, stage=0, **split) == 7 * layer + embedding
    assert stage_params(model, 16, stage=1, **split) == 8 * layer
    assert stage_params(model, 16, stage=15, **split) == 7 * layer + embedding + 16384  # output + final norm
    # 8 layers (~3.6 B) outweigh 7 layers plus the 2.1 B embedding: a middle rank is the most loaded.
    assert most_loaded_stage(model, 16, **split) == 1


def test_uneven_split_with_interleaving_places_layers_as_megatron_offsets_do():
    # 22 layers, pp=4, vpp=2, first=2, last=4: the middle ranks get (22-6)/2 = 8, 4 per chunk; each
    # virtual stage runs 1 + 4 + 4 + 2 = 11 layers through the ranks in order.
    model = _tiny(num_layers=22)
    split = dict(first_stage_layers=2, last_stage_layers=4)
    assert stage_layer_indices(model, 4, 2, 0, **split) == [0, 11]
    assert stage_layer_indices(model, 4, 2, 1, **split) == [1, 2, 3, 4, 12, 13, 14, 15]
    assert stage_layer_indices(model, 4, 2, 3, **split) == [9, 10, 20, 21]


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "first", "last", "field", "words"),
    [
        (126, 16, 1, 7, 6, "first_stage_layers", "not divisible by the 14 middle"),
        (126, 16, 2, 7, 7, "first_stage_layers", "not divisible by vpp=2"),
        (126, 16, 2, 8, 7, "last_stage_layers", "not divisible by vpp=2"),
        (24, 4, 2, 2, 4, "first_stage_layers", "x vpp=2"),  # 18 over 2 middle ranks = 9, not a multiple of 2
        (10, 2, 1, 4, 4, "first_stage_layers", "middle layers exactly when"),
        (10, 3, 1, 6, 6, "first_stage_layers", "middle layers exactly when"),
    ],
)
def test_uneven_splits_megatron_refuses_are_user_errors(layers, pp, vpp, first, last, field, words):
    with pytest.raises(MegapilotError, match=words) as excinfo:
        stage_layer_indices(_tiny(num_layers=layers), pp, vpp, 0, first_stage_layers=first, last_stage_layers=last)
    assert excinfo.value.field == field and excinfo.value.fix


def test_only_the_first_rank_given_the_last_shares_the_rest():
    # 9 layers, pp=3, first=1: ranks 1 and 2 share 8, Megatron's rule when the last count is unset.
    model = _tiny(num_layers=9)
    assert [len(stage_layer_indices(model, 3, stage=s, first_stage_layers=1)) for s in range(3)] == [1, 4, 4]


@given(
    shape=st.sampled_from([(4, 1, 2, 2), (4, 1, 1, None), (4, 1, None, 3), (4, 2, 2, 4), (3, 2, 2, 2), (2, 1, 1, 2)]),
    tied=st.booleans(),
    mtp_layers=st.integers(0, 1),
)
@settings(max_examples=30)
def test_uneven_stages_cover_every_layer_once(shape, tied, mtp_layers):
    pp, vpp, first, last = shape
    middle_ranks = pp - (first is not None) - (last is not None)
    num_layers = (first or 0) + (last or 0) + middle_ranks * 2 * vpp
    model = _tiny(num_layers=num_layers, tie_embeddings=tied, mtp_num_layers=mtp_layers)
    split = dict(first_stage_layers=first, last_stage_layers=last)
    held = sorted(i for s in range(pp) for i in stage_layer_indices(model, pp, vpp, s, **split))
    assert held == list(range(num_layers))
    padded = count_params(model, padded_vocab=True)
    copies = (padded.embedding if tied else 0) + (padded.embedding if mtp_layers else 0)
    assert sum(stage_params(model, pp, vpp, s, **split) for s in range(pp)) == padded.total + copies


def test_uneven_layer_offsets_equal_megatron_cores_get_transformer_layer_offset():
    """Megatron-Core's own placement function, called per (rank, virtual stage) without a process group."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    for layers, pp, vpp, first, last in [(126, 16, 1, 7, 7), (22, 4, 2, 2, 4), (9, 3, 1, 1, None),
                                         (10, 4, 1, None, 1), (3, 2, 1, 1, 2)]:
        config = TransformerConfig(
            num_layers=layers, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, pipeline_dtype=torch.float32,
            num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last)
        model = _tiny(num_layers=layers)
        for rank in range(pp):
            ours = stage_layer_indices(model, pp, vpp, rank, first_stage_layers=first, last_stage_layers=last)
            chunk = len(ours) // vpp
            starts = [ours[v * chunk] for v in range(vpp)]
            theirs = [get_transformer_layer_offset(config, vp_stage=v if vpp > 1 else None, pp_rank=rank)
                      for v in range(vpp)]
            assert starts == theirs, (layers, pp, vpp, first, last, rank)


def test_a_mamba2_mixer_counts_megatrons_mamba_mixer_weights():
    """MambaMixer (core 0.16, not buildable here without triton): in_proj, conv1d + bias, dt_bias, A_log, D,
    the gated norm and out_proj, derived by hand for d_inner = 4 heads x 8, 2 groups of state 16."""
    from megapilot.spec.model import MambaSpec

    model = _tiny(num_layers=3, hybrid_override_pattern="M*-",
                  mamba=MambaSpec(state_dim=16, head_dim=8, num_groups=2, num_heads=4))
    h, d, gn, heads = model.hidden_size, 32, 2 * 2 * 16, 4
    mixer = h * (2 * d + gn + heads) + (d + gn) * 4 + (d + gn) + 3 * heads + d + d * h
    kinds = [layer_params(model, i) for i in range(3)]
    assert kinds[0].total == mixer + h  # + its pre-norm
    assert kinds[1].mlp == 0 and kinds[1].attention > 0
    assert kinds[2].attention == 0 and kinds[2].mlp > 0
