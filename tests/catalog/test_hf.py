from __future__ import annotations

import json
from operator import attrgetter
from pathlib import Path

import pytest

from megapilot.catalog.hf import SUPPORTED_ARCHITECTURES, from_hf_config, load_hf_config
from megapilot.errors import MegapilotError
from megapilot.estimate.params import count_params
from megapilot.spec.model import YarnRopeScaling

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"


def _config(name: str) -> dict:
    return json.loads((HF_CONFIGS / f"{name}.json").read_text())


# ---- the vendored real configs -----------------------------------------------------------------


def test_llama_maps_gqa_rope_and_untied_head():
    model = load_hf_config(HF_CONFIGS / "Llama-3.1-70B.json")
    assert model.name == "Llama-3.1-70B" and model.hf_architecture == "LlamaForCausalLM"
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (80, 8192, 28672)
    assert (model.num_attention_heads, model.num_query_groups, model.kv_channels) == (64, 8, None)
    assert model.rotary_base == 500_000 and model.mlp_activation == "swiglu" and not model.tie_embeddings
    assert model.max_position_embeddings == 131_072 and model.norm_epsilon == 1e-5


def test_mixtral_experts_use_the_intermediate_size():
    moe = load_hf_config(HF_CONFIGS / "Mixtral-8x7B-v0.1.json").moe
    assert moe is not None
    assert (moe.num_experts, moe.router_topk, moe.moe_ffn_hidden_size) == (8, 2, 14336)
    assert moe.shared_expert_ffn_hidden_size == 0 and moe.first_k_dense_layers == 0


def test_qwen3_moe_has_explicit_head_dim_and_qk_norm():
    model = load_hf_config(HF_CONFIGS / "Qwen3-30B-A3B.json")
    assert model.kv_channels == 128 and model.qk_layernorm and model.num_query_groups == 4
    assert model.moe is not None and (model.moe.num_experts, model.moe.router_topk) == (128, 8)
    assert model.moe.moe_ffn_hidden_size == 768 and model.moe.moe_layer_freq == 1


def test_deepseek_v3_maps_mla_moe_and_mtp():
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json")
    assert model.mla is not None and model.mla.q_lora_rank == 1536 and model.mla.kv_lora_rank == 512
    assert (model.mla.qk_head_dim, model.mla.qk_pos_emb_head_dim, model.mla.v_head_dim) == (128, 64, 128)
    assert model.num_query_groups is None and model.mtp_num_layers == 1
    moe = model.moe
    assert moe is not None and moe.first_k_dense_layers == 3 and moe.shared_expert_ffn_hidden_size == 2048
    assert moe.router_expert_bias and moe.num_experts == 256 and moe.router_topk == 8


def test_deepseek_v32_is_v3_with_sparse_attention_and_685b_as_deepseek_counts():
    v3, v32 = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json"), load_hf_config(HF_CONFIGS / "DeepSeek-V3.2.json")
    assert v32.dsa is not None and (v32.dsa.indexer_heads, v32.dsa.indexer_head_dim, v32.dsa.topk) == (64, 128, 2048)
    assert v3.dsa is None
    assert v32.model_dump(exclude={"name", "hf_architecture", "mla"}) == v3.model_dump(
        exclude={"name", "hf_architecture", "mla"})
    counts = count_params(v32)
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64  # wq_b, wk, k_norm (weight + bias), weights_proj
    assert counts.main_model - count_params(v3).main_model == 61 * indexer
    # the card's 685B counts the MTP module with its own embedding and output-layer copies
    assert abs((counts.total + counts.embedding + counts.output_layer) / 685e9 - 1) < 0.005


def test_a_deepseek_v32_config_leaving_indexer_fields_out_takes_transformers_defaults():
    config = _config("DeepSeek-V3.2")
    del config["index_topk"], config["index_n_heads"]
    config["index_head_dim"] = 64
    dsa = from_hf_config(config, "partial").dsa
    assert dsa is not None and (dsa.indexer_heads, dsa.indexer_head_dim, dsa.topk) == (64, 64, 2048)
    config["index_topk"] = "2048"
    with pytest.raises(MegapilotError) as err:
        from_hf_config(config, "bad")
    assert err.value.field == "index_topk"


def test_glm5_reads_as_mla_with_glms_sparse_attention_and_deepseek_v3s_router():
    model = load_hf_config(HF_CONFIGS / "GLM-5.json")
    mla, dsa, moe = model.mla, model.dsa, model.moe
    assert mla is not None and (mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim) == (192, 64, 256)
    assert dsa is not None and (dsa.indexer_heads, dsa.indexer_head_dim, dsa.topk) == (32, 128, 2048)
    assert dsa.rope_interleaved and not dsa.rotate_activation and dsa.topk_freq == 1
    assert moe is not None and moe.router_score_function == "sigmoid" and moe.router_expert_bias
    assert moe.first_k_dense_layers == 3 and model.rotary_base == 1_000_000 and model.mtp_num_layers == 1


def _glm5_shrunk(**changes: object) -> dict:
    return {**_config("GLM-5"), "num_hidden_layers": 8, **changes}


def test_glm5_shared_topk_layers_map_to_megatrons_freq_and_offset():
    # transformers' schedule: index_topk_freq with its default offset 2, or an explicit per-layer list
    dsa = from_hf_config(_glm5_shrunk(index_topk_freq=2), "f").dsa
    assert dsa is not None and (dsa.topk_freq, dsa.skip_topk_offset) == (2, 2)
    kinds = ["full", "full", "full", "shared", "shared", "shared", "full", "shared"]
    dsa = from_hf_config(_glm5_shrunk(indexer_types=kinds), "l").dsa
    assert dsa is not None and [dsa.runs_indexer(i) for i in range(8)] == [k == "full" for k in kinds]
    with pytest.raises(MegapilotError) as err:  # no (freq, offset) of Megatron's rule gives this mix
        from_hf_config(_glm5_shrunk(indexer_types=["full", "shared", "full", "full"] + ["full"] * 4), "x")
    assert err.value.field == "indexer_types"


def test_glm5_shared_layers_hold_no_indexer():
    shared = from_hf_config(_glm5_shrunk(index_topk_freq=4, index_skip_topk_offset=3), "s")
    full = from_hf_config(_glm5_shrunk(), "f")
    from megapilot.estimate.params import dsa_indexer_params
    assert count_params(full).main_model - count_params(shared).main_model == 4 * dsa_indexer_params(full)


def test_deepseek_v2_lite_has_full_rank_query_and_two_shared_experts():
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V2-Lite.json")  # tab-indented upstream
    assert model.mla is not None and model.mla.q_lora_rank is None
    assert model.moe is not None and model.moe.shared_expert_ffn_hidden_size == 2 * 1408
    assert not model.moe.router_expert_bias and model.mtp_num_layers == 0


def test_gpt2_maps_to_layernorm_gelu_learned_positions_biases_tied():
    model = load_hf_config(HF_CONFIGS / "gpt2.json")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (12, 768, 12)
    assert model.ffn_hidden_size == 3072 and model.max_position_embeddings == 1024
    assert model.mlp_activation == "gelu" and model.normalization == "LayerNorm"
    assert model.position_embedding == "learned_absolute" and model.add_bias_linear and model.tie_embeddings


def test_directory_with_config_json_is_named_after_the_directory(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text((HF_CONFIGS / "Llama-3.1-8B.json").read_text())
    assert load_hf_config(folder).name == "my-llama"
    assert load_hf_config(folder / "config.json").name == "my-llama"


def test_model_type_alone_is_enough():
    config = _config("Llama-3.1-8B")
    del config["architectures"]
    assert from_hf_config(config, "x").hf_architecture == "llama"


# ---- other supported families (fields as in their public config.json files) -------------------

# name: (config fields, published total params, published active params or None)
OTHER_FAMILIES = {
    "Mistral-7B-v0.1": (dict(architectures=["MistralForCausalLM"], hidden_size=4096, intermediate_size=14336,
                             num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32, vocab_size=32000,
                             sliding_window=4096, rope_theta=10000.0), 7.24e9, None),
    "Qwen2-7B": (dict(architectures=["Qwen2ForCausalLM"], hidden_size=3584, intermediate_size=18944,
                      num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064,
                      tie_word_embeddings=False, use_sliding_window=False), 7.62e9, None),
    "Qwen3-8B": (dict(architectures=["Qwen3ForCausalLM"], hidden_size=4096, intermediate_size=12288,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=36,
                      vocab_size=151936, tie_word_embeddings=False), 8.2e9, None),
    "Qwen1.5-MoE-A2.7B": (dict(architectures=["Qwen2MoeForCausalLM"], hidden_size=2048, num_hidden_layers=24,
                               num_attention_heads=16, num_key_value_heads=16, intermediate_size=5632,
                               moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts=60,
                               num_experts_per_tok=4, vocab_size=151936, tie_word_embeddings=False,
                               decoder_sparse_step=1, mlp_only_layers=[]), 14.3e9, 2.7e9),
    "gemma-7b": (dict(architectures=["GemmaForCausalLM"], hidden_size=3072, intermediate_size=24576,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=256, num_hidden_layers=28,
                      vocab_size=256000, hidden_act="gelu"), 8.54e9, None),
    "gemma-2-9b": (dict(architectures=["Gemma2ForCausalLM"], hidden_size=3584, intermediate_size=14336,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=256, num_hidden_layers=42,
                        vocab_size=256000, hidden_activation="gelu_pytorch_tanh", sliding_window=4096), 9.24e9, None),
}


@pytest.mark.parametrize("name", sorted(OTHER_FAMILIES))
def test_other_families_count_to_their_published_size(name):
    config, total, active = OTHER_FAMILIES[name]
    breakdown = count_params(from_hf_config(config, name))
    assert breakdown.total == pytest.approx(total, rel=0.005)
    if active is not None:
        assert breakdown.active == pytest.approx(active, rel=0.005)


def test_qwen2_family_gets_qkv_bias_and_gemma_a_tied_gated_gelu():
    qwen2 = from_hf_config(OTHER_FAMILIES["Qwen2-7B"][0], "q")
    assert qwen2.add_qkv_bias and not qwen2.add_bias_linear
    gemma = from_hf_config(OTHER_FAMILIES["gemma-7b"][0], "g")
    assert gemma.tie_embeddings and gemma.mlp_activation == "geglu" and gemma.kv_channels == 256


def test_qwen2_moe_shared_expert_is_gated():
    moe = from_hf_config(OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0], "q").moe
    assert moe is not None and moe.shared_expert_gate and moe.shared_expert_ffn_hidden_size == 5632


