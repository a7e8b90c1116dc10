"""FLOPs per token/step, checked against formulas worked by hand for four model families."""

from __future__ import annotations

import pytest

from megapilot.estimate.flops import flops_per_step, flops_per_token
from megapilot.spec import MLASpec, ModelSpec, MoESpec

GPT_22B = ModelSpec(  # Korthikanti et al. 2022, Table 3 (GPT, MHA, 4h GELU MLP)
    name="gpt-22b", num_layers=48, hidden_size=6144, ffn_hidden_size=4 * 6144, num_attention_heads=64,
    vocab_size=51200, mlp_activation="gelu", normalization="LayerNorm",
)
LLAMA3_8B = ModelSpec(
    name="llama3-8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
    num_query_groups=8, vocab_size=128256,
)
MIXTRAL_8X7B = ModelSpec(
    name="mixtral", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
    num_query_groups=8, vocab_size=32000,
    moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=14336),
)
DEEPSEEK_V2_LITE = ModelSpec(
    name="dsv2-lite", num_layers=27, hidden_size=2048, ffn_hidden_size=10944, num_attention_heads=16,
    vocab_size=102400,
    moe=MoESpec(num_experts=64, router_topk=6, moe_ffn_hidden_size=1408, shared_expert_ffn_hidden_size=2816,
                first_k_dense_layers=1),
    mla=MLASpec(kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128),
)


def test_gpt_full_attention_count_equals_korthikanti_closed_form():
    h, layers, s, vocab, batch = 6144, 48, 2048, 51200, 4
    # Korthikanti 2022: model FLOPs = 72 B L s h^2 (1 + s/6h + V/12hL)
    closed_form = 72 * batch * layers * s * h**2 * (1 + s / (6 * h) + vocab / (12 * h * layers))
    ours = flops_per_step(GPT_22B, s, batch, convention="megatron_full_attention")
    assert ours == pytest.approx(closed_form, rel=1e-12)


def test_causal_convention_halves_only_the_attention_core():
    h, layers, s = 6144, 48, 2048
    full = flops_per_token(GPT_22B, s, convention="megatron_full_attention")
    causal = flops_per_token(GPT_22B, s)
    assert full.total - causal.total == pytest.approx(6 * h * s * layers)
    assert causal.attention_core == pytest.approx(6 * h * s * layers)


def test_llama3_8b_gqa_swiglu_by_hand():
    h, kv, ffn, s, vocab = 4096, 8 * 128, 14336, 8192, 128256
    attention_linear = 6 * (h * (h + 2 * kv) + h * h)  # 251,658,240
    mlp = 6 * h * ffn * 3  # SwiGLU: gate, up, down
    core = 6 * h * s
    per_token = 32 * (attention_linear + mlp + core) + 6 * h * vocab
    assert per_token == 51_470_401_536
    assert flops_per_token(LLAMA3_8B, s).total == per_token
    # the calibration file's own restatement for Llama3-8B @ 8K: 51.470e9 causal
    assert flops_per_token(LLAMA3_8B, s).total == pytest.approx(51_470e6, rel=1e-4)


def test_mixtral_moe_counts_topk_experts_only():
    h, kv, moe_ffn, s, vocab = 4096, 1024, 14336, 4096, 32000
    per_layer = 6 * (h * (h + 2 * kv) + h * h) + 6 * h * (2 * moe_ffn) * 3 + 6 * h * s
    expected = 32 * per_layer + 6 * h * vocab
    assert expected == 79_706_456_064
    assert flops_per_token(MIXTRAL_8X7B, s).total == expected


def test_deepseek_v2_lite_mla_with_dense_first_layer_by_hand():
    h, heads, s, vocab = 2048, 16, 4096, 102400
    q_term = h * heads * (128 + 64)  # no q LoRA: full-rank query
    kv_term = 512 * (h + heads * (128 + 128) + 1)
    mla_linear = 6 * (q_term + kv_term + h * 64 + heads * 128 * h)
    mla_core = 6 * (heads * (128 + 64) / 2 + heads * 128 / 2) * s
    dense_mlp = 6 * h * 10944 * 3
    moe_mlp = 6 * h * (1408 * 6 + 2816) * 3
    expected = 27 * (mla_linear + mla_core) + dense_mlp + 26 * moe_mlp + 6 * h * vocab
    assert expected == 16_386_180_096
    assert flops_per_token(DEEPSEEK_V2_LITE, s).total == pytest.approx(expected, rel=1e-12)


