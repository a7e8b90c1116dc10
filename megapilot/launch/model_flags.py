"""ModelSpec -> Megatron-LM model flags: the one mapping from a model's meaning to `pretrain_gpt.py`.

Everything that changes which model is built (shape, attention, MLP, norms, RoPE and its scaling,
MoE routing, MLA, MTP) is written here and nowhere else, so `estimate` and `script` agree on one
model. Names and choices follow Megatron-LM core_v0.16.0 (`megatron_args.py` checks them against the
pinned parser). A model field that `pretrain_gpt.py` at that release cannot build is refused here,
naming the field, before any script is written: a script that trains a different model than the one
planned is worse than none.

Where a value has no flag, the constant Megatron-Core uses is what the model must have (the
`_MEGATRON_*` constants below, each with where Megatron fixes it).
"""

from __future__ import annotations

from collections.abc import Collection

from megapilot.errors import MegapilotError
from megapilot.launch.hybrid_split import PATTERN_FLAG
from megapilot.launch.megatron_args import FlagTable, flag_table
from megapilot.launch.sections import ArgSection
from megapilot.spec import ModelSpec
from megapilot.spec.model import Llama3RopeScaling, YarnRopeScaling

#: Llama 3 RoPE scaling: megatron/core/models/common/embeddings/rotary_pos_embedding.py `_apply_scaling`
#: has these as keyword defaults that nothing passes, and core_v0.16.0's gpt_builders.py passes
#: `rope_scaling=args.use_rope_scaling` but not `--rope-scaling-factor`, so GPTModel's default factor 8 holds.
_MEGATRON_LLAMA3_SCALING = {
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
}
#: YaRN under MLA: MLATransformerConfig's defaults for the values arguments.py has no flag for. The rounding of the
#: correction range (`truncate`) is refused on its own (`_refuse_unrounded_mla_yarn`).
_MEGATRON_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def model_section(model: ModelSpec, table: FlagTable | None = None, *, cpu: bool = False) -> ArgSection:
    """The model's flags for `table`'s release (None: the newest megapilot has a table for); `cpu` keeps the MoE
    dispatcher Megatron-Core can run without CUDA streams."""
    table = table or flag_table()
    _refuse_unreleased_attention(model)
    s = ArgSection(f"model: {model.name}")
    s.add_terms(model, "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads")
    _add_attention(s, model)
    if model.gated_delta_net is not None:
        _add_gated_delta_net(s, model, cpu=cpu)
    _add_activation(s, model)
    s.add_terms(model, "--normalization", "--norm-epsilon", "--apply-layernorm-1p")
    _add_position(s, model, table, cpu=cpu)
    s.add_terms(model, "--max-position-embeddings", "--make-vocab-size-divisible-by")
    # (inverted switches: the field says what the flag turns off)
    s.add_terms(model, "--untie-embeddings-and-output-weights", "--disable-bias-linear")
    # Modern decoder LLMs pretrain without dropout; Megatron's defaults (0.1) date from GPT-2/BERT.
    s.add("--attention-dropout", 0.0)
    s.add("--hidden-dropout", 0.0)
    if model.mla is not None:
        _add_mla(s, model)
    if model.dsa is not None:
        _add_dsa(s, model, cpu=cpu)
    if model.moe is not None:
        _add_moe(s, model, cpu=cpu)
    if model.mtp_num_layers:
        # (a hybrid's MTP module pattern, when it has one: Megatron-LM 0.17 on)
        s.add_terms(model, "--mtp-num-layers", "--mtp-loss-scaling-factor", "--mtp-hybrid-override-pattern")
        s.add_terms(model, "--mtp-use-repeated-layer")
    if model.is_hybrid:
        _add_hybrid(s, model)
    return s


#: pretrain_mamba.py builds its stack from this spec (it refuses to start without one).
MAMBA_STACK_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")


def _add_hybrid(s: ArgSection, model: ModelSpec) -> None:
    """A Mamba hybrid: the layer pattern, the Mamba-2 mixer's shape and the layer spec pretrain_mamba.py needs."""
    assert model.mamba is not None and model.hybrid_override_pattern is not None
    s.add("--spec", *MAMBA_STACK_SPEC)
    s.add("--is-hybrid-model")
    s.add(PATTERN_FLAG, model.hybrid_override_pattern)  # cut into pipeline segments where a split needs (flags.py)
    s.add("--mamba-state-dim", model.mamba.state_dim)
    s.add("--mamba-head-dim", model.mamba.head_dim)
    s.add("--mamba-num-groups", model.mamba.num_groups)
    if model.mamba.num_heads is not None:
        s.add("--mamba-num-heads", model.mamba.num_heads)
    if model.mamba.conv_kernel != 4:
        raise MegapilotError(
            f"{model.name} has a Mamba conv kernel of {model.mamba.conv_kernel}; Megatron's MambaMixer fixes d_conv=4 "
            "with no flag", field="model.mamba.conv_kernel", fix="use conv_kernel 4")


