"""Model FLOPs in Megatron-LM's `num_floating_point_operations` convention.

Convention (Megatron-LM `megatron/training/training.py`, core >= v0.12):
- only GEMMs count; norms, softmax, activations and the router are free;
- every weight GEMM runs three times (forward, data-gradient, weight-gradient) and a multiply-add is
  2 FLOPs, so a weight of `in x out` costs 6 * in * out FLOPs per token;
- the attention core (QK^T and PV) is halved for the causal mask: 6 * q * s per layer per token;
- recomputation is never counted (these are *model* FLOPs, the MFU numerator).

`convention="megatron_full_attention"` counts the attention core over the full s x s matrix
(12 * q * s), as Megatron-Core <= v0.11, NeMo 2.0 before Aug 2025 and the 2021-22 papers did, so that
published TFLOP/s of that era can be compared. Nothing else changes between the two conventions here
(core <= v0.11 also counted MoE as top-k x ffn_hidden_size in every layer; we keep the MoE layout).

DeepSeek Sparse Attention counts what its layers compute: MLA's core over the indexer's top-k keys, the
indexer's own projections and scores, and its KL loss's score recomputation (`dsa_core_flops`); Megatron's
formula counts such a layer as dense MLA.

DeepSeek-V4's attention (`compressed_core_flops`) likewise: Megatron-LM dev's `_dsv4_hybrid_self_attention_flops`
terms (the q LoRA, the one K=V head, the grouped output projection, the compressors' projections, the core over the
window and the compressed keys, the indexer's projections and scores), with what each query sees counted as it is
(w - w^2 / 2s window keys, not w; s / 2r compressed keys, causal), the indexer's projections at forward and weight
gradient only (its inputs are detached), its scores over the compressed keys halved for the causal mask, and its KL
loss's recomputation of the kept scores, as for DSA. The hyper-connections' mixing projections (n streams x h ->
n^2 + 2n per sublayer, `hyper_connection_flops`) are GEMMs, so they count; their n x n mixes of the streams are
elementwise and do not.

Units: FLOPs (not FLOP/s). All terms are per token unless the name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from megapilot.spec.model import ModelSpec

FlopConvention = Literal["megatron", "megatron_full_attention"]
FLOP_CONVENTIONS: tuple[str, ...] = ("megatron", "megatron_full_attention")

# Three GEMMs per weight (forward, dgrad, wgrad) x 2 FLOPs per multiply-add.
GEMM_PASSES_FLOPS = 6
FORWARD_BACKWARD_PASSES = 3  # Megatron's count: the backward costs two forwards
SSD_SCAN_FORWARD_FLOPS_PER_STATE = 7  # Megatron's `mamba_layer_flops`: the scan's forward, 7 d N per token


def _mlp_matrices(model: ModelSpec) -> int:
    """Weight matrices of one MLP: gate + up + down for SwiGLU/GeGLU, up + down otherwise."""
    return 3 if model.gated_mlp else 2


# ---- attention ---------------------------------------------------------------------------------


def attention_linear_flops(model: ModelSpec, kv_heads: int | None = None) -> float:
    """Token-linear attention GEMMs of one layer, per token.

    Standard/GQA attention: 6 * [h * (q + 2 kv + g) + q * h], q = heads * kv_channels,
    kv = query_groups * kv_channels, g = q with an output gate, else 0 (Megatron `num_floating_point_operations`).
    MLA (DeepSeek-V2, arXiv 2405.04434 Sec. 2.1; Megatron's MLA branch):
    6 * [q_term + kv_lora * (h + heads * (qk_head + v_head) + 1) + h * qk_rope + heads * v_head * h].
    """
    h = model.hidden_size
    if model.csa is not None:
        return compressed_attention_linear_flops(model)
    if model.mla is not None:
        mla, heads = model.mla, model.num_attention_heads
        q_head = mla.qk_head_dim + mla.qk_pos_emb_head_dim
        q_term = h * heads * q_head if mla.q_lora_rank is None else mla.q_lora_rank * (h + heads * q_head + 1)
        kv_term = mla.kv_lora_rank * (h + heads * (mla.qk_head_dim + mla.v_head_dim) + 1)
        rope_key = h * mla.qk_pos_emb_head_dim
        output = heads * mla.v_head_dim * h
        return GEMM_PASSES_FLOPS * (q_term + kv_term + rope_key + output)
    q = model.num_attention_heads * model.head_dim
    kv = (kv_heads or model.kv_heads) * model.head_dim
    gate = q if model.attention_output_gate else 0
    return GEMM_PASSES_FLOPS * (h * (q + 2 * kv + gate) + q * h)


def attention_core_flops(
    model: ModelSpec, seq_length: int, convention: FlopConvention = "megatron", window: int | None = None
) -> float:
    """QK^T and PV of one layer, per token.

    Full matrix: 3 passes x 2 GEMMs x 2 FLOPs x q x s = 12 q s; causal halves it to 6 q s
    (Megatron core >= v0.12). MLA: q = heads * (qk_head + qk_rope) for QK^T and heads * v_head for PV.
    A sliding window (or a Llama 4 chunk) of w < s tokens: a query sees on average w - w^2 / (2 s) keys
    instead of s / 2 (the first w queries see their prefix, the rest w keys; a chunk's mean is w / 2).
    """
    if window is not None and window < seq_length and convention == "megatron":
        causal = attention_core_flops(model, seq_length, convention)
        mean_keys = window / 2 if model.attention_chunk_size == window else window - window * window / (2 * seq_length)
        return causal * mean_keys / (seq_length / 2)
    if model.mla is not None:
        mla, heads = model.mla, model.num_attention_heads
        qk_width = heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim)
        pv_width = heads * mla.v_head_dim
        full = GEMM_PASSES_FLOPS * (qk_width + pv_width) * seq_length
    else:
        full = 12 * model.num_attention_heads * model.head_dim * seq_length
    return full if convention == "megatron_full_attention" else full / 2


# ---- DeepSeek Sparse Attention -------------------------------------------------------------------
# The indexer's inputs (MLA's q latent and the layer input) are detached: its projections run forward and
# weight-gradient only (2 of the 3 GEMM passes).
INDEXER_LINEAR_PASSES_FLOPS = 4


def dsa_indexer_linear_flops(model: ModelSpec) -> float:
    """The lightning indexer's projections (`ModelSpec.dsa_indexer_projections`), per token, forward and weight
    gradient (0 without DSA)."""
    return INDEXER_LINEAR_PASSES_FLOPS * sum(n_in * n_out for n_in, n_out in model.dsa_indexer_projections)


def dsa_indexer_score_flops(model: ModelSpec, seq_length: int, convention: FlopConvention = "megatron") -> float:
    """The indexer's q.k scores over every earlier key, per token (0 without DSA): forward and the gradients to
    its q and k, 3 x 2 FLOPs per head-dim product, halved for the causal mask as the core is."""
    dsa = model.dsa
    if dsa is None:
        return 0.0
    causal = 1 if convention == "megatron_full_attention" else 0.5
    # DeepSeek-V4's indexer scores the ratio-4 layer's pooled keys, one per 4 tokens
    keys = seq_length / 4 if model.csa is not None else seq_length
    return GEMM_PASSES_FLOPS * dsa.indexer_heads * dsa.indexer_head_dim * keys * causal


def dsa_core_flops(model: ModelSpec, layer_index: int, seq_length: int,
                   convention: FlopConvention = "megatron") -> float:
    """One DSA layer's sequence mixing, per token: MLA's core over the `topk` tokens the indexer keeps (a query
    at position t attends min(t, topk) keys, the count of a sliding window of topk), the indexer's scores over
    every earlier key (forward, and the gradients to its q and k that its KL loss sends back: 3 x 2 FLOPs per
    head-dim product, halved for the causal mask as the core is) and the KL loss's recomputation of the main
    heads' QK^T scores over the kept keys (forward only: its query and key are detached). A layer that reuses an
    earlier layer's top-k (cross-layer sharing) runs no indexer and no KL loss."""
    dsa, mla = model.dsa, model.mla
    assert dsa is not None and mla is not None
    window = min(dsa.topk, seq_length)
    sparse = attention_core_flops(model, seq_length, convention, window)
    if not dsa.runs_indexer(layer_index):
        return sparse
    indexer = dsa_indexer_score_flops(model, seq_length, convention)
    mean_keys = window - window * window / (2 * seq_length) if convention == "megatron" else window
    kl_scores = 2 * model.num_attention_heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim) * mean_keys
    return sparse + indexer + kl_scores


# ---- DeepSeek-V4's compressed attention ----------------------------------------------------------


def compressed_attention_linear_flops(model: ModelSpec) -> float:
    """DeepSeek-V4's attention projections, per token (Megatron-LM dev's dsv4 `q_term + kv_term + o_term`):
    6 * [q_lora (h + heads v + 1) + h v + heads v o_lora + o_groups o_lora h]."""
    mla, csa, h, heads = model.mla, model.csa, model.hidden_size, model.num_attention_heads
    assert mla is not None and csa is not None and mla.q_lora_rank is not None
    query = mla.q_lora_rank * (h + heads * mla.v_head_dim + 1)
    output = heads * mla.v_head_dim * csa.o_lora_rank + csa.o_groups * csa.o_lora_rank * h
    return GEMM_PASSES_FLOPS * (query + h * mla.v_head_dim + output)


def compressor_linear_flops(model: ModelSpec, layer_index: int) -> float:
    """The KV compressor's wkv and wgate of layer `layer_index` (0 on a window-only layer), per token, all three
    passes (its input is the layer's, not detached)."""
    return GEMM_PASSES_FLOPS * sum(n_in * n_out for n_in, n_out in model.compressor_projections(layer_index))


def _mean_keys(cap: int | None, length: float, convention: FlopConvention) -> float:
    """Keys a query sees on average among `length` earlier positions when it attends to at most `cap` of them:
    the causal mean (length / 2, or length under the full-matrix convention) below the cap, else the cap less the
    prefix the first `cap` queries miss (cap - cap^2 / (2 length))."""
    if cap is None or cap >= length:
        return length if convention == "megatron_full_attention" else length / 2
    return cap if convention == "megatron_full_attention" else cap - cap * cap / (2 * length)


def compressed_core_flops(model: ModelSpec, layer_index: int, seq_length: int,
                          convention: FlopConvention = "megatron") -> float:
    """One DeepSeek-V4 layer's sequence mixing, per token: QK^T and PV (6 x 2 FLOPs per head-dim product, MLA's
    widths) over the sliding window's keys and the compressed keys it attends to - the indexer's top-k of the
    s / 4 pooled ones on a ratio-4 layer, all s / 128 on a ratio-128 layer, none on a window-only one - and, on a
    ratio-4 layer, the indexer's scores over every earlier compressed key and its KL loss's recomputation of the
    kept scores (`dsa_core_flops`' terms over the compressed sequence)."""
    mla, csa, dsa = model.mla, model.csa, model.dsa
    assert mla is not None and csa is not None
    heads, ratio = model.num_attention_heads, csa.ratio(layer_index)
    per_key = GEMM_PASSES_FLOPS * heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim + mla.v_head_dim)
    keys = _mean_keys(model.sliding_window, seq_length, convention)
    if ratio == 0:
        return per_key * keys
    compressed = seq_length / ratio
    topk = dsa.topk if dsa is not None and model.runs_dsa_indexer(layer_index) else None
    kept = _mean_keys(topk, compressed, convention)
    core = per_key * (keys + kept)
    if topk is None:
        return core
    kl_scores = 2 * heads * (mla.qk_head_dim + mla.qk_pos_emb_head_dim) * kept
    return core + dsa_indexer_score_flops(model, seq_length, convention) + kl_scores


