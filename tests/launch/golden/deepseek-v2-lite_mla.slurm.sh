#!/usr/bin/env bash
#SBATCH --job-name=deepseek-v2-lite_mla
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --output=/lustre/jobs/deepseek-v2-lite_mla/logs/%x-%j.out
# SLURM sbatch launch: deepseek-v2-lite on 1 node(s) x 8 MI300X
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
  # model: deepseek-v2-lite
  --num-layers 27
  --hidden-size 2048
  --ffn-hidden-size 10944
  --num-attention-heads 16
  --qk-layernorm
  --swiglu
  --normalization RMSNorm
  --norm-epsilon 1e-06
  --position-embedding-type rope
  --rotary-base 10000
  --rope-type yarn
  --rotary-scaling-factor 40.0
  --mscale 0.707
  --mscale-all-dim 0.707
  --max-position-embeddings 163840
  --make-vocab-size-divisible-by 128
  --untie-embeddings-and-output-weights
  --disable-bias-linear
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --multi-latent-attention
  --kv-lora-rank 512
  --qk-head-dim 128
  --qk-pos-emb-head-dim 64
  --v-head-dim 128
  --num-experts 64
  --moe-router-topk 6
  --moe-ffn-hidden-size 1408
  --moe-shared-expert-intermediate-size 2816
  --moe-layer-freq '([0]*1+[1]*26)'
  --moe-router-score-function softmax
  --moe-router-pre-softmax
  --moe-router-dtype fp32
  --moe-router-load-balancing-type seq_aux_loss
  --moe-aux-loss-coeff 0.001
  --moe-token-dispatcher-type alltoall
  # parallelism: TP=1 PP=1 VPP=1 CP=1 EP=8 DP=8
  --tensor-model-parallel-size 1
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --expert-model-parallel-size 8
  --expert-tensor-parallel-size 1
  --use-distributed-optimizer
  --overlap-grad-reduce
  --overlap-param-gather
  # activation recompute: selective
  --recompute-activations
  # precision: bf16 on MI300X
  --bf16
  --transformer-impl transformer_engine
  --moe-grouped-gemm
  # training: 64 x 4096 tokens per step
  --micro-batch-size 1
  --global-batch-size 64
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
  --tokenizer-model /lustre/tokenizers/deepseek-v2-lite
  # logging
  --log-interval 1
  --log-throughput
  --timing-log-level 1
  --tensorboard-dir /lustre/checkpoints/deepseek-v2-lite_mla/tensorboard
  --log-timers-to-tensorboard
  --log-memory-to-tensorboard
  # checkpoints
  --save /lustre/checkpoints/deepseek-v2-lite_mla
  --save-interval 100
  --load /lustre/checkpoints/deepseek-v2-lite_mla
  --ckpt-format torch_dist
  # performance: fused vocab-parallel cross entropy (Megatron's native kernel; Megatron-LM disabled TE's for stability)
  --cross-entropy-loss-fusion
  --cross-entropy-fusion-impl native
  # performance: TE/flash attention builds the causal mask itself; the dataloader need not make a seq x seq mask per sample
  --no-create-attention-mask-in-dataloader
  # performance: Python GC only every 100 steps, in step with all ranks (a rank collecting on its own stalls every collective)
  --manual-gc
  --manual-gc-interval 100
  # data: index caches written here, not beside a shared (often read-only) dataset
  --data-cache-path /lustre/checkpoints/deepseek-v2-lite_mla/data-cache
  # runtime: collective timeout 18 min = 10 + 1 per 16 nodes beyond 16 + one checkpoint write at 0.5 GB/s per node
  --distributed-timeout-minutes 18
  # runtime: save and exit after 227 min, before the SLURM limit 04:00:00 kills the job
  --exit-duration-in-mins 227
)

SRUN_ARGS=(
  --ntasks-per-node=1
  --kill-on-bad-exit=1
  --container-image=rocm/megatron-lm:v25.9
  --container-mounts=/lustre:/lustre
)

srun "${SRUN_ARGS[@]}" python3 -m torch.distributed.run "${TORCHRUN_ARGS[@]}" /opt/Megatron-LM/pretrain_gpt.py "${MEGATRON_ARGS[@]}"
