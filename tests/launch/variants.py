"""Plans that switch on every branch of the flag renderer (beyond the five golden cases)."""

from __future__ import annotations

from megapilot.launch import LaunchOptions
from megapilot.spec import ModelSpec, MoESpec, SavedPlan, TrainingSpec
from megapilot.spec.cuda_graphs import CudaGraphs
from megapilot.spec.model import DSASpec, GatedDeltaNetSpec, MambaSpec, YarnRopeScaling
from tests.launch.plans import (
    DEEPSEEK_V2_LITE,
    GOLDEN_PLANS,
    LLAMA31_8B,
    LLAMA31_405B,
    MIXTRAL_8X7B,
    make_plan,
)

_TRAIN = TrainingSpec(seq_length=4096, global_batch_size=64)

GPT2_STYLE = ModelSpec(
    name="gpt2-style", num_layers=12, hidden_size=768, ffn_hidden_size=3072, num_attention_heads=12,
    vocab_size=50257, mlp_activation="gelu", normalization="LayerNorm", position_embedding="learned_absolute",
    tie_embeddings=True, add_bias_linear=True, max_position_embeddings=1024,
)
QWEN_STYLE = LLAMA31_8B.model_copy(update={
    "name": "qwen-style", "add_qkv_bias": True, "qk_layernorm": True, "mlp_activation": "squared_relu",
    "mtp_num_layers": 1, "sliding_window": 4096, "rope_scaling": None,
})
QWEN_MOE = MIXTRAL_8X7B.model_copy(update={
    "name": "qwen-moe-style",
    "moe": MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=1408, shared_expert_ffn_hidden_size=5632,
                   shared_expert_gate=True, router_expert_bias=True, router_score_function="sigmoid",
                   moe_layer_freq=2),
})

# MLA with plain RoPE and DeepSeek-V3's router (sigmoid, groups, top-k scaling).
DEEPSEEK_Q_LORA = DEEPSEEK_V2_LITE.model_copy(update={
    "name": "deepseek-q-lora", "mla": DEEPSEEK_V2_LITE.mla.model_copy(update={"q_lora_rank": 1536}),
    "rope_scaling": None,
    "moe": DEEPSEEK_V2_LITE.moe.model_copy(update={
        "router_pre_softmax": False, "router_score_function": "sigmoid", "router_expert_bias": True,
        "router_topk_scaling_factor": 2.5, "router_num_groups": 8, "router_group_topk": 3}),
})

VARIANT_PLANS: dict[str, SavedPlan] = {
    **GOLDEN_PLANS,
    "fp16_gpt2": make_plan(GPT2_STYLE, "a100", 1,
                           _TRAIN.model_copy(update={"precision": "fp16", "seq_length": 1024}), tp=2),
    "mxfp8_b200": make_plan(LLAMA31_8B, "b200", 1, _TRAIN.model_copy(update={"precision": "mxfp8"}), tp=2,
                            recompute="full", recompute_method="block", recompute_num_layers=2),
    "nvfp4_b200": make_plan(QWEN_STYLE, "b200", 1, _TRAIN.model_copy(update={"precision": "nvfp4"}), tp=1),
    "fp8_delayed": make_plan(LLAMA31_8B, "h100", 1,
                             _TRAIN.model_copy(update={"precision": "fp8", "fp8_recipe": "delayed"})),
    "fp8_tensorwise": make_plan(LLAMA31_8B, "h100", 1,
                                _TRAIN.model_copy(update={"precision": "fp8", "fp8_recipe": "tensorwise"})),
    "fsdp": make_plan(LLAMA31_8B, "h100", 1, _TRAIN, fsdp=True, distributed_optimizer=False),
    # 405B over TP8 holds ~94 GiB of unsharded bf16 weights per rank: built on the meta device.
    "fsdp_meta_init": make_plan(LLAMA31_405B, "h100", 8, _TRAIN.model_copy(update={"global_batch_size": 64}),
                                tp=8, sequence_parallel=True, fsdp=True),
    "no_dist_opt": make_plan(LLAMA31_8B, "h100", 1, _TRAIN, distributed_optimizer=False),
    # the NeMo / Megatron-Bridge performance recipes' gradients, kept and reduced in bf16
    "bf16_gradients": make_plan(LLAMA31_8B, "h100", 1, _TRAIN.model_copy(update={"grad_reduce_in_bf16": True})),
    "mla_q_lora": make_plan(DEEPSEEK_Q_LORA, "h100", 1, _TRAIN, ep=8, etp=1),
    # the modules DeepSeek-V3's recipes recompute (--recompute-granularity selective --recompute-modules ...)
    "mla_recompute_modules": make_plan(DEEPSEEK_Q_LORA, "h100", 1, _TRAIN, ep=8, etp=1,
                                       recompute_modules=("mla_up_proj", "moe_act", "layernorm")),
    "moe_shared_gate": make_plan(QWEN_MOE, "h100", 1, _TRAIN, ep=8, etp=1),
    # Megatron-Bridge's GB200 recipes offload activations to the Grace's memory (--cpu-offloading-num-layers, PP 1,
    # no recompute)
    "offload_activations": make_plan(LLAMA31_8B, "gb200", 1, _TRAIN, recompute="none", cpu_offloading_num_layers=8),
    # Uneven split with interleaving: 32 layers, PP4 x VPP2, 6 on the first and last ranks (10 in between).
    "uneven_vpp": make_plan(LLAMA31_8B, "h100", 1, _TRAIN.model_copy(update={"global_batch_size": 64}), tp=2,
                            pp=4, vpp=2, first_stage_layers=6, last_stage_layers=6),
}

