"""Build the GPT model chunks, wrapped in Megatron's DistributedDataParallel, and the optimizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.activations import squared_relu
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.optimizer import MegatronOptimizer, OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionBlockSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

from megapilot.errors import MegapilotError
from megapilot.trainer import cpu_compat
from megapilot.trainer.config import TrainerConfig
from megapilot.trainer.mla_attention import with_local_mla_attention


def params_dtype(config: TrainerConfig) -> torch.dtype:
    if config.bf16:
        return torch.bfloat16
    if config.fp16:
        return torch.float16
    return torch.float32


def transformer_config(config: TrainerConfig, on_gpu: bool) -> TransformerConfig:
    """Megatron's TransformerConfig (MLATransformerConfig under MLA) from the flags, as Megatron-LM's
    core_transformer_config_from_args builds it; fused kernels off (they need CUDA/TE/Apex)."""
    dtype = params_dtype(config)
    interleaved = config.virtual_pipeline_model_parallel_size is not None
    common = dict(
        num_layers=config.num_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads, num_query_groups=config.num_query_groups,
        ffn_hidden_size=config.ffn_hidden_size, kv_channels=config.kv_channels,
        init_method_std=config.init_method_std, hidden_dropout=config.hidden_dropout,
        attention_dropout=config.attention_dropout, layernorm_epsilon=config.norm_epsilon,
        normalization=config.normalization, gated_linear_unit=config.swiglu,
        activation_func=_activation(config), add_bias_linear=config.add_bias_linear,
        add_qkv_bias=config.add_qkv_bias, qk_layernorm=config.qk_layernorm, window_size=config.window_size,
        apply_residual_connection_post_layernorm=config.apply_residual_connection_post_layernorm,
        **config.parallel_sizes(),
        num_layers_in_first_pipeline_stage=config.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=config.decoder_last_pipeline_num_layers,
        sequence_parallel=config.sequence_parallel,
        pipeline_dtype=dtype, params_dtype=dtype, bf16=config.bf16, fp16=config.fp16,
        recompute_granularity=config.recompute_granularity, recompute_method=config.recompute_method,
        recompute_num_layers=config.recompute_num_layers,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        # Megatron-LM's defaults: with VPP, overlapped unbatched p2p; otherwise batched p2p. (Batched
        # ops with PP=2 and VPP would pair a gradient send with an activation receive on gloo.)
        overlap_p2p_comm=interleaved, batch_p2p_comm=not interleaved,
        **_moe_options(config), **_mtp_options(config),
        **({} if on_gpu else cpu_compat.transformer_overrides()),
    )
    try:
        if config.multi_latent_attention:
            return MLATransformerConfig(**common, **_mla_options(config))
        return TransformerConfig(**common)
    except (ValueError, AssertionError) as refused:
        # Megatron-Core's own checks of the combination (e.g. top-1 routing needs --moe-router-pre-softmax):
        # a user error in the flags, said in Megatron's words, not a traceback.
        raise MegapilotError(f"Megatron-Core refuses these flags: {refused}", field="flags",
                             fix="change the flags the message names (a TransformerConfig rule)") from None


def _activation(config: TrainerConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    if config.swiglu:
        return F.silu
    return squared_relu if config.squared_relu else F.gelu


def _moe_options(config: TrainerConfig) -> dict[str, object]:
    if not config.is_moe:
        return {}
    freq = config.moe_layer_freq
    return dict(
        num_moe_experts=config.num_experts, moe_router_topk=config.moe_router_topk,
        moe_ffn_hidden_size=config.moe_ffn_hidden_size or config.ffn_hidden_size,
        moe_router_load_balancing_type=config.moe_router_load_balancing_type,
        moe_aux_loss_coeff=config.moe_aux_loss_coeff, moe_token_dispatcher_type=config.moe_token_dispatcher_type,
        moe_shared_expert_intermediate_size=config.moe_shared_expert_intermediate_size,
        moe_shared_expert_gate=config.moe_shared_expert_gate,
        moe_layer_freq=freq if isinstance(freq, int) else list(freq), moe_router_dtype=config.moe_router_dtype,
        moe_router_score_function=config.moe_router_score_function,
        moe_router_pre_softmax=config.moe_router_pre_softmax,
        moe_router_topk_scaling_factor=config.moe_router_topk_scaling_factor,
        moe_router_num_groups=config.moe_router_num_groups, moe_router_group_topk=config.moe_router_group_topk,
        moe_router_enable_expert_bias=config.moe_router_enable_expert_bias,
        moe_router_bias_update_rate=config.moe_router_bias_update_rate,
    )


def _mtp_options(config: TrainerConfig) -> dict[str, object]:
    if not config.mtp_num_layers:
        return {}
    return dict(mtp_num_layers=config.mtp_num_layers, mtp_loss_scaling_factor=config.mtp_loss_scaling_factor)


def _mla_options(config: TrainerConfig) -> dict[str, object]:
    """MLA's own fields. As Megatron-LM, an unset --rope-type keeps MLATransformerConfig's default (yarn)."""
    return dict(
        multi_latent_attention=True, q_lora_rank=config.q_lora_rank, kv_lora_rank=config.kv_lora_rank,
        qk_head_dim=config.qk_head_dim, qk_pos_emb_head_dim=config.qk_pos_emb_head_dim,
        v_head_dim=config.v_head_dim, rotary_base=config.rotary_base, rotary_percent=config.rotary_percent,
        rotary_scaling_factor=config.rotary_scaling_factor, mscale=config.mscale,
        mscale_all_dim=config.mscale_all_dim, **({"rope_type": config.rope_type} if config.rope_type else {}),
    )


def uses_transformer_engine(on_gpu: bool) -> bool:
    """Whether the layers are built with Transformer Engine (on a GPU where it is installed)."""
    if not on_gpu:
        return False
    try:
        import transformer_engine  # noqa: F401  (only the import is checked)
    except ImportError:
        return False
    return True


def layer_spec(config: TrainerConfig, tconfig: TransformerConfig, on_gpu: bool,
               vp_stage: int | None) -> ModuleSpec | TransformerBlockSubmodules:
    """The decoder's layer spec as Megatron-LM's gpt_builder chooses it (a block spec for MoE models,
    so dense-first layers and --moe-layer-freq patterns are honoured)."""
    use_te = uses_transformer_engine(on_gpu)
    if config.is_moe:
        spec = get_gpt_decoder_block_spec(tconfig, use_transformer_engine=use_te,
                                          normalization=config.normalization, vp_stage=vp_stage)
    elif use_te:
        spec = get_gpt_layer_with_transformer_engine_spec(
            qk_layernorm=config.qk_layernorm, multi_latent_attention=config.multi_latent_attention)
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization=config.normalization,
                                        multi_latent_attention=config.multi_latent_attention)
    return _local_mla(spec, config, use_te)


def _local_mla(spec: Any, config: TrainerConfig, use_te: bool) -> Any:
    """Megatron-Core's local attention cannot take MLA's two head dims; use the trainer's own without TE."""
    if use_te or not config.multi_latent_attention:
        return spec
    return with_local_mla_attention(spec)