def training_script(model: ModelSpec) -> str:
    """The Megatron-LM entry script that builds `model`: pretrain_mamba.py for hybrids, else pretrain_gpt.py."""
    return "pretrain_mamba.py" if model.is_hybrid else "pretrain_gpt.py"


def _refuse_unreleased_attention(model: ModelSpec) -> None:
    """DeepSeek-V4's compressed attention (with its hash-routed layers, grouped output projection and
    hyper-connections) is built by Megatron-LM's dev branch (dsv4_hybrid, Aug 2026) and AMD Primus v26.5.0, by no
    Megatron-Core release the launchers target (core 0.16-0.19) and by no flags Primus's Megatron backend reads off
    them: megapilot plans and estimates the model but writes no script that would train another."""
    if model.csa is not None:
        raise MegapilotError(
            f"{model.name} attends over compressed KV (DeepSeek-V4's dsv4_hybrid attention), which no Megatron-Core "
            "release up to 0.19 builds; only Megatron-LM's dev branch and AMD Primus v26.5.0 (its own "
            "deepseek_v4 model) do", field="model.mla.csa",
            fix="plan and estimate it with megapilot, and launch it with Megatron-LM dev (TP 1) or Primus v26.5.0's "
                "deepseek_v4_flash.yaml")


def _add_attention(s: ArgSection, model: ModelSpec) -> None:
    if model.mla is None:
        s.add_terms(model, "--kv-channels")  # written out where kv_channels is left to hidden / heads
        if model.is_gqa:
            s.add("--group-query-attention")
            s.add_terms(model, "--num-query-groups")
    s.add_terms(model, "--add-qkv-bias")
    s.add_terms(model, "--attention-output-gate")
    # Under MLA, Megatron's --qk-layernorm builds the q/kv latent norms instead of per-head ones (the row's
    # `own_rule`: one switch for two fields).
    if model.qk_layernorm or (model.mla is not None and model.mla.latent_layernorms):
        s.add("--qk-layernorm")
    if model.sliding_window is not None:
        s.add_terms(model, "--window-size")  # (W-1, 0): the last W tokens, the query's own included
        s.add_terms(model, "--window-attn-skip-freq")
    s.add_terms(model, "--softmax-type", left_out_at_default=True)
    if model.no_rope_freq is not None:
        s.add("--no-rope-freq", model.no_rope_freq)
    if model.attention_chunk_size is not None:
        raise MegapilotError(
            f"{model.name} uses chunked attention ({model.attention_chunk_size} tokens), which no Megatron-LM release "
            "has a flag for (only Megatron-Bridge's Llama 4 layer spec builds it)",
            field="model.attention_chunk_size", fix="launch through Megatron-Bridge, or drop attention_chunk_size "
            "to train with full attention")
    if model.qk_l2_norm:
        _add_qk_l2_norm(s, model)


def _add_qk_l2_norm(s: ArgSection, model: ModelSpec) -> None:
    """Llama 4's weightless q/k L2 norm. Megatron-LM's --qk-l2-norm puts L2Norm in the one layer spec every layer
    shares (gpt_layer_specs.py), so it also normalises the NoPE layers, which Llama 4 (transformers, and
    Megatron-Bridge's Llama 4 layer spec) leaves unnormalised: with NoPE layers that is another model."""
    if model.no_rope_freq is not None:
        raise MegapilotError(
            f"{model.name} L2-normalises q and k on its RoPE layers only (qk_l2_norm, Llama 4's use_qk_norm); "
            f"Megatron-LM's --qk-l2-norm normalises every layer, the NoPE ones of --no-rope-freq "
            f"{model.no_rope_freq} too, which trains another model", field="model.qk_l2_norm",
            fix="launch through Megatron-Bridge (its Llama 4 layer spec skips the NoPE layers), or write the model "
                "as a ModelSpec YAML with qk_l2_norm false (or no_rope_freq null) to train that model instead")
    s.add_terms(model, "--qk-l2-norm")


