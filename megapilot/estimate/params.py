"""Parameter counts of a `ModelSpec`, per layer, per model and per pipeline stage.

Pure functions, no I/O. Counting follows the weights Megatron-Core (and the Hugging Face checkpoint of
the same model) allocates:

- attention: Q/K/V and output projections (+ biases); MLA: the q LoRA pair (or a full-rank q), the
  joint KV down-projection with the shared rotary key, the KV up-projection and the output projection;
  DeepSeek Sparse Attention adds its lightning indexer (`LayerParams.indexer`, whole on every TP rank);
- MLP: dense (2 matrices, 3 with a gated unit), routed experts, shared experts (+ their optional gate h→1),
  router h→E (+ the optional per-expert routing bias); a latent MoE's routed experts in the latent width and
  its two projections h→latent→h;
- norms: one weight (RMSNorm) or weight + bias (LayerNorm) per norm — the two per-layer norms, the
  q/k norms of `qk_layernorm` and MLA's q/kv LoRA norms all land in `LayerParams.norms` (Llama 4's `qk_l2_norm`
  has no weight: nothing to count);
- embeddings: the word embedding (+ learned absolute positions), an output layer unless tied, a final norm;
- MTP: each multi-token-prediction module is one transformer layer of the last layer's kind (a hybrid's: the
  layers of its MTP pattern), its enorm, hnorm and final norm, and the eh-projection 2h→h; it shares the
  embedding and output layer; with a repeated layer one module's weights serve every depth.

Published counts use the tokenizer's vocab; Megatron allocates the padded one (`padded_vocab=True`).

Per pipeline rank, `stage_params` is the one account of what a rank holds (checked against real
Megatron-Core ranks); `stage_params_by_sharding` is the same account grouped by how the weights are
split over GPUs, which the memory and step-time models divide by TP and EP x ETP.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megapilot.errors import MegapilotError
from megapilot.spec.model import COMPRESSED_SPARSE, ModelSpec
from megapilot.spec.pipeline import (
    EMBEDDING,
    EVEN_SPLIT,
    LOSS,
    MTP,
    PipelineSplit,
    PipelineStages,
)


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer, by block.

    `mlp` is the dense MLP (0 on MoE layers); `routed_experts` holds all experts of the layer and
    `active_routed_experts` the top-k a token is sent to.
    """

    attention: int
    mlp: int
    routed_experts: int
    active_routed_experts: int
    shared_experts: int
    router: int
    norms: int
    # A latent MoE's h -> latent and latent -> h projections around the dispatch ("duplicated": whole on every
    # TP rank, Megatron's parallel_mode="duplicated").
    latent_projections: int = 0
    # DeepSeek Sparse Attention's lightning indexer (its q, k and head-weight projections and its key LayerNorm),
    # whole on every TP rank like the latent projections (Megatron builds it "duplicated").
    indexer: int = 0
    # DeepSeek-V4's KV compressor (its wkv and wgate projections, per-position bias and norm) and the
    # hyper-connections' mixing projections, biases and gates: whole on every rank (Megatron builds both duplicated).
    compressor: int = 0
    hyper_connections: int = 0

    @property
    def _replicated(self) -> int:
        return self.norms + self.router + self.latent_projections + self.indexer + self.compressor \
            + self.hyper_connections

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.routed_experts + self.shared_experts + self._replicated

    @property
    def active(self) -> int:
        """Weights one token touches in this layer: routed top-k instead of every expert."""
        return self.attention + self.mlp + self.active_routed_experts + self.shared_experts + self._replicated

    @property
    def by_sharding(self) -> ParamsBySharding:
        """The same weights grouped by how Megatron splits them over GPUs."""
        return ParamsBySharding(
            tp_sharded=self.attention + self.mlp + self.shared_experts,
            replicated=self._replicated,
            expert=self.routed_experts,
        )


