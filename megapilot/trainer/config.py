"""`TrainerConfig`: the parsed flags as one typed object, checked before any process group starts.

Everything here is torch-free so the checks run (and are tested) in milliseconds.
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass, fields

from megapilot.data.tokenizer import ByteTokenizer, embedded_trainer_tokenizer
from megapilot.errors import MegapilotError
from megapilot.spec.validate import check_pipeline_split
from megapilot.trainer.args import parse_flags

#: Tokenizer names accepted with --mock-data only, where just a vocabulary size is needed.
VOCAB_ONLY_TOKENIZER_NAMES = ("NullTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer",
                              "TikTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer")


@dataclass(frozen=True)
class TrainerConfig:
    """Every setting the trainer uses, named as Megatron-LM's flags (dest form)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    kv_channels: int | None
    num_query_groups: int
    swiglu: bool
    squared_relu: bool
    normalization: str
    norm_epsilon: float
    position_embedding_type: str
    rotary_base: int
    rotary_percent: float
    seq_length: int
    max_position_embeddings: int
    add_bias_linear: bool
    untie_embeddings_and_output_weights: bool
    qk_layernorm: bool
    add_qkv_bias: bool
    window_size: tuple[int, int] | None
    use_rope_scaling: bool
    rope_scaling_factor: float
    rope_type: str | None
    rotary_scaling_factor: float
    mscale: float
    mscale_all_dim: float
    multi_latent_attention: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    mtp_num_layers: int | None
    mtp_loss_scaling_factor: float
    init_method_std: float
    attention_dropout: float
    hidden_dropout: float
    make_vocab_size_divisible_by: int
    apply_residual_connection_post_layernorm: bool
    num_experts: int | None
    moe_router_topk: int
    moe_ffn_hidden_size: int | None
    moe_router_load_balancing_type: str
    moe_aux_loss_coeff: float
    moe_token_dispatcher_type: str
    moe_shared_expert_intermediate_size: int | None
    moe_layer_freq: int | tuple[int, ...]
    moe_router_dtype: str | None
    moe_shared_expert_gate: bool
    moe_router_score_function: str
    moe_router_pre_softmax: bool
    moe_router_topk_scaling_factor: float | None
    moe_router_num_groups: int | None
    moe_router_group_topk: int | None
    moe_router_enable_expert_bias: bool
    moe_router_bias_update_rate: float
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    decoder_first_pipeline_num_layers: int | None
    decoder_last_pipeline_num_layers: int | None
    context_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int
    sequence_parallel: bool
    use_distributed_optimizer: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    distributed_backend: str | None
    distributed_timeout_minutes: int
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    bf16: bool
    fp16: bool
    loss_scale: float | None
    initial_loss_scale: float
    accumulate_allreduce_grads_in_fp32: bool  # as Megatron-LM's validate_args leaves it (`_fp32_gradients`)
    grad_reduce_in_bf16: bool
    micro_batch_size: int
    global_batch_size: int
    train_iters: int
    exit_interval: int | None
    optimizer: str
    lr: float
    min_lr: float
    lr_decay_style: str
    lr_decay_iters: int
    lr_warmup_iters: int
    lr_warmup_init: float
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    seed: int
    data_path: str | None
    mock_data: bool
    split: str
    data_cache_path: str | None
    tokenizer_type: str
    vocab_size: int | None
    reset_position_ids: bool
    reset_attention_mask: bool
    eod_mask_loss: bool
    log_interval: int
    log_throughput: bool
    timing_log_level: int
    eval_interval: int
    eval_iters: int
    save: str | None
    load: str | None
    save_interval: int | None
    ckpt_step: int | None
    ckpt_format: str
    no_load_optim: bool
    no_load_rng: bool
    no_save_optim: bool
    finetune: bool

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    def parallel_sizes(self) -> dict[str, int | None]:
        """The six parallel sizes under the keyword names that Megatron-Core's `TransformerConfig` and
        `parallel_state.initialize_model_parallel` both take, so the two are always given the same layout."""
        return {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": self.virtual_pipeline_model_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
        }

    def printed_arguments(self, world_size: int) -> dict[str, object]:
        """The values Megatron-LM's start-up `arguments` block shows: every flag, plus the sizes it derives
        (`world_size`, `data_parallel_size`) and `rank` (the block is printed by rank 0)."""
        values: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(world_size=world_size, data_parallel_size=self.data_parallel_size(world_size), rank=0)
        return values

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // self.model_parallel_size

    def num_microbatches(self, world_size: int) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel_size(world_size))

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether the 0-based layer holds experts (Megatron's --moe-layer-freq: every n-th, or a 0/1 list)."""
        if not self.is_moe:
            return False
        if isinstance(self.moe_layer_freq, int):
            return layer_index % self.moe_layer_freq == 0
        return bool(self.moe_layer_freq[layer_index])

    def check_world_size(self, world_size: int) -> None:
        """Raise if the layout does not tile `world_size` processes or the batch does not split evenly."""
        if world_size % self.model_parallel_size:
            raise MegapilotError(
                f"world size {world_size} is not divisible by TP×PP×CP = {self.tensor_model_parallel_size}×"
                f"{self.pipeline_model_parallel_size}×{self.context_parallel_size}", field="--nproc-per-node",
                fix="start a multiple of TP×PP×CP processes")
        dp = self.data_parallel_size(world_size)
        if self.global_batch_size % (self.micro_batch_size * dp):
            raise MegapilotError(
                f"global batch {self.global_batch_size} is not divisible by micro batch × DP = "
                f"{self.micro_batch_size}×{dp}", field="--global-batch-size",
                fix=f"use a multiple of {self.micro_batch_size * dp}")
        expert_group = self.expert_model_parallel_size * self.expert_tensor_parallel_size
        if self.is_moe and world_size % (expert_group * self.pipeline_model_parallel_size):
            raise MegapilotError(f"world size {world_size} is not divisible by EP×ETP×PP",
                                 field="--expert-model-parallel-size",
                                 fix="choose EP so that EP×ETP×PP divides the world size")


def _require(ns: argparse.Namespace, dest: str) -> None:
    if getattr(ns, dest) is None:
        flag = "--" + dest.replace("_", "-")
        raise MegapilotError("is required", field=flag, fix=f"pass {flag} N")


def _check_positive(ns: argparse.Namespace, *dests: str) -> None:
    for dest in dests:
        value = getattr(ns, dest)
        if value is not None and value <= 0:
            flag = "--" + dest.replace("_", "-")
            raise MegapilotError(f"must be positive, got {value}", field=flag, fix=f"pass {flag} with a value > 0")


def _resolve_virtual_pipeline(ns: argparse.Namespace) -> int | None:
    pp = ns.pipeline_model_parallel_size
    uneven = ns.decoder_first_pipeline_num_layers is not None or ns.decoder_last_pipeline_num_layers is not None
    stages_per_rank: int | None = (ns.num_virtual_stages_per_pipeline_rank  # argparse: type=int, default None
                                   or ns.virtual_pipeline_model_parallel_size)
    if ns.num_layers_per_virtual_pipeline_stage is None:
        return stages_per_rank
    if uneven:  # Megatron-LM's validate_args refuses the same combination
        raise MegapilotError("cannot be combined with an uneven pipeline split",
                             field="--num-layers-per-virtual-pipeline-stage",
                             fix="give the virtual stages per rank with --num-virtual-stages-per-pipeline-rank")
    layers_per_stage: int = ns.num_layers // pp  # argparse: type=int
    if ns.num_layers % pp or layers_per_stage % ns.num_layers_per_virtual_pipeline_stage:
        raise MegapilotError(
            f"{ns.num_layers} layers over PP={pp} do not split into virtual stages of "
            f"{ns.num_layers_per_virtual_pipeline_stage} layers", field="--num-layers-per-virtual-pipeline-stage",
            fix="choose a divisor of num_layers / PP")
    if pp == 1:
        raise MegapilotError("needs pipeline parallelism", field="--num-layers-per-virtual-pipeline-stage",
                             fix="set --pipeline-model-parallel-size ≥ 2 or drop the flag")
    virtual_stage_layers: int = ns.num_layers_per_virtual_pipeline_stage  # argparse: type=int
    return layers_per_stage // virtual_stage_layers


def _check_pipeline_split(ns: argparse.Namespace, virtual_stages: int | None) -> int | None:
    """Refuse a layer split Megatron-Core's TransformerConfig would refuse, naming the flag; pass VPP on."""
    flag_of = {"first_stage_layers": "--decoder-first-pipeline-num-layers",
               "last_stage_layers": "--decoder-last-pipeline-num-layers", "pp": "--pipeline-model-parallel-size",
               "vpp": "--num-layers-per-virtual-pipeline-stage"}
    try:
        check_pipeline_split(ns.num_layers, ns.pipeline_model_parallel_size, virtual_stages or 1,
                             ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers)
    except MegapilotError as error:
        field = flag_of.get(error.field or "", error.field)
        raise MegapilotError(error.problem, field=field, fix=error.fix) from None
    return virtual_stages


def _eval_layer_list(node: ast.expr) -> list[int]:
    """The list expressions Megatron's moe_freq_type evaluates, without eval: [0,1], +, and * by an int."""
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and type(e.value) is int for e in node.elts):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, int)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _eval_layer_list(node.left) + _eval_layer_list(node.right)
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant)
            and type(node.right.value) is int):
        return _eval_layer_list(node.left) * node.right.value
    raise ValueError("not a list expression")