def test_qwen_moe_sparse_step_and_dense_prefix_map_to_megatron_pattern():
    base = OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0]
    every_second = from_hf_config(base | {"decoder_sparse_step": 2}, "q")
    assert [every_second.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    dense_prefix = from_hf_config(base | {"mlp_only_layers": [0, 1]}, "q")
    assert dense_prefix.moe is not None and dense_prefix.moe.first_k_dense_layers == 2


# ---- refusals ------------------------------------------------------------------------------------


def _refusal(config: dict) -> MegapilotError:
    with pytest.raises(MegapilotError) as excinfo:
        from_hf_config(config, "x")
    return excinfo.value


def test_unsupported_architecture_is_named_with_the_supported_list():
    error = _refusal(_config("Llama-3.1-8B") | {"architectures": ["FalconForCausalLM"]})
    assert error.field == "architectures" and "FalconForCausalLM" in str(error)
    assert all(arch in error.fix for arch in SUPPORTED_ARCHITECTURES)


def test_missing_hidden_size_names_the_field():
    config = _config("Llama-3.1-8B")
    del config["hidden_size"]
    error = _refusal(config)
    assert error.field == "hidden_size"


def test_partial_sliding_window_and_scattered_moe_layers_are_refused():
    assert _refusal(OTHER_FAMILIES["Qwen3-8B"][0] | {"use_sliding_window": True}).field == "use_sliding_window"
    scattered = OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0] | {"mlp_only_layers": [3, 7]}
    assert _refusal(scattered).field == "mlp_only_layers"


def test_a_deepseek_config_dense_to_its_last_layer_is_refused_naming_first_k_dense_replace():
    config = _config("DeepSeek-V3")
    assert _refusal(config | {"first_k_dense_replace": config["num_hidden_layers"]}).field == "first_k_dense_replace"
    assert _refusal(config | {"moe_layer_freq": 100, "first_k_dense_replace": 1}).field == "moe_layer_freq"


def test_inconsistent_shapes_become_a_user_error():
    error = _refusal(_config("Llama-3.1-8B") | {"num_attention_heads": 24})  # 4096 is not a multiple of 24
    assert error.field == "hidden_size" and "num_attention_heads=24" in error.problem


def test_bad_path_and_bad_json_name_the_model_field(tmp_path):
    with pytest.raises(MegapilotError) as missing:
        load_hf_config(tmp_path / "nope.json")
    assert missing.value.field == "model"
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    with pytest.raises(MegapilotError) as bad_json:
        load_hf_config(broken)
    assert bad_json.value.field == "model"
    broken.write_text("[1, 2]")
    with pytest.raises(MegapilotError, match="not an object"):
        load_hf_config(tmp_path)


