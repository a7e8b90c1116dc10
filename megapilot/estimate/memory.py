"""Per-GPU memory of the most-loaded rank, GiB.

Two modes:

- `megatron_formula=True` reproduces Megatron-LM's `theoretical_memory_usage.py` (HEAD): weights +
  optimizer at 18 B/param (6 + 12/DP with the distributed optimizer), activations by Korthikanti
  Table 2 (path A: SP + selective; path B: everything else, x1.05), no overhead. Use it to compare
  with the number Megatron prints at the first iteration.
- The default mode is more complete. Differences from Megatron's formula, each a term here:
  * every pipeline stage is costed and the largest is reported (stage 0 holds the embedding and the
    most in-flight micro-batches, the last stage the output layer, fp32 logits and MTP);
  * the stage's real layers are counted (MoE dense-first layers, MTP), experts sharded by EP x ETP and
    their optimizer by expert-DP; norms/router replicated across TP;
  * activations see GQA (smaller K/V), gated MLPs (gate + up outputs), MoE dispatch buffers
    (top-k copies of each token), CP (sequence split), full recompute with `recompute_num_layers`;
  * attention is assumed fused (flash/cuDNN): the s x s scores are never stored, so selective
    core-attention recompute saves nothing more; fp32 softmax statistics are kept;
  * Megatron-FSDP: weights, gradients and optimizer sharded over DP, plus the two gathered layers
    and one layer of full gradients it holds while computing;
  * quantised recipes: GEMM inputs saved for backward in the recipe's bytes, and the recipe's weight copies
    (FP8 and its transpose on Hopper, one copy on Blackwell, both block-scaled layouts) beside the bf16
    weights; FP8 and MXFP8 on NVIDIA with a sharded optimizer keep the weights only in FP8
    (`--fp8-param-gather`, as `script` and the Bridge fp8_cs / fp8_mx presets run), no bf16 copy;
  * an overhead allowance: CUDA context + workspaces (1 GiB), NCCL buffers (0.25 GiB per
    communicator in use), allocator fragmentation (10 % of activations); on a CPU rank, its process's runtime
    instead (Python, torch and Megatron-Core resident before the model: `GPUSpec.host_runtime_gib`, measured).

Bytes per parameter (bf16 params, fp32 main grads, fp32 master + Adam m, v): 2 + 4 + 12; gradients
take the training's `main_grad_bytes` (2 with --grad-reduce-in-bf16, as NeMo's performance recipes run).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megapilot.estimate.params import (
    ParamsBySharding,
    layers_by_sharding,
    mtp_module_params,
    norm_params,
    pipeline_stages,
    stage_params_by_sharding,
    stage_vocab_params,
)
from megapilot.estimate.quantization import (
    keeps_fp8_primary_weights,
    saved_input_bytes_per_value,
    weight_copy_bytes_per_param,
)
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig
from megapilot.spec.pipeline import EMBEDDING, EVEN_SPLIT, LOSS, MTP, PipelineSplit
from megapilot.spec.training import FP32_GRAD_BYTES, Optimizer, QuantFlavour, TrainingSpec

GIB = 2**30
MIB = 2**20

PARAM_BYTES = 2  # bf16 model weights
BF16_GEMM_INPUT_BYTES = 2  # a saved GEMM input outside quantised recipes
MAIN_GRAD_BYTES = FP32_GRAD_BYTES  # fp32 gradient buffer (Megatron DDP accumulates in fp32 under --bf16)
OPTIMIZER_BYTES = 12  # fp32 master weights + Adam exp_avg + exp_avg_sq
MUON_BYTES = 8  # fp32 master weights + Muon's momentum buffer

# Overhead allowance (default mode). CUDA context + cuBLAS/cuDNN workspaces ~1 GiB on Hopper-class
# GPUs; NCCL keeps ~0.25 GiB of buffers per communicator it uses; the caching allocator loses about
# 10 % of the activation pool to fragmentation.
CUDA_CONTEXT_GIB = 1.0
NCCL_BUFFER_GIB_PER_GROUP = 0.25
FRAGMENTATION_FRACTION = 0.10
# Megatron's path-B activation estimate multiplies by 1.05 "for overhead".
MEGATRON_PATH_B_OVERHEAD = 1.05


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory of one GPU (the most-loaded pipeline rank), GiB."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    overhead_gib: float
    capacity_gib: float
    stage: int  # the pipeline rank costed

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib + self.overhead_gib

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib


# ---- parameters held by one GPU ----------------------------------------------------------------


@dataclass(frozen=True)
class ShardParams:
    """Parameters one GPU of a pipeline stage holds, by how they are sharded."""

    dense: float  # attention, dense MLP, shared experts, embeddings, output layer, MTP projections: split over TP
    replicated: float  # norms, router: whole on every TP rank
    expert: float  # routed experts: split over EP x ETP
    vocab: float = 0.0  # of `dense`: the embedding and output-layer weights (Muon leaves them to Adam)


@lru_cache(maxsize=64)
def layer_kinds(model: ModelSpec) -> tuple[tuple[bool, str], ...]:
    """(holds MoE, layer kind) of every layer, found once per model: activations are costed once per kind
    (a transformer layer mixing with Gated DeltaNet, or of its own heterogeneous shape, or reusing an earlier layer's
    DSA top-k, is a kind of its own)."""
    def kind(i: int) -> str:
        if model.layer_blocks is not None:  # a heterogeneous layer is a kind of its own shape
            return f"transformer-{model.layer_blocks[i]!r}"
        if model.is_linear_attention_layer(i):
            return "transformer-gdn"
        if model.csa is not None:  # DeepSeek-V4: window only, compressed sparse, heavily compressed
            return f"transformer-csa{model.csa.ratio(i)}"
        if model.dsa is not None and not model.runs_dsa_indexer(i):
            return "transformer-shared-topk"  # reuses an earlier layer's DSA top-k: no indexer activations
        return model.layer_kind(i)
    return tuple((model.is_moe_layer(i), kind(i)) for i in range(model.num_layers))


@lru_cache(maxsize=64)
def moe_flags(model: ModelSpec) -> tuple[bool, ...]:
    """Layer i holds an MoE block (computed once per model: the planner asks for thousands of layouts)."""
    return tuple(model.is_moe_layer(i) for i in range(model.num_layers))


def shard_params(model: ModelSpec, parallel: ParallelConfig, stage: int) -> ShardParams:
    """Parameters on one GPU of pipeline rank `stage` (before any DP sharding).

    The stage's parameters come from `params.stage_params_by_sharding`, the count checked against
    real Megatron-Core pipeline ranks (embedding copies on the last rank included), so the memory
    model and the parameter count cannot disagree on what a stage holds.
    """
    p = parallel
    return _shard_params(model, p.tp, p.pp, p.vpp, p.ep, p.expert_tp, stage, p.pipeline_split)


@lru_cache(maxsize=8192)
def _shard_params(
    model: ModelSpec, tp: int, pp: int, vpp: int, ep: int, etp: int, stage: int, split: PipelineSplit = EVEN_SPLIT,
) -> ShardParams:
    held = stage_params_by_sharding(model, pp, vpp, stage, tp=tp, split=split)
    vocab = stage_vocab_params(model, pp, vpp, stage, tp=tp, split=split)
    return ShardParams(dense=held.tp_sharded / tp, replicated=held.replicated, expert=held.expert / (ep * etp),
                       vocab=vocab / tp)


# ---- weights, gradients, optimizer ---------------------------------------------------------------


def weights_gib(shard: ShardParams, parallel: ParallelConfig, flavour: QuantFlavour | None = None,
                architecture: str | None = None, *, fp8_primary: bool = False) -> float:
    """bf16 weights, plus under a quantised recipe the copies Transformer Engine keeps across the step's
    micro-batches (quantization.weight_copy_bytes_per_param: one FP8 copy per-tensor on Blackwell, a transposed
    one more on Hopper, a row- and a column-wise block-scaled copy with their scales); with FP8 primary weights
    (`--fp8-param-gather`, quantization.keeps_fp8_primary_weights) those copies are the weights, without the bf16
    one. Megatron-FSDP shards them over DP (expert-DP)."""
    per_param: float = PARAM_BYTES
    if flavour is not None:
        if architecture is None:
            raise ValueError(f"a {flavour} recipe's weight copies depend on the GPU architecture; pass it")
        if fp8_primary:
            per_param = 0.0
        per_param += weight_copy_bytes_per_param(flavour, architecture)
    return _bytes_by_sharding(shard, parallel, per_param, sharded=parallel.fsdp) / GIB


def fsdp_unsharded_gib(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Megatron-FSDP's transient full layers: the layer being computed and the one prefetched, in bf16,
    plus one layer's unsharded fp32 gradients before their reduce-scatter (0 without FSDP)."""
    if not parallel.fsdp:
        return 0.0
    largest = max(
        (layer.tp_sharded / parallel.tp + layer.replicated + layer.expert / (parallel.ep * parallel.expert_tp))
        for layer in _distinct_layers(model)
    )
    return largest * (2 * PARAM_BYTES + MAIN_GRAD_BYTES) / GIB


