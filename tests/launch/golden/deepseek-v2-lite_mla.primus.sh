#!/usr/bin/env bash
# AMD Primus launch: deepseek-v2-lite on 1 node(s) x 8 MI300X
# Layout TP=1 PP=1 VPP=1 CP=1 EP=8 DP=8 MBS=1 GBS=64; precision bf16.
# Flags checked against Megatron-LM core_v0.19.0. Drafted by megapilot: review, then run.
set -euo pipefail

# ---- environment: each variable with the reason it is set
# one OpenMP thread per rank: torchrun's default too, stated so the CPU is not oversubscribed
export OMP_NUM_THREADS=1
# free collective buffers on stream sync instead of recordStream: less memory fragmentation
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
# NCCL/RCCL warnings reach the log, so a hang or link error leaves evidence
export NCCL_DEBUG=WARN
# collectives on high-priority streams, so overlapped communication is not starved by compute
export TORCH_NCCL_HIGH_PRIORITY=1
# one hardware queue keeps TP/CP communication kernels in issue order (Megatron asserts 1 with TP/CP > 1 before arch 10; Primus sets 1)
export CUDA_DEVICE_MAX_CONNECTIONS=1
# keep kernel scratch memory allocated: reclaiming it between kernels stalls large GEMMs
export HSA_NO_SCRATCH_RECLAIM=1
# host/device copies on the SDMA engines, not compute units (Primus base_env.sh default)
export HSA_ENABLE_SDMA=1
# fewer HIP hardware queues lowers launch contention for one rank per GPU
export GPU_MAX_HW_QUEUES=2
# MSCCL algorithms off: plain RCCL rings/trees are the tested path
export RCCL_MSCCL_ENABLE=0
# skip RCCL's per-call argument checks (Primus base_env.sh)
export NCCL_CHECKS_DISABLE=1
# no PXN relays through peer GPUs: they cost GPU memory (Primus default)
export NCCL_PXN_DISABLE=1
# 512 KiB network chunks for send/recv (Primus base_env.sh)
export NCCL_P2P_NET_CHUNKSIZE=524288
# growable allocator segments: fewer fragmentation OOMs
export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True
# CK v3 attention backward with fp32 atomics: the setting AMD uses on MI300X/MI325X
export NVTE_CK_IS_V3_ATOMIC_FP32=1

# ---- node wiring: primus-cli reads these; run this script on every node
export NNODES=1
export GPUS_PER_NODE=8
export NODE_RANK=0
export MASTER_ADDR=localhost
export MASTER_PORT=29611

# ---- the experiment file (a quoted heredoc: nothing in it is expanded by the shell)
CONFIG=/lustre/jobs/deepseek-v2-lite_mla/train.primus.yaml
mkdir -p "$(dirname "$CONFIG")"
cat > "$CONFIG" <<'PRIMUS_EXPERIMENT_YAML'
# Primus experiment for deepseek-v2-lite, drafted by megapilot (overrides = Megatron args)
work_group: megapilot
user_name: megapilot
exp_name: deepseek-v2-lite_mla
workspace: /lustre/jobs/deepseek-v2-lite_mla/logs
modules:
  pre_trainer:
    framework: megatron
    config: pre_trainer.yaml
    model: language_model.yaml
    overrides:
      num_layers: 27
      hidden_size: 2048
      ffn_hidden_size: 10944
      num_attention_heads: 16
      qk_layernorm: true
      swiglu: true
      normalization: RMSNorm
      layernorm_epsilon: 1.0e-06
      position_embedding_type: rope
      rotary_base: 10000
      rope_type: yarn
      rotary_scaling_factor: 40.0
      mscale: 0.707
      mscale_all_dim: 0.707
      max_position_embeddings: 163840
      make_vocab_size_divisible_by: 128
      untie_embeddings_and_output_weights: true
      add_bias_linear: false
      attention_dropout: 0.0
      hidden_dropout: 0.0
      multi_latent_attention: true
      kv_lora_rank: 512
      qk_head_dim: 128
      qk_pos_emb_head_dim: 64
      v_head_dim: 128
      num_experts: 64
      moe_router_topk: 6
      moe_ffn_hidden_size: 1408
      moe_shared_expert_intermediate_size: 2816
      moe_layer_freq: ([0]*1+[1]*26)
      moe_router_score_function: softmax
      moe_router_pre_softmax: true
      moe_router_dtype: fp32
      moe_router_load_balancing_type:
      - seq_aux_loss
      moe_aux_loss_coeff:
      - 0.001
      moe_token_dispatcher_type: alltoall
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      expert_model_parallel_size: 8
      expert_tensor_parallel_size: 1
      use_distributed_optimizer: true
      overlap_grad_reduce: true
      overlap_param_gather: true
      recompute_activations: true
      bf16: true
      transformer_impl: transformer_engine
      moe_grouped_gemm: true
      micro_batch_size: 1
      global_batch_size: 64
      seq_length: 4096
      train_iters: 100
      lr: 0.0003
      min_lr: 3.0e-05
      lr_decay_style: cosine
      lr_warmup_iters: 0
      weight_decay: 0.1
      clip_grad: 1.0
      adam_beta1: 0.9
      adam_beta2: 0.95
      init_method_std: 0.02
      seed: 1234
      eval_interval: 1000
      data_path:
      - /lustre/data/fineweb/fineweb_text_document
      split: 99,1,0
      tokenizer_type: HuggingFaceTokenizer
      tokenizer_model: /lustre/tokenizers/deepseek-v2-lite
      log_interval: 1
      log_throughput: true
      timing_log_level: 1
      tensorboard_dir: /lustre/checkpoints/deepseek-v2-lite_mla/tensorboard
      log_timers_to_tensorboard: true
      log_memory_to_tensorboard: true
      save: /lustre/checkpoints/deepseek-v2-lite_mla
      save_interval: 100
      load: /lustre/checkpoints/deepseek-v2-lite_mla
      ckpt_format: torch_dist
      cross_entropy_loss_fusion: true
      cross_entropy_fusion_impl: native
      create_attention_mask_in_dataloader: false
      manual_gc: true
      manual_gc_interval: 100
      data_cache_path: /lustre/checkpoints/deepseek-v2-lite_mla/data-cache
      distributed_timeout_minutes: 18
      sequence_parallel: false
      group_query_attention: false
      add_qkv_bias: false
      mock_data: false
      fp16: false
      add_position_embedding: true
      override_opt_param_scheduler: false
      manual_gc_eval: true
      eval_iters: 100
      dataloader_type: single
      exit_on_missing_checkpoint: false
      finetune: false
      enable_primus_turbo: true
      use_turbo_attention: true
      use_turbo_grouped_gemm: true
PRIMUS_EXPERIMENT_YAML

cd /workspace/Primus
exec bash runner/primus-cli direct -- train pretrain --config "$CONFIG"