@dataclass(frozen=True)
class ParamsBySharding:
    """Parameters grouped by how Megatron splits them (counts before any split).

    `tp_sharded`: attention, dense MLPs, shared experts, embeddings, output layer, MTP projections -
    split over TP. `replicated`: norms and routers - whole on every TP rank. `expert`: routed
    experts - split over EP x ETP.
    """

    tp_sharded: int
    replicated: int
    expert: int

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert

    def __add__(self, other: ParamsBySharding) -> ParamsBySharding:
        return ParamsBySharding(self.tp_sharded + other.tp_sharded, self.replicated + other.replicated,
                                self.expert + other.expert)

    def scaled(self, factor: int) -> ParamsBySharding:
        return ParamsBySharding(self.tp_sharded * factor, self.replicated * factor, self.expert * factor)


@dataclass(frozen=True)
class ParamBreakdown:
    """Whole-model parameters.

    `total` = embedding + output_layer + layers + final_norm + mtp.
    `active` = what one token touches in the main model: the input embedding (word + position), the
    attention, dense MLPs, top-k routed and shared experts, routers and norms of every layer, the final
    norm and the output layer. It INCLUDES the input embedding and EXCLUDES the MTP modules (they only
    run in training); `active_without_input_embedding` gives the other publishers' convention.
    """

    embedding: int
    output_layer: int
    layers: int
    final_norm: int
    mtp: int
    total: int
    active: int
    per_layer: tuple[LayerParams, ...]

    @property
    def main_model(self) -> int:
        """Total without the MTP modules (what most model cards call the model size)."""
        return self.total - self.mtp

    @property
    def active_without_input_embedding(self) -> int:
        return self.active - self.embedding


# ---- building blocks ---------------------------------------------------------------------------


def norm_params(model: ModelSpec, width: int) -> int:
    """One norm over `width` features: RMSNorm has a scale, LayerNorm a scale and a bias."""
    return width * (2 if model.normalization == "LayerNorm" else 1)


def _linear(model: ModelSpec, in_features: int, out_features: int) -> int:
    """A linear layer's weight plus its bias when the model uses biases (`add_bias_linear`)."""
    return in_features * out_features + (out_features if model.add_bias_linear else 0)


def _mlp_params(model: ModelSpec, ffn_hidden_size: int, width: int | None = None) -> int:
    """Up (+ gate) projection and down projection of one MLP of width `ffn_hidden_size` between tokens of
    `width` (h unless given: a latent MoE's routed experts take and give latent-sized tokens)."""
    if ffn_hidden_size == 0:
        return 0
    width = model.hidden_size if width is None else width
    up_outputs = ffn_hidden_size * (2 if model.gated_mlp else 1)
    return _linear(model, width, up_outputs) + _linear(model, ffn_hidden_size, width)


def _standard_attention_params(model: ModelSpec, kv_heads: int | None = None) -> tuple[int, int]:
    """(projection weights and biases, q/k norms) of multi-head / grouped-query attention (`kv_heads`: a
    heterogeneous layer's own, else the model's)."""
    h = model.hidden_size
    q_width = model.num_attention_heads * model.head_dim
    kv_width = (kv_heads or model.kv_heads) * model.head_dim
    # an output gate is one more query-wide projection out of QKV (Megatron's linear_qkv_out_dim)
    qkv_outputs = q_width * (2 if model.attention_output_gate else 1) + 2 * kv_width
    qkv = h * qkv_outputs + (qkv_outputs if model.add_bias_linear or model.add_qkv_bias else 0)
    output = _linear(model, q_width, h)
    qk_norms = 2 * norm_params(model, model.head_dim) if model.qk_layernorm else 0
    sinks = model.num_attention_heads if model.softmax_type == "learnable" else 0  # one learned logit per head
    return qkv + output + sinks, qk_norms