# The other JSON files of a checkpoint folder, as users pass them for its config.json.
COMPANION_FILES = {
    "tokenizer_config.json": ({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
                               "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True},
                              "tokenizer"),
    "generation_config.json": ({"_from_model_config": True, "bos_token_id": 128000, "eos_token_id": 128001,
                                "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                "transformers_version": "4.43.0.dev0"}, "generation"),
    "adapter_config.json": ({"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.1-8B", "r": 16,
                             "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}, "meta-llama/Llama-3.1-8B"),
    "model.safetensors.index.json": ({"metadata": {"total_size": 16060522496},
                                      "weight_map": {"lm_head.weight": "model-00004-of-00004.safetensors"}},
                                     "index"),
    "params.json": ({"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256,
                     "ffn_dim_multiplier": 1.3, "multiple_of": 1024, "norm_eps": 1e-05, "rope_theta": 500000.0},
                    "params.json"),
    "special_tokens_map.json": ({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, "tokenizer"),
}


@pytest.mark.parametrize("file_name", list(COMPANION_FILES))
def test_a_checkpoints_other_json_file_is_refused_as_what_it_is_not_asked_for_a_model_type(tmp_path, file_name):
    # a tokenizer_config.json read "model.num_layers: Field required" (no fix), a generation_config.json (or either
    # saved as config.json) was told to add a model_type, which would not have made it a model's config
    from megapilot.catalog import get_model

    content, named = COMPANION_FILES[file_name]
    (tmp_path / file_name).write_text(json.dumps(content))
    (tmp_path / "as_config").mkdir()
    (tmp_path / "as_config" / "config.json").write_text(json.dumps(content))
    for path in (tmp_path / file_name, tmp_path / "as_config"):
        with pytest.raises(MegapilotError) as info:
            get_model(str(path))
        error = info.value
        assert error.field == "model" and "\n" not in str(error), str(error)
        assert named in error.problem + error.fix and "config.json" in error.fix, str(error)
        assert "model_type" not in error.fix, str(error)


def test_gpt2_with_a_non_gelu_activation_is_refused():
    assert _refusal(_config("gpt2") | {"activation_function": "relu"}).field == "activation_function"


# ---- newer families: GPT-OSS, Llama 4, Phi-3, Qwen3-Next ----------------------------------------


def test_gpt_oss_counts_its_biases_sinks_and_experts_to_the_published_total():
    from megapilot.estimate.params import count_params

    model = from_hf_config(_config("gpt-oss-20b"), "gpt-oss-20b")
    assert (model.add_bias_linear, model.softmax_type, model.mlp_activation) == (True, "learnable", "quick_geglu")
    assert [model.attention_window(i) for i in range(4)] == [128, None, 128, None]  # layer_types alternate
    counts = count_params(model)
    assert counts.total == 20_914_757_184  # the README's count; model card 20.9B
    assert round(counts.active_without_input_embedding / 1e9, 1) == 3.6  # model card 3.6B active


def test_gpt_oss_with_another_window_pattern_is_refused_naming_layer_types():
    config = _config("gpt-oss-20b") | {"layer_types": ["full_attention"] * 24}
    assert _refusal(config).field == "layer_types"


def test_llama4_scout_reads_the_text_config_with_shared_expert_and_sigmoid_router():
    from megapilot.estimate.params import count_params

    model = from_hf_config(_config("Llama-4-Scout-17B-16E-Instruct"), "scout")
    assert model.moe is not None and model.moe.router_score_function == "sigmoid"
    assert (model.moe.num_experts, model.moe.router_topk, model.moe.shared_expert_ffn_hidden_size) == (16, 1, 8192)
    assert model.num_moe_layers == 48 and model.attention_window(0) == 8192 and model.attention_window(3) is None
    counts = count_params(model)
    # 109B is the multimodal checkpoint; its text model (what pretrain_gpt.py builds) is 1.1 % smaller, and the
    # 17B active figure is the text model's.
    assert counts.total == 107_769_861_120
    assert abs(counts.active / 17e9 - 1) < 0.02


def test_llama4_published_total_is_text_model_plus_vision_encoder_and_projector():
    from megapilot.catalog import get_preset
    from megapilot.catalog.hf import llama4_vision_params
    from megapilot.estimate.params import count_params

    config = _config("Llama-4-Scout-17B-16E-Instruct")
    vision = llama4_vision_params(config)
    # 34 encoder layers of 1408 wide (biased q/k/v/o, biased 5632 MLP, two LayerNorms), patch embedding, class
    # token, 577 learned positions, two outer LayerNorms, the 5632->4096->4096 adapter, the 4096->5120 projector.
    per_layer = 4 * (1408 * 1408 + 1408) + 2 * 1408 * 5632 + 5632 + 1408 + 4 * 1408
    assert vision == 34 * per_layer + 3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 4 * 1408 + 5632 * 4096 \
        + 4096 * 4096 + 4096 * 5120
    text = count_params(from_hf_config(config, "scout")).total
    assert abs((text + vision) / 109e9 - 1) < 0.005 < abs(text / 109e9 - 1)  # like with like: within 0.5 %
    for name in ("llama4-scout", "llama4-maverick"):  # one vision tower in both checkpoints
        assert get_preset(name).published_extra_params == vision
    with pytest.raises(MegapilotError) as missing:
        llama4_vision_params({k: v for k, v in config.items() if k != "vision_config"})
    assert missing.value.field == "vision_config"


def test_phi3_maps_like_llama():
    phi3 = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_hidden_layers": 32,
            "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": False}
    from megapilot.estimate.params import count_params

    assert count_params(from_hf_config(phi3, "phi3-mini")).total == 3_821_079_552  # published 3.8B
    assert from_hf_config(phi3 | {"partial_rotary_factor": 0.75}, "phi-partial").rotary_percent == 0.75


def test_qwen3_next_maps_its_gated_deltanet_gated_attention_and_gated_shared_expert():
    from megapilot.estimate.params import count_params

    model = from_hf_config(_config("Qwen3-Next-80B-A3B-Instruct"), "qwen3-next")
    gdn = model.gated_delta_net
    assert (gdn.key_heads, gdn.value_heads, gdn.key_head_dim, gdn.value_head_dim, gdn.conv_kernel,
            gdn.full_attention_freq) == (16, 32, 128, 128, 4, 4)
    assert [model.is_linear_attention_layer(i) for i in range(8)] == [True, True, True, False] * 2
    assert model.attention_output_gate and model.qk_layernorm and not model.add_qkv_bias
    assert model.head_dim == 256 and model.kv_heads == 2 and model.rotary_percent == 0.25
    assert model.norm_zero_centered and not model.tie_embeddings
    moe = model.moe
    assert (moe.num_experts, moe.router_topk, moe.moe_ffn_hidden_size) == (512, 10, 512)
    assert moe.shared_expert_ffn_hidden_size == 512 and moe.shared_expert_gate and not moe.router_pre_softmax
    counted = count_params(model)
    assert abs(counted.total / 1e9 - 80) <= 0.4  # the model card's "80B in total" (0.5 %)
    # "3B activated": the top-10 experts, the shared expert and the mixers, embeddings and output layer apart
    assert 3.0 <= (counted.active - counted.embedding - counted.output_layer) / 1e9 < 3.5


def test_nemotron3_nano_hybrid_counts_its_mamba_moe_and_attention_layers_to_the_published_size():
    from megapilot.estimate.params import count_params

    model = from_hf_config(_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"), "nemotron3-nano")
    pattern = model.hybrid_override_pattern or ""
    assert model.is_hybrid and model.mamba is not None and model.moe is not None
    assert (pattern.count("M"), pattern.count("E"), pattern.count("*")) == (23, 23, 6)
    assert [model.layer_kind(i) for i in range(3)] == ["mamba", "moe", "mamba"]
    counts = count_params(model)
    assert abs(counts.total / 31.6e9 - 1) < 0.005  # published ≈31.6B
    assert abs(counts.active / 3.6e9 - 1) < 0.01  # ≈3.6B with embeddings
    assert abs(counts.active_without_input_embedding / 3.2e9 - 1) < 0.02  # ≈3.2B without


def test_a_hybrid_pattern_with_another_letter_or_length_is_refused():
    config = _config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert _refusal(config | {"hybrid_override_pattern": "MX" * 26}).field == "hybrid_override_pattern"
    assert _refusal(config | {"mlp_hidden_act": "silu"}).field == "mlp_hidden_act"


def test_a_hybrid_pattern_shorter_than_num_hidden_layers_is_refused_not_planned_as_its_length():
    # a 3-letter pattern beside num_hidden_layers=52 was planned as a 3-layer model; the checkpoint's own config
    # class asserts the two agree
    config = _config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"hybrid_override_pattern": "MEM"}
    error = _one_line_refusal(config, "hybrid_override_pattern")
    assert "3" in error.problem and "52" in error.problem and "num_hidden_layers" in error.fix


# ---- model semantics: rope scaling, routing, windows, and what Megatron cannot express ------------------------


def _deepseek_v3(**changes: object) -> dict:
    return _config("DeepSeek-V3") | changes


def test_llama31_rope_scaling_is_read():
    scaling = load_hf_config(HF_CONFIGS / "Llama-3.1-8B.json").rope_scaling
    assert scaling is not None and scaling.type == "llama3"
    assert (scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor) == (8.0, 1.0, 4.0)
    assert scaling.original_max_position_embeddings == 8192


def test_deepseek_v3_router_and_yarn_mean_what_the_config_says():
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V3.json")
    moe = model.moe
    assert moe is not None and moe.router_score_function == "sigmoid" and not moe.router_pre_softmax
    assert (moe.router_num_groups, moe.router_group_topk, moe.router_topk_scaling_factor) == (8, 4, 2.5)
    assert moe.router_dtype == "fp32"
    assert model.rope_scaling is not None and model.rope_scaling.type == "yarn"
    assert (model.rope_scaling.factor, model.rope_scaling.mscale_all_dim) == (40.0, 1.0)
    assert model.mla is not None and model.mla.latent_layernorms


def test_deepseek_v2_lite_keeps_its_top6_softmax_weights_unrenormalised():
    moe = load_hf_config(HF_CONFIGS / "DeepSeek-V2-Lite.json").moe
    assert moe is not None and moe.router_pre_softmax and moe.router_topk_scaling_factor is None
    assert moe.router_num_groups is None  # greedy: every expert eligible


def test_qwen2_moe_norm_topk_prob_false_is_pre_softmax_and_qwen3_true_is_not():
    qwen2 = dict(_config("Qwen3-30B-A3B"), architectures=["Qwen2MoeForCausalLM"], norm_topk_prob=False,
                 shared_expert_intermediate_size=5632)
    assert from_hf_config(qwen2, "qwen2-moe").moe.router_pre_softmax
    assert not load_hf_config(HF_CONFIGS / "Qwen3-30B-A3B.json").moe.router_pre_softmax


def test_mistral_window_covers_every_layer():
    mistral = dict(_config("Llama-3.1-8B"), architectures=["MistralForCausalLM"], sliding_window=4096,
                   rope_scaling=None)
    assert from_hf_config(mistral, "mistral").sliding_window == 4096
    assert load_hf_config(HF_CONFIGS / "Mixtral-8x7B-v0.1.json").sliding_window is None  # null: full attention


def test_deepseek_v2_group_limited_greedy_maps_when_megatron_scores_groups_alike():
    # Megatron scores a group by its top num_experts_per_tok // topk_group experts; V2 by its best one.
    v2 = _deepseek_v3(architectures=["DeepseekV2ForCausalLM"], scoring_func="softmax",
                      topk_method="group_limited_greedy",
                      num_experts_per_tok=4, n_group=8, topk_group=4, norm_topk_prob=False, routed_scaling_factor=16.0)
    moe = from_hf_config(v2, "v2-like").moe
    assert (moe.router_num_groups, moe.router_group_topk, moe.router_topk_scaling_factor) == (8, 4, 16.0)
    assert moe.router_pre_softmax


@pytest.mark.parametrize(("changes", "field"), [
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling.rope_type"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0, "attention_factor": 0.8}), "rope_scaling.attention_factor"),
    (dict(rope_scaling={"type": "yarn"}), "rope_scaling.factor"),
    (dict(rope_scaling={"factor": 8.0}), "rope_scaling.rope_type"),  # was read as no scaling: the 8x gone unsaid
    (dict(scoring_func="sqrtsoftplus"), "scoring_func"),
    (dict(norm_topk_prob=False), "norm_topk_prob"),  # Megatron's sigmoid router always renormalises
    (dict(topk_group=2), "topk_group"),  # 8 // 2 = 4 experts would score a group; V3 uses its best 2
    (dict(topk_method="group_limited_greedy"), "topk_group"),  # V2's rule scores a group by its best expert
])
def test_routing_and_rope_megatron_cannot_express_are_refused_by_field(changes, field):
    with pytest.raises(MegapilotError) as err:
        from_hf_config(_deepseek_v3(**changes), "deepseek-variant")
    assert err.value.field == field


def test_group_limited_softmax_with_renormalised_weights_is_refused():
    v2 = _deepseek_v3(architectures=["DeepseekV2ForCausalLM"], scoring_func="softmax",
                      topk_method="group_limited_greedy",
                      num_experts_per_tok=4, n_group=8, topk_group=4, norm_topk_prob=True)
    with pytest.raises(MegapilotError) as err:
        from_hf_config(v2, "v2-like")
    assert err.value.field == "norm_topk_prob"


# ---- Nemotron-H (dense hybrids) and Nemotron 3 Super ------------------------------------------------------------

# Nemotron-H-8B as Hugging Face's NemotronHConfig states it (its defaults are documented as the 8B's; vLLM's
# transformers_utils/configs/nemotron_h.py), with the 8K context of nvidia/Nemotron-H-8B-Base-8K.
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072,
    "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_attention_heads": 32, "head_dim": 128, "num_key_value_heads": 8, "mlp_hidden_act": "relu2",
    "attention_bias": False, "mlp_bias": False, "use_bias": False, "layer_norm_epsilon": 1e-5,
    "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "conv_kernel": 4,
    "use_conv_bias": True, "mamba_proj_bias": False, "max_position_embeddings": 8192,
    "mtp_hybrid_override_pattern": "*E", "num_nextn_predict_layers": 0,
}


def test_nemotron_h_8b_config_imports_as_the_preset_and_counts_its_layer_kinds():
    from megapilot.catalog import get_model
    from megapilot.estimate.params import count_params

    imported = from_hf_config(NEMOTRON_H_8B, "nemotron-h-8b")
    preset = get_model("nemotron-h-8b")
    assert imported.model_dump(exclude={"name"}) == preset.model_dump(exclude={"name"})
    assert imported.moe is None and imported.position_embedding == "none" and imported.kv_channels is None
    kinds = [imported.layer_kind(i) for i in range(imported.num_layers)]
    assert (kinds.count("mamba"), kinds.count("mlp"), kinds.count("attention")) == (24, 24, 4)  # card: 4 attention
    assert count_params(imported).total == count_params(preset).total


def test_nemotron_h_56b_has_the_layer_mix_its_card_states():
    from megapilot.catalog import get_model

    model = get_model("nemotron-h-56b")
    kinds = [model.layer_kind(i) for i in range(model.num_layers)]
    # Model card: 54 Mamba-2, 54 MLP and 10 self-attention layers.
    assert (kinds.count("mamba"), kinds.count("mlp"), kinds.count("attention")) == (54, 54, 10)
    assert model.mamba is not None and model.mamba.inner_size(model.hidden_size) == 2 * model.hidden_size


def test_nemotron3_super_counts_its_latent_moe_and_hybrid_mtp_module_to_the_published_size():
    """The checkpoint's safetensors headers: 123,611,012,096 BF16 weights, 2,942,324,736 of them in the MTP module,
    12.77B active; the 41 fp32 routing-bias buffers (512 each) are kept apart there and counted here."""
    from megapilot.estimate.params import count_params, layer_params

    model = from_hf_config(_config("NVIDIA-Nemotron-3-Super-120B-A12B-BF16"), "nemotron3-super")
    assert model.moe is not None and model.moe.latent_size == 1024 and model.num_moe_layers == 40
    assert (model.mtp_num_layers, model.mtp_hybrid_pattern) == (1, "*E")
    assert [model.layer_kind(i) for i in model.mtp_layer_indices] == ["attention", "moe"]
    routing_buffers = 41 * 512
    counts = count_params(model)
    assert counts.total == 123_611_012_096 + routing_buffers
    assert counts.mtp == 2_942_324_736 + 512
    assert counts.active == 12_770_216_960 + 40 * 512
    moe_layer = layer_params(model, 1)
    # experts 1024 -> 2688 -> 1024 (squared ReLU, two matrices); projections 4096 -> 1024 -> 4096, whole per TP rank
    assert moe_layer.routed_experts == 512 * 2 * 1024 * 2688
    assert moe_layer.latent_projections == 2 * 4096 * 1024
    assert moe_layer.by_sharding.replicated == moe_layer.norms + moe_layer.router + moe_layer.latent_projections


def test_a_hybrid_mtp_depth_without_its_pattern_is_refused_by_field():
    config = _config("NVIDIA-Nemotron-3-Super-120B-A12B-BF16")
    assert _refusal(config | {"mtp_hybrid_override_pattern": None}).field == "mtp_hybrid_override_pattern"
    main_only = from_hf_config(config | {"num_nextn_predict_layers": 0}, "super-main-model")
    assert main_only.mtp_num_layers == 0


# ---- Llama-Nemotron (DeciLM block configs) ---------------------------------------------------------------------


def _decilm_block(kv_group: int | None, ffn_mult: float | None, *, attention_no_op: bool = False) -> dict:
    return {"attention": {"n_heads_in_group": kv_group, "no_op": attention_no_op, "replace_with_linear": False},
            "ffn": {"ffn_mult": ffn_mult, "no_op": False, "replace_with_linear": False}}


# The top-level fields and first eight blocks of nvidia/Llama-3_3-Nemotron-Super-49B-v1's config.json (as copied
# into Megatron-Bridge's heterogeneous-config tests): layers 0-5 attend with 8 KV heads, layers 6-7 have no attention,
# ffn_mult is 2.625 on layer 0 and 5.25 on layers 1-5.
NEMOTRON_SUPER_49B = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 8192,
    "num_attention_heads": 64, "num_hidden_layers": 8, "intermediate_size": None, "num_key_value_heads": None,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "tie_word_embeddings": False,
    "block_configs": [_decilm_block(8, 2.625)] + [_decilm_block(8, 5.25)] * 5
    + [_decilm_block(None, 2.625, attention_no_op=True)] * 2,
}


def test_llama_nemotron_per_layer_blocks_import_as_megatron_cores_widths_and_kv_heads():
    from megapilot.estimate.params import layer_params

    model = from_hf_config(NEMOTRON_SUPER_49B, "nas-8")
    assert model.layer_blocks is not None
    # Megatron-Core's widths: int(2 * 2.625 * 8192 / 3) = 14336, int(2 * 5.25 * 8192 / 3) = 28672; the model-wide
    # width and KV heads are the most common full layer's
    assert [model.layer_ffn_hidden_size(i) for i in range(8)] == [14336] + [28672] * 5 + [14336] * 2
    assert (model.ffn_hidden_size, model.kv_heads) == (28672, 8)
    assert [block.attention for block in model.layer_blocks] == ["full"] * 6 + ["none"] * 2
    no_attention = layer_params(model, 6)
    assert no_attention.attention == 0 and no_attention.norms == 8192  # the pre-MLP norm only
    linear = NEMOTRON_SUPER_49B | {"block_configs": [_decilm_block(8, 5.25)] * 7 + [
        {"attention": {"n_heads_in_group": None, "no_op": False, "replace_with_linear": True},
         "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False}}]}
    replaced = layer_params(from_hf_config(linear, "nas-linear"), 7)
    assert (replaced.attention, replaced.mlp, replaced.norms) == (8192 * 8192, 0, 8192)


def test_decilm_with_one_block_shape_imports_as_the_llama_it_is():
    from megapilot.estimate.params import count_params

    uniform = NEMOTRON_SUPER_49B | {"num_hidden_layers": 80, "block_configs": [_decilm_block(8, 3.5)] * 80}
    model = from_hf_config(uniform, "decilm-uniform")
    llama = load_hf_config(HF_CONFIGS / "Llama-3.1-70B.json")
    assert (model.ffn_hidden_size, model.num_query_groups) == (19200, 8)  # int(2 * 3.5 * 8192 / 3) -> 19200
    assert model.model_dump(exclude={"name", "hf_architecture", "ffn_hidden_size"}) == llama.model_dump(
        exclude={"name", "hf_architecture", "ffn_hidden_size"})
    assert count_params(model).total < count_params(llama).total
    bad_group = NEMOTRON_SUPER_49B | {"block_configs": [_decilm_block(7, 5.25)] * 8}
    assert _refusal(bad_group).field == "block_configs[0].attention.n_heads_in_group"
    assert _refusal(NEMOTRON_SUPER_49B | {"block_configs": [_decilm_block(8, 5.25), "attention"]}).field \
        == "block_configs[1]"
    assert _refusal(NEMOTRON_SUPER_49B | {"block_configs": []}).field == "block_configs"


# ---- transformers >= 5 writes RoPE as one `rope_parameters` object ----------------------------------------------


def _as_rope_parameters(config: dict) -> dict:
    """The config as transformers >= 5 saves it: base, rotary share and scaling moved into `rope_parameters`."""
    moved = {key: config.pop(key) for key in ("rope_theta", "partial_rotary_factor") if key in config}
    scaling = config.pop("rope_scaling", None) or {"rope_type": "default"}
    return config | {"rope_parameters": moved | scaling}


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Qwen3-30B-A3B", "gpt-oss-20b",
                                  "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"])
def test_a_config_saved_with_rope_parameters_reads_as_the_same_model(name):
    """A silent default here would put the wrong --rotary-base (and RoPE scaling) into the launch script."""
    old = from_hf_config(_config(name), name)
    new = from_hf_config(_as_rope_parameters(_config(name)), name)
    assert new == old
    assert "rope_theta" not in _as_rope_parameters(_config(name))


def test_rope_parameters_per_attention_kind_must_agree():
    config = _as_rope_parameters(_config("Llama-3.1-8B"))
    same = config | {"rope_parameters": {"full_attention": config["rope_parameters"],
                                         "sliding_attention": config["rope_parameters"]}}
    assert from_hf_config(same, "m").rotary_base == 500_000
    local = config["rope_parameters"] | {"rope_theta": 10_000.0}
    differ = config | {"rope_parameters": {"full_attention": config["rope_parameters"], "sliding_attention": local}}
    with pytest.raises(MegapilotError) as refused:
        from_hf_config(differ, "m")
    assert refused.value.field == "rope_parameters"


# ---- GLM-4.5 (Glm4MoeForCausalLM) ---------------------------------------------------------------------------

# transformers 5.24's Glm4MoeConfig defaults, written out as a config.json would hold them (its docstring: "a
# configuration similar to GLM-4.5-Air"); `partial_rotary_factor` is the 0.5 its __post_init__ sets.
GLM4_MOE_DEFAULTS = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 4096,
    "intermediate_size": 10944, "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
    "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "norm_topk_prob": True, "use_qk_norm": False, "num_nextn_predict_layers": 1,
    "partial_rotary_factor": 0.5, "head_dim": 128, "rope_theta": 1000000,
}


def test_glm4_moe_reads_as_megatron_bridge_maps_it():
    model = from_hf_config(GLM4_MOE_DEFAULTS, "glm-4.5-air-shaped")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups,
            model.kv_channels) == (46, 4096, 96, 8, 128)
    assert model.rotary_percent == 0.5 and model.mtp_num_layers == 1 and model.rotary_base == 1_000_000
    assert not model.add_qkv_bias and not model.qk_layernorm and not model.add_bias_linear
    moe = model.moe
    assert moe is not None
    assert (moe.num_experts, moe.router_topk, moe.moe_ffn_hidden_size, moe.shared_expert_ffn_hidden_size) == \
        (128, 8, 1408, 1408)
    assert (moe.first_k_dense_layers, moe.moe_layer_freq) == (1, 1)
    assert moe.router_score_function == "sigmoid" and moe.router_expert_bias and not moe.router_pre_softmax
    assert moe.router_topk_scaling_factor is None and moe.router_num_groups is None
    # GLM-4.5 (355B-A32B): QKV bias, q/k norm, 2.5x routed scaling, three dense layers, group-limited routing
    big = from_hf_config(GLM4_MOE_DEFAULTS | {"attention_bias": True, "use_qk_norm": True, "first_k_dense_replace": 3,
                                             "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4}, "glm")
    assert big.add_qkv_bias and big.qk_layernorm and not big.add_bias_linear
    assert big.moe is not None and big.moe.first_k_dense_layers == 3
    assert big.moe.router_topk_scaling_factor == 2.5
    assert (big.moe.router_num_groups, big.moe.router_group_topk) == (8, 4)


def test_glm4_moe_air_shape_has_the_published_total_and_active_parameters():
    """GLM-4.5-Air's model card: 106B total, 12B active (the decoder, without its MTP module and embeddings)."""
    counts = count_params(from_hf_config(GLM4_MOE_DEFAULTS | {"num_nextn_predict_layers": 0}, "air"))
    embedding = 2 * 151552 * 4096  # input embedding and untied output layer
    assert counts.total == pytest.approx(106e9, rel=0.01)
    assert counts.active - embedding == pytest.approx(12e9, rel=0.02)


def _as_layer_lists(config: dict) -> dict:
    """A Nemotron-H config as transformers >= 5 saves it: the pattern strings as lists of layer kinds, and no
    layer count (it follows from the list)."""
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    saved = {k: v for k, v in config.items() if k not in ("hybrid_override_pattern", "num_hidden_layers",
                                                            "mtp_hybrid_override_pattern")}
    saved["layers_block_type"] = [kinds[c] for c in config["hybrid_override_pattern"]]
    if config.get("mtp_hybrid_override_pattern"):
        saved["mtp_layers_block_type"] = [kinds[c] for c in config["mtp_hybrid_override_pattern"]]
    return saved


@pytest.mark.parametrize("name", ["NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-3-Super-120B-A12B-BF16"])
def test_a_hybrid_saved_with_layer_kind_lists_reads_as_the_same_model(name):
    assert from_hf_config(_as_layer_lists(_config(name)), name) == from_hf_config(_config(name), name)


def test_an_unknown_layer_kind_is_refused_by_field():
    config = _as_layer_lists(_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    config["layers_block_type"][0] = "indexed_attention"
    with pytest.raises(MegapilotError) as refused:
        from_hf_config(config, "m")
    assert refused.value.field == "layers_block_type" and "indexed_attention" in refused.value.problem


def test_qwen3_next_saved_with_layer_types_reads_as_the_same_model():
    """transformers >= 5 drops full_attention_interval for the list of layer kinds it stands for."""
    config = _as_rope_parameters(_config("Qwen3-Next-80B-A3B-Instruct"))
    every = config.pop("full_attention_interval")
    config["layer_types"] = ["linear_attention" if (i + 1) % every else "full_attention"
                             for i in range(config["num_hidden_layers"])]
    assert from_hf_config(config, "q") == from_hf_config(_config("Qwen3-Next-80B-A3B-Instruct"), "q")
    config["layer_types"][0] = "full_attention"
    with pytest.raises(MegapilotError) as refused:
        from_hf_config(config, "q")
    assert refused.value.field == "layer_types"


def test_deepseek_v4_imports_as_mla_with_compressed_attention_hash_layers_and_hyper_connections():
    """DeepSeek-V4-Flash as Megatron-LM dev's dsv4_hybrid and Megatron-Bridge's DeepSeek-V4 bridge read it."""
    model = load_hf_config(HF_CONFIGS / "DeepSeek-V4-Flash.json")
    mla, csa, moe = model.mla, model.csa, model.moe
    assert mla is not None and csa is not None and moe is not None and model.dsa is not None
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim) == (
        1024, 512, 448, 64, 512)
    assert (model.dsa.indexer_heads, model.dsa.indexer_head_dim, model.dsa.topk) == (64, 128, 512)
    assert len(csa.compress_ratios) == 44 and csa.compress_ratios[:4] == (0, 0, 4, 128) and csa.ratio(43) == 0
    assert (csa.o_groups, csa.o_lora_rank, model.sliding_window, model.softmax_type) == (8, 1024, 128, "learnable")
    assert (model.residual_streams, model.activation_clamp, model.mtp_num_layers) == (4, 10.0, 1)
    assert (moe.num_hash_layers, moe.router_score_function, moe.router_topk, moe.first_k_dense_layers) == (
        3, "sqrtsoftplus", 6, 0)
    assert moe.router_expert_bias and model.num_moe_layers == 43
    # the indexer runs on the ratio-4 layers only; the MTP layer (window only) is costed as layer 0
    assert [i for i in range(6) if model.runs_dsa_indexer(i)] == [2, 4]
    assert model.mtp_layer_indices == (0,)


def test_deepseek_v4_counts_to_its_published_sizes():
    """284B on the model card is the main model; the Hub's 291B adds the MTP module; the card's 13B active leaves
    out the input embedding, as DeepSeek-V3's 37B does (13.8B with it)."""
    counts = count_params(load_hf_config(HF_CONFIGS / "DeepSeek-V4-Flash.json"))
    assert counts.main_model == pytest.approx(284e9, rel=0.005)
    assert counts.total == pytest.approx(291e9, rel=0.005)
    assert counts.active_without_input_embedding == pytest.approx(13e9, abs=0.5e9)
    assert counts.active - 13e9 > 0.5e9


@pytest.mark.parametrize(("change", "field"), [
    (dict(compress_ratios=[8] * 44), "compress_ratios"),
    (dict(compress_ratios=[0, 4]), "compress_ratios"),
    (dict(compress_ratios="4"), "compress_ratios"),
    (dict(num_hash_layers=44), "num_hash_layers"),
    (dict(qk_rope_head_dim=512), "qk_rope_head_dim"),
    (dict(o_groups=0), "model.o_groups"),
    (dict(hc_mult=0), "model.residual_streams"),
    (dict(scoring_func="softplus"), "scoring_func"),
])
def test_deepseek_v4_out_of_range_fields_are_refused_by_field(change, field):
    with pytest.raises(MegapilotError) as refused:
        from_hf_config(_config("DeepSeek-V4-Flash") | change, "v4")
    assert refused.value.field == field


def test_deepseek_v4_ratios_of_the_main_model_alone_give_the_mtp_layer_a_window():
    config = _config("DeepSeek-V4-Flash")
    config["compress_ratios"] = config["compress_ratios"][:43]
    assert from_hf_config(config, "v4") == from_hf_config(_config("DeepSeek-V4-Flash"), "v4")


# ---- values of the wrong type, non-finite or out of range: refused by the config's own field ---------------------


def _llama(**changes: object) -> dict:
    return _config("Llama-3.1-8B") | changes


def _one_line_refusal(config: dict, field: str) -> MegapilotError:
    error = _refusal(config)
    assert error.field == field and error.fix
    assert "\n" not in str(error) and str(error).startswith(f"{field}: ")
    return error


@pytest.mark.parametrize(("config", "field"), [
    (_llama(rope_theta="abc"), "rope_theta"),  # int() raised a ValueError the CLI called an internal error
    (_llama(rope_theta=float("nan")), "rope_theta"),  # Python's json reads NaN
    (_llama(rope_theta=float("inf")), "rope_theta"),
    (_llama(rope_theta=0.5), "rope_theta"),  # would truncate to --rotary-base 0
    (_llama(rope_theta=True), "rope_theta"),
    (_llama(rms_norm_eps="1e-5"), "rms_norm_eps"),  # float() read the string silently
    (_llama(partial_rotary_factor=float("nan")), "partial_rotary_factor"),
    (_config("Mixtral-8x7B-v0.1") | {"router_aux_loss_coef": "0.02"}, "router_aux_loss_coef"),
    (_config("DeepSeek-V3") | {"aux_loss_alpha": float("nan")}, "aux_loss_alpha"),
    (_config("DeepSeek-V3") | {"routed_scaling_factor": float("-inf")}, "routed_scaling_factor"),
    (_config("gpt2") | {"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon"),
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"layer_norm_epsilon": float("nan")}, "layer_norm_epsilon"),
    (_config("GLM-5") | {"index_topk_freq": "2"}, "index_topk_freq"),
    (_config("GLM-5") | {"index_skip_topk_offset": 2.5}, "index_skip_topk_offset"),
    (_as_rope_parameters(_llama(rope_theta="500000")), "rope_theta"),  # transformers >= 5's rope_parameters
])
def test_a_number_of_the_wrong_type_or_not_finite_is_refused_by_its_field(config, field):
    _one_line_refusal(config, field)


@pytest.mark.parametrize(("config", "field"), [
    (_llama(tie_word_embeddings="yes"), "tie_word_embeddings"),
    (_llama(tie_word_embeddings="false"), "tie_word_embeddings"),  # truthy: it tied the head
    (_llama(tie_word_embeddings=0), "tie_word_embeddings"),
    (_config("gpt2") | {"tie_word_embeddings": "true"}, "tie_word_embeddings"),
    (_llama(attention_bias="false", mlp_bias="false"), "attention_bias"),
    (_config("DeepSeek-V3") | {"norm_topk_prob": "true"}, "norm_topk_prob"),
    (_config("Qwen3-30B-A3B") | {"norm_topk_prob": 1}, "norm_topk_prob"),
    (_config("Qwen3-30B-A3B") | {"use_sliding_window": "false"}, "use_sliding_window"),
    (GLM4_MOE_DEFAULTS | {"use_qk_norm": "no"}, "use_qk_norm"),
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"use_bias": "false"}, "use_bias"),
])
def test_a_flag_that_is_not_a_json_boolean_is_refused_by_its_field(config, field):
    assert "JSON boolean" in _one_line_refusal(config, field).problem


@pytest.mark.parametrize(("config", "field"), [
    (_llama(num_key_value_heads=0), "num_key_value_heads"),  # read as absent: silently full multi-head attention
    (_llama(num_key_value_heads=-8), "num_key_value_heads"),
    (_llama(num_key_value_heads=5), "num_key_value_heads"),  # 5 does not divide 32 heads
    (_llama(num_key_value_heads="8"), "num_key_value_heads"),
    (OTHER_FAMILIES["Qwen3-8B"][0] | {"head_dim": 0}, "head_dim"),  # read as absent: hidden / heads
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"num_key_value_heads": 0}, "num_key_value_heads"),
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"head_dim": 0}, "head_dim"),
    (_config("DeepSeek-V3") | {"n_group": 7}, "n_group"),  # 7 does not divide 256 experts
    (_config("DeepSeek-V3") | {"n_group": 0}, "n_group"),
    (_config("DeepSeek-V3") | {"topk_group": 9}, "topk_group"),  # more groups picked than the 8 there are
    (_config("DeepSeek-V3") | {"topk_group": 0}, "topk_group"),
    (GLM4_MOE_DEFAULTS | {"n_group": 3}, "n_group"),  # 3 does not divide 128 experts
    (OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0] | {"mlp_only_layers": "0,1"}, "mlp_only_layers"),
    (NEMOTRON_SUPER_49B | {"block_configs": [_decilm_block(0, 5.25)] * 8},
     "block_configs[0].attention.n_heads_in_group"),
])
def test_a_shape_out_of_range_is_refused_by_its_field(config, field):
    _one_line_refusal(config, field)


