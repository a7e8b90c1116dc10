"""The Megatron-LM flag vocabulary: which spec field each `pretrain_gpt.py` flag carries, its type, Megatron's own
default, the releases that have it and what it means. One row per flag, stated once.

Its readers:
- `launch` renders the spec into these flags: the training section straight from the rows, the model and
  parallelism sections every flag whose row says how it carries its field (`ArgSection.add_terms`): as it is, or
  by the row's `Derivation` (an inverted switch, a switch for one value of its field, a value written in
  Megatron's own form);
- `diagnose.flags` reads a script's flags back into specs by the same rows (`Term.read`), taking Megatron's default
  for a flag a script leaves out from here (what the run then trained with);
- `diagnose.mismatch` compares a log's arguments block (keyed by `Term.dest`) with the script's specs by field;
- `trainer.args` accepts these flags with these types, defaults and meanings;
- `launch.versions` writes out the defaults a release changed under the renderers (`pinned_from`);
- `launch.megatron_args` holds the per-release parser tables; tests/test_vocabulary.py checks every row's
  `since`/`until`, kind and destination against them, and its field path against the specs, so the vocabulary
  cannot drift from the releases or the specs it names.

A default is Megatron-LM's argparse default (None: the flag has none, the run needs it or derives it; a pinned row
keeps the value it had before `pinned_from`). Where a reader assumes something else for a missing flag (a guessed
learning rate), that assumption is its own and says so.
Kept free of imports beyond the standard library: the torch-free trainer flag table reads it without loading the
specs (or pydantic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["int", "float", "str", "bool"]
Default = int | float | str | bool | None


@dataclass(frozen=True)
class Derivation:
    """How a flag says its field where it does not carry it as it is: both ways, so that what a script writes is
    what reading the script back gives."""

    how: str  # in words, for a reader of the table
    to_flag: Callable[..., Any]  # the field's value (then `context`'s) -> the flag's (a switch: whether it is
    # written; None: left out)
    from_flag: Callable[..., Any]  # the flag as a script has it (a switch: whether it is there; else its text or
    # None), then `context`'s values -> the field's value (None: this flag does not say it)
    examples: tuple[Any, ...]  # field values that go to the flag and back unchanged (tests/test_vocabulary.py)
    # fields beside the row's, in the same spec, that the derivation also reads, and their values for the examples
    context: tuple[str, ...] = ()
    example_context: tuple[Any, ...] = ()


# A store_false switch: its field is true unless the switch is written.
INVERTED = Derivation("written when the field is false", lambda value: not value, lambda present: not present,
                      (True, False))


def one_of(value: str) -> Derivation:
    """A switch that says one value of its field (`--swiglu`: mlp_activation 'swiglu'); the field's other values
    are said by other flags or Megatron's default."""
    return Derivation(f"written when the field is {value!r}", lambda field: field == value,
                      lambda present: value if present else None, (value,))


def _window_flag(window: int | None) -> str | None:
    return None if window is None else f"{window - 1},0"  # (left, right) keys, both ends included: W-1 to the left


def _window_field(text: str | None) -> int | None:
    left, _, _right = (text or "").partition(",")
    return int(left) + 1 if left.strip().isdigit() else None


# `--window-size LEFT,RIGHT` of a causal model: the last LEFT+1 tokens, the query's own included.
CAUSAL_WINDOW = Derivation("the window of W tokens as Megatron's (left, right) = (W-1, 0)", _window_flag,
                           _window_field, (4096, 128, None))


def _kv_channels_flag(kv_channels: int | None, hidden_size: int, num_attention_heads: int) -> int:
    return kv_channels or hidden_size // num_attention_heads


def _kv_channels_field(text: str | None, hidden_size: int, num_attention_heads: int) -> int | None:
    try:
        kv_channels = None if text is None else int(float(text))
    except ValueError:
        return None
    return None if kv_channels is None or kv_channels * num_attention_heads == hidden_size else kv_channels


def _expert_tp_flag(etp: int | None, tp: int) -> int:
    return etp or tp


def _expert_tp_field(text: str | None, tp: int) -> int | None:
    try:
        etp = None if text is None else int(float(text))
    except ValueError:
        return None
    return None if etp == tp else etp


# Written out where etp is unset (it follows TP); read back unset where it is TP.
EXPERT_TP = Derivation("TP where the field is unset; unset where it is TP", _expert_tp_flag, _expert_tp_field,
                       (None, 1, 4), context=("tp",), example_context=(2,))