def hyper_connection_flops(model: ModelSpec) -> float:
    """The hyper-connections of one transformer layer, per token: two sublayers' fp32 projections of the n streams
    (n h) to their n^2 + 2n mixing logits, 6 FLOPs per weight (0 without hyper-connections)."""
    return GEMM_PASSES_FLOPS * float(sum(n_in * n_out for n_in, n_out in model.hyper_connection_projections()))


# ---- MLP ---------------------------------------------------------------------------------------


def dense_mlp_flops(model: ModelSpec, ffn_hidden_size: int | None = None) -> float:
    """Dense MLP of one layer, per token: 6 * h * ffn * (3 if gated else 2) (`ffn_hidden_size`: a heterogeneous
    layer's own width, else the model's)."""
    return GEMM_PASSES_FLOPS * model.hidden_size * (ffn_hidden_size or model.ffn_hidden_size) * _mlp_matrices(model)


def _linear_replacement_flops(model: ModelSpec) -> float:
    """A heterogeneous layer's sublayer replaced by one h -> h linear, per token."""
    return GEMM_PASSES_FLOPS * model.hidden_size * model.hidden_size


def moe_mlp_flops(model: ModelSpec) -> float:
    """MoE block of one layer, per token: 6 * h * (moe_ffn * topk + shared_ffn) * (3 if gated else 2).

    Only the top-k routed experts a token visits count; the router GEMM is not counted (Megatron). A latent MoE's
    routed experts run in the latent width l, and its two projections add 6 * 2 h l (Megatron's
    `moe_layer_flops`).
    """
    assert model.moe is not None
    moe, h = model.moe, model.hidden_size
    routed_width = moe.routed_width(h)
    routed = routed_width * moe.moe_ffn_hidden_size * moe.router_topk
    shared = h * moe.shared_expert_ffn_hidden_size
    latent_projections = 2 * h * routed_width if moe.latent_size is not None else 0
    return GEMM_PASSES_FLOPS * ((routed + shared) * _mlp_matrices(model) + latent_projections)