@lru_cache(maxsize=64)
def _distinct_layers(model: ModelSpec) -> tuple[ParamsBySharding, ...]:
    """The different layer kinds of a model (dense, MoE, ...), found once per model."""
    return tuple(set(layers_by_sharding(model)))


def gradients_gib(shard: ShardParams, parallel: ParallelConfig, main_grad_bytes: int = MAIN_GRAD_BYTES) -> float:
    """Main-gradient buffer (fp32, or bf16 with --grad-reduce-in-bf16): whole with DDP and the
    distributed optimizer, sharded under FSDP."""
    return _bytes_by_sharding(shard, parallel, main_grad_bytes, sharded=parallel.fsdp) / GIB


def optimizer_gib(shard: ShardParams, parallel: ParallelConfig, optimizer: Optimizer = "adam") -> float:
    """fp32 master + Adam moments: 12 B/param, divided by DP (expert-DP for experts) when sharded.

    ZeRO-1 / distributed optimizer: Rajbhandari et al. 2020 (arXiv 1910.02054) stage 1. Muon (Megatron's
    `get_megatron_muon_optimizer`) keeps an fp32 master and one fp32 momentum, 8 B, for every 2-D weight but
    the embedding and output layer, which with the norms and biases stay on Adam's 12 B; `dist_muon` shards
    both over DP layer by layer (even shares: Megatron balances the layers it deals out), `muon` not at all.
    """
    if optimizer == "adam":
        sharded = parallel.distributed_optimizer or parallel.fsdp
        return _bytes_by_sharding(shard, parallel, OPTIMIZER_BYTES, sharded=sharded) / GIB
    on_adam = ShardParams(dense=shard.vocab, replicated=shard.replicated, expert=0.0)
    on_muon = ShardParams(dense=shard.dense - shard.vocab, replicated=0.0, expert=shard.expert)
    sharded = optimizer == "dist_muon"
    return (_bytes_by_sharding(on_adam, parallel, OPTIMIZER_BYTES, sharded=sharded)
            + _bytes_by_sharding(on_muon, parallel, MUON_BYTES, sharded=sharded)) / GIB


def _bytes_by_sharding(shard: ShardParams, parallel: ParallelConfig, per_param: float, *, sharded: bool) -> float:
    if not sharded:
        return (shard.dense + shard.replicated + shard.expert) * per_param
    dense_dp = parallel.dp * parallel.cp  # Megatron shards over the DP x CP group
    return ((shard.dense + shard.replicated) / dense_dp + shard.expert / parallel.expert_dp) * per_param


# ---- activations (default mode) ------------------------------------------------------------------


def _mlp_intermediate_bytes(model: ModelSpec, ffn: int, gemm_input: float = 2) -> float:
    """Bytes per token kept inside one MLP: gate + up outputs (bf16) and the activation output (the
    down-projection's input, `gemm_input` bytes)."""
    return ffn * (2 * (2 if model.gated_mlp else 1) + gemm_input)