def mtp_block_spec(config: TrainerConfig, tconfig: TransformerConfig, on_gpu: bool,
                   vp_stage: int | None) -> MultiTokenPredictionBlockSubmodules | None:
    """MTP modules built like the last decoder layer (gpt_builder's rule); None without MTP."""
    if not config.mtp_num_layers:
        return None
    use_te = uses_transformer_engine(on_gpu)
    last_layer = _local_mla(get_gpt_decoder_layer_specs(tconfig, use_transformer_engine=use_te,
                                                        normalization=config.normalization)[-1], config, use_te)
    return get_gpt_mtp_block_spec(tconfig, last_layer, use_transformer_engine=use_te, vp_stage=vp_stage)


def model_chunk(config: TrainerConfig, tconfig: TransformerConfig, vocab_size: int, on_gpu: bool,
                vp_stage: int | None) -> GPTModel:
    """One GPTModel (a pipeline chunk) with every model flag honoured, as pretrain_gpt.py builds it."""
    first = parallel_state.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    return GPTModel(
        config=tconfig, transformer_layer_spec=layer_spec(config, tconfig, on_gpu, vp_stage),
        vocab_size=vocab_size, max_sequence_length=config.max_position_embeddings, pre_process=first,
        post_process=last, share_embeddings_and_output_weights=not config.untie_embeddings_and_output_weights,
        position_embedding_type=config.position_embedding_type, rotary_percent=config.rotary_percent,
        rotary_base=config.rotary_base, rope_scaling=config.use_rope_scaling,
        rope_scaling_factor=config.rope_scaling_factor,
        mtp_block_spec=mtp_block_spec(config, tconfig, on_gpu, vp_stage), vp_stage=vp_stage,
    )


