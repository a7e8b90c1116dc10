"""The model flags `script` writes, built by Megatron-Core 0.16.1: the intended model, every preset and vendored config.

For each model preset and each vendored Hugging Face config, the flags `script` renders (CPU render for the
embedded trainer, one GPU) are parsed by the trainer's `build_config` and turned into Megatron-Core's
`TransformerConfig` / `MLATransformerConfig` and a `GPTModel` exactly as the trainer builds it (its
`transformer_config` and `model_chunk`). The model is built on the meta device (shapes only, no memory).

Speed: a 61-layer, 256-expert model takes minutes to instantiate even on the meta device, so each model is
built twice with fewer layers: `prefix` layers (the leading dense layers plus one period of the MoE pattern)
and `prefix + period` layers. The difference is exactly one period of layers; the full count is the short
model plus (num_layers - prefix) / period such differences. The embedding, output layer, final norm and MTP
modules are in both builds and cancel in the difference.

Checked per model: the built parameter count equals megapilot's count of the same model (padded vocab; the
DeepSeek-V3 routing bias is a buffer in Megatron, a weight in the HF checkpoint), megapilot's count equals the
published size (the tolerance of tests/catalog/test_models.py), and the built router / RoPE / norm / MTP
settings are what the HF config means.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

import torch

from megapilot.catalog.gpus import get_gpu
from megapilot.catalog.hf import load_hf_config
from megapilot.catalog.models import load_presets
from megapilot.errors import MegapilotError
from megapilot.estimate.params import count_params
from megapilot.launch import LaunchOptions, render_megatron_args
from megapilot.spec import ClusterSpec, ModelSpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.model import Llama3RopeScaling, YarnRopeScaling
from tests.catalog.test_models import _half_unit_of_last_digit

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
CPU_TRAINER = LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True, check_paths_exist=False)

#: Published totals of the vendored configs (tests/data/hf_configs/README.md), in billions.
HF_PUBLISHED_B = {
    "Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.6, "Llama-3.1-405B": 405.9, "Mixtral-8x7B-v0.1": 46.7,
    "DeepSeek-V2-Lite": 15.7, "DeepSeek-V3": 671, "Qwen3-30B-A3B": 30.5, "gpt2": 0.124, "gpt-oss-20b": 20.9,
    "Qwen3-Next-80B-A3B-Instruct": 80,
}

#: Models whose script is refused before it is written, or that pretrain_gpt.py does not build (field or reason).
NOT_BUILT_BY_PRETRAIN_GPT = {
    "kimi-k2": "model.rope_scaling.beta_fast",  # YaRN beta_fast 1; MLATransformerConfig's 32 has no flag
    "gpt-oss-20b": "model.rope_scaling",  # YaRN on standard attention: no core_v0.16.0 CLI path
    "gpt-oss-120b": "model.rope_scaling",
    "llama4-scout-17b-16e": "model.attention_chunk_size",
    "llama4-maverick-17b-128e": "model.attention_chunk_size",
    "Llama-4-Scout-17B-16E-Instruct": "model.attention_chunk_size",
    "nemotron3-nano-30b-a3b": "pretrain_mamba.py",  # a hybrid: MambaModel, not GPTModel
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "pretrain_mamba.py",
    "nemotron3-super-120b-a12b": "pretrain_mamba.py",
    "NVIDIA-Nemotron-3-Super-120B-A12B-BF16": "pretrain_mamba.py",
    # per-layer shapes: the block-config file goes beside a script (-o), checked in test_heterogeneous.py
    "Llama-3_3-Nemotron-Super-49B-v1": "output",
    "llama3.3-nemotron-super-49b": "output",
    "nemotron-h-8b": "pretrain_mamba.py",
    "nemotron-h-56b": "pretrain_mamba.py",
    # DeepSeek Sparse Attention: Transformer Engine only (its indexer is checked module by module below)
    "deepseek-v3.2": "model.mla.dsa",
    "DeepSeek-V3.2": "model.mla.dsa",
    "glm-5": "model.mla.dsa",
    "GLM-5": "model.mla.dsa",
    # Gated DeltaNet: Megatron-Core builds it with Transformer Engine only (its mixers are checked module by module)
    "qwen3-next-80b-a3b": "model.gated_delta_net",
    "Qwen3-Next-80B-A3B-Instruct": "model.gated_delta_net",
    # DeepSeek-V4's compressed attention: Megatron-LM dev and Primus v26.5.0 only, no core release
    "deepseek-v4-flash": "model.mla.csa",
    "DeepSeek-V4-Flash": "model.mla.csa",
}


#: Vendored configs the HF importer refuses, by the field it names (none: DeepSeek-V4 imports and its script is
#: refused by release, above).
IMPORT_REFUSED: dict[str, str] = {}


def _cases() -> dict[str, tuple[ModelSpec, float | None]]:
    cases: dict[str, tuple[ModelSpec, float | None]] = {
        name: (preset.spec, preset.published_params_b) for name, preset in load_presets().items()
    }
    for path in sorted(HF_CONFIGS.glob("*.json")):
        try:
            cases[path.stem] = (load_hf_config(path), HF_PUBLISHED_B.get(path.stem))
        except MegapilotError as refused:  # a family the importer refuses by field is not a model to build
            cases[path.stem] = (None, refused.field)  # type: ignore[assignment]  # no flags: refused
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def one_process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Megatron-Core's parallel state for one CPU process (TP=PP=EP=1), torn down after the module."""
    from megatron.core import parallel_state

    from megapilot.trainer import cpu_compat

    already = torch.distributed.is_initialized()
    if not already:
        store = tmp_path_factory.mktemp("pg") / "store"
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    if not torch.cuda.is_available():  # MLA asks for CUDA devices; the trainer's CPU rewrites answer
        cpu_compat.enable_cpu_mode()
    parallel_state.initialize_model_parallel()
    yield
    parallel_state.destroy_model_parallel()
    cpu_compat.disable_cpu_mode()
    if not already:
        torch.distributed.destroy_process_group()