def layer_activation_bytes(
    model: ModelSpec, layer_index: int, parallel: ParallelConfig, tokens: float, flavour: QuantFlavour | None = None
) -> float:
    """Activations one layer keeps for backward, for `tokens` tokens of a micro-batch (no recompute).

    Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.1, generalised: 8 h bytes/token that only
    sequence parallelism splits over TP (two norm inputs 4h, QKV and MLP inputs 4h; Korthikanti's two 1-byte
    dropout masks are not kept: the launch scripts set --hidden-dropout 0 and --attention-dropout 0, and a dropout
    of p = 0 returns its input without drawing a mask, in eager PyTorch and under torch.compile alike); Q, K, V
    (GQA-sized), the attention output and fp32 softmax statistics (fused attention: no s x s scores); the MLP
    intermediates. On MoE layers every token is kept
    top-k times (`routed_copy_bytes`: the dispatched input and the expert intermediates), shared experts
    like a dense MLP, and fp32 router logits. Under a quantised recipe Transformer Engine saves the GEMM inputs
    (QKV and MLP inputs, attention output, MLP activation output) as the column-wise copy wgrad reads
    (quantization.saved_input_bytes_per_value: 1 byte in FP8, about 0.56 in NVFP4, with the block scales).
    """
    p = parallel
    representative = _first_of_kind(model)[layer_kinds(model)[layer_index]]
    saved = saved_gemm_input_bytes(flavour)
    return _layer_bytes_per_token(model, representative, p.tp, p.sequence_parallel, p.expert_tp, saved) * tokens


def saved_gemm_input_bytes(flavour: QuantFlavour | None) -> float:
    """Bytes kept per saved GEMM-input value: bf16, or the flavour's quantised column-wise copy."""
    return BF16_GEMM_INPUT_BYTES if flavour is None else saved_input_bytes_per_value(flavour)


@lru_cache(maxsize=64)
def _first_of_kind(model: ModelSpec) -> dict[tuple[bool, str], int]:
    """The first layer of each kind: layers of one kind keep the same activations."""
    first: dict[tuple[bool, str], int] = {}
    for index, kind in enumerate(layer_kinds(model)):
        first.setdefault(kind, index)
    return first


@lru_cache(maxsize=4096)
def _layer_bytes_per_token(
    model: ModelSpec, layer_index: int, tp: int, sequence_parallel: bool, expert_tp: int, gemm_input: float
) -> float:
    """`layer_activation_bytes` per token (`gemm_input`: bytes per saved GEMM-input value); cached: the planner
    asks for the same few (kind, TP, SP, ETP) often."""
    h = model.hidden_size
    kind = model.layer_kind(layer_index)
    # Per sublayer: its norm input (2h) and the GEMM input after the norm (no dropout mask: dropout is 0); a
    # transformer layer has two sublayers (a heterogeneous one those its block keeps), a hybrid layer one.
    sublayers = model.layer_block(layer_index).sublayers if kind == "transformer" else 1
    # Hyper-connections keep each sublayer's n residual streams (bf16) for the backward of their mixes, beside the
    # one stream the sublayer reads.
    streams = 2 * h * model.residual_streams if model.residual_streams > 1 else 0
    norm_and_inputs = sublayers * (2 * h + gemm_input * h + streams)
    split = norm_and_inputs / tp if sequence_parallel else norm_and_inputs  # only sequence parallelism splits it
    if kind == "mamba":
        return split + _mamba_mixer_bytes(model, gemm_input) / tp
    if model.layer_blocks is not None:
        return split + _heterogeneous_layer_bytes(model, layer_index, gemm_input, tp) / tp
    if model.is_linear_attention_layer(layer_index):
        return _with_mlp(model, layer_index, kind, _gated_delta_net_bytes(model, gemm_input), gemm_input, expert_tp,
                         split, tp)
    if model.csa is not None:
        attention = _compressed_attention_bytes(model, layer_index, gemm_input)
    elif model.mla is not None:
        mla, heads = model.mla, model.num_attention_heads
        q = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        kv_bytes = 2 * (q + heads * mla.v_head_dim) + 2 * mla.kv_lora_rank
        out = heads * mla.v_head_dim
        attention = 2 * q + kv_bytes + gemm_input * out + 4 * heads
    else:  # TP above the KV heads gives each rank one whole KV head (Megatron-Core 0.16+): tp of them in all
        attention = _attention_bytes(model, max(model.kv_heads, tp), gemm_input)
    if kind in ("mlp", "moe"):
        return _with_mlp(model, layer_index, kind, 0.0, gemm_input, expert_tp, split, tp)
    return _with_mlp(model, layer_index, kind, attention, gemm_input, expert_tp, split, tp) \
        + dsa_indexer_bytes(model, layer_index)


def recomputed_bytes_per_token(model: ModelSpec, layer_index: int, tp: int, sequence_parallel: bool,
                               expert_tp: int, gemm_input: float, modules: frozenset[str]) -> float:
    """What selective recompute's `--recompute-modules` drop from `_layer_bytes_per_token`, per token.

    Megatron-Core (TransformerLayer, MoELayer) checkpoints each module on its input, which stays stored:
    - layernorm: the outputs of the norms that are modules of their own - MLA's input norm and a MoE layer's
      pre-MLP norm (the router reads it); the others are fused into Transformer Engine's norm + linear and
      have no output to drop;
    - mla_up_proj: MLA's query, key and value after the up-projections and RoPE;
    - mlp: a dense MLP's input after its fused norm and its intermediates (MoE layers: not at all);
    - moe: everything a MoE layer keeps past its input (routed copies, shared experts, router logits);
      moe_act: only the experts' activation outputs; shared_experts: only the shared experts' intermediates;
    - core_attn: nothing that fused attention keeps (its input Q, K, V stays; it keeps no scores)."""
    h = model.hidden_size
    kind = model.layer_kind(layer_index)
    if kind in ("mamba", "attention") or model.layer_blocks is not None:
        return 0.0
    moe_layer = model.is_moe_layer(layer_index)
    own_norms = int(model.mla is not None and kind == "transformer") + int(moe_layer)
    split_part = own_norms * gemm_input * h if "layernorm" in modules else 0.0
    per_rank = 0.0
    if "mla_up_proj" in modules and model.mla is not None and kind == "transformer":
        mla, heads = model.mla, model.num_attention_heads
        q = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        # (DeepSeek-V4: q and its one K=V head, not per-head keys and values)
        per_rank += 2 * q + 2 * (q + heads * mla.v_head_dim if mla.csa is None else mla.v_head_dim)
    if moe_layer and model.moe is not None:
        moe = model.moe
        if "moe" in modules:
            kept = _with_mlp(model, layer_index, kind, 0.0, gemm_input, expert_tp, 0.0, 1)
            per_rank += kept
        else:
            if "moe_act" in modules:
                per_rank += moe.router_topk * moe.expert_load_factor * moe.moe_ffn_hidden_size * gemm_input
            if "shared_experts" in modules:
                per_rank += _mlp_intermediate_bytes(model, moe.shared_expert_ffn_hidden_size, gemm_input)
    elif "mlp" in modules and not moe_layer:
        split_part += gemm_input * h
        per_rank += _mlp_intermediate_bytes(model, model.layer_ffn_hidden_size(layer_index), gemm_input)
    return (split_part / tp if sequence_parallel else split_part) + per_rank / tp