def _moe_layer_freq(ns: argparse.Namespace) -> int | tuple[int, ...]:
    """--moe-layer-freq: an int (every n-th layer) or a 0/1 list with one entry per layer."""
    text = str(ns.moe_layer_freq).strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        pattern = _eval_layer_list(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        raise MegapilotError(f"{text!r} is neither a positive integer nor a list expression such as "
                             "([0]*1+[1]*3)", field="--moe-layer-freq", fix="pass N or a 0/1 list per layer") from None
    if len(pattern) != ns.num_layers or set(pattern) - {0, 1}:
        raise MegapilotError(f"the pattern has {len(pattern)} entries of 0/1 for {ns.num_layers} layers",
                             field="--moe-layer-freq", fix="give one 0 (dense) or 1 (MoE) per layer")
    return tuple(pattern)


def _window_size(ns: argparse.Namespace) -> tuple[int, int] | None:
    """--window-size 'left,right' (Megatron's tuple_type; parentheses allowed)."""
    if ns.window_size is None:
        return None
    parts = ns.window_size.strip("()").split(",")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise MegapilotError(f"{ns.window_size!r} is not 'left,right'", field="--window-size",
                             fix="pass e.g. --window-size 4095,0 for a window of the last 4096 tokens")
    left, right = (int(p) for p in parts)
    return left, right


def _check_router(ns: argparse.Namespace) -> None:
    """The routing rules TransformerConfig asserts, refused here by flag before any process starts."""
    if not ns.num_experts:
        return
    if ns.moe_router_enable_expert_bias and ns.moe_router_score_function != "sigmoid":
        raise MegapilotError("aux-loss-free expert bias needs the sigmoid score function",
                             field="--moe-router-enable-expert-bias", fix="add --moe-router-score-function sigmoid")
    if (ns.moe_router_num_groups is None) != (ns.moe_router_group_topk is None):
        raise MegapilotError("group-limited routing needs both the group count and the groups per token",
                             field="--moe-router-group-topk",
                             fix="pass --moe-router-num-groups and --moe-router-group-topk")
    if ns.moe_router_num_groups and ns.num_experts % ns.moe_router_num_groups:
        raise MegapilotError(f"{ns.moe_router_num_groups} groups do not divide {ns.num_experts} experts",
                             field="--moe-router-num-groups", fix="choose a divisor of --num-experts")


def _check_attention(ns: argparse.Namespace) -> None:
    if ns.multi_latent_attention:
        return
    if ns.rope_type == "yarn":  # Megatron-LM's core_transformer_config_from_args asserts the same
        raise MegapilotError("standard attention supports rope_type 'rope' only (YaRN is built for MLA)",
                             field="--rope-type", fix="drop --rope-type, or add --multi-latent-attention")
    if ns.kv_channels is None and ns.hidden_size % ns.num_attention_heads:
        raise MegapilotError(f"hidden size {ns.hidden_size} is not divisible by {ns.num_attention_heads} heads",
                             field="--num-attention-heads", fix="choose a divisor of --hidden-size")


def _resolve_tokenizer(ns: argparse.Namespace) -> str:
    name = embedded_trainer_tokenizer(ns.tokenizer_type, ns.mock_data)
    if name == ByteTokenizer.name:
        return name
    if name in VOCAB_ONLY_TOKENIZER_NAMES and ns.mock_data:
        return name
    if name == "NullTokenizer":  # pre-tokenized ids in --data-path, as in Megatron-LM
        if ns.vocab_size is None:
            raise MegapilotError("NullTokenizer needs the vocabulary size", field="--vocab-size",
                                 fix="pass --vocab-size V (the ids in --data-path are below V)")
        return name
    raise MegapilotError(f"tokenizer {name!r} is not available in megapilot's trainer", field="--tokenizer-type",
                         fix="use --tokenizer-type ByteTokenizer with data from `megapilot data prepare`, "
                             "or --mock-data")


def _resolve_recompute(ns: argparse.Namespace) -> str | None:
    if ns.recompute_activations:
        return "selective"
    granularity: str | None = ns.recompute_granularity  # argparse: choices full/selective, default None
    if granularity == "full" and ns.recompute_method is None:
        raise MegapilotError("full recompute needs a method", field="--recompute-method",
                             fix="add --recompute-method uniform --recompute-num-layers 1")
    return granularity


def _check_cpu_limits(ns: argparse.Namespace, gpu_available: bool) -> None:
    if gpu_available:
        return
    if ns.context_parallel_size > 1:
        raise MegapilotError(
            "needs a GPU: Megatron-Core's context parallelism runs only in Transformer Engine's attention "
            "(the local attention used on CPU asserts CP = 1)", field="--context-parallel-size",
            fix="set --context-parallel-size 1 for a CPU run")
    if ns.sequence_parallel and ns.tensor_model_parallel_size > 1:
        raise MegapilotError("needs a GPU: megatron-core's torch LayerNorm/RMSNorm (used without Transformer Engine "
                             "or Apex) refuses sequence parallelism", field="--sequence-parallel",
                             fix="drop --sequence-parallel for a CPU run")
    if ns.num_experts and ns.moe_token_dispatcher_type == "alltoall":
        raise MegapilotError("needs a GPU: megatron-core's all-to-all token dispatcher uses CUDA streams",
                             field="--moe-token-dispatcher-type",
                             fix="use --moe-token-dispatcher-type allgather on CPU")
    if ns.distributed_backend == "nccl":
        raise MegapilotError("needs a GPU: NCCL has no CPU transport", field="--distributed-backend",
                             fix="use --distributed-backend gloo (the default on CPU)")


def build_config(argv: list[str], *, gpu_available: bool = False) -> TrainerConfig:
    """Parse and check the flags; the one place where flag combinations are judged."""
    ns = parse_flags(argv, gpu_available=gpu_available)
    for dest in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "train_iters", "lr"):
        _require(ns, dest)
    _check_positive(ns, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "train_iters",
                    "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
                    "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                    "log_interval", "save_interval")
    if ns.mock_data == bool(ns.data_path):
        raise MegapilotError("pass exactly one data source", field="--data-path",
                             fix="pass --data-path PREFIX (from `megapilot data prepare`) or --mock-data")
    _check_attention(ns)
    _check_router(ns)
    if ns.swiglu and ns.squared_relu:  # Megatron-LM's core_transformer_config_from_args asserts the same
        raise MegapilotError("choose one activation", field="--squared-relu", fix="pass --swiglu or --squared-relu")
    if ns.bf16 and ns.fp16:
        raise MegapilotError("choose one precision", field="--fp16", fix="pass --bf16 or --fp16, not both")
    if ns.save_interval and not ns.save:
        raise MegapilotError("has no directory to save into", field="--save-interval", fix="add --save DIR")
    _check_cpu_limits(ns, gpu_available)
    position = ns.position_embedding_type
    if ns.use_rotary_position_embeddings:
        position = "rope"
    if ns.no_position_embedding:
        position = "none"
    num_query_groups = ns.num_query_groups if ns.group_query_attention else ns.num_attention_heads
    values = vars(ns) | {
        "ffn_hidden_size": ns.ffn_hidden_size or 4 * ns.hidden_size,
        "num_query_groups": num_query_groups,
        "position_embedding_type": position,
        "max_position_embeddings": ns.max_position_embeddings or ns.seq_length,
        "add_bias_linear": not ns.disable_bias_linear,
        "virtual_pipeline_model_parallel_size": _check_pipeline_split(ns, _resolve_virtual_pipeline(ns)),
        "expert_tensor_parallel_size": ns.expert_tensor_parallel_size or ns.tensor_model_parallel_size,
        "recompute_granularity": _resolve_recompute(ns),
        "global_batch_size": ns.global_batch_size or ns.micro_batch_size,
        "lr_decay_iters": ns.lr_decay_iters or ns.train_iters,
        "tokenizer_type": _resolve_tokenizer(ns),
        "sequence_parallel": ns.sequence_parallel and ns.tensor_model_parallel_size > 1,
        "moe_layer_freq": _moe_layer_freq(ns),
        "window_size": _window_size(ns),
        "accumulate_allreduce_grads_in_fp32": _fp32_gradients(ns),
    }
    names = {f.name for f in fields(TrainerConfig)}
    return TrainerConfig(**{name: values[name] for name in names})


def _fp32_gradients(ns: argparse.Namespace) -> bool:
    """Whether the gradients are kept and reduced in fp32, as Megatron-LM's validate_args decides it: with --bf16
    always, unless --grad-reduce-in-bf16 (which wins over --accumulate-allreduce-grads-in-fp32 there too); with
    --fp16 only when asked."""
    if ns.bf16:
        return not ns.grad_reduce_in_bf16
    return bool(ns.accumulate_allreduce_grads_in_fp32)
