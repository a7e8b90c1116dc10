from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.spec import MLASpec, ModelSpec, MoESpec, ParallelConfig


def _model(**kw) -> ModelSpec:
    base = dict(name="m", num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8, vocab_size=50257)
    return ModelSpec(**(base | kw))


def test_vocab_padding_follows_megatron_multiple_times_tp():
    model = _model()
    assert model.padded_vocab_size(1) == 50304
    assert model.padded_vocab_size(8) == 51200


def test_moe_layer_pattern_dense_first_then_frequency():
    moe = MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=128, first_k_dense_layers=1, moe_layer_freq=2)
    model = _model(moe=moe)
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert model.num_moe_layers == 2 and model.num_dense_layers == 2


def test_gqa_groups_must_divide_heads():
    with pytest.raises(ValidationError, match="num_query_groups"):
        _model(num_query_groups=3)


def test_topk_above_experts_is_refused():
    with pytest.raises(ValidationError, match="router_topk"):
        MoESpec(num_experts=4, router_topk=5, moe_ffn_hidden_size=64)


def test_mla_model_needs_no_divisible_hidden():
    mla = MLASpec(kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
    assert _model(hidden_size=250, mla=mla).mla is mla


def test_parallel_config_local_rules():
    with pytest.raises(ValidationError, match="sequence_parallel"):
        ParallelConfig(tp=1, sequence_parallel=True)
    with pytest.raises(ValidationError, match="vpp"):
        ParallelConfig(pp=1, vpp=2)
    assert ParallelConfig.for_world(64, tp=8, pp=4).dp == 2
    assert ParallelConfig.for_world(64, tp=2, cp=2, ep=4).expert_dp == 8


# ---- model semantics: router rules (Megatron-Core's TransformerConfig), rope scaling, MLA norms ---------------
_MOE = dict(num_experts=8, router_topk=4, moe_ffn_hidden_size=64)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(router_expert_bias=True), "router_expert_bias"),  # aux-loss-free bias needs sigmoid scores
    (dict(router_score_function="sigmoid", router_pre_softmax=True), "router_pre_softmax"),
    (dict(router_num_groups=4), "router_num_groups and router_group_topk"),
    (dict(router_num_groups=3, router_group_topk=1), "does not divide"),
    (dict(router_num_groups=4, router_group_topk=5), "exceeds router_num_groups"),
    (dict(router_num_groups=4, router_group_topk=1), "experts score each group"),  # 4 // 1 > 2 per group
])
def test_router_combinations_megatron_refuses_are_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        MoESpec(**(_MOE | fields))


def test_deepseek_v3_router_is_a_valid_moe_spec():
    moe = MoESpec(num_experts=256, router_topk=8, moe_ffn_hidden_size=2048, router_score_function="sigmoid",
                  router_expert_bias=True, router_num_groups=8, router_group_topk=4, router_topk_scaling_factor=2.5)
    assert moe.router_group_topk == 4


def test_mla_takes_latent_norms_not_per_head_qk_norms_and_scaling_needs_rope():
    from megapilot.spec.model import Llama3RopeScaling

    mla = MLASpec(kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
    assert mla.latent_layernorms
    with pytest.raises(ValidationError, match="latent_layernorms"):
        _model(mla=mla, qk_layernorm=True)
    with pytest.raises(ValidationError, match="rope_scaling needs"):
        _model(position_embedding="learned_absolute", rope_scaling=Llama3RopeScaling(factor=8.0))
    scaled = _model(rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096})
    assert scaled.rope_scaling is not None and scaled.rope_scaling.type == "yarn"


def test_token_dropping_follows_megatron_rules():
    from megapilot.spec import MoESpec

    with pytest.raises(ValueError, match="pad_to_capacity needs a capacity_factor"):
        MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=64, pad_to_capacity=True)
    with pytest.raises(ValueError, match="not sinkhorn"):
        MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=64, capacity_factor=1.0,
                load_balancing_type="sinkhorn")
    dropping = MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=64, capacity_factor=1.5)
    assert dropping.expert_load_factor == 1.0  # drops beyond capacity; evenly routed, nothing is dropped or padded
    assert dropping.model_copy(update={"pad_to_capacity": True}).expert_load_factor == 1.5