# Written out where kv_channels is unset (hidden / heads, Megatron's own default); read back unset when it is that.
HEAD_DIM = Derivation("hidden / heads where the field is unset; unset where it is hidden / heads", _kv_channels_flag,
                      _kv_channels_field, (None, 96), context=("hidden_size", "num_attention_heads"),
                      example_context=(4096, 32))


@dataclass(frozen=True)
class Term:
    """One Megatron-LM flag and what it means to megapilot."""

    flag: str  # --moe-router-topk
    field: str | None  # the spec field it carries, as a path from a SavedPlan: model.moe.router_topk; None: no field
    kind: Kind  # bool: a store_true switch (its default is False)
    default: Default  # Megatron-LM's own default
    meaning: str
    since: str | None = None  # first release with the flag; None: in every release megapilot has a table for
    until: str | None = None  # last release with it; None: still in the newest
    argument: str | None = None  # Megatron's destination where it is not the flag's name (store_false switches)
    # A release from which Megatron's own default no longer holds what the renderers rely on, and why: from it on,
    # the default above is written out (launch.versions).
    pinned_from: str | None = None
    pinned_why: str = ""
    derived: Derivation | None = None  # how the flag says its field where it does not carry it as it is
    # Why launch/ writes the flag by a rule of its own rather than from this row: its value is not one field's both
    # ways (field -> flag -> field would lose what the field was), so no `Derivation` can say it. Empty: the row's.
    own_rule: str = ""

    @property
    def dest(self) -> str:
        """The argument's name in Megatron's parsed arguments (and its log's arguments block)."""
        return self.argument or self.flag.removeprefix("--").replace("-", "_")

    @property
    def context_paths(self) -> tuple[str, ...]:
        """The paths of the fields beside this row's that its derivation reads (`model.hidden_size`)."""
        parent = (self.field or "").rpartition(".")[0]
        return tuple(f"{parent}.{name}" for name in (self.derived.context if self.derived else ()))

    def rendered(self, value: object, *context: object) -> object:
        """The flag's value for its field's `value` (and the `context_paths` values): a switch, whether it is
        written; else the value (None: the flag is left out)."""
        return self.derived.to_flag(value, *context) if self.derived is not None else value

    def read(self, given: object, *context: object) -> object:
        """The field's value from the flag as a script has it: a switch, whether it is there; else its text (None:
        absent, read as None: the reader applies `default` where the run fell back to it)."""
        if self.derived is not None:
            return self.derived.from_flag(given, *context)
        if self.kind == "bool" or given is None:
            return given
        return {"int": int, "float": float, "str": str}[self.kind](given)


def _int(flag: str, field: str | None, default: int | None, meaning: str, **extra: Any) -> Term:
    return Term(flag, field, "int", default, meaning, **extra)


def _float(flag: str, field: str | None, default: float | None, meaning: str, **extra: Any) -> Term:
    return Term(flag, field, "float", default, meaning, **extra)


def _str(flag: str, field: str | None, default: str | None, meaning: str, **extra: Any) -> Term:
    return Term(flag, field, "str", default, meaning, **extra)


def _switch(flag: str, field: str | None, meaning: str, **extra: Any) -> Term:
    return Term(flag, field, "bool", False, meaning, **extra)