@dataclass
class Built:
    config: object
    model: torch.nn.Module
    params: int


def _plan(model: ModelSpec) -> SavedPlan:
    return SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=1),
                     training=TrainingSpec(seq_length=128, global_batch_size=1, train_iters=1),
                     parallel=ParallelConfig.for_world(1, mbs=1, recompute="none"))


def _build(model: ModelSpec) -> Built:
    """The rendered flags → the trainer's config → Megatron-Core's config and GPTModel, on the meta device."""
    from megapilot.trainer.config import build_config
    from megapilot.trainer.data_loading import build_tokenizer
    from megapilot.trainer.flops import padded_vocab_size
    from megapilot.trainer.model import model_chunk, transformer_config

    config = build_config(render_megatron_args(_plan(model), CPU_TRAINER), gpu_available=False)
    vocab = padded_vocab_size(build_tokenizer(config).vocab_size, config.make_vocab_size_divisible_by, 1)
    with torch.device("meta"):
        tconfig = transformer_config(config, on_gpu=False)
        gpt = model_chunk(config, tconfig, vocab, on_gpu=False, vp_stage=None)
    return Built(tconfig, gpt, sum(p.numel() for p in gpt.parameters()))


def _period(model: ModelSpec) -> tuple[int, int]:
    """(prefix, period): the leading dense layers plus one MoE period, and the layers one period adds."""
    if model.moe is None:
        return 1, 1
    return model.moe.first_k_dense_layers + model.moe.moe_layer_freq, model.moe.moe_layer_freq


def _full_count(model: ModelSpec) -> tuple[int, Built]:
    prefix, period = _period(model)
    if prefix + period >= model.num_layers or (model.num_layers - prefix) % period:
        built = _build(model)
        return built.params, built
    short = _build(model.model_copy(update={"num_layers": prefix}))
    longer = _build(model.model_copy(update={"num_layers": prefix + period}))
    return short.params + (model.num_layers - prefix) // period * (longer.params - short.params), short


def _routing_bias_buffers(model: ModelSpec) -> int:
    """Megatron keeps the aux-loss-free routing bias as a buffer: one per MoE layer, MTP layers included."""
    if model.moe is None or not model.moe.router_expert_bias:
        return 0
    mtp_moe_layers = model.mtp_num_layers if model.is_moe_layer(model.num_layers - 1) else 0
    return (model.num_moe_layers + mtp_moe_layers) * model.moe.num_experts