def _gpu_only(model: ModelSpec, why: str, field: str, cpu_alternative: str) -> MegapilotError:
    """The refusal of a mixer the embedded CPU trainer cannot build."""
    return MegapilotError(f"{model.name} {why}: the embedded CPU trainer cannot train it", field=field,
                          fix=f"write the script for GPUs (drop --cpu), or try {cpu_alternative} on CPU")


def _add_gated_delta_net(s: ArgSection, model: ModelSpec, *, cpu: bool) -> None:
    """Gated DeltaNet on all layers but every full_attention_freq-th (core_v0.16.0's experimental variant)."""
    gdn = model.gated_delta_net
    assert gdn is not None
    if cpu:
        raise _gpu_only(model, "mixes tokens with Gated DeltaNet, which Megatron-Core builds only with Transformer "
                        "Engine and runs with flash-linear-attention's GPU kernels", "model.gated_delta_net",
                        "a Qwen3 MoE")
    s.add("--experimental-attention-variant", "gated_delta_net")
    s.add("--linear-attention-freq", gdn.full_attention_freq)
    s.add("--linear-num-key-heads", gdn.key_heads)
    s.add("--linear-num-value-heads", gdn.value_heads)
    s.add("--linear-key-head-dim", gdn.key_head_dim)
    s.add("--linear-value-head-dim", gdn.value_head_dim)
    s.add("--linear-conv-kernel-dim", gdn.conv_kernel)


def _add_activation(s: ArgSection, model: ModelSpec) -> None:
    s.add_terms(model, "--swiglu", "--squared-relu", "--quick-geglu")  # a switch each for its one activation
    if model.mlp_activation == "quick_geglu":
        s.add_terms(model, "--glu-linear-offset", left_out_at_default=True)
        s.add_terms(model, "--activation-func-clamp-value")
    elif model.mlp_activation == "geglu":
        raise MegapilotError(
            f"{model.name} uses a gated GELU MLP, which pretrain_gpt.py has no flag for "
            "(gated_linear_unit is not exposed on its command line)",
            field="model.mlp_activation", fix="use a swiglu/gelu model, or launch it through Megatron-Bridge",
        )
    # "gelu" is Megatron's default activation: no flag.


# ---- position ------------------------------------------------------------------------------------
def _add_position(s: ArgSection, model: ModelSpec, table: FlagTable, *, cpu: bool) -> None:
    if model.position_embedding == "rope" and model.mla is None and isinstance(model.rope_scaling, YarnRopeScaling):
        _add_standard_yarn(s, model, table, cpu=cpu)
        return
    s.add_terms(model, "--position-embedding-type")
    if model.position_embedding != "rope":
        return
    s.add_terms(model, "--rotary-base")
    s.add_terms(model, "--rotary-percent", left_out_at_default=True)
    if model.mla is not None:
        _add_mla_rope(s, model)
    elif isinstance(model.rope_scaling, Llama3RopeScaling):
        _require_megatron_values(model.rope_scaling, _MEGATRON_LLAMA3_SCALING, "Llama 3 RoPE scaling")
        s.add("--use-rope-scaling")  # the object's presence (the row's `own_rule`); its fields by their rows
        s.add_terms(model, "--rope-scaling-factor")
    elif model.rope_scaling is not None:
        raise MegapilotError(
            f"{model.rope_scaling.type} RoPE scaling is built by pretrain_gpt.py for no model: it does not pass "
            "--rotary-seq-len-interpolation-factor to the model",
            field="model.rope_scaling",
            fix="train at the original context (drop rope_scaling), or launch through Megatron-Bridge",
        )


# The first flag of standard attention's YaRN: pretrain_gpt.py fills GPTModel's yarn_* config from the command line
# from core_v0.19.0 on (argument_utils._apply_yarn_config_from_args). core_v0.18.0 accepts
# --position-embedding-type yarn but sets none of them, and GPTModel's YaRN branch reads them with no default.
_STANDARD_YARN_FLAG = "--yarn-beta-fast"
_STANDARD_YARN_RELEASE = "core_v0.19.0"