def _compressed_attention_bytes(model: ModelSpec, layer_index: int, gemm_input: float) -> float:
    """Per token inside DeepSeek-V4's attention: the q latent (the q up-projection's input), q after its norm and
    RoPE (bf16), the one K=V head, the core's output and the grouped projection's output (the two output GEMMs'
    inputs), fp32 softmax statistics per head, and on a compressing layer the compressor's wkv and wgate outputs
    (bf16) its gated pooling reads again in its backward."""
    mla, csa, heads = model.mla, model.csa, model.num_attention_heads
    assert mla is not None and csa is not None and mla.q_lora_rank is not None
    q = heads * mla.v_head_dim
    compressor = 2 * sum(n_out for _, n_out in model.compressor_projections(layer_index))
    output_inputs = gemm_input * (q + csa.o_groups * csa.o_lora_rank)
    return gemm_input * mla.q_lora_rank + 2 * q + 2 * mla.v_head_dim + output_inputs + 4 * heads + compressor


def dsa_indexer_bytes(model: ModelSpec, layer_index: int) -> float:
    """Per token, whole on every TP rank (the indexer runs on the gathered sequence): what DeepSeek Sparse
    Attention keeps for backward with fused kernels - the top-k indices (int32) the sparse core reads again in its
    backward and, on a layer that runs its own indexer, the indexer's q (bf16, heads x dim), its key (bf16) and fp32
    head weights. 0 without DSA."""
    dsa = model.dsa
    if dsa is None:
        return 0.0
    if model.csa is not None:  # DeepSeek-V4: on a ratio-4 layer only; its keys come out of its compressor
        if not model.runs_dsa_indexer(layer_index):
            return 0.0
        compressor = 2 * sum(n_out for _, n_out in model.dsa_indexer_projections[2:])
        return 4 * dsa.topk + 2 * dsa.indexer_heads * dsa.indexer_head_dim + 4 * dsa.indexer_heads + compressor
    indexer = 2 * dsa.indexer_heads * dsa.indexer_head_dim + 2 * dsa.indexer_head_dim + 4 * dsa.indexer_heads
    return 4 * dsa.topk + (indexer if dsa.runs_indexer(layer_index) else 0)


def _attention_bytes(model: ModelSpec, kv_heads: int, gemm_input: float) -> float:
    """Per token inside (GQA) attention, before TP: Q (bf16, kept twice: the rotary input and output), K and V
    (4 kv bytes), the core's output as the output projection's input, and fp32 softmax statistics per head."""
    q = model.num_attention_heads * model.head_dim
    attention = 2 * q + 4 * kv_heads * model.head_dim + gemm_input * q + 4 * model.num_attention_heads
    if model.attention_output_gate:
        attention += 2 * q  # the gate's projection, kept for the gating's backward
    return attention


def _heterogeneous_layer_bytes(model: ModelSpec, layer_index: int, gemm_input: float, tp: int) -> float:
    """Per token inside a layer of its own shape, before TP: its attention with its own KV heads (at least one per
    TP rank) and its MLP with its own width; a linear replacement keeps only the GEMM input its sublayer already
    counts."""
    block = model.layer_block(layer_index)
    attention = _attention_bytes(model, max(model.layer_kv_heads(layer_index), tp), gemm_input) \
        if block.attention == "full" else 0.0
    mlp = _mlp_intermediate_bytes(model, model.layer_ffn_hidden_size(layer_index), gemm_input) \
        if block.mlp == "full" else 0.0
    return attention + mlp


def _with_mlp(model: ModelSpec, layer_index: int, kind: str, attention: float, gemm_input: float, expert_tp: int,
              split: float, tp: int) -> float:
    """A layer's bytes per token: the sequence-parallel-split part, the mixer's and the MLP's (TP-split)."""
    if kind == "attention":
        mlp: float = 0.0
    elif model.is_moe_layer(layer_index):
        moe = model.moe
        assert moe is not None
        # Each token is kept top-k times (padded to capacity: the padding is kept too).
        routed = moe.router_topk * moe.expert_load_factor * routed_copy_bytes(model, gemm_input, expert_tp)
        mlp = routed + _mlp_intermediate_bytes(model, moe.shared_expert_ffn_hidden_size, gemm_input)
        mlp += 4 * moe.num_experts
        if moe.latent_size is not None:
            # fc2_latent_proj's saved input: the combined output, in the latent width (fc1_latent_proj's input is
            # the MLP input the sublayer already counts; its output is the dispatched copies, counted above)
            mlp += gemm_input * moe.latent_size
    else:
        mlp = _mlp_intermediate_bytes(model, model.ffn_hidden_size, gemm_input)
    return split + (attention + mlp) / tp


def routed_copy_bytes(model: ModelSpec, gemm_input: float, expert_tp: int = 1) -> float:
    """Bytes one routed copy of a token keeps for backward: the dispatched token as fc1's saved input
    (`gemm_input` bytes per value: Transformer Engine keeps it quantised under FP8; an ETP group holds the
    whole token on every rank, which the caller's / TP undoes; a latent MoE dispatches latent-sized tokens) and
    the expert MLP's intermediates. Nothing
    of the combine: Megatron-Core applies the routing weights inside the experts' activation, so the
    unpermute's backward needs no expert output, and the all-to-all and permutation buffers are not kept."""
    moe = model.moe
    assert moe is not None
    return gemm_input * moe.routed_width(model.hidden_size) * expert_tp + _mlp_intermediate_bytes(
        model, moe.moe_ffn_hidden_size, gemm_input)


# Tokens per chunk of the chunked gated delta rule (flash-linear-attention's chunk_gated_delta_rule, which
# Megatron's GatedDeltaNet calls): its per-chunk WY matrices are saved for the backward.
GDN_CHUNK = 64