def build_model(config: TrainerConfig, vocab_size_padded: int, on_gpu: bool) -> list[DistributedDataParallel]:
    """One DDP-wrapped GPTModel per virtual pipeline stage held by this rank (one without VPP)."""
    tconfig = transformer_config(config, on_gpu)
    vpp = config.virtual_pipeline_model_parallel_size
    stages = [None] if vpp is None else list(range(vpp))
    chunks = [model_chunk(config, tconfig, vocab_size_padded, on_gpu, stage) for stage in stages]
    if on_gpu:
        chunks = [chunk.cuda(torch.cuda.current_device()) for chunk in chunks]
    if config.bf16 or config.fp16:
        # As Megatron-LM's get_model: half-precision weights, inputs cast on the first stage and
        # outputs back to fp32 on the last.
        from megatron.core.transformer.module import Float16Module

        chunks = [Float16Module(tconfig, chunk) for chunk in chunks]
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=config.accumulate_allreduce_grads_in_fp32 or not (config.bf16 or config.fp16),
        overlap_grad_reduce=config.overlap_grad_reduce, overlap_param_gather=config.overlap_param_gather,
        use_distributed_optimizer=config.use_distributed_optimizer,
        check_for_nan_in_grad=False, average_in_collective=True,
    )
    return [
        DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=chunk,
                                disable_bucketing=index > 0)
        for index, chunk in enumerate(chunks)
    ]


def build_optimizer(
    config: TrainerConfig, model: list[DistributedDataParallel]
) -> tuple[MegatronOptimizer, OptimizerParamScheduler]:
    """Megatron's optimizer (distributed or not) and its warm-up + decay scheduler (sample-based)."""
    optimizer_config = OptimizerConfig(
        optimizer=config.optimizer, lr=config.lr, min_lr=config.min_lr, weight_decay=config.weight_decay,
        adam_beta1=config.adam_beta1, adam_beta2=config.adam_beta2, adam_eps=config.adam_eps,
        clip_grad=config.clip_grad, bf16=config.bf16, fp16=config.fp16, params_dtype=params_dtype(config),
        loss_scale=config.loss_scale, initial_loss_scale=config.initial_loss_scale,
        use_distributed_optimizer=config.use_distributed_optimizer,
        overlap_param_gather=config.overlap_param_gather,
    )
    optimizer = get_megatron_optimizer(optimizer_config, model)
    batch = config.global_batch_size
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=config.lr_warmup_init, max_lr=config.lr, min_lr=config.min_lr,
        lr_warmup_steps=config.lr_warmup_iters * batch, lr_decay_steps=config.lr_decay_iters * batch,
        lr_decay_style=config.lr_decay_style, start_wd=config.weight_decay, end_wd=config.weight_decay,
        wd_incr_steps=config.train_iters * batch, wd_incr_style="constant",
    )
    return optimizer, scheduler


def count_parameters(model: list[DistributedDataParallel]) -> int:
    return sum(p.numel() for chunk in model for p in chunk.parameters())