# GPT-OSS's attention and MLP semantics, Llama 4's NoPE frequency, and a Mamba hybrid (pretrain_mamba.py): these
# need Megatron-LM's own entry scripts, so they are rendered with it only.
GPT_OSS_STYLE = MIXTRAL_8X7B.model_copy(update={
    "name": "gpt-oss-style", "mlp_activation": "quick_geglu", "glu_linear_offset": 1.0, "activation_clamp": 7.0,
    "sliding_window": 128, "sliding_window_skip_freq": 2, "softmax_type": "learnable", "add_bias_linear": True,
    "no_rope_freq": 4,
})
HYBRID_MAMBA = ModelSpec(
    name="hybrid-mamba", num_layers=8, hidden_size=1024, ffn_hidden_size=2048, num_attention_heads=8,
    num_query_groups=2, vocab_size=32000, mlp_activation="squared_relu", position_embedding="none",
    hybrid_override_pattern="M-M*M-ME", mamba=MambaSpec(num_heads=32, head_dim=64, num_groups=8, state_dim=128),
    moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=1024, shared_expert_ffn_hidden_size=2048),
)
# Nemotron 3 Super's semantics: latent MoE and an attention + MoE MTP module repeated at both depths.
LATENT_HYBRID = HYBRID_MAMBA.model_copy(update={
    "name": "latent-hybrid", "moe": HYBRID_MAMBA.moe.model_copy(update={"latent_size": 256}),
    "mtp_num_layers": 2, "mtp_hybrid_pattern": "*E", "mtp_repeated_layer": True,
})
# Qwen3-Next's semantics: Gated DeltaNet on three layers of four, a gated attention with partial RoPE, zero-centred
# norms (its experimental variant needs Transformer Engine: rendered for Megatron-LM only).
GATED_DELTANET = MIXTRAL_8X7B.model_copy(update={
    "name": "gated-deltanet", "num_layers": 8, "qk_layernorm": True, "attention_output_gate": True,
    "rotary_percent": 0.25, "norm_zero_centered": True,
    "gated_delta_net": GatedDeltaNetSpec(key_heads=8, value_heads=16, key_head_dim=64, value_head_dim=64),
})
# DeepSeek-V3.2's semantics: MLA attending through DeepSeek Sparse Attention's indexer (Transformer Engine only).
SPARSE_MLA = DEEPSEEK_Q_LORA.model_copy(update={
    "name": "sparse-mla", "mla": DEEPSEEK_Q_LORA.mla.model_copy(update={
        "dsa": DSASpec(indexer_heads=16, indexer_head_dim=64, topk=512)}),
})
# GLM-5's indexer: interleaved RoPE, no Hadamard rotation, one layer's top-k shared with the next three.
SHARED_TOPK_MLA = SPARSE_MLA.model_copy(update={
    "name": "shared-topk-mla", "norm_epsilon": 1e-5, "mla": SPARSE_MLA.mla.model_copy(update={
        "dsa": SPARSE_MLA.mla.dsa.model_copy(update={"topk_freq": 4, "skip_topk_offset": 3, "rope_interleaved": True,
                                                   "rotate_activation": False})}),
})
MEGATRON_MOCK = LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False)