def _gated_delta_net_bytes(model: ModelSpec, gemm_input: float) -> float:
    """Per token inside a Gated DeltaNet mixer (before TP): in_proj's output (q, k, v, z, beta, alpha) and the
    conv's output in bf16, the L2-normed q and k, the fp32 decay and beta per value head, the chunk's fp32 WY
    matrix row (GDN_CHUNK per value head), the rule's output and the gated norm's output (out_proj's input,
    `gemm_input` bytes). The chunk states are recomputed in the backward, not kept."""
    assert model.gated_delta_net is not None
    gdn = model.gated_delta_net
    return (2 * gdn.in_proj_width + 2 * gdn.conv_channels + 2 * 2 * gdn.key_width + 4 * 2 * gdn.value_heads
            + 4 * GDN_CHUNK * gdn.value_heads + 2 * gdn.value_width + gemm_input * gdn.value_width)


def _mamba_mixer_bytes(model: ModelSpec, gemm_input: float) -> float:
    """Per token inside a Mamba-2 mixer: its inner tensors (`mamba_mixer_inner_bytes`) and out_proj's input
    (`gemm_input` bytes)."""
    assert model.mamba is not None
    return mamba_mixer_inner_bytes(model) + gemm_input * model.mamba.inner_size(model.hidden_size)


def mamba_mixer_inner_bytes(model: ModelSpec) -> float:
    """Per token (all TP ranks together), what a Mamba-2 mixer keeps for backward between its in_proj and
    out_proj on Megatron-Core's memory-efficient path (`MambaMixer._ssm_training`): mamba_ssm's
    `MambaSplitConv1dScanCombinedFn` saves only its input, the in_proj output (z, x, B, C, dt), and the scan's
    ungated output (its backward recomputes the conv and the chunk states); the group RMSNorm (`LayerNormFn`,
    mamba_ssm/ops/triton/layernorm_gated.py) saves its input, the gated scan output, and an fp32 rstd per group.
    All bf16 but rstd; the norm's output is out_proj's input, counted as a GEMM input."""
    assert model.mamba is not None
    mamba, h = model.mamba, model.hidden_size
    heads, inner = mamba.heads(h), mamba.inner_size(h)
    in_proj_output = 2 * inner + 2 * mamba.num_groups * mamba.state_dim + heads
    return 2 * in_proj_output + 2 * inner + 2 * inner + 4 * mamba.num_groups





def _layer_input_bytes(model: ModelSpec, parallel: ParallelConfig, tokens: float) -> float:
    """What full recompute keeps per layer: its bf16 input (split over TP only with SP)."""
    shard = parallel.tp if parallel.sequence_parallel else 1
    return 2 * model.hidden_size * tokens / shard


def in_flight_microbatches(parallel: ParallelConfig, num_microbatches: int, stage: int) -> float:
    """Micro-batches whose activations rank `stage` holds at the 1F1B peak, in units of its whole stage.

    1F1B (Narayanan et al. 2021, Sec. 2.2): rank r holds min(pp - r, m). Interleaved with v chunks:
    rank r runs 2 (pp - r - 1) + (v - 1) pp warm-up chunk-forwards plus the current one before its
    first backward; each chunk is 1/v of the stage, so stage 0 holds pp (1 + (pp - 1)/(pp v)) -
    Megatron's factor.
    """
    p, v = parallel.pp, parallel.vpp
    if v == 1:
        return float(min(p - stage, num_microbatches))
    chunk_forwards = 2 * (p - stage - 1) + (v - 1) * p + 1
    return min(chunk_forwards, num_microbatches * v) / v


def activations_gib(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelConfig, stage: int
) -> float:
    """Peak activations of pipeline rank `stage`, default (complete) mode."""
    (parts,) = _activation_bytes_by_stage(model, training, parallel, (stage,))
    return _peak_activations_gib(parallel, training, stage, parts)


def _peak_activations_gib(p: ParallelConfig, training: TrainingSpec, stage: int,
                          parts: tuple[float, float, float]) -> float:
    """A rank's activations at its 1F1B peak: what each in-flight micro-batch keeps, plus what it holds once."""
    kept, working_set, once = parts
    in_flight = in_flight_microbatches(p, p.num_microbatches(training.global_batch_size), stage)
    return (kept * in_flight + working_set + once) / GIB


# Ranks' activation bytes by what they depend on: the planner checks the memory of layouts that differ in EP, DP,
# FSDP and the optimizer's sharding over the same stages, whose activations are the same. Keyed by the model's
# identity (each entry keeps the model alive, so its id is never reused while the entry stands).
_STAGE_ACTIVATIONS: dict[tuple[object, ...], tuple[ModelSpec, tuple[tuple[float, float, float], ...]]] = {}
_STAGE_ACTIVATIONS_CACHE_SIZE = 16384


def _activation_bytes_by_stage(
    model: ModelSpec, training: TrainingSpec, p: ParallelConfig, stages: tuple[int, ...]
) -> tuple[tuple[float, float, float], ...]:
    """`_stage_activation_bytes` of each of `stages`, cached."""
    key = (id(model), training.seq_length, training.quant_flavour, p.tp, p.sequence_parallel, p.expert_tp, p.cp,
           p.mbs, p.pp, p.vpp, p.first_stage_layers, p.last_stage_layers, p.account_for_embedding, p.account_for_loss,
           p.pipeline_layout, p.recompute, p.recompute_method, p.recompute_num_layers, p.recompute_modules,
           p.cpu_offloading_num_layers, stages)
    entry = _STAGE_ACTIVATIONS.get(key)
    if entry is not None and entry[0] is model:
        return entry[1]
    parts = tuple(_stage_activation_bytes(model, training, p, stage) for stage in stages)
    if len(_STAGE_ACTIVATIONS) >= _STAGE_ACTIVATIONS_CACHE_SIZE:
        _STAGE_ACTIVATIONS.clear()
    _STAGE_ACTIVATIONS[key] = (model, parts)
    return parts


