#!/usr/bin/env bash
# torchrun launch: mixtral-8x7b on 2 node(s) x 8 H100-SXM5-80GB
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

# ---- multi-node (static rendezvous): run this script on each of the 2 nodes
# with NODE_RANK=0..1 and MASTER_ADDR=<address of node 0>.
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0..1}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"

TORCHRUN_ARGS=(
  --nnodes 2
  --nproc-per-node 8
  --node-rank "$NODE_RANK"
  --master-addr "$MASTER_ADDR"
  --master-port 29611
)

MEGATRON_ARGS=(
  # model: mixtral-8x7b
  --num-layers 32
  --hidden-size 4096
  --ffn-hidden-size 14336
  --num-attention-heads 32
  --kv-channels 128
  --group-query-attention
  --num-query-groups 8
  --swiglu
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --position-embedding-type rope
  --rotary-base 1000000
  --max-position-embeddings 32768
  --make-vocab-size-divisible-by 128
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --num-experts 8
  --moe-router-topk 2
  --moe-ffn-hidden-size 14336
  --moe-layer-freq 1
  --moe-router-score-function softmax
  --moe-router-load-balancing-type aux_loss
  --moe-aux-loss-coeff 0.01
  --moe-token-dispatcher-type alltoall
  # parallelism: TP=2 PP=1 VPP=1 CP=1 EP=8 DP=8
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --expert-model-parallel-size 8
  --expert-tensor-parallel-size 1
  --sequence-parallel
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # activation recompute: selective
  --recompute-activations
  # precision: bf16 on H100-SXM5-80GB
  --bf16
  --transformer-impl transformer_engine
  --moe-grouped-gemm
  # training: 256 x 4096 tokens per step
  --micro-batch-size 1
  --global-batch-size 256
  --seq-length 4096
  --train-iters 100
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
  # data and tokenizer
  --data-path /lustre/data/fineweb/fineweb_text_document
  --split '99,1,0'
  --tokenizer-type HuggingFaceTokenizer
  --tokenizer-model /lustre/tokenizers/mixtral-8x7b
  # logging
  --log-interval 1
  --log-throughput
  --timing-log-level 1
  --tensorboard-dir /lustre/checkpoints/mixtral-8x7b_ep8/tensorboard
  --log-timers-to-tensorboard
  --log-memory-to-tensorboard
  # checkpoints
  --save /lustre/checkpoints/mixtral-8x7b_ep8
  --save-interval 100
  --load /lustre/checkpoints/mixtral-8x7b_ep8
  --ckpt-format torch_dist
  # performance: overlap TP all-gather/reduce-scatter with the GEMMs (TE userbuffers; needs SP)
  --tp-comm-overlap
  # performance: fused vocab-parallel cross entropy (Megatron's native kernel; Megatron-LM disabled TE's for stability)
  --cross-entropy-loss-fusion
  --cross-entropy-fusion-impl native
  # performance: TE/flash attention builds the causal mask itself; the dataloader need not make a seq x seq mask per sample
  --no-create-attention-mask-in-dataloader
  # performance: fused token permute/unpermute around the experts (TE >= 2.1)
  --moe-permute-fusion
  # performance: Python GC only every 100 steps, in step with all ranks (a rank collecting on its own stalls every collective)
  --manual-gc
  --manual-gc-interval 100
  # data: index caches written here, not beside a shared (often read-only) dataset
  --data-cache-path /lustre/checkpoints/mixtral-8x7b_ep8/data-cache
  # runtime: collective timeout 21 min = 10 + 1 per 16 nodes beyond 16 + one checkpoint write at 0.5 GB/s per node
  --distributed-timeout-minutes 21
)

exec python3 -m torch.distributed.run "${TORCHRUN_ARGS[@]}" /opt/Megatron-LM/pretrain_gpt.py "${MEGATRON_ARGS[@]}"
