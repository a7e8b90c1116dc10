#!/usr/bin/env bash
# AMD Primus launch: mixtral-8x7b on 2 node(s) x 8 H100-SXM5-80GB
# Layout TP=2 PP=1 VPP=1 CP=1 EP=8 DP=8 MBS=1 GBS=256; precision bf16.
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

# ---- node wiring: primus-cli reads these; run this script on every node
export NNODES=2
export GPUS_PER_NODE=8
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0..1}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"
export NODE_RANK MASTER_ADDR
export MASTER_PORT=29611

# ---- the experiment file (a quoted heredoc: nothing in it is expanded by the shell)
CONFIG=/lustre/jobs/mixtral-8x7b_ep8/train.primus.yaml
mkdir -p "$(dirname "$CONFIG")"
cat > "$CONFIG" <<'PRIMUS_EXPERIMENT_YAML'
# Primus experiment for mixtral-8x7b, drafted by megapilot (overrides = Megatron args)
work_group: megapilot
user_name: megapilot
exp_name: mixtral-8x7b_ep8
workspace: /lustre/jobs/mixtral-8x7b_ep8/logs
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
      rotary_base: 1000000
      max_position_embeddings: 32768
      make_vocab_size_divisible_by: 128
      untie_embeddings_and_output_weights: true
      add_bias_linear: false
      attention_dropout: 0.0
      hidden_dropout: 0.0
      num_experts: 8
      moe_router_topk: 2
      moe_ffn_hidden_size: 14336
      moe_layer_freq: 1
      moe_router_score_function: softmax
      moe_router_load_balancing_type:
      - aux_loss
      moe_aux_loss_coeff:
      - 0.01
      moe_token_dispatcher_type: alltoall
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      expert_model_parallel_size: 8
      expert_tensor_parallel_size: 1
      sequence_parallel: true
      use_distributed_optimizer: true
      overlap_grad_reduce: true
      overlap_param_gather: true
      recompute_activations: true
      bf16: true
      transformer_impl: transformer_engine
      moe_grouped_gemm: true
      micro_batch_size: 1
      global_batch_size: 256
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
      tokenizer_model: /lustre/tokenizers/mixtral-8x7b
      log_interval: 1
      log_throughput: true
      timing_log_level: 1
      tensorboard_dir: /lustre/checkpoints/mixtral-8x7b_ep8/tensorboard
      log_timers_to_tensorboard: true
      log_memory_to_tensorboard: true
      save: /lustre/checkpoints/mixtral-8x7b_ep8
      save_interval: 100
      load: /lustre/checkpoints/mixtral-8x7b_ep8
      ckpt_format: torch_dist
      tp_comm_overlap: true
      cross_entropy_loss_fusion: true
      cross_entropy_fusion_impl: native
      create_attention_mask_in_dataloader: false
      moe_permute_fusion: true
      manual_gc: true
      manual_gc_interval: 100
      data_cache_path: /lustre/checkpoints/mixtral-8x7b_ep8/data-cache
      distributed_timeout_minutes: 21
      qk_layernorm: false
      add_qkv_bias: false
      multi_latent_attention: false
      mock_data: false
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
