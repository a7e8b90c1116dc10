#!/usr/bin/env bash
# AMD Primus launch: llama3.1-8b on 1 node(s) x 8 H100-SXM5-80GB
# Layout TP=1 PP=1 VPP=1 CP=1 EP=1 DP=8 MBS=1 GBS=128; precision fp8.
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
# no TP/CP ordering to keep: 8 queues let the DP overlap run beside compute (Megatron-Bridge's default)
export CUDA_DEVICE_MAX_CONNECTIONS=8
# growable allocator segments: fewer fragmentation OOMs with varying activation sizes
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

# ---- node wiring: primus-cli reads these; run this script on every node
export NNODES=1
export GPUS_PER_NODE=8
export NODE_RANK=0
export MASTER_ADDR=localhost
export MASTER_PORT=29611

# ---- the experiment file (a quoted heredoc: nothing in it is expanded by the shell)
CONFIG=/lustre/jobs/llama3.1-8b_1node/train.primus.yaml
mkdir -p "$(dirname "$CONFIG")"
cat > "$CONFIG" <<'PRIMUS_EXPERIMENT_YAML'
# Primus experiment for llama3.1-8b, drafted by megapilot (overrides = Megatron args)
work_group: megapilot
user_name: megapilot
exp_name: llama3.1-8b_1node
workspace: /lustre/jobs/llama3.1-8b_1node/logs
modules:
  pre_trainer:
    framework: megatron
    config: pre_trainer.yaml
    model: language_model.yaml
    overrides:
      num_layers: 32
      hidden_size: 4096
      ffn_hidden_size: 14336
      num_attention_heads: 32
      kv_channels: 128
      group_query_attention: true
      num_query_groups: 8
      swiglu: true
      normalization: RMSNorm
      layernorm_epsilon: 1.0e-05
      position_embedding_type: rope
      rotary_base: 500000
      use_rope_scaling: true
      rope_scaling_factor: 8.0
      max_position_embeddings: 131072
      make_vocab_size_divisible_by: 128
      untie_embeddings_and_output_weights: true
      add_bias_linear: false
      attention_dropout: 0.0
      hidden_dropout: 0.0
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      use_distributed_optimizer: true
      overlap_grad_reduce: true
      overlap_param_gather: true
      bf16: true
      fp8: hybrid
      fp8_recipe: tensorwise
      fp8_param_gather: true
      transformer_impl: transformer_engine
      micro_batch_size: 1
      global_batch_size: 128
      seq_length: 8192
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
      tokenizer_model: /lustre/tokenizers/llama3.1-8b
      log_interval: 1
      log_throughput: true
      timing_log_level: 1
      tensorboard_dir: /lustre/checkpoints/llama3.1-8b_1node/tensorboard
      log_timers_to_tensorboard: true
      log_memory_to_tensorboard: true
      save: /lustre/checkpoints/llama3.1-8b_1node
      save_interval: 100
      load: /lustre/checkpoints/llama3.1-8b_1node
      ckpt_format: torch_dist
      cross_entropy_loss_fusion: true
      cross_entropy_fusion_impl: native
      create_attention_mask_in_dataloader: false
      manual_gc: true
      manual_gc_interval: 100
      data_cache_path: /lustre/checkpoints/llama3.1-8b_1node/data-cache
      distributed_timeout_minutes: 14
      sequence_parallel: false
      qk_layernorm: false
      add_qkv_bias: false
      multi_latent_attention: false
      mock_data: false
      moe_grouped_gemm: false
      fp16: false
      add_position_embedding: true
      override_opt_param_scheduler: false
      manual_gc_eval: true
      eval_iters: 100
      dataloader_type: single
      exit_on_missing_checkpoint: false
      finetune: false
PRIMUS_EXPERIMENT_YAML

cd /workspace/Primus
exec bash runner/primus-cli direct -- train pretrain --config "$CONFIG"
