#!/usr/bin/env bash
# AMD Primus launch: llama3.3-70b on 8 node(s) x 8 H100-SXM5-80GB
# Layout TP=8 PP=2 VPP=1 CP=1 EP=1 DP=4 MBS=1 GBS=512; precision bf16.
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
# one hardware queue keeps TP/CP communication kernels in issue order, as Megatron asserts with TP or CP > 1 before Blackwell
export CUDA_DEVICE_MAX_CONNECTIONS=1
# growable allocator segments: fewer fragmentation OOMs with varying activation sizes
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# keep 16 SMs free of the fwd norm kernels for the overlapped TP communication (--tp-comm-overlap)
export NVTE_FWD_LAYERNORM_SM_MARGIN=16
# keep 16 SMs free of the bwd norm kernels for the overlapped TP communication (--tp-comm-overlap)
export NVTE_BWD_LAYERNORM_SM_MARGIN=16
# 2 MiB chunks for pipeline send/recv over the network (Megatron-Bridge, Llama 70B/405B with PP > 1): fewer, larger transfers
export NCCL_P2P_NET_CHUNKSIZE=2097152

# ---- node wiring: primus-cli reads these; run this script on every node
export NNODES=8
export GPUS_PER_NODE=8
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0..7}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
export NODE_RANK MASTER_ADDR
export MASTER_PORT=29611

# ---- the experiment file (a quoted heredoc: nothing in it is expanded by the shell)
CONFIG=/lustre/jobs/llama3.3-70b_8nodes/train.primus.yaml
mkdir -p "$(dirname "$CONFIG")"
cat > "$CONFIG" <<'PRIMUS_EXPERIMENT_YAML'
# Primus experiment for llama3.3-70b, drafted by megapilot (overrides = Megatron args)
work_group: megapilot
user_name: megapilot
exp_name: llama3.3-70b_8nodes
workspace: /lustre/jobs/llama3.3-70b_8nodes/logs
modules:
  pre_trainer:
    framework: megatron
    config: pre_trainer.yaml
    model: language_model.yaml
    overrides:
      num_layers: 80
      hidden_size: 8192
      ffn_hidden_size: 28672
      num_attention_heads: 64
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
      tensor_model_parallel_size: 8
      pipeline_model_parallel_size: 2
      context_parallel_size: 1
      sequence_parallel: true
      use_distributed_optimizer: true
      overlap_grad_reduce: true
      overlap_param_gather: true
      recompute_activations: true
      bf16: true
      transformer_impl: transformer_engine
      micro_batch_size: 1
      global_batch_size: 512
      seq_length: 8192
      train_iters: 1000
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
      tokenizer_model: /lustre/tokenizers/llama3.3-70b
      log_interval: 1
      log_throughput: true
      timing_log_level: 1
      tensorboard_dir: /lustre/checkpoints/llama3.3-70b_8nodes/tensorboard
      log_timers_to_tensorboard: true
      log_memory_to_tensorboard: true
      save: /lustre/checkpoints/llama3.3-70b_8nodes
      save_interval: 1000
      load: /lustre/checkpoints/llama3.3-70b_8nodes
      ckpt_format: torch_dist
      tp_comm_overlap: true
      cross_entropy_loss_fusion: true
      cross_entropy_fusion_impl: native
      create_attention_mask_in_dataloader: false
      manual_gc: true
      manual_gc_interval: 100
      data_cache_path: /lustre/checkpoints/llama3.3-70b_8nodes/data-cache
      distributed_timeout_minutes: 15
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