def _mla_attention_params(model: ModelSpec) -> tuple[int, int]:
    """(projections, LoRA norms) of DeepSeek multi-head latent attention (biases are not used by MLA)."""
    assert model.mla is not None
    mla, h, heads = model.mla, model.hidden_size, model.num_attention_heads
    if mla.csa is not None:
        return _compressed_attention_params(model)
    q_head_dim = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    if mla.q_lora_rank is None:
        query = h * heads * q_head_dim
        lora_norms = 0
    else:
        query = h * mla.q_lora_rank + mla.q_lora_rank * heads * q_head_dim
        lora_norms = norm_params(model, mla.q_lora_rank)
    kv_down = h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)  # latent KV + the shared rotary key
    kv_up = mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim)
    output = heads * mla.v_head_dim * h
    lora_norms += norm_params(model, mla.kv_lora_rank)
    return query + kv_down + kv_up + output, lora_norms if mla.latent_layernorms else 0


def _compressed_attention_params(model: ModelSpec) -> tuple[int, int]:
    """(projections and sinks, norms) of DeepSeek-V4's attention (Megatron-LM dev's DSv4HybridAttention): the q
    LoRA h -> q_lora -> heads x v_head_dim, the one K=V head h -> v_head_dim, the grouped output projection
    (heads x v_head_dim -> o_groups x o_lora_rank, each group its own heads) then o_groups x o_lora_rank -> h, a sink
    logit per head; the q-latent and KV norms."""
    mla, h, heads = model.mla, model.hidden_size, model.num_attention_heads
    assert mla is not None and mla.csa is not None and mla.q_lora_rank is not None
    csa, width = mla.csa, heads * mla.v_head_dim
    query = h * mla.q_lora_rank + mla.q_lora_rank * width
    output = width * csa.o_lora_rank + csa.o_groups * csa.o_lora_rank * h
    norms = norm_params(model, mla.q_lora_rank) + norm_params(model, mla.v_head_dim)
    return query + h * mla.v_head_dim + output + heads, norms if mla.latent_layernorms else 0


def compressor_params(model: ModelSpec, layer_index: int) -> int:
    """DeepSeek-V4's KV compressor on layer `layer_index` (0 on a window-only layer): its wkv and wgate
    projections, its fp32 per-position bias (ratio x projected width) and its RMSNorm over the head."""
    projections = model.compressor_projections(layer_index)
    if not projections or model.csa is None or model.mla is None:
        return 0
    return _compressor_params(model, projections, model.csa.ratio(layer_index), model.mla.v_head_dim)


def _compressor_params(model: ModelSpec, projections: tuple[tuple[int, int], ...], ratio: int, head_dim: int) -> int:
    width = projections[0][1]
    return sum(n_in * n_out for n_in, n_out in projections) + ratio * width + norm_params(model, head_dim)


def dsa_indexer_params(model: ModelSpec) -> int:
    """DeepSeek Sparse Attention's lightning indexer of a layer that runs one (0 without DSA), as Megatron-Core's
    DSAIndexer and DeepSeek's reference `Indexer` build it: its projections (`ModelSpec.dsa_indexer_projections`,
    no biases) and its key's LayerNorm (weight and bias). DeepSeek-V4's indexer (Megatron-LM dev's CSAIndexer) has
    no key LayerNorm: its keys come from its own compressor, whose bias and norm count instead."""
    dsa = model.dsa
    if dsa is None:
        return 0
    projections = model.dsa_indexer_projections
    if model.csa is not None:
        query_and_weights, compressor = projections[:2], projections[2:]
        return sum(n_in * n_out for n_in, n_out in query_and_weights) + _compressor_params(
            model, compressor, COMPRESSED_SPARSE, dsa.indexer_head_dim)
    return sum(n_in * n_out for n_in, n_out in projections) + 2 * dsa.indexer_head_dim


def hyper_connection_params(model: ModelSpec) -> int:
    """The hyper-connections of one transformer layer (0 without): per sublayer, the fp32 projection of the n
    streams (n x h) to the n^2 + 2n mixing logits (H_res, H_pre, H_post), their bias and three gates
    (Megatron's HyperConnectionModule; DeepSeek-V4's hc_*_fn, hc_*_base, hc_*_scale)."""
    return sum(n_in * n_out + n_out + 3 for n_in, n_out in model.hyper_connection_projections())