def mlp_flops(model: ModelSpec, layer_index: int) -> float:
    """The MLP of layer `layer_index`: MoE or dense by Megatron's layer pattern (none on a hybrid's Mamba or
    attention layers)."""
    if model.layer_kind(layer_index) in ("mamba", "attention"):
        return 0.0
    if model.is_moe_layer(layer_index):
        return moe_mlp_flops(model)
    block = model.layer_block(layer_index).mlp
    if block != "full":
        return _linear_replacement_flops(model) if block == "linear" else 0.0
    return dense_mlp_flops(model, model.layer_ffn_hidden_size(layer_index))


def mamba_mixer_flops(model: ModelSpec, seq_length: int) -> float:
    """One Mamba-2 mixer, per token, as Megatron's hybrid FLOPs formula counts it (training.py
    `mamba_layer_flops`, forward, times 3 for forward + backward as `num_floating_point_operations` returns
    it): in_proj 6 h (2 d + 2 G N + H), the SSM scan 3 x 7 d N, out_proj 6 d h (d = heads x head_dim, N = state
    size, G = groups, H = heads)."""
    assert model.mamba is not None
    mamba, h = model.mamba, model.hidden_size
    heads, inner = mamba.heads(h), mamba.inner_size(h)
    in_proj = GEMM_PASSES_FLOPS * h * (2 * inner + 2 * mamba.num_groups * mamba.state_dim + heads)
    scan = FORWARD_BACKWARD_PASSES * SSD_SCAN_FORWARD_FLOPS_PER_STATE * inner * mamba.state_dim
    return in_proj + scan + GEMM_PASSES_FLOPS * inner * h