# Options that apply to some plans only (a flex MoE dispatcher is refused on a dense model): rendered on their own.
PAIRED_VARIANTS: list[tuple[SavedPlan, LaunchOptions]] = [
    (make_plan(GPT_OSS_STYLE, "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK),
    # attention sinks under CP: Transformer Engine's a2a path only (--cp-comm-type a2a)
    (make_plan(GPT_OSS_STYLE, "h100", 1, _TRAIN, cp=2, cp_comm_type="a2a", ep=8, etp=1), MEGATRON_MOCK),
    (make_plan(HYBRID_MAMBA, "h100", 1, _TRAIN, tp=2, ep=4, etp=1), MEGATRON_MOCK),
    (make_plan(LATENT_HYBRID, "h100", 1, _TRAIN, tp=2, ep=4, etp=1), MEGATRON_MOCK),
    (make_plan(GATED_DELTANET, "h100", 1, _TRAIN, tp=2, ep=4, etp=1), MEGATRON_MOCK),
    (make_plan(SPARSE_MLA, "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK),
    (make_plan(SHARED_TOPK_MLA, "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK),
    # YaRN under standard attention (GPT-OSS's, its range unrounded): core_v0.19.0's --position-embedding-type yarn
    (make_plan(LLAMA31_8B.model_copy(update={"rope_scaling": YarnRopeScaling(
        factor=32.0, original_max_position_embeddings=4096, truncate=False)}), "h100", 1, _TRAIN, tp=2),
     MEGATRON_MOCK),
    # a weightless q/k L2 norm (Llama 4's, without its NoPE layers: Megatron-LM normalises every layer)
    (make_plan(LLAMA31_8B.model_copy(update={"qk_l2_norm": True}), "h100", 1, _TRAIN, tp=2), MEGATRON_MOCK),
    (make_plan(MIXTRAL_8X7B.model_copy(update={"moe": MIXTRAL_8X7B.moe.model_copy(
        update={"capacity_factor": 1.0, "pad_to_capacity": True})}), "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK),
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN, ep=8, etp=1),
     LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", moe_flex_dispatcher="deepep",
                   check_paths_exist=False)),
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN, ep=8, etp=1),
     LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", moe_a2a_overlap=True, check_paths_exist=False)),
    # FP8 experts: the router pads their token counts for the quantised GEMMs, under each release's flag name
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN.model_copy(update={"precision": "fp8"}), ep=8, etp=1), MEGATRON_MOCK),
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN.model_copy(update={"precision": "fp8"}), ep=8, etp=1),
     MEGATRON_MOCK.model_copy(update={"megatron_version": "core_v0.15.0"})),
    # CUDA graphs in each release's words: the scopes as a list (core_v0.16.0), renamed --cuda-graph-modules
    # (core_v0.18.0 on), and the whole iteration with what Megatron asserts beside it (local graphs under EP).
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router", "moe_preprocess")),
        "megatron_version": "core_v0.16.0"})),
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN, ep=8, etp=1), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="transformer_engine", scope=("attn", "moe_router", "moe_preprocess"))})),
    (make_plan(MIXTRAL_8X7B, "h100", 1, _TRAIN, ep=8, etp=1, recompute="full"), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="local", scope=("full_iteration",)), "megatron_version": "core_v0.16.0"})),
    # before the lists (core_v0.14-0.15): one scope word, the implementation by flag (core_v0.14) or by name
    (make_plan(LLAMA31_8B, "h100", 1, _TRAIN, tp=2, recompute="none"), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="local", scope=("full_iteration",)), "megatron_version": "core_v0.15.0"})),
    (make_plan(LLAMA31_8B, "h100", 1, _TRAIN, tp=2, recompute="none"), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="local"), "megatron_version": "core_v0.14.0"})),
    (make_plan(LLAMA31_8B, "h100", 1, _TRAIN, tp=2, recompute="none"), MEGATRON_MOCK.model_copy(update={
        "cuda_graphs": CudaGraphs(impl="transformer_engine", scope=("attn",)), "megatron_version": "core_v0.14.0"})),
    # Muon: Megatron-LM's optimizer (the embedded trainer runs Adam and SGD), without the distributed optimizer.
    (make_plan(LLAMA31_8B, "h100", 1, _TRAIN.model_copy(update={"optimizer": "dist_muon"}), tp=2,
               distributed_optimizer=False), MEGATRON_MOCK),
    (make_plan(LLAMA31_8B, "h100", 1, _TRAIN.model_copy(update={"optimizer": "muon"}), tp=2,
               distributed_optimizer=False), MEGATRON_MOCK),
]

OPTION_VARIANTS: dict[str, LaunchOptions] = {
    "mock": LaunchOptions(mock_data=True, megatron_path="/opt/Megatron-LM", check_paths_exist=False),
    "bpe": LaunchOptions(data_path="/d/x_text_document", vocab_file="/t/vocab.json", merge_file="/t/merges.txt",
                         megatron_path="/opt/Megatron-LM", save="/ckpt", tensorboard_dir="/tb",
                         check_paths_exist=False),
    "sentencepiece": LaunchOptions(data_path="/d/x_text_document", tokenizer_model="/t/tokenizer.model",
                                   load="/ckpt/old", load_step=40, save="/ckpt/new", save_interval=50,
                                   megatron_path="/opt/Megatron-LM", check_paths_exist=False),
    "cpu": LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True, check_paths_exist=False),
    "slurm_saving": LaunchOptions(launcher="slurm", mock_data=True, megatron_path="/opt/Megatron-LM", save="/ckpt",
                                  log_dir="/logs", time_limit="1-00:00:00", check_paths_exist=False),
}