def hyper_connection_head_params(model: ModelSpec) -> int:
    """The learned contraction of the n streams back to one before the final norm (and in each MTP module): an
    n x h -> n projection, its bias and a scale (DeepSeek-V4's hc_head_fn, hc_head_base, hc_head_scale)."""
    n = model.residual_streams
    return 0 if n == 1 else n * n * model.hidden_size + n + 1


def final_norm_params(model: ModelSpec) -> int:
    """The final norm, with the hyper-connections' contraction before it."""
    return norm_params(model, model.hidden_size) + hyper_connection_head_params(model)


def _router_params(model: ModelSpec) -> int:
    """Router h→E (+ its bias when the model uses linear biases, GPT-OSS), plus DeepSeek-V3's per-expert routing
    bias when the model has one.

    Megatron keeps that bias as a buffer updated by the balancing rule, not a trained weight; the
    Hugging Face checkpoint (and DeepSeek's published 671B) counts it, so it is counted here.
    """
    assert model.moe is not None
    bias = model.moe.num_experts if model.moe.router_expert_bias else 0
    linear_bias = model.moe.num_experts if model.add_bias_linear else 0  # Megatron's router has one with biases on
    return model.hidden_size * model.moe.num_experts + bias + linear_bias


def mamba_mixer_params(model: ModelSpec) -> int:
    """One Mamba-2 mixer (Megatron's MambaMixer): in_proj h -> (2 d_inner + 2 G N + heads), the depthwise
    conv over (d_inner + 2 G N) channels with its bias, dt_bias, A_log and D per head, the gated RMSNorm over
    d_inner, and out_proj d_inner -> h (no linear biases)."""
    assert model.mamba is not None
    mamba, h = model.mamba, model.hidden_size
    heads, inner = mamba.heads(h), mamba.inner_size(h)
    groups_state = 2 * mamba.num_groups * mamba.state_dim
    in_proj = h * (2 * inner + groups_state + heads)
    conv_channels = inner + groups_state
    conv = conv_channels * mamba.conv_kernel + conv_channels
    return in_proj + conv + 3 * heads + inner + inner * h


def gated_delta_net_params(model: ModelSpec) -> tuple[int, int]:
    """(weights, norm) of one Gated DeltaNet mixer (Megatron's GatedDeltaNet): in_proj h -> (q, k, v, z, beta,
    alpha), the depthwise causal conv over q, k and v (no conv bias), dt_bias and A_log per value head, out_proj
    v -> h; the gated RMSNorm's scale is one value head wide, shared by the heads."""
    assert model.gated_delta_net is not None
    gdn, h = model.gated_delta_net, model.hidden_size
    in_proj = _linear(model, h, gdn.in_proj_width)
    conv = gdn.conv_channels * gdn.conv_kernel
    out_proj = _linear(model, gdn.value_width, h)
    return in_proj + conv + 2 * gdn.value_heads + out_proj, norm_params(model, gdn.value_head_dim)


