#!/usr/bin/env bash
# torchrun launch: tiny on 1 node(s) x 2 H100-SXM5-80GB
# Layout TP=1 PP=1 VPP=1 CP=1 EP=1 DP=2 MBS=8 GBS=16; precision bf16.
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

TORCHRUN_ARGS=(
  --standalone
  --nnodes 1
  --nproc-per-node 2
)

MEGATRON_ARGS=(
  # model: tiny
  --num-layers 4
  --hidden-size 128
  --ffn-hidden-size 512
  --num-attention-heads 4
  --kv-channels 32
  --normalization LayerNorm
  --norm-epsilon 1e-05
  --position-embedding-type learned_absolute
  --max-position-embeddings 128
  --make-vocab-size-divisible-by 128
  --attention-dropout 0.0
  --hidden-dropout 0.0
  # parallelism: TP=1 PP=1 VPP=1 CP=1 EP=1 DP=2
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # precision: fp32 on CPU (gloo, local layers)
  --transformer-impl local
  --distributed-backend gloo
  # training: 16 x 128 tokens per step
  --micro-batch-size 8
  --global-batch-size 16
  --seq-length 128
  --train-iters 10
  --lr 0.0003
  --min-lr 3e-05
  --lr-decay-style cosine
  --lr-warmup-iters 0
  --weight-decay 0.1
  --clip-grad 1.0
  --adam-beta1 0.9
  --adam-beta2 0.95
  --init-method-std 0.02
  --seed 1234
  --eval-interval 1000
  # data and tokenizer: bytes (the embedded trainer's tokenizer for --data-path)
  --data-path /tmp/tour/docs
  --split '99,1,0'
  # logging
  --log-interval 1
  --log-throughput
  --timing-log-level 1
  # checkpoints
  --ckpt-format torch_dist
)

exec /work/main/.venv/bin/python3.11 -m torch.distributed.run "${TORCHRUN_ARGS[@]}" -m megapilot.trainer "${MEGATRON_ARGS[@]}"