def gated_delta_net_flops(model: ModelSpec) -> tuple[float, float]:
    """(projections, the rest) of one Gated DeltaNet mixer, per token, as Megatron counts them
    (training.py `num_floating_point_operations`, gated_delta_net branch): in_proj 6 h (2 qk + 2 v + 2 Hv) and
    out_proj 6 h v; the conv 6 K (2 qk + v) and the gated delta rule 6 x 4 Hv dv^2 (KK^T, VK^T, the state
    update and SQ). No sequence-length term: the state is fixed-size."""
    assert model.gated_delta_net is not None
    gdn, h = model.gated_delta_net, model.hidden_size
    projections = GEMM_PASSES_FLOPS * h * (gdn.in_proj_width + gdn.value_width)
    conv = GEMM_PASSES_FLOPS * gdn.conv_kernel * gdn.conv_channels
    delta_rule = GEMM_PASSES_FLOPS * 4 * gdn.value_heads * gdn.value_head_dim ** 2
    return projections, conv + delta_rule


# ---- whole model -------------------------------------------------------------------------------


def layer_attention_core_flops(
    model: ModelSpec, layer_index: int, seq_length: int, convention: FlopConvention = "megatron"
) -> float:
    """The attention core of layer `layer_index`: windowed where the model slides or chunks there; a Gated
    DeltaNet layer's conv and delta rule (its sequence mixing, linear in the tokens)."""
    if not model.has_attention(layer_index):
        return 0.0
    if model.is_linear_attention_layer(layer_index):
        return gated_delta_net_flops(model)[1]
    if model.csa is not None:
        return compressed_core_flops(model, layer_index, seq_length, convention)
    if model.dsa is not None:
        return dsa_core_flops(model, layer_index, seq_length, convention)
    return attention_core_flops(model, seq_length, convention, model.attention_window(layer_index))