def _buildable() -> list[str]:
    return [name for name, (spec, _) in CASES.items() if spec is not None and name not in NOT_BUILT_BY_PRETRAIN_GPT]


def test_every_preset_and_vendored_config_is_either_built_or_refused_by_name() -> None:
    assert len(CASES) >= len(load_presets()) + 8
    for name, field in NOT_BUILT_BY_PRETRAIN_GPT.items():
        spec, _ = CASES[name]
        if field == "pretrain_mamba.py":
            assert spec.is_hybrid
            continue
        with pytest.raises(MegapilotError) as refused:
            render_megatron_args(_plan(spec), CPU_TRAINER)
        assert refused.value.field == field, name
    unimported = {name: field for name, (spec, field) in CASES.items() if spec is None}
    assert unimported == IMPORT_REFUSED


@pytest.mark.parametrize("name", _buildable())
def test_megatron_builds_the_model_megapilot_counts_and_its_publisher_states(name: str,
                                                                              one_process_group: None) -> None:
    spec, published_b = CASES[name]
    built_params, _ = _full_count(spec)
    counted = count_params(spec, padded_vocab=True)
    assert built_params + _routing_bias_buffers(spec) == counted.total
    if published_b is not None:
        main_b = count_params(spec).main_model / 1e9
        assert abs(main_b - published_b) <= max(0.005 * published_b, _half_unit_of_last_digit(published_b))


def _megatron_config_of(spec: ModelSpec) -> object:
    """Megatron-Core's TransformerConfig for `spec`'s mixers, field by field as the flags `script` writes set it
    (the trainer cannot take them: the experimental variant needs Transformer Engine)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    gdn = spec.gated_delta_net
    assert gdn is not None
    return TransformerConfig(
        num_layers=gdn.full_attention_freq, hidden_size=spec.hidden_size, ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads, num_query_groups=spec.num_query_groups,
        kv_channels=spec.head_dim, normalization=spec.normalization, add_bias_linear=spec.add_bias_linear,
        qk_layernorm=spec.qk_layernorm, attention_output_gate=spec.attention_output_gate,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=gdn.full_attention_freq,
        linear_conv_kernel_dim=gdn.conv_kernel, linear_key_head_dim=gdn.key_head_dim,
        linear_value_head_dim=gdn.value_head_dim, linear_num_key_heads=gdn.key_heads,
        linear_num_value_heads=gdn.value_heads, use_cpu_initialization=True, gradient_accumulation_fusion=False,
        perform_initialization=False)  # shapes only (meta device)


def test_qwen3_next_mixers_are_what_megatron_core_builds(one_process_group: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-Core 0.16.1's GatedDeltaNet and its gated SelfAttention, built on the meta device with local
    linears (its spec function asks for Transformer Engine; the parameters are the modules' own either way, and
    TE's fused input norm is the layer's pre-norm, counted apart). GatedDeltaNet refuses to start without
    flash-linear-attention's kernels, which only its forward calls: the flag is lifted for the construction."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.ssm import gated_delta_net
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from megapilot.estimate.params import layer_params, norm_params

    spec = load_hf_config(HF_CONFIGS / "Qwen3-Next-80B-A3B-Instruct.json")
    config = _megatron_config_of(spec)
    monkeypatch.setattr(gated_delta_net, "HAVE_FLA", True)
    with torch.device("meta"):
        mixer = gated_delta_net.GatedDeltaNet(
            config, gated_delta_net.GatedDeltaNetSubmodules(in_proj=ColumnParallelLinear, out_norm=WrappedTorchNorm,
                                                            out_proj=RowParallelLinear),
            layer_number=1, pg_collection=ProcessGroupCollection.use_mpu_process_groups(), conv_init=0.1)
        local = get_gpt_layer_local_spec(qk_layernorm=True, normalization=spec.normalization)
        attention = build_module(local.submodules.self_attention, config=config, layer_number=4)
    pre_norms = 2 * norm_params(spec, spec.hidden_size)  # input and pre-MLP norms, outside the mixers
    linear, full = layer_params(spec, 0), layer_params(spec, 3)
    assert spec.is_linear_attention_layer(0) and not spec.is_linear_attention_layer(3)
    assert sum(p.numel() for p in mixer.parameters()) == linear.attention + linear.norms - pre_norms
    assert sum(p.numel() for p in attention.parameters()) == full.attention + full.norms - pre_norms
    gate_width = spec.num_attention_heads * spec.head_dim
    assert attention.linear_qkv.weight.shape[0] == 2 * gate_width + 2 * spec.kv_heads * spec.head_dim


class _DuplicatedLinear(torch.nn.Module):
    """Stand-in for Transformer Engine's `Linear` (not installable without a GPU) as DSAIndexer builds it with
    parallel_mode="duplicated": the whole in x out weight on every rank, the bias only when asked for."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool, **_: object) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size))
        self.bias = torch.nn.Parameter(torch.empty(output_size)) if bias else None