def _stage_activation_bytes(
    model: ModelSpec, training: TrainingSpec, p: ParallelConfig, stage: int
) -> tuple[float, float, float]:
    """(bytes kept per in-flight micro-batch, transient bytes while a chunk is recomputed, bytes held once: the
    loss and MTP modules' activations) of pipeline rank `stage`."""
    tokens = p.mbs * training.seq_length / p.cp
    stages = pipeline_stages(model, p.pp, p.vpp, p.pipeline_split)
    layers = stages.decoder_layers(stage)
    kinds = layer_kinds(model)
    saved_input = saved_gemm_input_bytes(training.quant_flavour)
    by_kind = _bytes_per_token_by_kind(model, p.tp, p.sequence_parallel, p.expert_tp, saved_input)
    full = [tokens * by_kind[kinds[i]] for i in layers]
    per_microbatch, working_set = _recompute_policy(model, p, full, tokens)
    if p.recompute_modules is not None and p.recomputed_modules - {"core_attn"}:
        dropped_by_kind = _recomputed_per_token_by_kind(model, p, saved_input)
        dropped = [tokens * dropped_by_kind[kinds[i]] for i in layers]
        # kept: each layer's input of the modules; while one layer's backward reruns them, their outputs live again
        per_microbatch -= sum(dropped)
        working_set = max(dropped, default=0.0)
    if p.cpu_offloading_num_layers:  # PP 1: this rank holds every layer
        # each offloaded layer leaves the GPU once its forward ends and comes back ahead of its backward, so only
        # the one in transit stays
        offloaded = [stored for _, stored in offloaded_layer_bytes(model, training, p)]
        per_microbatch -= sum(offloaded)
        working_set = max(working_set, max(offloaded, default=0.0))
    if stage == stages.rank_of(EMBEDDING):
        # the token ids (int64) the embedding's backward reads; its output is the first layer's input, which that
        # layer's norm keeps (counted there), and with dropout 0 there is no mask
        per_microbatch += 8 * tokens
    once = 0.0
    if stage == stages.rank_of(LOSS):
        once += _output_activation_bytes(model, p, tokens)
    if stage == stages.rank_of(MTP):
        once += _mtp_activation_bytes(model, p, tokens)
    return per_microbatch, working_set, once


def offloaded_layer_bytes(model: ModelSpec, training: TrainingSpec, p: ParallelConfig) -> list[tuple[int, float]]:
    """(layer, bytes its activations take to host memory and back per micro-batch) of each layer
    `--cpu-offloading-num-layers` offloads: Megatron's first N (it runs them with PP 1 only)."""
    if not p.cpu_offloading_num_layers:
        return []
    tokens = p.mbs * training.seq_length / p.cp
    kinds = layer_kinds(model)
    by_kind = _bytes_per_token_by_kind(model, p.tp, p.sequence_parallel, p.expert_tp,
                                       saved_gemm_input_bytes(training.quant_flavour))
    return [(i, tokens * by_kind[kinds[i]]) for i in range(min(p.cpu_offloading_num_layers, model.num_layers))]


# Share of a GPU's host memory activation offload may fill: the rest holds the OS, the data loader's workers and their
# pinned batches, and the checkpoint's staging copies.
HOST_MEMORY_USABLE_FRACTION = 0.8


@dataclass(frozen=True)
class HostOffload:
    """Host memory one GPU's activation offload holds against what its node has for it, GiB."""

    offloaded_gib: float  # every offloaded layer's activations of the micro-batch in flight (PP 1: one at a time)
    host_memory_gib: float | None  # the GPU's share of its node's DRAM; None = unknown, not checked

    @property
    def usable_gib(self) -> float | None:
        return None if self.host_memory_gib is None else self.host_memory_gib * HOST_MEMORY_USABLE_FRACTION

    @property
    def fits(self) -> bool:
        return self.usable_gib is None or self.offloaded_gib <= self.usable_gib


def host_offload(model: ModelSpec, training: TrainingSpec, p: ParallelConfig,
                 host_memory_gib: float | None) -> HostOffload | None:
    """What `--cpu-offloading-num-layers` parks in host memory, or None without offload."""
    if not p.cpu_offloading_num_layers:
        return None
    offloaded = sum(stored for _, stored in offloaded_layer_bytes(model, training, p)) / GIB
    return HostOffload(offloaded, host_memory_gib)


@lru_cache(maxsize=1024)  # asked for by every stage of every memory check the planner makes
def _bytes_per_token_by_kind(model: ModelSpec, tp: int, sequence_parallel: bool, expert_tp: int,
                             saved_input_bytes: float) -> dict[tuple[bool, str], float]:
    """Stored bytes per token of each layer kind (dense, MoE, hybrid blocks), each costed once."""
    return {kind: _layer_bytes_per_token(model, first, tp, sequence_parallel, expert_tp, saved_input_bytes)
            for kind, first in _first_of_kind(model).items()}


def _recomputed_per_token_by_kind(model: ModelSpec, p: ParallelConfig,
                                  saved_input_bytes: float) -> dict[tuple[bool, str], float]:
    """`recomputed_bytes_per_token` of each layer kind, each costed once."""
    return _recomputed_by_kind(model, p.tp, p.sequence_parallel, p.expert_tp, saved_input_bytes, p.recomputed_modules)


@lru_cache(maxsize=1024)  # the planner's memory checks ask for the same few (kind, TP, SP, ETP, modules)
def _recomputed_by_kind(model: ModelSpec, tp: int, sequence_parallel: bool, expert_tp: int, saved_input_bytes: float,
                        modules: frozenset[str]) -> dict[tuple[bool, str], float]:
    return {kind: recomputed_bytes_per_token(model, first, tp, sequence_parallel, expert_tp, saved_input_bytes,
                                             modules)
            for kind, first in _first_of_kind(model).items()}