def test_the_group_routing_megatron_accepts_still_reads():
    moe = from_hf_config(_config("DeepSeek-V3") | {"n_group": 8, "topk_group": 8}, "all-groups").moe
    assert moe is not None and moe.router_num_groups is None  # every group picked: no grouping
    assert from_hf_config(_llama(num_key_value_heads=32, head_dim=128), "mha").num_query_groups is None


# ---- a key left out takes the default of the family's configuration class in transformers -----------------------

# config, its family's norm_topk_prob default (transformers' configuration_<family>.py)
NORM_TOPK_PROB_DEFAULTS = {
    "DeepSeek-V3": (_config("DeepSeek-V3"), True),
    "DeepSeek-V3.2": (_config("DeepSeek-V3.2"), True),
    "DeepSeek-V4-Flash": (_config("DeepSeek-V4-Flash"), True),
    "DeepSeek-V2-Lite": (_config("DeepSeek-V2-Lite"), False),
    "GLM-5": (_config("GLM-5"), True),
    "GLM-4.5-Air": (GLM4_MOE_DEFAULTS, True),
    "Qwen3-30B-A3B": (_config("Qwen3-30B-A3B"), False),
    "Qwen3-Next-80B-A3B-Instruct": (_config("Qwen3-Next-80B-A3B-Instruct"), True),
    "Qwen1.5-MoE-A2.7B": (OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0], False),
}