def _add_standard_yarn(s: ArgSection, model: ModelSpec, table: FlagTable, *, cpu: bool) -> None:
    """YaRN under standard attention (GPT-OSS): `--position-embedding-type yarn` and every one of its values stated,
    the rounding of the correction range included (GPT-OSS does not round)."""
    if cpu:
        raise _gpu_only(model, "scales RoPE with YaRN under standard attention, which Megatron-Core builds from "
                        f"{_STANDARD_YARN_RELEASE} on", "model.rope_scaling", "a model without rope_scaling")
    if _STANDARD_YARN_FLAG not in table.flags:
        raise MegapilotError(
            f"{model.name} scales RoPE with YaRN under standard attention, which pretrain_gpt.py builds from "
            f"Megatron-LM {_STANDARD_YARN_RELEASE} on (--position-embedding-type yarn and its --yarn-* flags); "
            f"Megatron-LM {table.label()} asserts rope_type 'rope' there or leaves YaRN's settings unset",
            field="megatron_version",
            fix=f"--megatron-version {_STANDARD_YARN_RELEASE} (or newer), train at the original context (drop "
                "rope_scaling), or launch through Megatron-Bridge")
    s.add("--position-embedding-type", "yarn")  # the row's own rule: YaRN under standard attention
    s.add_terms(model, "--rotary-base")
    s.add_terms(model, "--rotary-percent", left_out_at_default=True)
    s.add_terms(model, "--rotary-scaling-factor", "--yarn-original-max-position-embeddings", "--yarn-beta-fast",
                "--yarn-beta-slow", "--mscale", "--mscale-all-dim", "--no-yarn-correction-range-round-to-int")


def _add_mla_rope(s: ArgSection, model: ModelSpec) -> None:
    """MLA builds its own rotary embedding: plain RoPE or YaRN (`--rope-type`); stated, never left to defaults."""
    scaling = model.rope_scaling
    if scaling is None:
        s.add("--rope-type", "rope")
        return
    if not isinstance(scaling, YarnRopeScaling):
        raise MegapilotError(
            f"multi-latent attention in Megatron-Core scales RoPE with YaRN only, not {scaling.type}",
            field="model.rope_scaling.type", fix="use a YaRN rope_scaling, or none",
        )
    _require_megatron_values(scaling, _MEGATRON_YARN_DEFAULTS, "YaRN under MLA")
    if not scaling.truncate:
        raise _refuse_unrounded_mla_yarn(model)
    s.add("--rope-type", "yarn")
    s.add_terms(model, "--rotary-scaling-factor", "--mscale", "--mscale-all-dim")


def _refuse_unrounded_mla_yarn(model: ModelSpec) -> MegapilotError:
    """YaRN without rounding its correction range has no flag under MLA in any release: multi-latent attention
    builds its YarnRotaryEmbedding without correction_range_round_to_int (default true, rounding) in core_v0.16.0
    through core_v0.19.0. core_v0.19.0's --no-yarn-correction-range-round-to-int sets
    yarn_correction_range_round_to_int, which only GPTModel's standard-attention YaRN (--position-embedding-type
    yarn) reads, and argument_utils fills those yarn_* fields only without --multi-latent-attention: written under
    MLA, it would train the rounded model while the script claims otherwise."""
    return MegapilotError(
        f"{model.name} uses YaRN under multi-latent attention without rounding its correction range "
        "(rope_scaling.truncate false, the config.json's rope_scaling.truncate); Megatron-Core's MLA always rounds "
        "it: no release up to core_v0.19.0 passes the switch to MLA (core_v0.19.0's "
        "--no-yarn-correction-range-round-to-int reaches standard attention's YaRN only)",
        field="model.rope_scaling.truncate",
        fix="set rope_scaling.truncate true (in the config.json, or a ModelSpec YAML) to train with the rounded "
            "range Megatron builds, or plan and estimate the model without a script")


def _require_megatron_values(scaling: Llama3RopeScaling | YarnRopeScaling, fixed: dict[str, float],
                             what: str) -> None:
    """Refuse a scaling parameter that Megatron fixes to another value (it has no flag to change it)."""
    for name, megatron_value in fixed.items():
        value = getattr(scaling, name)
        if value != megatron_value:
            raise MegapilotError(
                f"{what} in Megatron-LM core_v0.16.0 pretrain_gpt.py uses {name}={_shown(megatron_value)} "
                f"and no flag reaches the model to change it; this model has {_shown(value)}",
                field=f"model.rope_scaling.{name}",
                fix="launch through Megatron-Bridge (its model providers set it), or use a model with "
                    f"{name}={_shown(megatron_value)}",
            )


def _shown(value: float) -> str:
    """A scaling parameter as a config writes it: true/false for a switch, else the number."""
    return str(value).lower() if isinstance(value, bool) else f"{value:g}"


# ---- MLA and MoE -----------------------------------------------------------------------------------
def _add_mla(s: ArgSection, model: ModelSpec) -> None:
    mla = model.mla
    assert mla is not None
    s.add("--multi-latent-attention")  # the object's presence (the row's `own_rule`); its fields by their rows
    s.add_terms(model, "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")