def test_a_hybrid_mtp_pattern_names_layer_kinds_of_the_main_model():
    from megapilot.spec.model import MambaSpec

    hybrid = ModelSpec(name="h", num_layers=4, hidden_size=512, ffn_hidden_size=1024, num_attention_heads=8,
                       vocab_size=1000, hybrid_override_pattern="M*ME", mamba=MambaSpec(num_heads=16),
                       moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=256, latent_size=128),
                       mtp_num_layers=2, mtp_hybrid_pattern="*E", mtp_repeated_layer=True)
    assert hybrid.mtp_layer_indices == (1, 3) and hybrid.mtp_weight_copies == 1
    assert hybrid.moe.routed_width(512) == 128
    assert hybrid.model_copy(update={"mtp_hybrid_pattern": None}).mtp_layer_indices == (3,)  # like the last layer
    with pytest.raises(ValidationError, match="missing"):
        ModelSpec(**(hybrid.model_dump() | {"mtp_hybrid_pattern": "*-"}))  # no MLP layer in the main model
    with pytest.raises(ValidationError, match="no hybrid_override_pattern"):
        ModelSpec(name="t", num_layers=2, hidden_size=512, ffn_hidden_size=1024, num_attention_heads=8,
                  vocab_size=1000, mtp_num_layers=1, mtp_hybrid_pattern="*")
    with pytest.raises(ValidationError, match="latent_size"):
        MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=256, latent_size=0)


# ---- DeepSeek-V4 ---------------------------------------------------------------------------------

def _v4(**changes) -> ModelSpec:
    """A two-layer DeepSeek-V4-shaped model (one CSA layer, one HCA layer, a window-only MTP layer)."""
    from megapilot.spec.model import CompressedAttentionSpec, DSASpec
    mla = dict(q_lora_rank=64, kv_lora_rank=64, qk_head_dim=48, qk_pos_emb_head_dim=16, v_head_dim=64,
               dsa=DSASpec(indexer_heads=4, indexer_head_dim=32, topk=16),
               csa=CompressedAttentionSpec(compress_ratios=(4, 128, 4), o_groups=2, o_lora_rank=32))
    mla.update(changes.pop("mla", {}))
    fields = dict(num_layers=2, hidden_size=128, ffn_hidden_size=64, num_attention_heads=4, vocab_size=256,
                  sliding_window=8, softmax_type="learnable", mtp_num_layers=1, residual_streams=4,
                  moe=MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=64, num_hash_layers=1,
                              router_score_function="sqrtsoftplus", router_expert_bias=True),
                  mla=MLASpec(**mla))
    return _model(**(fields | changes))


def test_a_deepseek_v4_model_is_valid_and_names_its_layers_kinds():
    model = _v4()
    assert [model.runs_dsa_indexer(i) for i in range(2)] == [True, False]
    assert model.mtp_layer_indices == (0,)  # the MTP layer's ratio 4 is layer 0's
    assert model.compressor_projections(0) == ((128, 128), (128, 128))  # ratio 4 overlaps: 2 x head dim
    assert model.compressor_projections(1) == ((128, 64), (128, 64))


@pytest.mark.parametrize(("changes", "message"), [
    (dict(sliding_window=None), "sliding_window"),
    (dict(softmax_type="vanilla"), "softmax_type"),
    (dict(mtp_num_layers=0), "compress_ratios has 3 ratios"),
    (dict(mla=dict(kv_lora_rank=32)), "K=V head"),
    (dict(mla=dict(q_lora_rank=None)), "q_lora_rank"),
    (dict(mla=dict(dsa=None)), "set mla.dsa"),
    (dict(residual_streams=0), "residual_streams"),
    (dict(num_attention_heads=3), "o_groups"),
    (dict(moe=MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=64, num_hash_layers=1,
                      first_k_dense_layers=1)), "num_hash_layers"),
])
def test_deepseek_v4_fields_megatron_cannot_build_are_refused(changes, message):
    with pytest.raises(ValidationError, match=message):
        _v4(**changes)


def test_compress_ratios_are_the_three_megatron_builds():
    from megapilot.spec.model import CompressedAttentionSpec
    with pytest.raises(ValidationError, match="compress_ratios"):
        CompressedAttentionSpec(compress_ratios=(8,), o_groups=1, o_lora_rank=1)
    with pytest.raises(ValidationError, match="o_groups"):
        CompressedAttentionSpec(compress_ratios=(0,), o_groups=0, o_lora_rank=1)


def test_sqrtsoftplus_routing_takes_the_expert_bias_softmax_does_not():
    assert MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=8, router_score_function="sqrtsoftplus",
                   router_expert_bias=True).router_expert_bias
    with pytest.raises(ValidationError, match="router_expert_bias"):
        MoESpec(num_experts=4, router_topk=2, moe_ffn_hidden_size=8, router_expert_bias=True)


