#!/usr/bin/env bash
#SBATCH --job-name=llama3.1-405b_pp16_uneven
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --output=/lustre/jobs/llama3.1-405b_pp16_uneven/logs/%x-%j.out
# SLURM sbatch launch: llama3.1-405b on 16 node(s) x 8 H100-SXM5-80GB
# Layout TP=8 PP=16 VPP=1 CP=1 EP=1 DP=1 MBS=1 GBS=256 PP_FIRST_LAYERS=7 PP_LAST_LAYERS=7; precision bf16.
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

# ---- rendezvous: the first node of the allocation hosts it; one torchrun per node joins
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=29611
export MASTER_ADDR MASTER_PORT

TORCHRUN_ARGS=(
  --nnodes "$SLURM_NNODES"
  --nproc-per-node 8
  --rdzv-backend c10d
  --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"
  --rdzv-id "$SLURM_JOB_ID"
)

MEGATRON_ARGS=(
  # model: llama3.1-405b
  --num-layers 126
  --hidden-size 16384
  --ffn-hidden-size 53248
  --num-attention-heads 128
  --kv-channels 128
  --group-query-attention
  --num-query-groups 8
  --swiglu
  --normalization RMSNorm
  --norm-epsilon 1e-05
  --position-embedding-type rope
  --rotary-base 500000
  --use-rope-scaling
  --rope-scaling-factor 8.0
  --max-position-embeddings 131072
  --make-vocab-size-divisible-by 128
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --attention-dropout 0.0
  --hidden-dropout 0.0
  # parallelism: TP=8 PP=16 VPP=1 CP=1 EP=1 DP=1
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 16
  --decoder-first-pipeline-num-layers 7
  --decoder-last-pipeline-num-layers 7
  --context-parallel-size 1
  --sequence-parallel
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # activation recompute: full
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  # precision: bf16 on H100-SXM5-80GB
  --bf16
  --transformer-impl transformer_engine
  # training: 256 x 8192 tokens per step
  --micro-batch-size 1
  --global-batch-size 256
  --seq-length 8192
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
  --tokenizer-model /lustre/tokenizers/llama3.1-405b
  # logging
  --log-interval 1
  --log-throughput
  --timing-log-level 1
  --tensorboard-dir /lustre/checkpoints/llama3.1-405b_pp16_uneven/tensorboard
  --log-timers-to-tensorboard
  --log-memory-to-tensorboard
  # checkpoints
  --save /lustre/checkpoints/llama3.1-405b_pp16_uneven
  --save-interval 100
  --load /lustre/checkpoints/llama3.1-405b_pp16_uneven
  --ckpt-format torch_dist
  # performance: overlap TP all-gather/reduce-scatter with the GEMMs (TE userbuffers; needs SP)
  --tp-comm-overlap
  # performance: fused vocab-parallel cross entropy (Megatron's native kernel; Megatron-LM disabled TE's for stability)
  --cross-entropy-loss-fusion
  --cross-entropy-fusion-impl native
  # performance: TE/flash attention builds the causal mask itself; the dataloader need not make a seq x seq mask per sample
  --no-create-attention-mask-in-dataloader
  # performance: Python GC only every 100 steps, in step with all ranks (a rank collecting on its own stalls every collective)
  --manual-gc
  --manual-gc-interval 100
  # data: index caches written here, not beside a shared (often read-only) dataset
  --data-cache-path /lustre/checkpoints/llama3.1-405b_pp16_uneven/data-cache
  # runtime: collective timeout 22 min = 10 + 1 per 16 nodes beyond 16 + one checkpoint write at 0.5 GB/s per node
  --distributed-timeout-minutes 22
  # runtime: save and exit after 223 min, before the SLURM limit 04:00:00 kills the job
  --exit-duration-in-mins 223
)

SRUN_ARGS=(
  --ntasks-per-node=1
  --kill-on-bad-exit=1
  --container-image=nvcr.io/nvidia/pytorch:25.09-py3
  --container-mounts=/lustre:/lustre
)

srun "${SRUN_ARGS[@]}" python3 -m torch.distributed.run "${TORCHRUN_ARGS[@]}" /opt/Megatron-LM/pretrain_gpt.py "${MEGATRON_ARGS[@]}"