def test_deepseek_v32_indexer_is_what_megatron_core_builds(one_process_group: None) -> None:
    """Megatron-Core 0.16.1's DSAIndexer for DeepSeek-V3.2's config, built on the meta device: its projections
    (Transformer Engine's duplicated Linear, stood in for) and its key LayerNorm (Megatron's own local norm)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexer, DSAIndexerSubmodules
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from megapilot.estimate.params import dsa_indexer_params, layer_params

    spec = load_hf_config(HF_CONFIGS / "DeepSeek-V3.2.json")
    mla, dsa = spec.mla, spec.dsa
    assert mla is not None and dsa is not None
    config = MLATransformerConfig(
        num_layers=1, hidden_size=spec.hidden_size, num_attention_heads=spec.num_attention_heads,
        q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank, qk_head_dim=mla.qk_head_dim,
        qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim, v_head_dim=mla.v_head_dim, normalization="RMSNorm",
        experimental_attention_variant="dsa", dsa_indexer_n_heads=dsa.indexer_heads,
        dsa_indexer_head_dim=dsa.indexer_head_dim, dsa_indexer_topk=dsa.topk, apply_rope_fusion=False,
        use_cpu_initialization=True, gradient_accumulation_fusion=False, perform_initialization=False)
    with torch.device("meta"):
        indexer = DSAIndexer(config, DSAIndexerSubmodules(
            linear_wq_b=_DuplicatedLinear, linear_wk=_DuplicatedLinear, k_norm=WrappedTorchNorm,
            linear_weights_proj=_DuplicatedLinear))
    assert sum(p.numel() for p in indexer.parameters()) == dsa_indexer_params(spec) == 13_959_424
    assert indexer.linear_wq_b.weight.shape == (dsa.indexer_heads * dsa.indexer_head_dim, mla.q_lora_rank)
    assert layer_params(spec, 0).indexer == dsa_indexer_params(spec)  # every layer attends through it


# ---- the model's meaning, read back from what Megatron-Core built -----------------------------------------


def _hf(name: str) -> Built:
    spec = load_hf_config(HF_CONFIGS / f"{name}.json")
    prefix, _ = _period(spec)
    return _build(spec.model_copy(update={"num_layers": min(prefix, spec.num_layers)}))


def _hf_llama3_inv_freq(head_dim: int, base: float, factor: float, low: float, high: float,
                        original: int) -> torch.Tensor:
    """transformers' `_compute_llama3_parameters`, written out from the published formula."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def test_llama31_rope_is_scaled_as_its_hf_config_says(one_process_group: None) -> None:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    built = _hf("Llama-3.1-8B")
    rope = built.model.rotary_pos_emb
    assert isinstance(rope, RotaryEmbedding)
    scaling = load_hf_config(HF_CONFIGS / "Llama-3.1-8B.json").rope_scaling
    assert isinstance(scaling, Llama3RopeScaling)
    # The same embedding, built off the meta device, has the frequencies transformers computes.
    real = RotaryEmbedding(kv_channels=128, rotary_percent=1.0, rotary_base=500000, rope_scaling=True,
                           rope_scaling_factor=8.0, use_cpu_initialization=True)
    assert rope.inv_freq.shape == real.inv_freq.shape
    expected = _hf_llama3_inv_freq(128, 500000.0, scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                                   scaling.original_max_position_embeddings)
    assert torch.allclose(real.inv_freq.double(), expected, rtol=1e-5)
    plain = RotaryEmbedding(kv_channels=128, rotary_percent=1.0, rotary_base=500000, use_cpu_initialization=True)
    assert not torch.allclose(plain.inv_freq, real.inv_freq)  # the scaling changes the model