def layer_params(model: ModelSpec, layer_index: int) -> LayerParams:
    """Parameters of the 0-based `layer_index`-th layer (dense or MoE, MHA/GQA or MLA; or one hybrid block).

    A hybrid layer holds one block and its pre-norm: a Mamba-2 mixer (counted under `attention`, the
    sequence mixer, split over TP like attention), attention alone, a dense MLP alone, or an MoE block alone.
    """
    kind = model.layer_kind(layer_index)
    pre_norm = norm_params(model, model.hidden_size)
    if kind == "mamba":
        return LayerParams(mamba_mixer_params(model), 0, 0, 0, 0, 0, pre_norm)
    if model.layer_blocks is not None:
        return _heterogeneous_layer_params(model, layer_index)
    if model.mla is not None:
        attention, attention_norms = _mla_attention_params(model)
    elif model.is_linear_attention_layer(layer_index):
        attention, attention_norms = gated_delta_net_params(model)  # the sequence mixer, split over TP likewise
    else:
        attention, attention_norms = _standard_attention_params(model)
    if kind == "attention":
        return LayerParams(attention, 0, 0, 0, 0, 0, pre_norm + attention_norms)
    if kind == "mlp":
        return LayerParams(0, _mlp_params(model, model.ffn_hidden_size), 0, 0, 0, 0, pre_norm)
    if kind == "moe":
        attention, attention_norms = 0, 0
    layer_norms = 2 * pre_norm if kind == "transformer" else pre_norm  # input norm (+ pre-MLP norm)
    norms = layer_norms + attention_norms

    indexer = dsa_indexer_params(model) if model.runs_dsa_indexer(layer_index) else 0
    extra = {"compressor": compressor_params(model, layer_index), "hyper_connections": hyper_connection_params(model)}
    if not model.is_moe_layer(layer_index):
        return LayerParams(attention, _mlp_params(model, model.ffn_hidden_size), 0, 0, 0, 0, norms, indexer=indexer,
                           **extra)

    moe = model.moe
    assert moe is not None
    h, width = model.hidden_size, moe.routed_width(model.hidden_size)
    one_expert = _mlp_params(model, moe.moe_ffn_hidden_size, width)
    latent_projections = _linear(model, h, width) + _linear(model, width, h) if moe.latent_size is not None else 0
    return LayerParams(
        attention=attention,
        mlp=0,
        routed_experts=moe.num_experts * one_expert,
        active_routed_experts=moe.router_topk * one_expert,
        shared_experts=_mlp_params(model, moe.shared_expert_ffn_hidden_size)
        + (model.hidden_size if moe.shared_expert_gate else 0),
        router=_router_params(model),
        norms=norms,
        latent_projections=latent_projections,
        indexer=indexer,
        **extra,
    )


def _heterogeneous_layer_params(model: ModelSpec, layer_index: int) -> LayerParams:
    """A layer of its own shape (Megatron-Core's heterogeneous layer spec): full attention with its KV heads, or
    one h -> h linear, or nothing; likewise the MLP with its width. A removed sublayer has no norm either."""
    block, h = model.layer_block(layer_index), model.hidden_size
    if block.attention == "full":
        attention, qk_norms = _standard_attention_params(model, model.layer_kv_heads(layer_index))
    else:
        attention, qk_norms = (_linear(model, h, h) if block.attention == "linear" else 0), 0
    if block.mlp == "full":
        mlp = _mlp_params(model, model.layer_ffn_hidden_size(layer_index))
    else:
        mlp = _linear(model, h, h) if block.mlp == "linear" else 0
    return LayerParams(attention, mlp, 0, 0, 0, 0, qk_norms + block.sublayers * norm_params(model, h))


def embedding_params(model: ModelSpec, *, padded_vocab: bool = False, tp: int = 1) -> int:
    """Word embedding, plus learned absolute position embeddings (GPT-2 style)."""
    vocab = model.padded_vocab_size(tp) if padded_vocab else model.vocab_size
    positions = model.max_position_embeddings if model.position_embedding == "learned_absolute" else 0
    return (vocab + positions) * model.hidden_size


def output_layer_params(model: ModelSpec, *, padded_vocab: bool = False, tp: int = 1) -> int:
    """The logit projection h→vocab; 0 when tied to the word embedding."""
    if model.tie_embeddings:
        return 0
    vocab = model.padded_vocab_size(tp) if padded_vocab else model.vocab_size
    return vocab * model.hidden_size


def mtp_module_params(model: ModelSpec) -> int:
    """One MTP module: a transformer layer like the last decoder layer (a hybrid's: the layers of its
    `mtp_hybrid_pattern`), enorm + hnorm + final norm, eh-proj 2h→h.

    The embedding and output layer are shared with the main model, so they are not counted here.
    """
    return _mtp_module_by_sharding(model).total