@pytest.mark.parametrize("name", sorted(NORM_TOPK_PROB_DEFAULTS))
def test_a_config_without_norm_topk_prob_reads_as_its_transformers_default(name):
    config, default = NORM_TOPK_PROB_DEFAULTS[name]
    left_out = {key: value for key, value in config.items() if key != "norm_topk_prob"}
    assert from_hf_config(left_out, name) == from_hf_config(config | {"norm_topk_prob": default}, name)


def test_deepseek_v3_without_norm_topk_prob_is_renormalised_not_refused():
    config = {key: value for key, value in _config("DeepSeek-V3").items() if key != "norm_topk_prob"}
    moe = from_hf_config(config, "v3").moe
    assert moe is not None and moe.router_score_function == "sigmoid" and not moe.router_pre_softmax


def test_every_family_that_reads_norm_topk_prob_has_its_default():
    from megapilot.catalog.hf import _ABSENT_KEY_DEFAULTS, _ARCHITECTURE_FAMILY

    families = {from_hf_config(config, "x").hf_architecture for config, _ in NORM_TOPK_PROB_DEFAULTS.values()}
    assert {_ARCHITECTURE_FAMILY[architecture] for architecture in families} == {
        family for family, defaults in _ABSENT_KEY_DEFAULTS.items() if "norm_topk_prob" in defaults}


def test_deepseek_v3_without_its_router_keys_reads_as_transformers_builds_it():
    """DeepseekV3Config: n_group 8, topk_group 4; its router is always sigmoid with the noaux_tc expert bias."""
    full = _config("DeepSeek-V3")
    left_out = {key: value for key, value in full.items()
                if key not in ("scoring_func", "topk_method", "n_group", "topk_group", "norm_topk_prob")}
    assert from_hf_config(left_out, "v3") == from_hf_config(full, "v3")
    moe = from_hf_config(left_out, "v3").moe
    assert moe is not None and moe.router_num_groups == 8 and moe.router_group_topk == 4


