"""ModelSpec -> Megatron-LM model flags: the one mapping from a model's meaning to `pretrain_gpt.py`.

Everything that changes which model is built (shape, attention, MLP, norms, rope, MoE routing, MLA,
MTP) is written here and nowhere else, so `estimate` and `script` agree on one model. Names and
choices follow Megatron-LM core_v0.16.0 (`megatron_args.py` checks them against the pinned parser).
"""

from __future__ import annotations

from megapilot.errors import MegapilotError
from megapilot.launch.sections import ArgSection
from megapilot.spec import ModelSpec


def model_section(model: ModelSpec, *, cpu: bool = False) -> ArgSection:
    """The model's flags; `cpu` keeps the MoE dispatcher Megatron-Core can run without CUDA streams."""
    s = ArgSection(f"model: {model.name}")
    s.add("--num-layers", model.num_layers)
    s.add("--hidden-size", model.hidden_size)
    s.add("--ffn-hidden-size", model.ffn_hidden_size)
    s.add("--num-attention-heads", model.num_attention_heads)
    if model.mla is None:
        s.add("--kv-channels", model.head_dim)
        if model.is_gqa:
            s.add("--group-query-attention")
            s.add("--num-query-groups", model.num_query_groups)
    _add_activation(s, model)
    s.add("--normalization", model.normalization)
    s.add("--norm-epsilon", model.norm_epsilon)
    s.add("--position-embedding-type", model.position_embedding)
    if model.position_embedding == "rope":
        s.add("--rotary-base", model.rotary_base)
    s.add("--max-position-embeddings", model.max_position_embeddings)
    s.add("--make-vocab-size-divisible-by", model.make_vocab_size_divisible_by)
    if not model.tie_embeddings:
        s.add("--untie-embeddings-and-output-weights")
    if not model.add_bias_linear:
        s.add("--disable-bias-linear")
    if model.add_qkv_bias:
        s.add("--add-qkv-bias")
    if model.qk_layernorm:
        s.add("--qk-layernorm")
    # Modern decoder LLMs pretrain without dropout; Megatron's defaults (0.1) date from GPT-2/BERT.
    s.add("--attention-dropout", 0.0)
    s.add("--hidden-dropout", 0.0)
    if model.mla is not None:
        _add_mla(s, model)
    if model.moe is not None:
        _add_moe(s, model, cpu=cpu)
    if model.mtp_num_layers:
        s.add("--mtp-num-layers", model.mtp_num_layers)
    return s


def _add_activation(s: ArgSection, model: ModelSpec) -> None:
    if model.mlp_activation == "swiglu":
        s.add("--swiglu")
    elif model.mlp_activation == "squared_relu":
        s.add("--squared-relu")
    elif model.mlp_activation == "geglu":
        raise MegapilotError(
            f"{model.name} uses a gated GELU MLP, which pretrain_gpt.py has no flag for "
            "(gated_linear_unit is not exposed on its command line)",
            field="model.mlp_activation", fix="use a swiglu/gelu model, or launch it through Megatron-Bridge",
        )
    # "gelu" is Megatron's default activation: no flag.


def _add_mla(s: ArgSection, model: ModelSpec) -> None:
    mla = model.mla
    assert mla is not None
    s.add("--multi-latent-attention")
    if mla.q_lora_rank is not None:
        s.add("--q-lora-rank", mla.q_lora_rank)
    s.add("--kv-lora-rank", mla.kv_lora_rank)
    s.add("--qk-head-dim", mla.qk_head_dim)
    s.add("--qk-pos-emb-head-dim", mla.qk_pos_emb_head_dim)
    s.add("--v-head-dim", mla.v_head_dim)


def _add_moe(s: ArgSection, model: ModelSpec, *, cpu: bool = False) -> None:
    moe = model.moe
    assert moe is not None
    s.add("--num-experts", moe.num_experts)
    s.add("--moe-router-topk", moe.router_topk)
    s.add("--moe-ffn-hidden-size", moe.moe_ffn_hidden_size)
    if moe.shared_expert_ffn_hidden_size:
        s.add("--moe-shared-expert-intermediate-size", moe.shared_expert_ffn_hidden_size)
        if moe.shared_expert_gate:
            s.add("--moe-shared-expert-gate")
    s.add("--moe-layer-freq", moe_layer_pattern(model))
    s.add("--moe-router-load-balancing-type", moe.load_balancing_type)
    s.add("--moe-aux-loss-coeff", moe.aux_loss_coeff)
    if moe.router_expert_bias:
        s.add("--moe-router-enable-expert-bias")
    # alltoall moves only the routed tokens; allgather (the default) replicates every token to every EP rank.
    # Megatron-Core's alltoall dispatcher needs CUDA streams, so a CPU run keeps allgather.
    s.add("--moe-token-dispatcher-type", "allgather" if cpu else "alltoall")


def moe_layer_pattern(model: ModelSpec) -> str:
    """--moe-layer-freq: the plain frequency, or Megatron's list expression when dense layers lead.

    Megatron evaluates expressions such as `([0]*1+[1]*26)` (1 = MoE layer); the run-length form keeps
    the flag short for deep models.
    """
    moe = model.moe
    assert moe is not None
    if moe.first_k_dense_layers == 0:
        return str(moe.moe_layer_freq)
    pattern = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
    runs: list[tuple[int, int]] = []
    for bit in pattern:
        if runs and runs[-1][0] == bit:
            runs[-1] = (bit, runs[-1][1] + 1)
        else:
            runs.append((bit, 1))
    return "(" + "+".join(f"[{bit}]*{count}" for bit, count in runs) + ")"