def _mtp_module_by_sharding(model: ModelSpec) -> ParamsBySharding:
    h = model.hidden_size
    norms_and_projection = ParamsBySharding(tp_sharded=2 * h * h, replicated=2 * norm_params(model, h)
                                            + final_norm_params(model), expert=0)
    layers = layers_by_sharding(model)
    module = norms_and_projection
    for index in model.mtp_layer_indices:
        module = module + layers[index]
    return module


@lru_cache(maxsize=64)
def layers_by_sharding(model: ModelSpec) -> tuple[ParamsBySharding, ...]:
    """Every layer's parameters grouped by sharding, computed once per model (the planner asks often)."""
    return tuple(layer_params(model, i).by_sharding for i in range(model.num_layers))


def count_params(model: ModelSpec, *, padded_vocab: bool = False, tp: int = 1) -> ParamBreakdown:
    """Count every parameter of `model`; `padded_vocab=True` uses Megatron's vocab padded for `tp`."""
    per_layer = tuple(layer_params(model, i) for i in range(model.num_layers))
    embedding = embedding_params(model, padded_vocab=padded_vocab, tp=tp)
    output_layer = output_layer_params(model, padded_vocab=padded_vocab, tp=tp)
    layers = sum(layer.total for layer in per_layer)
    final_norm = final_norm_params(model)
    mtp = model.mtp_weight_copies * mtp_module_params(model)
    active = embedding + sum(layer.active for layer in per_layer) + final_norm + output_layer
    return ParamBreakdown(
        embedding=embedding,
        output_layer=output_layer,
        layers=layers,
        final_norm=final_norm,
        mtp=mtp,
        total=embedding + output_layer + layers + final_norm + mtp,
        active=active,
        per_layer=per_layer,
    )


# ---- pipeline stages ---------------------------------------------------------------------------


def _split_of(
    split: PipelineSplit | None, first_stage_layers: int | None, last_stage_layers: int | None
) -> PipelineSplit:
    """The typed split; the first/last keywords are the older spelling of an uneven one."""
    if split is not None:
        return split
    if first_stage_layers is None and last_stage_layers is None:
        return EVEN_SPLIT
    return PipelineSplit(first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)


def pipeline_stages(model: ModelSpec, pp: int, vpp: int = 1, split: PipelineSplit = EVEN_SPLIT) -> PipelineStages:
    """The model's virtual stages under `split` (MegapilotError where Megatron refuses the split)."""
    return split.resolve(model.num_layers, model.mtp_num_layers, pp, vpp)


def stage_layer_indices(
    model: ModelSpec, pp: int, vpp: int = 1, stage: int = 0, *,
    first_stage_layers: int | None = None, last_stage_layers: int | None = None,
    split: PipelineSplit | None = None,
) -> list[int]:
    """0-based layers held by pipeline rank `stage`.

    Even split: Megatron splits the layers into pp*vpp equal model chunks; chunk c goes to rank
    c % pp, so rank `stage` holds chunks stage, stage+pp, ..., stage+(vpp-1)*pp. Uneven split
    (`first_stage_layers`/`last_stage_layers`): each rank's count (the given first/last, the rest
    shared by the middle ranks) is cut into vpp equal chunks, and virtual stage v runs through the
    ranks in order, as Megatron-Core's get_transformer_layer_offset places them. Account-for flags and
    layout strings: the layers their resolved stages list (`spec.pipeline`).
    """
    resolved = _split_of(split, first_stage_layers, last_stage_layers)
    _check_stage(model, pp, vpp, stage, resolved)
    return list(pipeline_stages(model, pp, vpp, resolved).decoder_layers(stage))


