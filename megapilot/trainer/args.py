"""The trainer's command line: the subset of Megatron-LM `pretrain_gpt.py` flags it honours, as data.

`FLAGS` is the one table of accepted flags (same names and meanings as Megatron-LM). Flags the
trainer knows but cannot honour are in `GPU_ONLY_FLAGS` (they need Transformer Engine or CUDA
kernels) and `UNSUPPORTED_FLAGS` (features this trainer does not implement); both are refused with
a one-line error naming the flag. Anything else unknown is refused too. This module does not
import torch, so the table can be listed and tested cheaply.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

from megapilot.errors import MegapilotError

FlagKind = Literal["int", "float", "str", "bool"]


@dataclass(frozen=True)
class Flag:
    """One accepted command-line flag."""

    name: str
    kind: FlagKind
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None
    #: True for flags accepted for script compatibility that change nothing in this trainer.
    accepted_without_effect: bool = False

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def _int(name: str, default: int | None, help: str) -> Flag:
    return Flag(name, "int", default, help)


def _float(name: str, default: float | None, help: str) -> Flag:
    return Flag(name, "float", default, help)


def _str(name: str, default: str | None, help: str, choices: tuple[str, ...] | None = None) -> Flag:
    return Flag(name, "str", default, help, choices)


def _bool(name: str, help: str) -> Flag:
    return Flag(name, "bool", False, help)


def _noop(name: str, kind: FlagKind, help: str) -> Flag:
    return Flag(name, kind, False if kind == "bool" else None, help, accepted_without_effect=True)


FLAGS: tuple[Flag, ...] = (
    # --- model shape
    _int("--num-layers", None, "number of transformer layers"),
    _int("--hidden-size", None, "transformer hidden size"),
    _int("--ffn-hidden-size", None, "MLP hidden size (default 4 x hidden size)"),
    _int("--num-attention-heads", None, "number of attention heads"),
    _int("--kv-channels", None, "projection size per head (default hidden / heads)"),
    _bool("--group-query-attention", "use grouped-query attention (with --num-query-groups)"),
    _int("--num-query-groups", 1, "number of key/value groups with --group-query-attention"),
    _bool("--swiglu", "use the gated SwiGLU MLP"),
    _bool("--squared-relu", "squared-ReLU MLP activation (Nemotron)"),
    _str("--normalization", "LayerNorm", "normalization layer", ("LayerNorm", "RMSNorm")),
    _float("--norm-epsilon", 1e-5, "epsilon of the normalization layers"),
    _str("--position-embedding-type", "learned_absolute", "position embedding",
         ("learned_absolute", "rope", "none")),
    _bool("--use-rotary-position-embeddings", "same as --position-embedding-type rope"),
    _bool("--no-position-embedding", "same as --position-embedding-type none"),
    _int("--rotary-base", 10000, "RoPE base"),
    _float("--rotary-percent", 1.0, "fraction of each head rotated by RoPE"),
    _int("--seq-length", None, "training sequence length in tokens"),
    _int("--max-position-embeddings", None, "maximum sequence length of the position embedding"),
    _bool("--disable-bias-linear", "no bias in linear layers"),
    _bool("--untie-embeddings-and-output-weights", "separate input embedding and output layer"),
    _bool("--qk-layernorm", "normalize queries and keys (under MLA: the q/kv latents)"),
    _bool("--add-qkv-bias", "bias on the QKV projection only"),
    _str("--window-size", None, "sliding-window attention: 'left,right' keys around each query"),
    _bool("--use-rope-scaling", "Llama 3.x frequency-dependent RoPE scaling"),
    _float("--rope-scaling-factor", 8.0, "factor of the Llama 3.x RoPE scaling"),
    _str("--rope-type", None, "RoPE of multi-latent attention (default yarn, as Megatron)", ("rope", "yarn")),
    _float("--rotary-scaling-factor", 1.0, "YaRN context-extension factor (MLA)"),
    _float("--mscale", 1.0, "YaRN mscale (MLA)"),
    _float("--mscale-all-dim", 0.0, "YaRN mscale over all dims (MLA)"),
    # --- multi-latent attention and multi-token prediction
    _bool("--multi-latent-attention", "DeepSeek multi-latent attention"),
    _int("--q-lora-rank", None, "rank of the compressed query (none: full-rank query)"),
    _int("--kv-lora-rank", 32, "rank of the compressed keys and values"),
    _int("--qk-head-dim", 128, "per-head query/key dim without RoPE"),
    _int("--qk-pos-emb-head-dim", 64, "per-head query/key dim with RoPE"),
    _int("--v-head-dim", 128, "per-head value dim"),
    _int("--mtp-num-layers", None, "multi-token-prediction depth"),
    _float("--mtp-loss-scaling-factor", 0.1, "weight of the MTP loss"),
    _float("--init-method-std", 0.02, "standard deviation of the weight initialization"),
    _float("--attention-dropout", 0.1, "dropout on attention probabilities"),
    _float("--hidden-dropout", 0.1, "dropout on hidden states"),
    _int("--make-vocab-size-divisible-by", 128, "pad the vocabulary to a multiple of this (times TP)"),
    _bool("--apply-residual-connection-post-layernorm", "residual taken after the layer norm"),
    _bool("--attention-softmax-in-fp32", "softmax in fp32"),
    # --- mixture of experts
    _int("--num-experts", None, "number of experts (MoE)"),
    _int("--moe-router-topk", 2, "experts per token"),
    _int("--moe-ffn-hidden-size", None, "hidden size of each expert"),
    _str("--moe-router-load-balancing-type", "aux_loss", "load-balancing loss",
         ("aux_loss", "seq_aux_loss", "sinkhorn", "none")),
    _float("--moe-aux-loss-coeff", 0.0, "weight of the auxiliary load-balancing loss"),
    _str("--moe-token-dispatcher-type", "allgather", "token dispatcher", ("allgather", "alltoall")),
    _int("--moe-shared-expert-intermediate-size", None, "hidden size of the shared expert"),
    _str("--moe-layer-freq", "1", "every n-th layer is MoE, or a list expression such as ([0]*1+[1]*3)"),
    _str("--moe-router-dtype", None, "router precision", ("fp32", "fp64")),
    _bool("--moe-shared-expert-gate", "sigmoid gate on the shared expert's output"),
    _str("--moe-router-score-function", "softmax", "router score function", ("softmax", "sigmoid")),
    _bool("--moe-router-pre-softmax", "softmax over all experts before the top-k"),
    _float("--moe-router-topk-scaling-factor", None, "multiplier on the routing weights"),
    _int("--moe-router-num-groups", None, "expert groups of group-limited routing"),
    _int("--moe-router-group-topk", None, "groups each token may route to"),
    _bool("--moe-router-enable-expert-bias", "per-expert routing bias (aux-loss-free balancing)"),
    _float("--moe-router-bias-update-rate", 1e-3, "update rate of the expert bias"),
    # --- parallelism
    _int("--tensor-model-parallel-size", 1, "tensor-parallel size (TP)"),
    _int("--pipeline-model-parallel-size", 1, "pipeline-parallel size (PP)"),
    _int("--num-layers-per-virtual-pipeline-stage", None, "layers per virtual stage (interleaved 1F1B)"),
    _int("--virtual-pipeline-model-parallel-size", None, "virtual stages per pipeline rank"),
    _int("--num-virtual-stages-per-pipeline-rank", None, "virtual stages per pipeline rank (Megatron-LM's name)"),
    _int("--decoder-first-pipeline-num-layers", None, "layers on the first pipeline stage (uneven split)"),
    _int("--decoder-last-pipeline-num-layers", None, "layers on the last pipeline stage (uneven split)"),
    _int("--context-parallel-size", 1, "context-parallel size (CP)"),
    _int("--expert-model-parallel-size", 1, "expert-parallel size (EP)"),
    _int("--expert-tensor-parallel-size", None, "tensor-parallel size inside experts"),
    _bool("--sequence-parallel", "sequence parallelism (with TP > 1)"),
    _bool("--use-distributed-optimizer", "shard optimizer state over data-parallel ranks (ZeRO-1)"),
    _bool("--overlap-grad-reduce", "overlap the gradient reduce with the backward pass"),
    _bool("--overlap-param-gather", "overlap the parameter all-gather (distributed optimizer)"),
    _str("--distributed-backend", None, "torch.distributed backend (default: nccl on GPU, gloo on CPU)",
         ("nccl", "gloo")),
    _int("--distributed-timeout-minutes", 10, "timeout of collective operations"),
    # --- activation recomputation
    _str("--recompute-granularity", None, "recompute activations", ("full", "selective")),
    _str("--recompute-method", None, "how layers are recomputed with full granularity", ("uniform", "block")),
    _int("--recompute-num-layers", None, "layers recomputed per stage with full granularity"),
    _bool("--recompute-activations", "same as --recompute-granularity selective"),
    # --- precision
    _bool("--bf16", "bfloat16 parameters and compute, fp32 main weights"),
    _bool("--fp16", "float16 parameters and compute with dynamic loss scaling"),
    _float("--loss-scale", None, "static loss scale for fp16 (default dynamic)"),
    _float("--initial-loss-scale", 4294967296.0, "initial dynamic loss scale for fp16"),
    _bool("--accumulate-allreduce-grads-in-fp32", "fp32 gradient buffers with bf16/fp16"),
    # --- batch and schedule
    _int("--micro-batch-size", 1, "samples per micro-batch per data-parallel rank"),
    _int("--global-batch-size", None, "samples per iteration over all data-parallel ranks"),
    _int("--train-iters", None, "number of training iterations"),
    _int("--exit-interval", None, "stop (with a checkpoint when --save is set) at this iteration"),
    # --- optimizer and learning rate
    _str("--optimizer", "adam", "optimizer", ("adam", "sgd")),
    _float("--lr", None, "peak learning rate"),
    _float("--min-lr", 0.0, "final learning rate"),
    _str("--lr-decay-style", "linear", "learning-rate decay", ("constant", "linear", "cosine", "inverse-square-root")),
    _int("--lr-decay-iters", None, "iterations over which the rate decays (default --train-iters)"),
    _int("--lr-warmup-iters", 0, "linear warm-up iterations"),
    _float("--lr-warmup-init", 0.0, "learning rate at the start of warm-up"),
    _float("--weight-decay", 0.01, "weight decay"),
    _float("--clip-grad", 1.0, "gradient clipping by global norm (0 disables)"),
    _float("--adam-beta1", 0.9, "Adam beta1"),
    _float("--adam-beta2", 0.999, "Adam beta2"),
    _float("--adam-eps", 1e-8, "Adam epsilon"),
    _int("--seed", 1234, "random seed"),
    # --- data and tokenizer
    _str("--data-path", None, "prefix of an indexed dataset (path without .bin/.idx)"),
    _bool("--mock-data", "Megatron's synthetic MockGPTDataset instead of real data"),
    _str("--split", "969,30,1", "train,valid,test split weights of the documents"),
    _str("--data-cache-path", None, "where the dataset index caches are written"),
    _str("--tokenizer-type", None, "tokenizer (ByteTokenizer is built in; others are read for vocab size)"),
    _str("--tokenizer-model", None, "tokenizer model path (only ByteTokenizer is implemented)"),
    _int("--vocab-size", None, "vocabulary size (with --mock-data or NullTokenizer)"),
    _str("--vocab-file", None, "vocabulary file (GPT2BPETokenizer; not implemented)"),
    _str("--merge-file", None, "merges file (GPT2BPETokenizer; not implemented)"),
    _int("--num-workers", 0, "data loader workers", ),
    _bool("--reset-position-ids", "restart position ids at each end-of-document"),
    _bool("--reset-attention-mask", "mask attention across documents"),
    _bool("--eod-mask-loss", "no loss on end-of-document tokens"),
    # --- logging, evaluation, checkpoints
    _int("--log-interval", 100, "iterations between iteration lines"),
    _bool("--log-throughput", "print TFLOP/s/GPU in the iteration line"),
    _int("--timing-log-level", 0, "timer detail (0: none; 1, 2: forward-backward and optimizer timers)"),
    _int("--eval-interval", 1000, "iterations between validation runs"),
    _int("--eval-iters", 100, "iterations per validation run (0 disables validation)"),
    _str("--save", None, "checkpoint directory to save into"),
    _str("--load", None, "checkpoint directory to resume from"),
    _int("--save-interval", None, "iterations between checkpoints"),
    _int("--ckpt-step", None, "iteration to load from --load (default: the latest)"),
    _str("--ckpt-format", "torch_dist", "checkpoint format", ("torch_dist",)),
    _bool("--no-load-optim", "do not load the optimizer state"),
    _bool("--no-load-rng", "do not load the RNG state"),
    _bool("--no-save-optim", "do not save the optimizer state"),
    _bool("--finetune", "load weights only and start at iteration 0"),
    # --- accepted for launch-script compatibility, without effect here
    _noop("--use-mcore-models", "bool", "always Megatron-Core models here"),
    _noop("--transformer-impl", "str", "local on CPU; Transformer Engine is used on GPU when installed"),
    _noop("--no-masked-softmax-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-bias-gelu-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-bias-swiglu-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-bias-dropout-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-rope-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-gradient-accumulation-fusion", "bool", "fusions are always off on CPU"),
    _noop("--no-persist-layer-norm", "bool", "fusions are always off on CPU"),
    _noop("--use-flash-attn", "bool", "PyTorch attention is used"),
    _noop("--tensorboard-dir", "str", "no TensorBoard writer"),
    _noop("--log-timers-to-tensorboard", "bool", "no TensorBoard writer"),
    _noop("--log-memory-to-tensorboard", "bool", "no TensorBoard writer"),
    _noop("--log-validation-ppl-to-tensorboard", "bool", "no TensorBoard writer"),
    _noop("--wandb-project", "str", "no Weights & Biases writer"),
    _noop("--wandb-exp-name", "str", "no Weights & Biases writer"),
    _noop("--log-params-norm", "bool", "the params norm is not printed"),
    _noop("--log-num-zeros-in-grad", "bool", "the zeros count is not printed"),
    _noop("--manual-gc", "bool", "Python's default garbage collection"),
    _noop("--manual-gc-interval", "int", "Python's default garbage collection"),
    _noop("--dist-ckpt-strictness", "str", "loading is always strict"),
    _noop("--ckpt-fully-parallel-save", "bool", "the default save strategy is used"),
    _noop("--ckpt-fully-parallel-load", "bool", "the default load strategy is used"),
    _noop("--use-checkpoint-args", "bool", "flags always come from the command line"),
    _noop("--log-progress", "bool", "progress.txt is not written"),
    _noop("--cross-entropy-loss-fusion", "bool", "fusions are off; plain cross entropy"),
    _noop("--empty-unused-memory-level", "int", "no CUDA cache to empty on CPU"),
)

#: Flags that need a GPU (Transformer Engine, CUDA kernels or NVLink features); refused on CPU.
GPU_ONLY_FLAGS: dict[str, str] = {
    "--fp8-format": "FP8 needs Transformer Engine on a Hopper/Blackwell GPU",
    "--fp8-recipe": "FP8 needs Transformer Engine on a Hopper/Blackwell GPU",
    "--fp8-param-gather": "FP8 needs Transformer Engine on a Hopper/Blackwell GPU",
    "--fp4-format": "FP4 needs Transformer Engine on a Blackwell GPU",
    "--tp-comm-overlap": "TP communication overlap needs Transformer Engine userbuffers on GPUs",
    "--moe-grouped-gemm": "grouped GEMM needs CUDA kernels",
    "--cuda-graph-impl": "CUDA graphs need a GPU",
    "--enable-cuda-graph": "CUDA graphs need a GPU",
    "--cpu-offloading-num-layers": "activation offloading moves GPU memory to the host (Transformer Engine's offload "
                                   "handler)",
    "--use-precision-aware-optimizer": "needs Transformer Engine's fused Adam",
    "--moe-latent-size": "Megatron-Core builds latent MoE projections with Transformer Engine only",
}

#: Megatron-LM flags this trainer does not implement (on any device).
UNSUPPORTED_FLAGS: dict[str, str] = {
    "--async-save": "checkpoints are saved synchronously",
    "--rampup-batch-size": "batch-size ramp-up is not implemented",
    "--num-layers-per-stage": "per-stage layer lists are not implemented (use "
                              "--decoder-first/last-pipeline-num-layers)",
    "--ckpt-convert-format": "checkpoint conversion is not implemented",
    "--heterogeneous-layers-config-path": "layers of differing shapes (Llama-Nemotron block configs) are not "
                                          "built",
}

_FLAGS_BY_NAME = {flag.name: flag for flag in FLAGS}

_KIND_TO_TYPE = {"int": int, "float": float, "str": str}


def flag_names() -> list[str]:
    """Every accepted flag name, in table order."""
    return [flag.name for flag in FLAGS]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m megapilot.trainer", add_help=True, allow_abbrev=False, exit_on_error=False,
        description="Megatron-Core GPT pretraining with Megatron-LM's flags (runs on CPU with gloo).",
    )
    for flag in FLAGS:
        if flag.kind == "bool":
            parser.add_argument(flag.name, dest=flag.dest, action="store_true", help=flag.help)
        else:
            parser.add_argument(flag.name, dest=flag.dest, type=_KIND_TO_TYPE[flag.kind], default=flag.default,
                                choices=flag.choices, help=flag.help)
    return parser


def _flag_of(token: str) -> str:
    return token.split("=", 1)[0]


def _refuse_known_but_unhonoured(argv: list[str], gpu_available: bool) -> None:
    for token in argv:
        name = _flag_of(token)
        if name in UNSUPPORTED_FLAGS:
            raise MegapilotError(f"not supported by megapilot's trainer: {UNSUPPORTED_FLAGS[name]}", field=name,
                                 fix=f"remove {name}, or run Megatron-LM's pretrain_gpt.py")
        if name in GPU_ONLY_FLAGS and not gpu_available:
            raise MegapilotError(f"needs a GPU: {GPU_ONLY_FLAGS[name]}", field=name,
                                 fix=f"remove {name} for a CPU run")
        if name in GPU_ONLY_FLAGS:
            raise MegapilotError(f"not implemented by megapilot's trainer: {GPU_ONLY_FLAGS[name]}", field=name,
                                 fix=f"remove {name}, or run Megatron-LM's pretrain_gpt.py")


def parse_flags(argv: list[str], *, gpu_available: bool = False) -> argparse.Namespace:
    """Parse Megatron-LM flags into a namespace (one attribute per `Flag.dest`).

    Raises `MegapilotError` naming the flag for an unknown flag, a flag that cannot be honoured
    here, or a value of the wrong type.
    """
    _refuse_known_but_unhonoured(argv, gpu_available)
    parser = _build_parser()
    try:
        namespace, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise MegapilotError(exc.message, field=exc.argument_name or "argv",
                             fix="see `python -m megapilot.trainer --help`") from None
    if unknown:
        first = _flag_of(unknown[0])
        raise MegapilotError("unknown flag" if first.startswith("-") else f"unexpected argument {first!r}",
                             field=first, fix="see `python -m megapilot.trainer --help` for the accepted flags")
    return namespace