def layer_attention_linear_flops(model: ModelSpec, layer_index: int) -> float:
    """The token-linear projections of layer `layer_index`'s sequence mixer: attention's, Gated DeltaNet's, or a
    heterogeneous layer's linear replacement."""
    if model.layer_block(layer_index).attention == "linear":
        return _linear_replacement_flops(model)
    if not model.has_attention(layer_index):
        return 0.0
    if model.is_linear_attention_layer(layer_index):
        return gated_delta_net_flops(model)[0]
    indexer = dsa_indexer_linear_flops(model) if model.runs_dsa_indexer(layer_index) else 0.0
    return attention_linear_flops(model, model.layer_kv_heads(layer_index)) + indexer \
        + compressor_linear_flops(model, layer_index)


def layer_flops(model: ModelSpec, layer_index: int, seq_length: int, convention: FlopConvention = "megatron") -> float:
    """One layer, per token: attention (linear + core) + MLP; a hybrid layer only its own block."""
    if model.layer_kind(layer_index) == "mamba":
        return mamba_mixer_flops(model, seq_length)
    linear = layer_attention_linear_flops(model, layer_index)
    return linear + layer_attention_core_flops(model, layer_index, seq_length, convention) + mlp_flops(
        model, layer_index) + hyper_connection_flops(model)


def logits_flops(model: ModelSpec, tp: int = 1) -> float:
    """Output layer, per token: 6 * h * V_padded, counted once per MTP depth + 1 (Megatron)."""
    return GEMM_PASSES_FLOPS * model.hidden_size * model.padded_vocab_size(tp) * (model.mtp_num_layers + 1)


def mtp_flops(model: ModelSpec, seq_length: int, convention: FlopConvention = "megatron") -> float:
    """MTP modules, per token: k modules of layers like the last (a hybrid's MTP pattern) + 6 k (3h + 2h^2) for
    norms and eh-projection.

    (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2; Megatron's MTP branch.) Their logits are in `logits_flops`.
    """
    k = model.mtp_num_layers
    if k == 0:
        return 0.0
    h = model.hidden_size
    module_layers = sum(layer_flops(model, index, seq_length, convention) for index in model.mtp_layer_indices)
    return k * module_layers + GEMM_PASSES_FLOPS * k * (3 * h + 2 * h * h)


@dataclass(frozen=True)
class FlopsPerToken:
    """Model FLOPs per token, split into the parts the step-time model prices differently."""

    attention_linear: float
    attention_core: float
    mlp: float
    mtp: float
    logits: float
    mamba: float = 0.0  # Mamba-2 mixers of a hybrid model
    hyper_connections: float = 0.0  # the hyper-connections' mixing projections

    @property
    def layers(self) -> float:
        return self.attention_linear + self.attention_core + self.mlp + self.mamba + self.hyper_connections

    @property
    def total(self) -> float:
        return self.layers + self.mtp + self.logits


@lru_cache(maxsize=1024)
def flops_per_token(
    model: ModelSpec, seq_length: int, *, convention: FlopConvention = "megatron", tp: int = 1
) -> FlopsPerToken:
    """Model FLOPs per trained token, by part (padded vocab for `tp`). Cached: the planner asks often."""
    mlp_total = sum(mlp_flops(model, i) for i in range(model.num_layers))
    return FlopsPerToken(
        attention_linear=sum(layer_attention_linear_flops(model, i) for i in range(model.num_layers)),
        attention_core=sum(layer_attention_core_flops(model, i, seq_length, convention)
                           for i in range(model.num_layers)),
        mlp=mlp_total,
        mtp=mtp_flops(model, seq_length, convention),
        logits=logits_flops(model, tp),
        mamba=(sum(model.layer_kind(i) == "mamba" for i in range(model.num_layers))
               * mamba_mixer_flops(model, seq_length))
        if model.mamba is not None else 0.0,
        hyper_connections=model.num_layers * hyper_connection_flops(model),
    )


def flops_per_step(
    model: ModelSpec,
    seq_length: int,
    global_batch_size: int,
    *,
    convention: FlopConvention = "megatron",
    tp: int = 1,
) -> float:
    """Model FLOPs of one global batch (`num_floating_point_operations(args, batch_size)`)."""
    return flops_per_token(model, seq_length, convention=convention, tp=tp).total * seq_length * global_batch_size