# ---- a config.json that names no family --------------------------------------------------------------------------


def test_a_config_naming_neither_model_type_nor_architectures_is_told_to_name_one():
    config = {key: value for key, value in _config("Llama-3.1-8B").items()
              if key not in ("model_type", "architectures")}
    error = _one_line_refusal(config, "model_type")
    assert "neither" in error.problem and '"model_type"' in error.fix
    assert all(family in error.fix for family in ("llama", "deepseek_v3", "qwen3_moe", "nemotron_h"))


@pytest.mark.parametrize("architectures", ["LlamaForCausalLM", [{"name": "LlamaForCausalLM"}]])
def test_architectures_that_is_not_a_list_of_class_names_is_refused_by_its_field(architectures):
    _one_line_refusal(_llama(architectures=architectures), "architectures")


@pytest.mark.parametrize(("config", "field"), [
    (_config("DeepSeek-V3") | {"first_k_dense_replace": -1}, "first_k_dense_replace"),  # planned as 0
    (GLM4_MOE_DEFAULTS | {"first_k_dense_replace": -2}, "first_k_dense_replace"),
    (_config("DeepSeek-V3") | {"n_shared_experts": -1}, "n_shared_experts"),  # named Megatron's shared width
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"n_shared_experts": -1}, "n_shared_experts"),
])
def test_a_negative_count_of_dense_layers_or_shared_experts_is_refused_by_its_key(config, field):
    error = _one_line_refusal(config, field)
    assert "-" in error.problem and field in error.fix


@pytest.mark.parametrize(("key", "value"), [("num_attention_heads", 0), ("intermediate_size", 0),
                                            ("hidden_size", -1), ("rms_norm_eps", -1.0)])
def test_a_value_the_spec_refuses_is_named_by_its_config_key_with_a_fix(key, value):
    # it read "model.ffn_hidden_size: Input should be greater than 0", with no fix and Megatron's name for the key
    config = _config("Llama-3.1-8B")
    config[key] = value
    with pytest.raises(MegapilotError) as info:
        from_hf_config(config, "broken")
    assert info.value.field == key and f"{key}={value!r}" in info.value.problem and key in info.value.fix


@pytest.mark.parametrize(("config", "field", "said"), [
    (_config("Mixtral-8x7B-v0.1") | {"num_experts_per_tok": 9}, "num_experts_per_tok", "num_local_experts=8"),
    (_config("Llama-3.1-8B") | {"hidden_size": 4097}, "hidden_size", "head_dim"),
    (_config("gpt2") | {"n_embd": 770}, "n_embd", "n_head=12"),
    (_config("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") | {"hybrid_override_pattern": "MX" * 26},
     "hybrid_override_pattern", "hybrid_override_pattern"),
    (_config("Qwen3-Next-80B-A3B-Instruct") | {"full_attention_interval": 0}, "full_attention_interval",
     "full_attention_interval"),
])
def test_a_value_two_keys_disagree_on_is_named_by_the_config_keys_not_megatrons(config, field, said):
    # it read "model: the config.json gives Megatron's model a value it refuses: router_topk=9 exceeds num_experts=8"
    error = _one_line_refusal(config, field)
    assert said in error.problem and field in error.fix and "Megatron's" not in error.problem, str(error)


def test_a_refused_value_with_no_known_key_still_carries_a_fix():
    config = _config("Mixtral-8x7B-v0.1")
    config["num_experts_per_tok"] = 0
    with pytest.raises(MegapilotError) as info:
        from_hf_config(config, "broken")
    assert info.value.field == "num_experts_per_tok" and info.value.fix


@pytest.mark.parametrize(("name", "key", "default"), [("Llama-3.1-8B", "max_position_embeddings", 2048),
                                                      ("gpt2", "n_positions", 1024)])  # LlamaConfig, GPT2Config
def test_zero_positions_are_refused_by_their_key_not_read_as_absent(name, key, default):
    # 0 read as 'absent' and became the default's 4,096 (GPT-2: 1,024) positions the config never gave
    config = _config(name)
    config[key] = 0
    with pytest.raises(MegapilotError) as info:
        from_hf_config(config, "broken")
    assert info.value.field == key and f"{key}=0" in info.value.problem and key in (info.value.fix or "")
    del config[key]
    assert from_hf_config(config, "no-key").max_position_embeddings == default  # absent: still the default


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "DeepSeek-V3"])  # llama3 and YaRN scaling
def test_a_zero_original_context_in_rope_scaling_is_refused_by_its_key(name):
    # llama3's 0 became 8,192; YaRN's fell back to max_position_embeddings
    config = _config(name)
    config["rope_scaling"] = config["rope_scaling"] | {"original_max_position_embeddings": 0}
    with pytest.raises(MegapilotError) as info:
        from_hf_config(config, "broken")
    assert info.value.field == "rope_scaling.original_max_position_embeddings" and info.value.fix


# ---- a 0 is the config's value, refused by its key where the model cannot run it; only absent or null is a default --


def _set(config: dict, path: str, value: object) -> dict:
    """A copy of `config` with the key at the dotted `path` (e.g. rope_scaling.factor) set to `value`."""
    config = json.loads(json.dumps(config))
    *parents, key = path.split(".")
    inner = config
    for parent in parents:
        inner = inner[parent]
    inner[key] = value
    return config


NANO, SUPER = "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-3-Super-120B-A12B-BF16"
SCOUT = "Llama-4-Scout-17B-16E-Instruct"


@pytest.mark.parametrize(("config", "path", "value", "field"), [
    # each was read as absent and silently became its default (in brackets)
    (_config("gpt2"), "n_inner", 0, "n_inner"),  # [4 x n_embd]
    (_config("gpt2"), "layer_norm_epsilon", 0, "layer_norm_epsilon"),  # [1e-5]
    (_config("Llama-3.1-8B"), "rms_norm_eps", 0, "rms_norm_eps"),  # [1e-6]
    (_config(NANO), "layer_norm_epsilon", 0, "layer_norm_epsilon"),  # [norm_eps]
    (_config(NANO) | {"layer_norm_epsilon": None}, "norm_eps", 0, "norm_eps"),  # [1e-5]
    (_config("Qwen3-Next-80B-A3B-Instruct"), "partial_rotary_factor", 0, "partial_rotary_factor"),  # [1.0]
    (GLM4_MOE_DEFAULTS, "partial_rotary_factor", 0, "partial_rotary_factor"),  # [0.5]
    (_config(NANO), "conv_kernel", 0, "conv_kernel"),  # [4]
    (_config("Qwen3-Next-80B-A3B-Instruct"), "linear_conv_kernel_dim", 0, "linear_conv_kernel_dim"),  # [4]
    (_config("Qwen3-30B-A3B"), "decoder_sparse_step", 0, "decoder_sparse_step"),  # [1]
    (_config("DeepSeek-V3"), "moe_layer_freq", 0, "moe_layer_freq"),  # [1]
    (_config(SCOUT), "text_config.interleave_moe_layer_step", 0, "interleave_moe_layer_step"),  # [1]
    (_config(SCOUT), "text_config.intermediate_size_mlp", 0, "intermediate_size_mlp"),  # [the experts' width]
    (_config("GLM-5"), "index_topk_freq", 0, "index_topk_freq"),  # [1]
    (_config("DeepSeek-V3"), "routed_scaling_factor", 0, "routed_scaling_factor"),  # [1.0]
    (_config(SUPER), "moe_latent_size", 0, "moe_latent_size"),  # [no latent MoE]
    (_config("DeepSeek-V3"), "n_routed_experts", 0, "n_routed_experts"),  # [a dense model]
    (_config("Llama-3.1-8B"), "rope_scaling.low_freq_factor", 0, "rope_scaling.low_freq_factor"),  # [1.0]
    (_config("Llama-3.1-8B"), "rope_scaling.high_freq_factor", 0, "rope_scaling.high_freq_factor"),  # [4.0]
    (_config("DeepSeek-V3"), "rope_scaling.mscale", 0, "rope_scaling.mscale"),  # [1.0], beside mscale_all_dim 1
    (_config("Llama-3.1-8B"), "rope_scaling.rope_type", "", "rope_scaling.rope_type"),  # [no scaling at all]
    (_config("Llama-3.1-8B"), "hidden_act", "", "hidden_act"),  # [silu]
    (_config("gpt2"), "activation_function", "", "activation_function"),  # [gelu_new]
    (_config(NANO), "mlp_hidden_act", "", "mlp_hidden_act"),  # [relu2]
    (_config("DeepSeek-V3"), "scoring_func", "", "scoring_func"),  # [softmax]
    (_config("DeepSeek-V3"), "topk_method", "", "topk_method"),  # [greedy: no group-limited routing]
    # these were refused, but under Megatron's name for another key ('model.factor'), with no fix
    (_config("Llama-3.1-8B"), "rope_scaling.factor", 0, "rope_scaling.factor"),
    (_config("DeepSeek-V3"), "rope_scaling.factor", -40, "rope_scaling.factor"),
    (_config("DeepSeek-V3"), "rope_scaling.beta_fast", -32, "rope_scaling.beta_fast"),
    (_config("DeepSeek-V3"), "rope_scaling.beta_slow", -1, "rope_scaling.beta_slow"),
    (_config("Llama-3.1-8B"), "partial_rotary_factor", 1.5, "partial_rotary_factor"),
    (_config(SUPER), "routed_scaling_factor", 0, "routed_scaling_factor"),
    (GLM4_MOE_DEFAULTS | {"num_nextn_predict_layers": None}, "num_mtp_layers", -1, "num_mtp_layers"),
    # these were taken as they are: a negative temperature term, hash layers Megatron cannot count
    (_config("DeepSeek-V3"), "rope_scaling.mscale", -1, "rope_scaling.mscale"),
    (_config("DeepSeek-V3"), "rope_scaling.mscale_all_dim", -1, "rope_scaling.mscale_all_dim"),
    (_config("DeepSeek-V4-Flash"), "num_hash_layers", -1, "num_hash_layers"),
])
def test_a_value_the_model_cannot_run_is_refused_by_its_key_not_read_as_absent(config, path, value, field):
    error = _one_line_refusal(_set(config, path, value), field)
    assert repr(field) in error.fix