def test_mtp_adds_a_layer_its_projection_and_another_logits_pass():
    with_mtp = DEEPSEEK_V2_LITE.model_copy(update={"mtp_num_layers": 1})
    h, s = 2048, 4096
    base = flops_per_token(DEEPSEEK_V2_LITE, s)
    extra = flops_per_token(with_mtp, s).total - base.total
    last_layer = (base.attention_linear + base.attention_core) / 27 + 6 * h * (1408 * 6 + 2816) * 3
    assert extra == pytest.approx(last_layer + 6 * (3 * h + 2 * h * h) + 6 * h * 102400)


def test_a_latent_hybrids_moe_and_mtp_module_count_as_megatrons_formula_counts_them():
    """Nemotron 3 Super, per token: a latent MoE layer is 6 (l x ffn x k x 2 + h x shared x 2 + 2 h l) - experts
    in the latent width, squared ReLU (two matrices), the projections h -> l -> h (Megatron's moe_layer_flops: 4 T l
    ffn k, 4 T h shared, 4 T h l forward); its MTP module is an attention and a latent-MoE layer, the eh-projection
    and one more logits pass, at each of the two depths the recipe repeats it."""
    from megapilot.catalog import get_model
    from megapilot.estimate.flops import layer_flops, moe_mlp_flops

    model = get_model("nemotron3-super")
    h, latent, ffn, shared, k, s = 4096, 1024, 2688, 5376, 22, 8192
    assert moe_mlp_flops(model) == 6 * (latent * ffn * k * 2 + h * shared * 2 + 2 * h * latent)
    attention_layer, moe_layer = model.hybrid_override_pattern.index("*"), 1
    twice = model.model_copy(update={"mtp_num_layers": 2, "mtp_repeated_layer": True})
    main = flops_per_token(model.model_copy(update={"mtp_num_layers": 0}), s)
    module = (layer_flops(model, attention_layer, s) + layer_flops(model, moe_layer, s)
              + 6 * (3 * h + 2 * h * h) + 6 * h * model.padded_vocab_size(1))
    assert flops_per_token(twice, s).total - main.total == pytest.approx(2 * module)


def test_logits_use_the_vocab_padded_for_tp():
    # 51200 is a multiple of 128*8, 50257 is not: padded to 50304 (tp=1) and 51200 (tp=8)
    gpt2ish = GPT_22B.model_copy(update={"vocab_size": 50257})
    h = 6144
    assert flops_per_token(gpt2ish, 2048, tp=1).logits == 6 * h * 50304
    assert flops_per_token(gpt2ish, 2048, tp=8).logits == 6 * h * 51200


def _calibration_rows_with_flop_checks():
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "calibration" / "published_calibration.json"
    rows = json.loads(path.read_text())
    return [r for r in rows if (r.get("derived") or {}).get("flops_convention_check")]


@pytest.mark.parametrize("row", _calibration_rows_with_flop_checks(), ids=lambda r: r["id"])
def test_both_conventions_match_the_calibration_files_independent_restatement(row):
    llama = "llama" in row["model"].lower()
    model = ModelSpec(
        name=row["model"], num_layers=row["layers"], hidden_size=row["hidden"], ffn_hidden_size=row["ffn_hidden"],
        num_attention_heads=row["heads"], num_query_groups=row["kv_heads"], vocab_size=row["vocab"],
        mlp_activation="swiglu" if llama else "gelu",
    )
    check = row["derived"]["flops_convention_check"]
    causal = flops_per_token(model, row["seq_len"]).total
    full = flops_per_token(model, row["seq_len"], convention="megatron_full_attention").total
    assert causal == pytest.approx(check["megatron_style_flops_per_token_causal"], rel=1e-3)
    assert full == pytest.approx(check["megatron_style_flops_per_token_full_attention"], rel=1e-3)