#: DeepSeek Sparse Attention's indexer loss weight: Megatron-Core has no default (None fails at the first step), so
#: it is written out; 0.01 with the sparse (top-k) KL loss is what Megatron-LM's DSA functional test and
#: Megatron-Bridge's DSA training recipes use.
DSA_INDEXER_LOSS_COEFF = 0.01
#: The fused DSA kernels the public recipes choose (--dsa-kernel-backend, core_v0.19.0 on; Megatron-Bridge's DSA
#: recipes set cudnn); earlier releases have only the unfused PyTorch path.
DSA_KERNEL_BACKEND = "cudnn"
#: The indexer key LayerNorm's epsilon in DeepSeek's and GLM's modeling code (transformers' DeepseekV32Indexer and
#: GlmMoeDsaIndexer: nn.LayerNorm(head_dim, eps=1e-6)).
DSA_INDEXER_K_NORM_EPSILON = 1e-6


def _add_dsa(s: ArgSection, model: ModelSpec, *, cpu: bool) -> None:
    """DeepSeek Sparse Attention over MLA (core_v0.16.0's experimental attention variant)."""
    dsa = model.dsa
    assert dsa is not None
    if cpu:
        raise _gpu_only(model, "attends through DeepSeek Sparse Attention, which Megatron-Core builds only with "
                        "Transformer Engine", "model.mla.dsa", "DeepSeek-V2-Lite (dense MLA)")
    s.add("--experimental-attention-variant", "dsa")
    s.add("--dsa-indexer-n-heads", dsa.indexer_heads)
    s.add("--dsa-indexer-head-dim", dsa.indexer_head_dim)
    s.add("--dsa-indexer-topk", dsa.topk)
    s.add("--dsa-indexer-loss-coeff", DSA_INDEXER_LOSS_COEFF)
    s.add("--dsa-indexer-use-sparse-loss")
    s.add("--no-rope-fusion")  # TransformerConfig asserts RoPE fusion is off under DSA
    # GLM-5's indexer (flags of core_v0.19.0 on: an older release's table refuses them, naming the release)
    if dsa.topk_freq > 1:
        s.add("--dsa-indexer-topk-freq", dsa.topk_freq)
        s.add("--dsa-indexer-skip-topk-offset", dsa.skip_topk_offset)
    s.add_terms(model, "--dsa-indexer-rope-interleaved", "--no-dsa-indexer-rotate-activation")
    if model.norm_epsilon != DSA_INDEXER_K_NORM_EPSILON:  # Megatron's key norm takes the model's epsilon otherwise
        s.add("--dsa-indexer-k-norm-epsilon", DSA_INDEXER_K_NORM_EPSILON)


def dsa_kernel_args(model: ModelSpec, release_flags: Collection[str]) -> list[str]:
    """`--dsa-kernel-backend` for a DSA model where the release has it; [] otherwise (unfused, or no DSA)."""
    if model.dsa is None or "--dsa-kernel-backend" not in release_flags:
        return []
    return ["--dsa-kernel-backend", DSA_KERNEL_BACKEND]


def _add_moe(s: ArgSection, model: ModelSpec, *, cpu: bool = False) -> None:
    moe = model.moe
    assert moe is not None
    s.add_terms(model, "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-latent-size")
    if moe.shared_expert_ffn_hidden_size:
        s.add_terms(model, "--moe-shared-expert-intermediate-size", "--moe-shared-expert-gate")
    s.add("--moe-layer-freq", moe_layer_pattern(model))  # two fields in one value (the row's `own_rule`)
    _add_router(s, model)
    if moe.capacity_factor is not None:
        s.add("--moe-expert-capacity-factor", moe.capacity_factor)
        if moe.pad_to_capacity:
            s.add("--moe-pad-expert-input-to-capacity")
    # alltoall moves only the routed tokens; allgather (the default) replicates every token to every EP rank.
    # Megatron-Core's alltoall dispatcher needs CUDA streams, so a CPU run keeps allgather.
    s.add("--moe-token-dispatcher-type", "allgather" if cpu else "alltoall")


def _add_router(s: ArgSection, model: ModelSpec) -> None:
    """How tokens pick experts and how the picked experts' outputs are weighted (the model's meaning)."""
    moe = model.moe
    assert moe is not None
    s.add_terms(model, "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-router-topk-scaling-factor")
    if moe.router_num_groups is not None:
        s.add_terms(model, "--moe-router-num-groups", "--moe-router-group-topk")
    s.add_terms(model, "--moe-router-dtype", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
                "--moe-router-enable-expert-bias")


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
