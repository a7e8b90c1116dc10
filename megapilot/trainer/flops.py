"""Model FLOPs per iteration, Megatron-LM's `num_floating_point_operations` for a GPT (core ≥ v0.12).

Every weight GEMM counts 6·(in×out) per token (forward, wgrad, dgrad; a multiply-add is 2 FLOPs);
causal attention counts half of QKᵀ and PV; recomputation is never counted. The router GEMM is not
counted. This is the figure behind "throughput per GPU (TFLOP/s/GPU)".
"""

from __future__ import annotations

from megapilot.trainer.config import TrainerConfig


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron's vocabulary padding: up to a multiple of `divisible_by × TP`."""
    multiple = divisible_by * tensor_parallel
    return ((vocab_size + multiple - 1) // multiple) * multiple


def _mlp_flops_per_token(config: TrainerConfig, is_moe_layer: bool) -> float:
    gemms = 3 if config.swiglu else 2
    if is_moe_layer:
        expert_width = (config.moe_ffn_hidden_size or config.ffn_hidden_size) * config.moe_router_topk
        shared = config.moe_shared_expert_intermediate_size or 0
        return 6.0 * config.hidden_size * (expert_width + shared) * gemms
    return 6.0 * config.hidden_size * config.ffn_hidden_size * gemms


def _attention_flops_per_token(config: TrainerConfig) -> float:
    kv_channels = config.kv_channels or config.hidden_size // config.num_attention_heads
    query_width = config.num_attention_heads * kv_channels
    kv_width = config.num_query_groups * kv_channels
    linear = 6.0 * (config.hidden_size * (query_width + 2 * kv_width) + query_width * config.hidden_size)
    core = 6.0 * query_width * config.seq_length  # 12·q·s halved for the causal mask
    return linear + core


def flops_per_iteration(config: TrainerConfig, vocab_size_padded: int) -> float:
    """Model FLOPs of one iteration over the whole global batch."""
    tokens = config.global_batch_size * config.seq_length
    layers_flops = 0.0
    for layer in range(config.num_layers):
        is_moe_layer = config.is_moe_layer(layer)
        layers_flops += _attention_flops_per_token(config) + _mlp_flops_per_token(config, is_moe_layer)
    logits = 6.0 * config.hidden_size * vocab_size_padded
    return tokens * (layers_flops + logits)