@pytest.mark.parametrize(("ffn", "field"), [({"ffn_hidden_size": 0}, "block_configs[1].ffn.ffn_hidden_size"),
                                            ({"ffn_mult": 0}, "block_configs[1].ffn.ffn_mult")])
def test_a_zero_llama_nemotron_mlp_width_is_refused_by_its_block_key(ffn, field):
    # ffn_hidden_size 0 fell back to ffn_mult; ffn_mult 0 was refused as Megatron's layer_blocks field
    blocks = [_decilm_block(8, 5.25) for _ in range(8)]
    blocks[1]["ffn"] |= ffn
    _one_line_refusal(NEMOTRON_SUPER_49B | {"block_configs": blocks}, field)


def test_zeros_transformers_reads_with_a_meaning_keep_that_meaning():
    v3 = _config("DeepSeek-V3")
    # DeepSeek's mscale_all_dim 0: no softmax-scale term over all dims (Megatron's 0 too)
    no_all_dim = from_hf_config(_set(v3, "rope_scaling.mscale_all_dim", 0), "v3").rope_scaling
    assert no_all_dim is not None and no_all_dim.model_dump()["mscale_all_dim"] == 0
    # transformers reads a 0 YaRN beta as the paper's default (`get(beta) or 32`), and a 0 mscale beside a 0
    # mscale_all_dim as the plain 0.1 ln(factor) + 1, Megatron's mscale 1
    scaling = {key: value for key, value in v3["rope_scaling"].items()
               if key not in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")}
    assert from_hf_config(v3 | {"rope_scaling": scaling | {"beta_fast": 0, "beta_slow": 0, "mscale": 0,
                                                            "mscale_all_dim": 0}}, "v3") == \
        from_hf_config(v3 | {"rope_scaling": scaling}, "v3")
    # GPT-2's n_inner null is 4 x n_embd; DeepSeek's n_routed_experts null a dense MLA model
    assert from_hf_config(_config("gpt2") | {"n_inner": None}, "gpt2").ffn_hidden_size == 4 * 768
    assert from_hf_config(v3 | {"n_routed_experts": None}, "dense").moe is None
    # absent or null: still the defaults
    llama = {key: value for key, value in _config("Llama-3.1-8B").items() if key != "rms_norm_eps"}
    assert from_hf_config(llama | {"partial_rotary_factor": None}, "l").norm_epsilon == 1e-6
    assert from_hf_config(llama, "l").rotary_percent == 1.0
    assert from_hf_config(GLM4_MOE_DEFAULTS | {"partial_rotary_factor": None}, "g").rotary_percent == 0.5


def test_a_stated_zero_mtp_depth_is_not_overridden_by_a_second_spelling():
    # GLM-4.5's num_nextn_predict_layers 0 read as absent and took num_mtp_layers instead
    glm = GLM4_MOE_DEFAULTS | {"num_nextn_predict_layers": 0, "num_mtp_layers": 1}
    assert from_hf_config(glm, "glm").mtp_num_layers == 0
    assert from_hf_config(glm | {"num_nextn_predict_layers": None}, "glm").mtp_num_layers == 1


# ---- every key a config leaves out reads as its family's class in transformers builds it -------------------------


def _without(config: dict, path: str) -> dict:
    """A copy of `config` without the key at the dotted `path` (e.g. text_config.rms_norm_eps)."""
    config = json.loads(json.dumps(config))
    *parents, key = path.split(".")
    inner = config
    for parent in parents:
        inner = inner[parent]
    del inner[key]
    return config


GPT_OSS_YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0, "truncate": False}
PHI3_MINI = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_hidden_layers": 32,
             "intermediate_size": 8192, "num_attention_heads": 32, "vocab_size": 32064, "rms_norm_eps": 1e-6}

# config, the key left out, the ModelSpec field it sets, and that field under the default of the family's
# configuration class in transformers 5.25 (models/<family>/configuration_<family>.py). Each differs from what the
# import read before: the readers' own fallbacks (1e-6, 4096 positions, RoPE base 10000, one KV head per query head,
# hidden / heads, silu, no experts, no aux loss, ...).
TRANSFORMERS_DEFAULTS = [
    # MixtralConfig
    (_config("Mixtral-8x7B-v0.1"), "rms_norm_eps", "norm_epsilon", 1e-5),
    (_config("Mixtral-8x7B-v0.1"), "router_aux_loss_coef", "moe.aux_loss_coeff", 1e-3),
    (_config("Mixtral-8x7B-v0.1"), "rope_theta", "rotary_base", 1_000_000),
    (_config("Mixtral-8x7B-v0.1"), "num_key_value_heads", "num_query_groups", 8),
    (_config("Mixtral-8x7B-v0.1"), "max_position_embeddings", "max_position_embeddings", 131072),
    # Phi3Config
    (PHI3_MINI, "rms_norm_eps", "norm_epsilon", 1e-5),
    # Llama4TextConfig
    (_config(SCOUT), "text_config.rms_norm_eps", "norm_epsilon", 1e-5),
    (_config(SCOUT), "text_config.router_aux_loss_coef", "moe.aux_loss_coeff", 1e-3),
    (_config(SCOUT), "text_config.rope_theta", "rotary_base", 500_000),
    (_config(SCOUT), "text_config.attention_chunk_size", "attention_chunk_size", 8192),
    (_config(SCOUT) | {"text_config": _config(SCOUT)["text_config"] | {"intermediate_size_mlp": 8192}},
     "text_config.intermediate_size_mlp", "ffn_hidden_size", 16384),
    (_config(SCOUT), "text_config.max_position_embeddings", "max_position_embeddings", 131072),
    (_config(SCOUT), "text_config.use_qk_norm", "qk_l2_norm", True),
    # GptOssConfig
    (_config("gpt-oss-20b"), "rms_norm_eps", "norm_epsilon", 1e-5),
    (_config("gpt-oss-20b"), "rope_theta", "rotary_base", 150_000),
    (_config("gpt-oss-20b"), "attention_bias", "add_bias_linear", True),
    (_config("gpt-oss-20b"), "swiglu_limit", "activation_clamp", 7.0),
    (_config("gpt-oss-20b"), "head_dim", "kv_channels", 64),
    (_config("gpt-oss-20b"), "rope_scaling", "rope_scaling", GPT_OSS_YARN),  # its __post_init__'s YaRN
    (_config("gpt-oss-20b"), "router_aux_loss_coef", "moe.aux_loss_coeff", 0.9),
    # Glm4MoeConfig
    (GLM4_MOE_DEFAULTS, "rms_norm_eps", "norm_epsilon", 1e-5),
    (GLM4_MOE_DEFAULTS, "n_shared_experts", "moe.shared_expert_ffn_hidden_size", 1408),
    (GLM4_MOE_DEFAULTS, "first_k_dense_replace", "moe.first_k_dense_layers", 1),
    # GlmMoeDsaConfig
    (_config("GLM-5"), "rms_norm_eps", "norm_epsilon", 1e-5),
    (_config("GLM-5"), "n_routed_experts", "moe.num_experts", 256),
    (_config("GLM-5") | {"routed_scaling_factor": 1.0}, "routed_scaling_factor", "moe.router_topk_scaling_factor",
     2.5),
    (_config("GLM-5") | {"q_lora_rank": 1536}, "q_lora_rank", "mla.q_lora_rank", 2048),
    # DeepseekV2Config
    (_config("DeepSeek-V2-Lite"), "n_routed_experts", "moe.num_experts", 64),
    (_config("DeepSeek-V2-Lite") | {"n_shared_experts": 1}, "n_shared_experts", "moe.shared_expert_ffn_hidden_size",
     2 * 1408),
    (_config("DeepSeek-V2-Lite"), "q_lora_rank", "mla.q_lora_rank", 1536),  # its null: no query LoRA
    (_config("DeepSeek-V2-Lite"), "max_position_embeddings", "max_position_embeddings", 2048),
    # DeepseekV3Config
    (_config("DeepSeek-V3"), "n_routed_experts", "moe.num_experts", 256),
    (_config("DeepSeek-V3"), "n_shared_experts", "moe.shared_expert_ffn_hidden_size", 2048),
    (_config("DeepSeek-V3"), "first_k_dense_replace", "moe.first_k_dense_layers", 3),
    (_config("DeepSeek-V3"), "routed_scaling_factor", "moe.router_topk_scaling_factor", 2.5),
    # DeepseekV32Config (its router is V3's sigmoid gate with the expert bias)
    (_config("DeepSeek-V3.2"), "n_routed_experts", "moe.num_experts", 256),
    (_config("DeepSeek-V3.2"), "scoring_func", "moe.router_score_function", "sigmoid"),
    (_config("DeepSeek-V3.2"), "topk_method", "moe.router_expert_bias", True),
    (_config("DeepSeek-V3.2"), "n_group", "moe.router_num_groups", 8),
    (_config("DeepSeek-V3.2"), "max_position_embeddings", "max_position_embeddings", 163840),
    # DeepseekV4Config
    (_config("DeepSeek-V4-Flash"), "scoring_func", "moe.router_score_function", "sqrtsoftplus"),
    (_config("DeepSeek-V4-Flash"), "topk_method", "moe.router_expert_bias", True),
    (_config("DeepSeek-V4-Flash") | {"routed_scaling_factor": 1.0}, "routed_scaling_factor",
     "moe.router_topk_scaling_factor", 1.5),
    (_config("DeepSeek-V4-Flash"), "hc_mult", "residual_streams", 4),
    (_config("DeepSeek-V4-Flash"), "num_hash_layers", "moe.num_hash_layers", 3),
    (_config("DeepSeek-V4-Flash"), "swiglu_limit", "activation_clamp", 10.0),
    # Qwen2MoeConfig, Qwen3MoeConfig, Qwen3NextConfig
    (OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0], "shared_expert_intermediate_size", "moe.shared_expert_ffn_hidden_size",
     5632),
    (OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0], "num_key_value_heads", "num_query_groups", None),  # 16 of 16 heads
    (_config("Qwen3-30B-A3B"), "router_aux_loss_coef", "moe.aux_loss_coeff", 1e-3),
    (_config("Qwen3-30B-A3B"), "num_key_value_heads", "num_query_groups", 4),
    (_config("Qwen3-30B-A3B"), "max_position_embeddings", "max_position_embeddings", 32768),
    (_config("Qwen3-Next-80B-A3B-Instruct"), "partial_rotary_factor", "rotary_percent", 0.25),
    (_config("Qwen3-Next-80B-A3B-Instruct"), "shared_expert_intermediate_size", "moe.shared_expert_ffn_hidden_size",
     512),
    (_config("Qwen3-Next-80B-A3B-Instruct"), "head_dim", "kv_channels", 256),
    (_config("Qwen3-Next-80B-A3B-Instruct"), "router_aux_loss_coef", "moe.aux_loss_coeff", 1e-3),
    # Qwen2Config, Qwen3Config (head_dim 128 where hidden / heads is 64)
    (OTHER_FAMILIES["Qwen2-7B"][0] | {"max_position_embeddings": 4096}, "max_position_embeddings",
     "max_position_embeddings", 32768),
    (OTHER_FAMILIES["Qwen3-8B"][0] | {"num_attention_heads": 64}, "head_dim", "kv_channels", 128),
    # MistralConfig: a window over every layer unless the config says null
    (OTHER_FAMILIES["Mistral-7B-v0.1"][0], "sliding_window", "sliding_window", 4096),
    (OTHER_FAMILIES["Mistral-7B-v0.1"][0], "num_key_value_heads", "num_query_groups", 8),
    # GemmaConfig, Gemma2Config: the tanh GELU, 256-wide heads
    (OTHER_FAMILIES["gemma-7b"][0], "hidden_act", "mlp_activation", "geglu"),
    (OTHER_FAMILIES["gemma-7b"][0], "head_dim", "kv_channels", 256),
    (OTHER_FAMILIES["gemma-2-9b"][0], "hidden_activation", "mlp_activation", "geglu"),
    (OTHER_FAMILIES["gemma-2-9b"][0], "num_key_value_heads", "num_query_groups", 4),
    # LlamaConfig
    (_config("Llama-3.1-8B"), "max_position_embeddings", "max_position_embeddings", 2048),
    # NemotronHConfig
    (NEMOTRON_H_8B, "mamba_num_heads", "mamba.num_heads", 128),
    (NEMOTRON_H_8B, "num_key_value_heads", "num_query_groups", 8),
    (_config(NANO), "moe_shared_expert_intermediate_size", "moe.shared_expert_ffn_hidden_size", 7688),
]