def stage_params(
    model: ModelSpec, pp: int, vpp: int = 1, stage: int = 0, *, tp: int = 1,
    first_stage_layers: int | None = None, last_stage_layers: int | None = None,
    split: PipelineSplit | None = None,
) -> int:
    """Parameters held by pipeline rank `stage` (all TP shards together), with the padded vocab for `tp`.

    The rank holding `E` holds the embedding; the one holding `L` the final norm and the output layer;
    the one holding `m` the MTP modules (the last rank unless a layout puts them elsewhere). With pp > 1
    Megatron-Core gives those ranks copies of what they share with the first (checked against core 0.16
    models built with pp=2): with tied embeddings the loss rank's own word-embedding matrix as the
    output layer, and with MTP a full input embedding for the MTP modules to read.
    """
    return stage_params_by_sharding(model, pp, vpp, stage, tp=tp,
                                    split=_split_of(split, first_stage_layers, last_stage_layers)).total


@lru_cache(maxsize=8192)
def stage_params_by_sharding(
    model: ModelSpec, pp: int, vpp: int = 1, stage: int = 0, *, tp: int = 1,
    first_stage_layers: int | None = None, last_stage_layers: int | None = None,
    split: PipelineSplit | None = None,
) -> ParamsBySharding:
    """`stage_params` grouped by how Megatron splits them over GPUs (what the memory model divides)."""
    resolved = _split_of(split, first_stage_layers, last_stage_layers)
    stages = pipeline_stages(model, pp, vpp, resolved)
    layers = layers_by_sharding(model)
    held = ParamsBySharding(0, 0, 0)
    for i in stage_layer_indices(model, pp, vpp, stage, split=resolved):
        held += layers[i]
    held += ParamsBySharding(_vocab_params_held(model, stages, stage, tp), 0, 0)
    if stage == stages.rank_of(LOSS):
        held += ParamsBySharding(0, final_norm_params(model), 0)
    if stage == stages.rank_of(MTP):
        held += _mtp_module_by_sharding(model).scaled(model.mtp_weight_copies)
    return held


def stage_vocab_params(model: ModelSpec, pp: int, vpp: int = 1, stage: int = 0, *, tp: int = 1,
                       split: PipelineSplit | None = None) -> int:
    """The embedding and output-layer weights pipeline rank `stage` holds (before TP splits them): what an
    optimizer that treats them apart (Muon's scalar optimizer) sees."""
    return _vocab_params_held(model, pipeline_stages(model, pp, vpp, _split_of(split, None, None)), stage, tp)


def _vocab_params_held(model: ModelSpec, stages: PipelineStages, stage: int, tp: int) -> int:
    """Rank 0's embedding, the last rank's output layer (a copy of a tied embedding), and the MTP rank's
    embedding copy."""
    embedding_rank, loss_rank, mtp_rank = (stages.rank_of(item) for item in (EMBEDDING, LOSS, MTP))
    embedding = embedding_params(model, padded_vocab=True, tp=tp)
    held = embedding if stage == embedding_rank else 0
    if stage == loss_rank:
        held += output_layer_params(model, padded_vocab=True, tp=tp)
        if model.tie_embeddings and stage != embedding_rank:
            held += model.padded_vocab_size(tp) * model.hidden_size
    if stage == mtp_rank and stage != embedding_rank:
        held += embedding
    return held


def most_loaded_stage(
    model: ModelSpec, pp: int, vpp: int = 1, tp: int = 1, *,
    first_stage_layers: int | None = None, last_stage_layers: int | None = None,
    split: PipelineSplit | None = None,
) -> int:
    """The pipeline rank holding the most parameters (the lowest rank on a tie)."""
    resolved = _split_of(split, first_stage_layers, last_stage_layers)
    loads = [stage_params(model, pp, vpp, stage, tp=tp, split=resolved) for stage in range(pp)]
    return loads.index(max(loads))


def _check_stage(model: ModelSpec, pp: int, vpp: int, stage: int, split: PipelineSplit) -> None:
    if pp < 1 or vpp < 1:
        raise MegapilotError(f"pp={pp}, vpp={vpp} must be >= 1", field="pp", fix="use positive pipeline sizes")
    pipeline_stages(model, pp, vpp, split)
    if not 0 <= stage < pp:
        raise MegapilotError(f"stage={stage} is outside 0..{pp - 1}", field="stage", fix=f"use 0 <= stage < {pp}")