def test_which_layers_run_a_softmax_attention_core():
    from megapilot.catalog.models import get_model

    dense = _model()
    assert all(dense.has_attention(i) and dense.has_softmax_core(i) for i in range(dense.num_layers))
    assert dense.has_softmax_attention
    # Qwen3-Next: Gated DeltaNet on three layers of four, softmax attention on every fourth (1-based)
    next_ = get_model("qwen3-next-80b-a3b")
    assert [next_.has_softmax_core(i) for i in range(4)] == [False, False, False, True]
    assert all(next_.has_attention(i) for i in range(4))  # the linear mixer is an attention too
    assert next_.has_softmax_attention
    # a hybrid Mamba stack: only its attention blocks; a pure Mamba stack has none
    hybrid = get_model("nemotron-h-8b")
    cores = [i for i in range(hybrid.num_layers) if hybrid.has_softmax_core(i)]
    assert cores and all(hybrid.layer_kind(i) == "attention" for i in cores)
    mamba_only = hybrid.model_copy(update={"hybrid_override_pattern": "M" * hybrid.num_layers})
    assert not mamba_only.has_softmax_attention


def test_qk_l2_norm_sits_on_the_rope_layers_and_neither_beside_mla_nor_a_weighted_qk_norm():
    llama4_like = _model(qk_l2_norm=True, no_rope_freq=4)
    assert [llama4_like.qk_l2_norm_at(i) for i in range(8)] == [True, True, True, False] * 2  # NoPE layers: none
    assert all(_model(qk_l2_norm=True).qk_l2_norm_at(i) for i in range(4))
    assert not _model(no_rope_freq=4).qk_l2_norm_at(0)
    with pytest.raises(ValidationError, match="qk_l2_norm"):
        _model(qk_l2_norm=True, qk_layernorm=True)  # Megatron builds the L2 norm in place of the weighted one
    with pytest.raises(ValidationError, match="qk_l2_norm"):
        _model(qk_l2_norm=True, mla=MLASpec(kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                                            v_head_dim=128))


@pytest.mark.parametrize("field", ["capacity_factor", "aux_loss_coeff"])
def test_an_infinite_moe_number_is_refused(field):
    # a model file's `.inf` would reach the script as --moe-expert-capacity-factor inf, which Megatron cannot size
    with pytest.raises(ValidationError, match="finite"):
        MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=64, **{field: float("inf")})



# ---- upper bounds: far above any published model, so a slip of digits is refused by name ---------------------
@pytest.mark.parametrize(("fields", "field"), [
    (dict(hidden_size=10**30), "hidden_size"),
    (dict(hidden_size=2**19, num_attention_heads=8), "hidden_size"),
    (dict(ffn_hidden_size=10**7), "ffn_hidden_size"),
    (dict(num_layers=10**6), "num_layers"),
    (dict(num_attention_heads=2**15, hidden_size=2**15), "num_attention_heads"),
    (dict(vocab_size=10**9), "vocab_size"),
    (dict(kv_channels=10**5), "kv_channels"),
    (dict(max_position_embeddings=10**12), "max_position_embeddings"),
    (dict(mtp_num_layers=10**9), "mtp_num_layers"),
    (dict(moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=64).model_dump() | {"num_experts": 10**6}),
     "moe.num_experts"),
])
def test_absurd_sizes_are_refused_naming_the_field(fields, field):
    with pytest.raises(ValidationError) as caught:
        _model(**fields)
    error = caught.value.errors()[0]
    assert ".".join(map(str, error["loc"])) == field
    assert "far beyond any published model" in error["msg"]


def test_the_largest_published_sizes_pass_the_bounds():
    # GPT-1T's width and heads, Nemotron-4 340B's MLP, Gemma 3's vocabulary, Llama 4 Scout's context
    model = _model(num_layers=126, hidden_size=25_600, num_attention_heads=160, ffn_hidden_size=73_728,
                   vocab_size=262_144, max_position_embeddings=10_485_760,
                   moe=MoESpec(num_experts=512, router_topk=10, moe_ffn_hidden_size=2048))
    assert model.hidden_size == 25_600 and model.moe is not None and model.moe.num_experts == 512


def test_an_absurd_mtp_depth_is_compared_with_published_mtp_depths_not_layer_counts():
    with pytest.raises(ValidationError, match="DeepSeek-V3 has 1 MTP layer"):
        _model(mtp_num_layers=10**9)