def test_qwen3_next_counts_gated_deltanet_and_gated_attention_as_megatron_does():
    # Megatron-LM training.py `num_floating_point_operations` (core_v0.16.0), its gated_delta_net branch and its
    # gate_projection_size for an attention output gate, written out for one layer of each kind, per token.
    from megapilot.catalog.models import get_model
    from megapilot.estimate.flops import layer_flops, mlp_flops

    model = get_model("qwen3-next-80b-a3b")
    h, s = model.hidden_size, 4096
    qk, v, hv, dv, conv = 16 * 128, 32 * 128, 32, 128, 4
    deltanet = 6 * (h * (2 * qk + 2 * v + 2 * hv) + conv * (2 * qk + v) + hv * dv ** 2 * 4 + h * v)
    q, kv = 16 * 256, 2 * 256
    attention = 6 * (h * (q + 2 * kv + q) + q * s / 2 * 2 + q * h)
    moe = 6 * h * (512 * 10 + 512) * 3
    assert mlp_flops(model, 0) == moe
    assert layer_flops(model, 0, s) == pytest.approx(deltanet + moe, rel=1e-12)
    assert layer_flops(model, 3, s) == pytest.approx(attention + moe, rel=1e-12)
    per_token = flops_per_token(model, s)
    assert per_token.layers == pytest.approx(12 * (3 * deltanet + attention + 4 * moe), rel=1e-12)


def test_heterogeneous_layers_count_their_own_attention_and_mlp():
    """Llama-Nemotron-style layers, per token: a layer without attention has no projections and no core, a linear
    replacement is one 6 h^2 GEMM, each MLP runs its own width."""
    from megapilot.estimate.flops import layer_flops
    from megapilot.spec.model import LayerBlock, Llama3RopeScaling

    h, heads, kv, s = 1024, 16, 4, 2048
    model = ModelSpec(name="nas", num_layers=3, hidden_size=h, ffn_hidden_size=4096, num_attention_heads=heads,
                      num_query_groups=kv, vocab_size=32000, rope_scaling=Llama3RopeScaling(factor=8.0),
                      layer_blocks=(LayerBlock(ffn_hidden_size=2048), LayerBlock(attention="none"),
                                    LayerBlock(attention="linear", mlp="none")))
    attention = 6 * (h * (h + 2 * kv * 64) + h * h) + 6 * h * s  # projections + causal core
    assert layer_flops(model, 0, s) == attention + 6 * h * 2048 * 3
    assert layer_flops(model, 1, s) == 6 * h * 4096 * 3
    assert layer_flops(model, 2, s) == 6 * h * h


def test_sparse_attention_adds_the_indexer_and_attends_over_topk_keys_only():
    from megapilot.catalog import get_model
    from megapilot.estimate.flops import attention_core_flops, dsa_core_flops

    dense, sparse = get_model("deepseek-v3"), get_model("deepseek-v3.2")
    dsa = sparse.dsa
    assert dsa is not None
    indexer_linear = 4 * (1536 * 64 * 128 + 7168 * (128 + 64))  # forward + weight gradient: detached inputs
    assert flops_per_token(sparse, 4096).attention_linear - flops_per_token(dense, 4096).attention_linear \
        == pytest.approx(61 * indexer_linear)
    # up to topk tokens every query keeps every earlier key: dense MLA's core, plus the indexer's causal scores
    # (3 passes x 2 FLOPs x heads x dim x s / 2) and the KL loss's forward QK^T over the same keys
    s = 2048
    kl = 2 * 128 * 192 * (s - s / 2)
    assert dsa_core_flops(sparse, 5, s) == pytest.approx(attention_core_flops(dense, s) + 3 * 64 * 128 * s + kl)
    # at 128K a query attends to 2,048 keys, not 64K on average: the core shrinks by more than 4x
    assert flops_per_token(sparse, 131072).attention_core < flops_per_token(dense, 131072).attention_core / 4