def _read(model: object, field: str) -> object:
    value = attrgetter(field)(model)
    return value.model_dump() if hasattr(value, "model_dump") else value


@pytest.mark.parametrize(("config", "key", "field", "default"), TRANSFORMERS_DEFAULTS,
                         ids=[f"{c.get('architectures', [c.get('model_type')])[0]}-{k}"
                              for c, k, _, _ in TRANSFORMERS_DEFAULTS])
def test_a_config_without_a_key_reads_as_its_family_default_in_transformers(config, key, field, default):
    # each read as the import's own fallback (in brackets above), not as transformers builds the model
    assert _read(from_hf_config(_without(config, key), "left-out"), field) == default


@pytest.mark.parametrize(("config", "key", "field", "default"), [
    (_config("Mixtral-8x7B-v0.1"), "rms_norm_eps", "norm_epsilon", 1e-5),
    (_config("Mixtral-8x7B-v0.1"), "router_aux_loss_coef", "moe.aux_loss_coeff", 1e-3),
    (_config("DeepSeek-V3"), "routed_scaling_factor", "moe.router_topk_scaling_factor", 2.5),
    (_config("gpt-oss-20b"), "rope_scaling", "rope_scaling", GPT_OSS_YARN),  # GptOssConfig replaces a None too
])
def test_a_null_key_reads_as_absent_where_its_null_has_no_meaning_of_its_own(config, key, field, default):
    assert _read(from_hf_config(config | {key: None}, "null"), field) == default


def test_a_null_with_a_meaning_of_its_own_keeps_it():
    # a dense MLA model, queries without LoRA, full attention, no chunking, one KV head per query head
    assert from_hf_config(_config("DeepSeek-V3") | {"n_routed_experts": None}, "v3").moe is None
    assert from_hf_config(_config("DeepSeek-V2-Lite"), "v2").mla.q_lora_rank is None
    assert from_hf_config(OTHER_FAMILIES["Mistral-7B-v0.1"][0] | {"sliding_window": None}, "m").sliding_window is None
    scout = _config(SCOUT)
    scout["text_config"]["attention_chunk_size"] = None
    assert from_hf_config(scout, "scout").attention_chunk_size is None
    assert from_hf_config(_config("Mixtral-8x7B-v0.1") | {"num_key_value_heads": None}, "m").num_query_groups is None


def test_a_gpt_oss_config_stating_plain_rope_in_rope_parameters_is_not_given_the_default_yarn():
    # GptOssConfig builds its YaRN only when the config states no RoPE at all
    saved = {key: value for key, value in _config("gpt-oss-20b").items() if key not in ("rope_scaling", "rope_theta")}
    plain = saved | {"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}}
    model = from_hf_config(plain, "plain")
    assert model.rope_scaling is None and model.rotary_base == 150_000


# ---- stated keys the import dropped, read as transformers reads them -----------------------------------------------


def test_yarn_truncate_is_read_as_transformers_reads_it():
    # gpt-oss states truncate false (Megatron-Bridge: yarn_correction_range_round_to_int=False); it was dropped
    gpt_oss = from_hf_config(_config("gpt-oss-20b"), "gpt-oss").rope_scaling
    assert isinstance(gpt_oss, YarnRopeScaling) and gpt_oss.truncate is False
    v3 = _config("DeepSeek-V3")
    assert from_hf_config(v3, "v3").rope_scaling.truncate is True  # absent: transformers' get("truncate", True)
    assert from_hf_config(_set(v3, "rope_scaling.truncate", None), "v3").rope_scaling.truncate is False  # falsy
    _one_line_refusal(_set(v3, "rope_scaling.truncate", "no"), "truncate")


def _scout_text(**changes: object) -> dict:
    scout = _config(SCOUT)
    scout["text_config"] |= changes
    return scout


def test_llama4_moe_layers_place_the_experts_over_the_interleave_step():
    # transformers: moe_layers when stated, range(step - 1, layers, step) otherwise; the step was read alone
    model = from_hf_config(_scout_text(moe_layers=list(range(1, 48, 2)), interleave_moe_layer_step=1), "maverick-like")
    assert model.moe is not None and (model.moe.first_k_dense_layers, model.moe.moe_layer_freq) == (1, 2)
    assert [model.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    every_layer = from_hf_config(_scout_text(moe_layers=None, interleave_moe_layer_step=1), "scout").moe
    assert every_layer is not None and every_layer.moe_layer_freq == 1
    _one_line_refusal(_scout_text(moe_layers=[0, 1, 5]), "moe_layers")
    _one_line_refusal(_scout_text(moe_layers="1,3"), "moe_layers")


def test_llama4_nope_layers_follow_no_rope_layer_interval():
    # Llama4TextConfig: NoPE every no_rope_layer_interval-th layer when no_rope_layers is empty; it was always 4
    assert from_hf_config(_scout_text(no_rope_layer_interval=2), "s").no_rope_freq == 2
    assert from_hf_config(_scout_text(), "s").no_rope_freq == 4
    assert from_hf_config(_scout_text(no_rope_layers=[int((i + 1) % 2 != 0) for i in range(48)]),
                          "s").no_rope_freq == 2
    _one_line_refusal(_scout_text(no_rope_layers=[1, 0] + [1] * 46), "no_rope_layers")
    _one_line_refusal(_scout_text(no_rope_layer_interval=0), "no_rope_layer_interval")


def test_llama4_use_qk_norm_is_the_weightless_qk_l2_norm_of_its_rope_layers():
    scout = from_hf_config(_config(SCOUT), "scout")  # Scout states true; Maverick false
    assert scout.qk_l2_norm and [scout.qk_l2_norm_at(i) for i in range(4)] == [True, True, True, False]
    assert not from_hf_config(_scout_text(use_qk_norm=False), "maverick-like").qk_l2_norm
    from megapilot.estimate.params import count_params
    assert count_params(scout).total == 107_769_861_120  # a norm without weights: the count is unchanged
    _one_line_refusal(_scout_text(use_qk_norm="yes"), "use_qk_norm")


def test_gpt_oss_reads_its_aux_loss_weight_and_trains_the_loss_only_where_the_config_outputs_router_logits():
    moe = from_hf_config(_config("gpt-oss-20b"), "gpt-oss").moe  # router_aux_loss_coef 0.9, output_router_logits false
    assert moe is not None and (moe.load_balancing_type, moe.aux_loss_coeff) == ("none", 0.9)
    trained = from_hf_config(_config("gpt-oss-20b") | {"output_router_logits": True, "router_aux_loss_coef": 0.02},
                             "gpt-oss").moe
    assert trained is not None and (trained.load_balancing_type, trained.aux_loss_coeff) == ("aux_loss", 0.02)
    _one_line_refusal(_config("gpt-oss-20b") | {"output_router_logits": "true"}, "output_router_logits")


def test_deepseek_reads_v2s_aux_loss_alpha_and_v3_without_one_has_no_aux_loss():
    v2 = from_hf_config(_config("DeepSeek-V2-Lite"), "v2").moe  # aux_loss_alpha 0.001, seq_aux true
    assert v2 is not None and (v2.load_balancing_type, v2.aux_loss_coeff) == ("seq_aux_loss", 0.001)
    v3 = from_hf_config(_config("DeepSeek-V3"), "v3").moe  # no aux_loss_alpha: balanced by the expert bias
    assert v3 is not None and v3.aux_loss_coeff == 0.0 and v3.router_expert_bias
    assert from_hf_config(_config("DeepSeek-V3") | {"aux_loss_alpha": 1e-4}, "v3").moe.aux_loss_coeff == 1e-4
    # a weight the spec refuses is named by its config key, not by Megatron's field
    assert _one_line_refusal(_config("DeepSeek-V2-Lite") | {"aux_loss_alpha": -0.1}, "aux_loss_alpha").fix
    _one_line_refusal(_config("Mixtral-8x7B-v0.1") | {"router_aux_loss_coef": -1}, "router_aux_loss_coef")


def test_qwen2_moe_qkv_bias_false_builds_no_qkv_bias():
    # Qwen2MoeConfig.qkv_bias (default true) sets the q/k/v biases; it was ignored
    base = OTHER_FAMILIES["Qwen1.5-MoE-A2.7B"][0]
    assert from_hf_config(base, "q").add_qkv_bias
    assert not from_hf_config(base | {"qkv_bias": False}, "q").add_qkv_bias
