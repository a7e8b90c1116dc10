"""The five golden launch cases, built directly from specs so golden files change only with the renderer.

Model dimensions are the published Hugging Face configs (meta-llama Llama-3.1-8B, Llama-3.3-70B-Instruct,
Llama-3.1-405B, mistralai Mixtral-8x7B-v0.1, deepseek-ai DeepSeek-V2-Lite).
"""

from __future__ import annotations

from megapilot.catalog import get_model
from megapilot.catalog.gpus import get_gpu
from megapilot.spec import ClusterSpec, MLASpec, ModelSpec, MoESpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.model import Llama3RopeScaling, YarnRopeScaling


def _llama(name: str, layers: int, hidden: int, ffn: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, num_attention_heads=heads,
        num_query_groups=8, vocab_size=128256, max_position_embeddings=131072, rotary_base=500000,
        rope_scaling=Llama3RopeScaling(factor=8.0),
    )


LLAMA31_8B = _llama("llama3.1-8b", 32, 4096, 14336, 32)
LLAMA33_70B = _llama("llama3.3-70b", 80, 8192, 28672, 64)
LLAMA31_405B = _llama("llama3.1-405b", 126, 16384, 53248, 128)
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
    num_query_groups=8, vocab_size=32000, max_position_embeddings=32768, rotary_base=1000000,
    moe=MoESpec(num_experts=8, router_topk=2, moe_ffn_hidden_size=14336),
)
DEEPSEEK_V2_LITE = ModelSpec(
    name="deepseek-v2-lite", num_layers=27, hidden_size=2048, ffn_hidden_size=10944, num_attention_heads=16,
    vocab_size=102400, max_position_embeddings=163840, norm_epsilon=1e-6,
    rope_scaling=YarnRopeScaling(factor=40, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=0.707),
    moe=MoESpec(num_experts=64, router_topk=6, moe_ffn_hidden_size=1408, shared_expert_ffn_hidden_size=2816,
                first_k_dense_layers=1, load_balancing_type="seq_aux_loss", aux_loss_coeff=1e-3,
                router_pre_softmax=True, router_dtype="fp32"),
    mla=MLASpec(kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128),
)


def make_plan(model: ModelSpec, gpu: str, nodes: int, training: TrainingSpec, **layout: object) -> SavedPlan:
    cluster = ClusterSpec(gpu=get_gpu(gpu), num_nodes=nodes, gpus_per_node=8)
    parallel = ParallelConfig.for_world(cluster.world_size, **layout)
    return SavedPlan(model=model, cluster=cluster, training=training, parallel=parallel)


def tiny_two_rank_plan(train_iters: int) -> SavedPlan:
    """The tiny GPT on 2 data-parallel ranks: small enough to really train on CPU in a test."""
    return SavedPlan(
        model=get_model("tiny"),
        cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=2),
        training=TrainingSpec(seq_length=64, global_batch_size=4, train_iters=train_iters),
        parallel=ParallelConfig.for_world(2, mbs=1, recompute="none"),
    )


GOLDEN_PLANS: dict[str, SavedPlan] = {
    "llama3.1-8b_1node": make_plan(
        LLAMA31_8B, "h100", 1, TrainingSpec(seq_length=8192, global_batch_size=128, precision="fp8"),
        tp=1, mbs=1, recompute="none",
    ),
    "llama3.3-70b_8nodes": make_plan(
        LLAMA33_70B, "h100", 8, TrainingSpec(seq_length=8192, global_batch_size=512, train_iters=1000),
        tp=8, pp=2, mbs=1, sequence_parallel=True,
    ),
    "mixtral-8x7b_ep8": make_plan(
        MIXTRAL_8X7B, "h100", 2, TrainingSpec(seq_length=4096, global_batch_size=256),
        tp=2, ep=8, etp=1, mbs=1, sequence_parallel=True,
    ),
    "deepseek-v2-lite_mla": make_plan(
        DEEPSEEK_V2_LITE, "mi300x", 1, TrainingSpec(seq_length=4096, global_batch_size=64),
        tp=1, ep=8, etp=1, mbs=1,
    ),
    "llama3.1-405b_pp_vpp_cp": make_plan(
        LLAMA31_405B, "h100", 14, TrainingSpec(seq_length=8192, global_batch_size=224, lr=8e-5, min_lr=8e-7),
        tp=8, pp=7, vpp=3, cp=2, mbs=1, sequence_parallel=True, recompute="full", recompute_num_layers=1,
    ),
    # 126 layers at PP16: 7 on the first and last ranks, 8 on each of the 14 middle ones.
    "llama3.1-405b_pp16_uneven": make_plan(
        LLAMA31_405B, "h100", 16, TrainingSpec(seq_length=8192, global_batch_size=256),
        tp=8, pp=16, mbs=1, sequence_parallel=True, recompute="full", recompute_num_layers=1,
        first_stage_layers=7, last_stage_layers=7,
    ),
}