def test_a_layer_reusing_an_earlier_layers_topk_runs_no_indexer_and_no_kl_loss():
    from megapilot.catalog import get_model
    from megapilot.estimate.flops import dsa_core_flops, layer_attention_linear_flops

    glm5 = get_model("glm-5")
    assert glm5.dsa is not None
    shared = glm5.model_copy(update={"mla": glm5.mla.model_copy(update={"dsa": glm5.dsa.model_copy(
        update={"topk_freq": 4, "skip_topk_offset": 3})})})
    assert shared.runs_dsa_indexer(2) and not shared.runs_dsa_indexer(3)
    assert layer_attention_linear_flops(shared, 3) < layer_attention_linear_flops(shared, 2)
    assert dsa_core_flops(shared, 3, 8192) < dsa_core_flops(shared, 2, 8192) == dsa_core_flops(glm5, 3, 8192)


def test_a_mamba_mixer_counts_megatrons_forward_formula_three_times_scan_included():
    """Megatron's `mamba_layer_flops` (training.py) is the forward, 2 T h (2 d + 2 G N + H) + 7 T d N + 2 T d h;
    `num_floating_point_operations` returns three times the forward."""
    from megapilot.catalog import get_model
    from megapilot.estimate.flops import mamba_mixer_flops

    model = get_model("nemotron-h-8b")
    h, d, n, groups, heads = 4096, 8192, 128, 8, 128
    forward = 2 * h * (2 * d + 2 * groups * n + heads) + 7 * d * n + 2 * d * h
    assert mamba_mixer_flops(model, 8192) == 3 * forward


# ---- DeepSeek-V4 ---------------------------------------------------------------------------------

def _v4_flash() -> ModelSpec:
    from megapilot.catalog import get_model
    return get_model("deepseek-v4-flash")


def test_deepseek_v4_projections_match_megatron_devs_dsv4_token_terms():
    """Megatron-LM dev's `_dsv4_hybrid_self_attention_flops` token-linear terms, restated: the q LoRA, the one K=V
    head, the grouped output projection, and the main compressors' wkv + wgate (2 x v wide at ratio 4, v at 128);
    its indexer projections run forward and weight gradient only here (their inputs are detached)."""
    from megapilot.estimate.flops import layer_attention_linear_flops
    model = _v4_flash()
    h, heads, v, q_lora, groups, o_lora = 4096, 64, 512, 1024, 8, 1024
    projections = 6 * (q_lora * (h + heads * v + 1) + h * v + heads * v * o_lora + groups * o_lora * h)
    assert layer_attention_linear_flops(model, 0) == projections  # window only: no compressor
    assert layer_attention_linear_flops(model, 3) == projections + 6 * h * v * 2  # ratio 128
    indexer = 4 * (q_lora * 64 * 128 + h * 64 + h * 2 * 128 * 2)
    assert layer_attention_linear_flops(model, 2) == projections + 6 * h * 2 * v * 2 + indexer  # ratio 4


def test_deepseek_v4_core_attends_over_the_window_and_its_compressed_keys():
    from megapilot.estimate.flops import layer_attention_core_flops
    model, s = _v4_flash(), 4096
    per_key = 6 * 64 * (512 + 512)
    window = 128 - 128 * 128 / (2 * s)
    assert layer_attention_core_flops(model, 0, s) == pytest.approx(per_key * window)
    assert layer_attention_core_flops(model, 3, s) == pytest.approx(per_key * (window + s / 128 / 2))
    kept = 512 - 512 * 512 / (2 * s / 4)  # the top-512 of s/4 pooled keys
    indexer_scores = 6 * 64 * 128 * (s / 4) / 2
    kl_scores = 2 * 64 * 512 * kept
    assert layer_attention_core_flops(model, 2, s) == pytest.approx(per_key * (window + kept) + indexer_scores
                                                                    + kl_scores)
    # a short sequence: fewer pooled keys than the top-k, each query sees half of them on average
    assert layer_attention_core_flops(model, 2, 1024) > layer_attention_core_flops(model, 3, 1024)


def test_hyper_connections_count_their_mixing_projections_per_sublayer():
    from megapilot.estimate.flops import hyper_connection_flops, layer_flops
    model = _v4_flash()
    assert hyper_connection_flops(model) == 2 * 6 * 4 * 4096 * (16 + 8)
    plain = model.model_copy(update={"residual_streams": 1})
    assert layer_flops(model, 5, 4096) - layer_flops(plain, 5, 4096) == hyper_connection_flops(model)
    totals = flops_per_token(model, 4096)
    assert totals.hyper_connections == 43 * hyper_connection_flops(model)
