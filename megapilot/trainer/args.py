"""The trainer's command line: the subset of Megatron-LM `pretrain_gpt.py` flags it honours, as data.

`FLAGS` is the one table of accepted flags: Megatron-LM's flags take their type, default and meaning from the
one Megatron vocabulary (`megapilot.vocabulary`), narrowed to the choices this trainer builds. Flags the
trainer knows but cannot honour are in `GPU_ONLY_FLAGS` (they need Transformer Engine or CUDA
kernels) and `UNSUPPORTED_FLAGS` (features this trainer does not implement); both are refused with
a one-line error naming the flag. Anything else unknown is refused too. This module does not
import torch, so the table can be listed and tested cheaply.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

from megapilot import vocabulary
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


def _megatron(name: str, choices: tuple[str, ...] | None = None) -> Flag:
    """A flag of the Megatron vocabulary, with its type, default and meaning from there; `choices` narrows it to
    the values this trainer builds."""
    row = vocabulary.term(name)
    return Flag(name, row.kind, row.default, row.meaning, choices)


def _noop(name: str, kind: FlagKind, help: str) -> Flag:
    return Flag(name, kind, False if kind == "bool" else None, help, accepted_without_effect=True)


FLAGS: tuple[Flag, ...] = (
    # --- model shape
    _megatron("--num-layers"),
    _megatron("--hidden-size"),
    _megatron("--ffn-hidden-size"),
    _megatron("--num-attention-heads"),
    _megatron("--kv-channels"),
    _megatron("--group-query-attention"),
    _megatron("--num-query-groups"),
    _megatron("--swiglu"),
    _megatron("--squared-relu"),
    _megatron("--normalization", ("LayerNorm", "RMSNorm")),
    _megatron("--norm-epsilon"),
    _megatron("--position-embedding-type", ("learned_absolute", "rope", "none")),
    _bool("--use-rotary-position-embeddings", "same as --position-embedding-type rope"),
    _bool("--no-position-embedding", "same as --position-embedding-type none"),
    _megatron("--rotary-base"),
    _megatron("--rotary-percent"),
    _megatron("--seq-length"),
    _megatron("--max-position-embeddings"),
    _megatron("--disable-bias-linear"),
    _megatron("--untie-embeddings-and-output-weights"),
    _megatron("--qk-layernorm"),
    _megatron("--add-qkv-bias"),
    _megatron("--window-size"),
    _megatron("--use-rope-scaling"),
    _megatron("--rope-scaling-factor"),
    _megatron("--rope-type", ("rope", "yarn")),
    _megatron("--rotary-scaling-factor"),
    _megatron("--mscale"),
    _megatron("--mscale-all-dim"),
    # --- multi-latent attention and multi-token prediction
    _megatron("--multi-latent-attention"),
    _megatron("--q-lora-rank"),
    _megatron("--kv-lora-rank"),
    _megatron("--qk-head-dim"),
    _megatron("--qk-pos-emb-head-dim"),
    _megatron("--v-head-dim"),
    _megatron("--mtp-num-layers"),
    _megatron("--mtp-loss-scaling-factor"),
    _megatron("--init-method-std"),
    _megatron("--attention-dropout"),
    _megatron("--hidden-dropout"),
    _megatron("--make-vocab-size-divisible-by"),
    _bool("--apply-residual-connection-post-layernorm", "residual taken after the layer norm"),
    _bool("--attention-softmax-in-fp32", "softmax in fp32"),
    # --- mixture of experts
    _megatron("--num-experts"),
    _megatron("--moe-router-topk"),
    _megatron("--moe-ffn-hidden-size"),
    _megatron("--moe-router-load-balancing-type", ("aux_loss", "seq_aux_loss", "sinkhorn", "none")),
    _megatron("--moe-aux-loss-coeff"),
    _megatron("--moe-token-dispatcher-type", ("allgather", "alltoall")),
    _megatron("--moe-shared-expert-intermediate-size"),
    _megatron("--moe-layer-freq"),
    _megatron("--moe-router-dtype", ("fp32", "fp64")),
    _megatron("--moe-shared-expert-gate"),
    _megatron("--moe-router-score-function", ("softmax", "sigmoid")),
    _megatron("--moe-router-pre-softmax"),
    _megatron("--moe-router-topk-scaling-factor"),
    _megatron("--moe-router-num-groups"),
    _megatron("--moe-router-group-topk"),
    _megatron("--moe-router-enable-expert-bias"),
    _megatron("--moe-router-bias-update-rate"),
    # --- parallelism
    _megatron("--tensor-model-parallel-size"),
    _megatron("--pipeline-model-parallel-size"),
    _megatron("--num-layers-per-virtual-pipeline-stage"),
    _int("--virtual-pipeline-model-parallel-size", None, "virtual stages per pipeline rank"),
    _megatron("--num-virtual-stages-per-pipeline-rank"),
    _megatron("--decoder-first-pipeline-num-layers"),
    _megatron("--decoder-last-pipeline-num-layers"),
    _megatron("--context-parallel-size"),
    _megatron("--expert-model-parallel-size"),
    _megatron("--expert-tensor-parallel-size"),
    _megatron("--sequence-parallel"),
    _megatron("--use-distributed-optimizer"),
    _megatron("--overlap-grad-reduce"),
    _megatron("--overlap-param-gather"),
    _str("--distributed-backend", None, "torch.distributed backend (default: nccl on GPU, gloo on CPU)",
         ("nccl", "gloo")),
    _int("--distributed-timeout-minutes", 10, "timeout of collective operations"),
    # --- activation recomputation
    _megatron("--recompute-granularity", ("full", "selective")),
    _megatron("--recompute-method", ("uniform", "block")),
    _megatron("--recompute-num-layers"),
    _megatron("--recompute-activations"),
    # --- precision
    _bool("--bf16", "bfloat16 parameters and compute, fp32 main weights"),
    _bool("--fp16", "float16 parameters and compute with dynamic loss scaling"),
    _float("--loss-scale", None, "static loss scale for fp16 (default dynamic)"),
    _float("--initial-loss-scale", 4294967296.0, "initial dynamic loss scale for fp16"),
    _bool("--accumulate-allreduce-grads-in-fp32", "fp32 gradient buffers with bf16/fp16"),
    _megatron("--grad-reduce-in-bf16"),
    # --- batch and schedule
    _megatron("--micro-batch-size"),
    _megatron("--global-batch-size"),
    _megatron("--train-iters"),
    _int("--exit-interval", None, "stop (with a checkpoint when --save is set) at this iteration"),
    # --- optimizer and learning rate
    _megatron("--optimizer", ("adam", "sgd")),
    _megatron("--lr"),
    _megatron("--min-lr"),
    _megatron("--lr-decay-style", ("constant", "linear", "cosine", "inverse-square-root")),
    _int("--lr-decay-iters", None, "iterations over which the rate decays (default --train-iters)"),
    _megatron("--lr-warmup-iters"),
    _float("--lr-warmup-init", 0.0, "learning rate at the start of warm-up"),
    _megatron("--weight-decay"),
    _megatron("--clip-grad"),
    _megatron("--adam-beta1"),
    _megatron("--adam-beta2"),
    _float("--adam-eps", 1e-8, "Adam epsilon"),
    _megatron("--seed"),
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
    _megatron("--eval-interval"),
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