def _recompute_policy(
    model: ModelSpec, p: ParallelConfig, full: list[float], tokens: float
) -> tuple[float, float]:
    """(bytes kept per in-flight micro-batch, transient bytes while one chunk is recomputed)."""
    if p.recompute != "full":
        return sum(full), 0.0
    layer_input = _layer_input_bytes(model, p, tokens)
    n = p.recompute_num_layers or 1
    if p.recompute_method == "block":  # the first n layers of each chunk recomputed, the rest stored
        chunk = len(full) // p.vpp
        kept = 0.0
        for start in range(0, len(full), max(chunk, 1)):
            block = full[start:start + chunk]
            kept += min(n, len(block)) * layer_input + sum(block[n:])
        # Megatron checkpoints each of those n layers on its own (transformer_block's block method wraps one layer
        # per checkpoint), so a backward reruns one layer at a time: one layer's activations live again, not n
        return kept, max(full[:n], default=0.0)
    groups = -(-len(full) // n)  # uniform: only the input of each n-layer group is kept
    return groups * layer_input, sum(sorted(full, reverse=True)[:n])


def _output_activation_bytes(model: ModelSpec, p: ParallelConfig, tokens: float) -> float:
    """Last stage: final-norm input, bf16 logits and the fp32 copy the cross-entropy works on.

    The last stage runs one micro-batch's forward and backward back to back, so this is held once.
    """
    norm_input = 2 * model.hidden_size * tokens / (p.tp if p.sequence_parallel else 1)
    return _logits_bytes(model, p, tokens) + norm_input


def _logits_bytes(model: ModelSpec, p: ParallelConfig, tokens: float) -> float:
    """bf16 logits and the fp32 copy the cross-entropy works on."""
    return tokens * model.padded_vocab_size(p.tp) / p.tp * (2 + 4)


def _mtp_activation_bytes(model: ModelSpec, p: ParallelConfig, tokens: float) -> float:
    """MTP modules (on the last rank, or where a layout puts them): a layer and one more logits pass each."""
    if not model.mtp_num_layers:
        return 0.0
    mtp_layer = sum(layer_activation_bytes(model, index, p, tokens) for index in model.mtp_layer_indices)
    return model.mtp_num_layers * (mtp_layer + _logits_bytes(model, p, tokens) + 4 * model.hidden_size * tokens / p.tp)


def overhead_gib(parallel: ParallelConfig, activations: float, host_runtime_gib: float = 0.0) -> float:
    """CUDA context + NCCL buffers per communicator in use + allocator fragmentation, GiB; a CPU rank's process
    runtime where it is given (no CUDA context, NCCL or caching allocator there)."""
    if host_runtime_gib:
        return host_runtime_gib
    p = parallel
    groups = sum(size > 1 for size in (p.tp, p.pp, p.cp, p.dp, p.ep))
    return CUDA_CONTEXT_GIB + NCCL_BUFFER_GIB_PER_GROUP * groups + FRAGMENTATION_FRACTION * activations


# ---- Megatron's own formula ------------------------------------------------------------------------


def megatron_weights_and_optimizer_bytes(model: ModelSpec, parallel: ParallelConfig) -> tuple[float, float]:
    """(parameters on the most-loaded shard, bytes per parameter) as `theoretical_memory_usage.py` computes.

    TP-sharded: (transformer block / PP + MTP + embedding) / TP; replicated norms/router: / PP;
    experts: / (PP x ETP x EP); with untied embeddings and PP = 1 the output layer is added.
    Bytes/param: 18, or 6 + 12/DP with the distributed optimizer (expert params use expert-DP).
    """
    p = parallel
    layers = sum(layers_by_sharding(model), ParamsBySharding(0, 0, 0))
    replicated = layers.replicated + norm_params(model, model.hidden_size)
    embedding = model.padded_vocab_size(p.tp) * model.hidden_size
    mtp = model.mtp_num_layers * mtp_module_params(model)
    tp_sharded = (layers.tp_sharded / p.pp + mtp + embedding) / p.tp
    if not model.tie_embeddings and p.pp == 1:
        tp_sharded += embedding / p.tp
    dense_params = tp_sharded + replicated / p.pp
    expert_params = layers.expert / (p.pp * p.expert_tp * p.ep)
    if p.distributed_optimizer:
        dense_bytes = 6 + 12 / (p.dp * p.cp)
        expert_bytes = 6 + 12 / p.expert_dp
    else:
        dense_bytes = expert_bytes = 18
    total_bytes = dense_params * dense_bytes + expert_params * expert_bytes
    params = dense_params + expert_params
    return params, total_bytes / params


def megatron_activation_bytes(model: ModelSpec, training: TrainingSpec, parallel: ParallelConfig) -> float:
    """Megatron's activation estimate for stage 0 (Korthikanti Table 2; path A or B, see module doc)."""
    p = parallel
    s, b, h, layers = training.seq_length, p.mbs, model.hidden_size, model.num_layers
    vocab = model.padded_vocab_size(p.tp)
    path_a = p.sequence_parallel and p.recompute == "selective"
    per_layer = s * b * h * (18 + 4 * model.ffn_hidden_size / h) if path_a else s * b * h * (10 + 24 / p.tp)
    total = per_layer * layers + 8 * s * b * p.pp + s * b * h * p.pp
    if p.vpp > 1:
        total *= 1 + (p.pp - 1) / (p.pp * p.vpp)
    elif p.pp > 1:
        total *= min(1.0, p.num_microbatches(training.global_batch_size) / p.pp)
    if path_a:
        if p.pp == 1:
            total += 4 * s * b * h * (1 + vocab / h)
        return total / p.tp
    if p.pp == 1:
        total += 2 * (s * b * vocab / p.tp + s * b * h)
    return total * MEGATRON_PATH_B_OVERHEAD


# ---- the public entry ------------------------------------------------------------------------------


def memory_per_gpu(
    model: ModelSpec,
    training: TrainingSpec,
    parallel: ParallelConfig,
    capacity_gib: float,
    *,
    megatron_formula: bool = False,
    architecture: str | None = None,
    host_runtime_gib: float = 0.0,
) -> MemoryBreakdown:
    """Memory of the most-loaded GPU (GiB), default mode or Megatron's formula (see module doc).

    The gradient buffers take the training's `main_grad_bytes` (fp32 unless --grad-reduce-in-bf16).
    `architecture`: the GPU's, which decides how many quantised weight copies a low-precision recipe keeps
    (needed with one).
    `host_runtime_gib`: a CPU rank's process runtime, its overhead (`GPUSpec.host_runtime_gib`).
    """
    if megatron_formula:
        return _megatron_memory(model, training, parallel, capacity_gib)
    return _most_loaded(model, training, parallel, capacity_gib, architecture, host_runtime_gib)


@lru_cache(maxsize=8192)
def _most_loaded(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelConfig, capacity_gib: float,
    architecture: str | None, host_runtime_gib: float = 0.0,
) -> MemoryBreakdown:
    """Cached: the planner checks a layout's memory first and its estimate asks again for the same layout."""
    p = parallel
    stages = _stages_to_cost(model, p)
    statics = _static_gib_by_stage(model, training, p, stages, architecture)
    activations = _activation_bytes_by_stage(model, training, p, stages)
    # totals first, in MemoryBreakdown.total_gib's order, and a breakdown for the heaviest rank only
    totals = _stage_totals_gib(p, training, stages, statics, activations, host_runtime_gib)
    heaviest = max(range(len(stages)), key=lambda index: (totals[index], -index))
    weights, gradients, optimizer = statics[heaviest]
    stage_activations = _peak_activations_gib(p, training, stages[heaviest], activations[heaviest])
    return MemoryBreakdown(
        weights_gib=weights,
        gradients_gib=gradients,
        optimizer_gib=optimizer,
        activations_gib=stage_activations,
        overhead_gib=overhead_gib(p, stage_activations, host_runtime_gib),
        capacity_gib=capacity_gib,
        stage=stages[heaviest],
    )


def memory_by_stage(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelConfig, *, architecture: str | None = None,
) -> tuple[tuple[int, float], ...]:
    """(pipeline rank, total GiB) of every rank that can be the most loaded (`_stages_to_cost_for`: the first and
    last ranks and each other layer mix), default mode; the heaviest is `memory_per_gpu`'s."""
    p = parallel
    stages = _stages_to_cost(model, p)
    statics = _static_gib_by_stage(model, training, p, stages, architecture)
    activations = _activation_bytes_by_stage(model, training, p, stages)
    return tuple(zip(stages, _stage_totals_gib(p, training, stages, statics, activations), strict=True))


def _stage_totals_gib(p: ParallelConfig, training: TrainingSpec, stages: tuple[int, ...],
                      statics: tuple[tuple[float, float, float], ...],
                      activations: tuple[tuple[float, float, float], ...], host_runtime_gib: float = 0.0
                      ) -> list[float]:
    totals = []
    for stage, (weights, gradients, optimizer), parts in zip(stages, statics, activations, strict=True):
        stage_activations = _peak_activations_gib(p, training, stage, parts)
        totals.append(weights + gradients + optimizer + stage_activations
                      + overhead_gib(p, stage_activations, host_runtime_gib))
    return totals


def _stages_to_cost(model: ModelSpec, parallel: ParallelConfig) -> tuple[int, ...]:
    p = parallel
    return _stages_to_cost_for(model, p.pp, p.vpp, p.pipeline_split)


@lru_cache(maxsize=1024)
def _stages_to_cost_for(model: ModelSpec, pp: int, vpp: int, split: PipelineSplit) -> tuple[int, ...]:
    """The pipeline ranks that can be the most loaded.

    Two ranks holding the same kinds of layers in the same order, neither the first nor the last,
    hold the same weights, and the lower one more in-flight micro-batches; so of each such group only
    the lowest rank is costed; nor one with the first rank's mix, which the first rank outweighs
    (its embedding on top). That leaves the first and last ranks, and per other layer mix its first
    middle rank (rank 1 of an uneven split with lighter ends; ranks where MoE and dense layers mix).
    A rank that holds the embedding, loss or MTP modules (a layout may put them anywhere) is a mix of its own.
    """
    resolved = pipeline_stages(model, pp, vpp, split)

    def mix(stage: int) -> tuple[object, ...]:
        ends = tuple(resolved.count(stage, item) for item in (EMBEDDING, MTP, LOSS))
        return (ends, *(kinds[i] for i in resolved.decoder_layers(stage)))

    kinds = layer_kinds(model)
    seen = {mix(0)}
    stages = [0]
    for stage in range(1, pp - 1):
        if (stage_mix := mix(stage)) not in seen:
            seen.add(stage_mix)
            stages.append(stage)
    if pp > 1:
        stages.append(pp - 1)
    return tuple(stages)


# (weights, gradients, optimizer) GiB of the costed stages, by what they depend on: the planner checks every
# micro-batch size and recompute setting of a shape, which all hold the same parameters. Keyed like
# _STAGE_ACTIVATIONS.
_STATIC_STAGE_GIB: dict[tuple[object, ...], tuple[ModelSpec, tuple[tuple[float, float, float], ...]]] = {}
_STATIC_STAGE_CACHE_SIZE = 16384


def _static_gib_by_stage(model: ModelSpec, training: TrainingSpec, p: ParallelConfig, stages: tuple[int, ...],
                         architecture: str | None) -> tuple[tuple[float, float, float], ...]:
    main_grad_bytes = training.main_grad_bytes
    key = (id(model), training.precision, training.quant_flavour, training.optimizer, p.tp, p.pp, p.vpp, p.cp, p.ep,
           p.expert_tp, p.dp, p.fsdp, p.distributed_optimizer, p.first_stage_layers, p.last_stage_layers,
           p.account_for_embedding, p.account_for_loss, p.pipeline_layout, stages, main_grad_bytes, architecture)
    entry = _STATIC_STAGE_GIB.get(key)
    if entry is not None and entry[0] is model:
        return entry[1]
    fp8_primary = keeps_fp8_primary_weights(training.precision, architecture,
                                            sharded_optimizer=p.distributed_optimizer or p.fsdp)
    statics = []
    for stage in stages:
        shard = shard_params(model, p, stage)
        statics.append((weights_gib(shard, p, training.quant_flavour, architecture, fp8_primary=fp8_primary)
                        + fsdp_unsharded_gib(model, p),
                        gradients_gib(shard, p, main_grad_bytes), optimizer_gib(shard, p, training.optimizer)))
    if len(_STATIC_STAGE_GIB) >= _STATIC_STAGE_CACHE_SIZE:
        _STATIC_STAGE_GIB.clear()
    _STATIC_STAGE_GIB[key] = (model, tuple(statics))
    return _STATIC_STAGE_GIB[key][1]


def _megatron_memory(
    model: ModelSpec, training: TrainingSpec, parallel: ParallelConfig, capacity_gib: float
) -> MemoryBreakdown:
    params, bytes_per_param = megatron_weights_and_optimizer_bytes(model, parallel)
    optimizer_bytes = bytes_per_param - PARAM_BYTES - MAIN_GRAD_BYTES
    return MemoryBreakdown(
        weights_gib=params * PARAM_BYTES / GIB,
        gradients_gib=params * MAIN_GRAD_BYTES / GIB,
        optimizer_gib=params * optimizer_bytes / GIB,
        activations_gib=megatron_activation_bytes(model, training, parallel) / GIB,
        overhead_gib=0.0,
        capacity_gib=capacity_gib,
        stage=0,
    )