TERMS: tuple[Term, ...] = (
    # --- model shape
    _int("--num-layers", "model.num_layers", None, "number of transformer layers"),
    _int("--hidden-size", "model.hidden_size", None, "transformer hidden size"),
    _int("--ffn-hidden-size", "model.ffn_hidden_size", None, "MLP hidden size (default 4 x hidden size)"),
    _int("--num-attention-heads", "model.num_attention_heads", None, "number of attention heads"),
    _int("--kv-channels", "model.kv_channels", None, "projection size per head (default hidden / heads)",
         derived=HEAD_DIM),
    _switch("--group-query-attention", None, "use grouped-query attention (with --num-query-groups)"),
    _int("--num-query-groups", "model.num_query_groups", 1, "number of key/value groups with --group-query-attention"),
    _switch("--swiglu", "model.mlp_activation", "use the gated SwiGLU MLP", derived=one_of("swiglu")),
    _switch("--squared-relu", "model.mlp_activation", "squared-ReLU MLP activation (Nemotron)",
            derived=one_of("squared_relu")),
    _switch("--quick-geglu", "model.mlp_activation", "gated quick-GELU MLP activation (gpt-oss)",
            since="core_v0.15.0", derived=one_of("quick_geglu")),
    _float("--glu-linear-offset", "model.glu_linear_offset", 0.0, "offset added to the GLU's linear half (gpt-oss: 1)",
           since="core_v0.15.0"),
    _float("--activation-func-clamp-value", "model.activation_clamp", None,
           "clamp of the gated activation's inputs (gpt-oss: 7)", since="core_v0.15.0"),
    _str("--normalization", "model.normalization", "LayerNorm", "normalization layer"),
    _float("--norm-epsilon", "model.norm_epsilon", 1e-5, "epsilon of the normalization layers",
           argument="layernorm_epsilon"),
    _switch("--apply-layernorm-1p", "model.norm_zero_centered", "zero-centred norm weights (applied as 1 + weight)",
            argument="layernorm_zero_centered_gamma"),
    _str("--position-embedding-type", "model.position_embedding", "learned_absolute", "position embedding",
         own_rule="yarn where the model scales RoPE with YaRN under standard attention (core_v0.19.0 on): the "
         "field says rope and the YaRN object says yarn"),
    _int("--rotary-base", "model.rotary_base", 10000, "RoPE base"),
    _float("--rotary-percent", "model.rotary_percent", 1.0, "fraction of each head rotated by RoPE"),
    _int("--max-position-embeddings", "model.max_position_embeddings", None,
         "maximum sequence length of the position embedding",
         own_rule="raised to the run's sequence where it is longer than the model's context "
         "(launch.flags.positions_raised_to): the flag then says the training's length, not this field"),
    _int("--make-vocab-size-divisible-by", "model.make_vocab_size_divisible_by", 128,
         "pad the vocabulary to a multiple of this (times TP)"),
    _switch("--disable-bias-linear", "model.add_bias_linear", "no bias in linear layers", argument="add_bias_linear",
            derived=INVERTED),
    _switch("--untie-embeddings-and-output-weights", "model.tie_embeddings",
            "separate input embedding and output layer", derived=INVERTED),
    _switch("--qk-layernorm", "model.qk_layernorm", "normalize queries and keys (under MLA: the q/kv latents)",
            own_rule="under MLA it says model.mla.latent_layernorms instead: one switch for two fields, which one "
            "chosen by a third (model.mla)"),
    _switch("--qk-l2-norm", "model.qk_l2_norm", "weightless L2 norm of per-head queries and keys (Llama 4), on "
            "every layer"),
    _switch("--add-qkv-bias", "model.add_qkv_bias", "bias on the QKV projection only"),
    _switch("--attention-output-gate", "model.attention_output_gate", "sigmoid gate on the attention output",
            since="core_v0.16.0"),
    _str("--window-size", "model.sliding_window", None,
         "sliding-window attention: 'left,right' keys around each query", since="core_v0.15.0",
         derived=CAUSAL_WINDOW),
    _int("--window-attn-skip-freq", "model.sliding_window_skip_freq", None,
         "every N-th layer attends in full, the others through the window", since="core_v0.15.0"),
    _str("--softmax-type", "model.softmax_type", "vanilla",
         "attention softmax: vanilla, off-by-one or with a learnable sink logit per head", since="core_v0.15.0"),
    _float("--attention-dropout", None, 0.1, "dropout on attention probabilities"),
    _float("--hidden-dropout", None, 0.1, "dropout on hidden states"),
    # --- RoPE scaling
    _switch("--use-rope-scaling", "model.rope_scaling", "Llama 3.x frequency-dependent RoPE scaling",
            own_rule="says only that the field's object is Llama 3's scaling: the object is built from the rows "
            "of its own fields (--rope-scaling-factor)"),
    _float("--rope-scaling-factor", "model.rope_scaling.factor", 8.0, "factor of the Llama 3.x RoPE scaling"),
    _str("--rope-type", None, None, "RoPE of multi-latent attention (default yarn, as Megatron)"),
    _float("--rotary-scaling-factor", "model.rope_scaling.factor", 1.0, "YaRN context-extension factor"),
    _float("--mscale", "model.rope_scaling.mscale", 1.0, "YaRN mscale"),
    _float("--mscale-all-dim", "model.rope_scaling.mscale_all_dim", 0.0, "YaRN mscale over all dims"),
    # (standard attention's YaRN, --position-embedding-type yarn; MLA's takes its own constants)
    # (their argparse defaults are None: argument_utils fills the values below, YarnRotaryEmbedding's own)
    _int("--yarn-original-max-position-embeddings", "model.rope_scaling.original_max_position_embeddings", 4096,
         "YaRN's original context (standard attention)", since="core_v0.19.0"),
    _float("--yarn-beta-fast", "model.rope_scaling.beta_fast", 32.0, "YaRN beta fast (standard attention)",
           since="core_v0.19.0"),
    _float("--yarn-beta-slow", "model.rope_scaling.beta_slow", 1.0, "YaRN beta slow (standard attention)",
           since="core_v0.19.0"),
    _switch("--no-yarn-correction-range-round-to-int", "model.rope_scaling.truncate",
            "YaRN's correction range not rounded to whole dimensions (standard attention)", since="core_v0.19.0",
            argument="yarn_correction_range_round_to_int", derived=INVERTED),
    # --- multi-latent attention and multi-token prediction
    _switch("--multi-latent-attention", "model.mla", "DeepSeek multi-latent attention",
            own_rule="says only that the field's object is there: the object is built from the rows of its own "
            "fields (--kv-lora-rank, ...)"),
    _int("--q-lora-rank", "model.mla.q_lora_rank", None, "rank of the compressed query (none: full-rank query)"),
    _int("--kv-lora-rank", "model.mla.kv_lora_rank", 32, "rank of the compressed keys and values"),
    _int("--qk-head-dim", "model.mla.qk_head_dim", 128, "per-head query/key dim without RoPE"),
    _int("--qk-pos-emb-head-dim", "model.mla.qk_pos_emb_head_dim", 64, "per-head query/key dim with RoPE"),
    _int("--v-head-dim", "model.mla.v_head_dim", 128, "per-head value dim"),
    _switch("--dsa-indexer-rope-interleaved", "model.mla.dsa.rope_interleaved",
            "interleaved RoPE in the sparse-attention indexer", since="core_v0.19.0"),
    _switch("--no-dsa-indexer-rotate-activation", "model.mla.dsa.rotate_activation",
            "no Hadamard rotation of the sparse-attention indexer's queries and keys", since="core_v0.19.0",
            argument="dsa_indexer_rotate_activation", derived=INVERTED),
    _int("--mtp-num-layers", "model.mtp_num_layers", None, "multi-token-prediction depth"),
    _float("--mtp-loss-scaling-factor", "model.mtp_loss_scaling_factor", 0.1, "weight of the MTP loss"),
    _switch("--mtp-use-repeated-layer", "model.mtp_repeated_layer", "every MTP depth reuses one module's weights",
            since="core_v0.17.0"),
    _str("--mtp-hybrid-override-pattern", "model.mtp_hybrid_pattern", None, "a hybrid's MTP layer pattern",
         since="core_v0.17.0"),
    # --- hybrid (Mamba) layer pattern
    _str("--hybrid-override-pattern", "model.hybrid_override_pattern", None,
         "a hybrid's layers: M Mamba, * attention, - MLP, E MoE (deprecated from core_v0.17.0, forwarded as it is)",
         own_rule="written where the hybrid's split is even; an uneven or interleaved one moves the pattern, cut into "
         "its stages, to --hybrid-layer-pattern (launch.hybrid_split)"),
    _str("--hybrid-layer-pattern", "model.hybrid_override_pattern", None,
         "a hybrid's layers, '|' between pipeline stages (PP x VPP of them), '/' before each MTP depth",
         since="core_v0.17.0",
         own_rule="cut by '|' into the pipeline stages of an uneven or interleaved split (launch.hybrid_split): the "
         "value then says parallel fields beside its own"),
    # --- mixture of experts
    _int("--num-experts", "model.moe.num_experts", None, "number of experts (MoE)"),
    _int("--moe-router-topk", "model.moe.router_topk", 2, "experts per token"),
    _int("--moe-ffn-hidden-size", "model.moe.moe_ffn_hidden_size", None, "hidden size of each expert"),
    _str("--moe-router-load-balancing-type", "model.moe.load_balancing_type", "aux_loss", "load-balancing loss"),
    _float("--moe-aux-loss-coeff", "model.moe.aux_loss_coeff", 0.0, "weight of the auxiliary load-balancing loss"),
    _str("--moe-token-dispatcher-type", None, "allgather", "token dispatcher"),
    _int("--moe-shared-expert-intermediate-size", "model.moe.shared_expert_ffn_hidden_size", None,
         "hidden size of the shared expert"),
    _str("--moe-layer-freq", "model.moe.moe_layer_freq", "1",
         "every n-th layer is MoE, or a list expression such as ([0]*1+[1]*3)",
         own_rule="one value from two fields, moe_layer_freq and first_k_dense_layers (a pattern over the layers, "
         "launch.model_flags.moe_layer_pattern), read back into both (diagnose.flags.moe_layer_placement)"),
    _str("--moe-router-dtype", "model.moe.router_dtype", None, "router precision"),
    _switch("--moe-shared-expert-gate", "model.moe.shared_expert_gate", "sigmoid gate on the shared expert's output",
            since="core_v0.16.0"),
    _str("--moe-router-score-function", "model.moe.router_score_function", "softmax", "router score function"),
    _switch("--moe-router-pre-softmax", "model.moe.router_pre_softmax", "softmax over all experts before the top-k"),
    _float("--moe-router-topk-scaling-factor", "model.moe.router_topk_scaling_factor", None,
           "multiplier on the routing weights"),
    _int("--moe-router-num-groups", "model.moe.router_num_groups", None, "expert groups of group-limited routing"),
    _int("--moe-router-group-topk", "model.moe.router_group_topk", None, "groups each token may route to"),
    _switch("--moe-router-enable-expert-bias", "model.moe.router_expert_bias",
            "per-expert routing bias (aux-loss-free balancing)"),
    _float("--moe-router-bias-update-rate", None, 1e-3, "update rate of the expert bias"),
    _int("--moe-latent-size", "model.moe.latent_size", None, "latent width of the expert projections",
         since="core_v0.16.0"),
    _switch("--moe-router-padding-for-quantization", None,
            "pad each expert's routed tokens to the quantised GEMM's multiple", since="core_v0.16.0"),
    # --- parallelism
    _int("--tensor-model-parallel-size", "parallel.tp", 1, "tensor-parallel size (TP)"),
    _int("--pipeline-model-parallel-size", "parallel.pp", 1, "pipeline-parallel size (PP)"),
    _int("--num-layers-per-virtual-pipeline-stage", None, None, "layers per virtual stage (interleaved 1F1B)"),
    _int("--num-virtual-stages-per-pipeline-rank", "parallel.vpp", None,
         "virtual stages per pipeline rank (Megatron-LM's name)"),
    _int("--decoder-first-pipeline-num-layers", "parallel.first_stage_layers", None,
         "layers on the first pipeline stage (uneven split)"),
    _int("--decoder-last-pipeline-num-layers", "parallel.last_stage_layers", None,
         "layers on the last pipeline stage (uneven split)"),
    _switch("--account-for-embedding-in-pipeline-split", "parallel.account_for_embedding",
            "the embedding takes one layer slot of the pipeline split"),
    _switch("--account-for-loss-in-pipeline-split", "parallel.account_for_loss",
            "the loss takes one layer slot of the pipeline split"),
    _str("--pipeline-model-parallel-layout", "parallel.pipeline_layout", None,
         "explicit placement of layers on pipeline stages (E/t/m/L grammar)"),
    _int("--context-parallel-size", "parallel.cp", 1, "context-parallel size (CP)"),
    _str("--cp-comm-type", "parallel.cp_comm_type", "p2p",
         "how CP exchanges attention: p2p (ring), a2a (Ulysses), all_gather or a2a+p2p; one, or one per layer"),
    _int("--expert-model-parallel-size", "parallel.ep", 1, "expert-parallel size (EP)"),
    _int("--expert-tensor-parallel-size", "parallel.etp", None, "tensor-parallel size inside experts",
         derived=EXPERT_TP),
    _switch("--sequence-parallel", "parallel.sequence_parallel", "sequence parallelism (with TP > 1)"),
    _switch("--use-distributed-optimizer", "parallel.distributed_optimizer",
            "shard optimizer state over data-parallel ranks (ZeRO-1)",
            own_rule="also written with FSDP, whose sharded steps run inside the distributed optimizer: beside "
            "--use-megatron-fsdp the flag cannot say whether the field was off"),
    _switch("--use-megatron-fsdp", "parallel.fsdp", "Megatron-FSDP: shard weights, gradients and optimizer state"),
    _switch("--overlap-grad-reduce", None, "overlap the gradient reduce with the backward pass"),
    _switch("--overlap-param-gather", None, "overlap the parameter all-gather (distributed optimizer)"),
    _switch("--grad-reduce-in-bf16", "training.grad_reduce_in_bf16",
            "keep and reduce the gradients in bf16 (with --bf16 Megatron keeps them in fp32 otherwise)"),
    # --- activation recomputation and offloading
    _str("--recompute-granularity", "parallel.recompute", None, "recompute activations"),
    _str("--recompute-method", "parallel.recompute_method", None, "how layers are recomputed with full granularity"),
    _int("--recompute-num-layers", "parallel.recompute_num_layers", None,
         "layers recomputed per stage with full granularity",
         own_rule="written 1 where the field is unset under full recompute (Megatron has no default): unset and 1 "
         "write the same flag, and a plan's own 1 must read back as 1"),
    _switch("--recompute-activations", "parallel.recompute", "same as --recompute-granularity selective",
            derived=one_of("selective")),
    _int("--cpu-offloading-num-layers", "parallel.cpu_offloading_num_layers", 0,
         "activations of the first N layers move to host memory", since="core_v0.16.0"),
    # --- batch, schedule and optimizer
    _int("--micro-batch-size", "parallel.mbs", 1, "samples per micro-batch per data-parallel rank"),
    _int("--global-batch-size", "training.global_batch_size", None,
         "samples per iteration over all data-parallel ranks"),
    _int("--seq-length", "training.seq_length", None, "training sequence length in tokens"),
    _int("--train-iters", "training.train_iters", None, "number of training iterations"),
    _float("--lr", "training.lr", None, "peak learning rate"),
    _float("--min-lr", "training.min_lr", 0.0, "final learning rate"),
    _str("--lr-decay-style", "training.lr_decay_style", "linear", "learning-rate decay"),
    _int("--lr-warmup-iters", "training.lr_warmup_iters", 0, "linear warm-up iterations"),
    _float("--weight-decay", "training.weight_decay", 0.01, "weight decay"),
    _float("--clip-grad", "training.clip_grad", 1.0, "gradient clipping by global norm (0 disables)"),
    _str("--optimizer", "training.optimizer", "adam", "optimizer"),
    _float("--adam-beta1", "training.adam_beta1", 0.9, "Adam beta1"),
    _float("--adam-beta2", "training.adam_beta2", 0.999, "Adam beta2"),
    _float("--init-method-std", "training.init_method_std", 0.02, "standard deviation of the weight initialization"),
    _int("--seed", "training.seed", 1234, "random seed"),
    # core_v0.16.0 moved --eval-interval into TrainingConfig with default None (it was 1000), but
    # get_train_valid_test_num_samples still computes train_iters // eval_interval: a run by --train-iters without
    # the flag stops with a TypeError before its first step.
    _int("--eval-interval", None, 1000, "iterations between validation runs", pinned_from="core_v0.16.0",
         pinned_why="the default became None in core_v0.16.0 and training by iterations divides by it"),
)

_BY_FLAG = {term.flag: term for term in TERMS}


def term(flag: str) -> Term:
    """The row of one flag (KeyError for a flag the vocabulary does not hold: a programming error)."""
    return _BY_FLAG[flag]


def default(flag: str) -> Default:
    """Megatron-LM's default for `flag`: what a run whose script leaves the flag out trains with."""
    return _BY_FLAG[flag].default


def int_default(flag: str) -> int:
    """An integer flag's default (a flag without one is a programming error here)."""
    value = _BY_FLAG[flag].default
    assert isinstance(value, int) and not isinstance(value, bool), flag
    return value


def field_value(root: object, path: str) -> object:
    """The value of a spec field named by its path (`parallel.mbs`) on anything that holds the specs as
    attributes (a SavedPlan, a run read back from flags); None where a part on the way is None."""
    value: object = root
    for name in path.split("."):
        if value is None:
            return None
        value = getattr(value, name)
    return value


def float_default(flag: str) -> float:
    """A float flag's default (a flag without one is a programming error here)."""
    value = _BY_FLAG[flag].default
    assert isinstance(value, (int, float)) and not isinstance(value, bool), flag
    return float(value)