def test_deepseek_v3_router_mla_yarn_and_mtp_mean_what_its_hf_config_says(one_process_group: None) -> None:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
    from megatron.core.transformer.identity_op import IdentityOp

    built = _hf("DeepSeek-V3")
    config = built.config
    # noaux_tc: sigmoid scores, 8 groups with 4 eligible, top-8 renormalised and scaled by 2.5, fp32 gate, bias.
    assert (config.moe_router_score_function, config.moe_router_num_groups, config.moe_router_group_topk) == (
        "sigmoid", 8, 4)
    assert config.moe_router_topk_scaling_factor == 2.5 and config.moe_router_dtype == "fp32"
    assert config.moe_router_enable_expert_bias and not config.moe_router_pre_softmax
    moe_layer = built.model.decoder.layers[3]
    assert moe_layer.mlp.router.expert_bias.shape == (256,)
    attention = moe_layer.self_attention
    assert not isinstance(attention.q_layernorm, IdentityOp) and not isinstance(attention.kv_layernorm, IdentityOp)
    rope = attention.rotary_pos_emb
    assert isinstance(rope, YarnRotaryEmbedding)
    assert (rope.scaling_factor, rope.original_max_position_embeddings, rope.beta_fast, rope.beta_slow) == (
        40, 4096, 32, 1)
    assert (rope.mscale, rope.mscale_all_dim) == (1.0, 1.0)
    assert config.mtp_num_layers == 1 and config.mtp_loss_scaling_factor == 0.1
    assert len(built.model.mtp.layers) == 1
    assert config.layernorm_epsilon == 1e-6 and config.normalization == "RMSNorm"


def test_deepseek_v2_lite_routes_with_an_unrenormalised_softmax_and_its_own_yarn(one_process_group: None) -> None:
    built = _hf("DeepSeek-V2-Lite")
    config = built.config
    assert config.moe_router_score_function == "softmax" and config.moe_router_pre_softmax  # norm_topk_prob false
    assert config.moe_router_topk_scaling_factor is None and config.moe_router_num_groups is None
    assert not config.moe_router_enable_expert_bias and config.mtp_num_layers is None
    rope = built.model.decoder.layers[1].self_attention.rotary_pos_emb
    assert (rope.scaling_factor, rope.mscale, rope.mscale_all_dim) == (40, 0.707, 0.707)


def test_qwen3_moe_and_mixtral_renormalise_the_top_k_and_keep_per_head_norms(one_process_group: None) -> None:
    from megatron.core.transformer.identity_op import IdentityOp

    qwen = _hf("Qwen3-30B-A3B")
    assert qwen.config.moe_router_score_function == "softmax" and not qwen.config.moe_router_pre_softmax
    attention = qwen.model.decoder.layers[0].self_attention
    assert not isinstance(attention.q_layernorm, IdentityOp)
    assert attention.q_layernorm.weight.shape == (128,)  # per head, as Qwen3's q_norm
    mixtral = _hf("Mixtral-8x7B-v0.1")
    assert not mixtral.config.moe_router_pre_softmax and mixtral.config.window_size is None
    assert mixtral.config.moe_aux_loss_coeff == 0.02


def test_yarn_scaling_of_deepseek_is_what_megatron_builds_for_mla() -> None:
    spec = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json")
    assert isinstance(spec.rope_scaling, YarnRopeScaling) and spec.mla is not None
    assert spec.mla.latent_layernorms


def test_mla_without_latent_norms_drops_qk_layernorm_and_counts_alike(one_process_group: None) -> None:
    spec = load_presets()["deepseek-v2-lite"].spec
    bare = spec.model_copy(update={"mla": spec.mla.model_copy(update={"latent_layernorms": False})})
    assert "--qk-layernorm" not in render_megatron_args(_plan(bare), CPU_TRAINER)
    built_params, _ = _full_count(bare)
    assert built_params == count_params(bare, padded_vocab=True).total
    assert count_params(spec).total - count_params(bare).total == spec.num_layers * spec.mla.kv_lora_rank
