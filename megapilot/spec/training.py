"""TrainingSpec: what is trained — sequence, batch, precision, optimizer and schedule."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# GEMM precision. mxfp8 (OCP E4M3, one E8M0 scale per 32 values) and nvfp4 (E2M1, one E4M3 scale per 16
# values plus a per-tensor scale) are Megatron-LM recipes; mxfp4 (E2M1, one E8M0 scale per 32 values) exists
# only in AMD Primus (Primus-Turbo / AITER GEMMs on CDNA4), Megatron-LM has no MXFP4 recipe.
Precision = Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "mxfp4"]
# How plain fp8 scales its tensors (Megatron-LM --fp8-recipe): "delayed" keeps an amax history and scales with
# last steps' maximum; "tensorwise" (current scaling) measures each tensor's amax before casting it;
# "blockwise" (Float8BlockScaling) gives every 1x128 block of activations/gradients and every 128x128 block of
# weights its own FP32 scale, the DeepSeek-V3 recipe.
Fp8Recipe = Literal["delayed", "tensorwise", "blockwise"]
LrDecayStyle = Literal["cosine", "linear", "constant", "WSD", "inverse-square-root"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "mxfp4")
# Precisions whose GEMM inputs are 8 bits or fewer (FP8 and the block-scaled formats): a quantised copy of each
# weight, one-byte saved GEMM inputs, the 8-bit GEMM fit.
QUANTIZED_PRECISIONS: tuple[str, ...] = ("fp8", "mxfp8", "nvfp4", "mxfp4")
FP8_RECIPES: tuple[str, ...] = ("delayed", "tensorwise", "blockwise")
# Megatron-LM's --optimizer choices megapilot prices: Adam, and Muon on one rank's weights or sharded layer-wise.
Optimizer = Literal["adam", "muon", "dist_muon"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
MUON_OPTIMIZERS = ("muon", "dist_muon")
DEFAULT_FP8_RECIPE: Fp8Recipe = "tensorwise"
# Bytes per value of the gradient buffers DDP accumulates into and reduces: fp32 (Megatron-LM's validate_args turns
# it on for --bf16), or the parameters' own 16 bits (--grad-reduce-in-bf16; fp16 training unless asked otherwise).
FP32_GRAD_BYTES = 4
HALF_GRAD_BYTES = 2
# One name per quantised-GEMM flavour: plain fp8 by its recipe, the block-scaled formats by their own name.
QuantFlavour = Literal["fp8-delayed", "fp8-tensorwise", "fp8-blockwise", "mxfp8", "nvfp4", "mxfp4"]


# The longest sequence planned: three times Llama 4 Scout's 10,485,760-token context (the longest published), so a
# slip of digits is refused by name instead of planned into a petabyte of activations.
MAX_SEQ_LENGTH = 33_554_432
# The largest global batch planned, in sequences: 2^24, over 1,000 times DeepSeek-V3's final 15,360 sequences and
# 256 times the 65,536 of BERT's large-batch (LAMB) runs, the most sequences a published step took. And in tokens
# (global batch x sequence length): 2^36, about 68.7 billion, over 1,000 times DeepSeek-V3's 63-million-token batch
# and 4,000 times Llama 3 405B's 16 million, the largest published. A batch past either is a slip of digits (10^12
# sequences priced a 45-billion-second step), refused by name.
MAX_GLOBAL_BATCH = 16_777_216
MAX_TOKENS_PER_STEP = 68_719_476_736
# The most training iterations planned: 2^32, thousands of times the longest published runs (T5's 1 million steps,
# Llama 2's 500,000); 10^21 printed a run of 3 x 10^16 days.
MAX_TRAIN_ITERS = 4_294_967_296


class TrainingSpec(BaseModel):
    """Sequence length, batch, numerics and the optimizer schedule of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_length: int = Field(gt=0, description="Tokens per sample (--seq-length).")
    global_batch_size: int = Field(gt=0, description="Samples per optimizer step (--global-batch-size).")
    precision: Precision = Field(default="bf16", description="GEMM precision; master weights stay fp32.")
    fp8_recipe: Fp8Recipe = Field(
        default=DEFAULT_FP8_RECIPE,
        description="Scaling recipe when precision is fp8: per-tensor current scaling by default (Megatron-Bridge's "
                    "fp8_cs, the recipe of its H100/B200 performance tables); delayed keeps an amax history; "
                    "blockwise scales 1x128 / 128x128 blocks (Bridge's fp8_sc).",
    )
    optimizer: Optimizer = Field(
        default="adam",
        description="--optimizer: adam; muon orthogonalises each 2-D weight's momentum by Newton-Schulz iterations "
                    "(one fp32 momentum; embeddings, output layer, norms and biases stay on Adam) and cannot use "
                    "the distributed optimizer; dist_muon shards that state layer by layer over data parallel.",
    )
    grad_reduce_in_bf16: bool = Field(
        default=False,
        description="--grad-reduce-in-bf16: gradients kept and reduced in bf16, half the bytes of the fp32 buffers "
                    "Megatron keeps under --bf16 otherwise (NeMo's and Megatron-Bridge's performance recipes); it "
                    "changes the numerics, so it is off unless asked for.",
    )
    train_iters: int = Field(default=100, gt=0, le=MAX_TRAIN_ITERS, description="--train-iters.")
    lr: float = Field(default=3e-4, gt=0)
    min_lr: float = Field(default=3e-5, ge=0)
    lr_decay_style: LrDecayStyle = "cosine"
    lr_warmup_iters: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    clip_grad: float = Field(default=1.0, ge=0)
    adam_beta1: float = Field(default=0.9, gt=0, lt=1)
    adam_beta2: float = Field(default=0.95, gt=0, lt=1)
    init_method_std: float = Field(default=0.02, gt=0)
    seed: int = 1234

    @field_validator("seq_length")
    @classmethod
    def _sequence_within_reason(cls, seq_length: int) -> int:
        if seq_length > MAX_SEQ_LENGTH:
            raise ValueError(f"{seq_length:,} tokens is above {MAX_SEQ_LENGTH:,}, far beyond any published context "
                             "(Llama 4 Scout: 10,485,760); check the value for extra digits")
        return seq_length

    @field_validator("global_batch_size")
    @classmethod
    def _batch_within_reason(cls, global_batch_size: int, info: ValidationInfo) -> int:
        if global_batch_size > MAX_GLOBAL_BATCH:
            raise ValueError(f"{global_batch_size:,} sequences is above {MAX_GLOBAL_BATCH:,}, far beyond any published "
                             "global batch (DeepSeek-V3: 15,360 sequences); check the value for extra digits")
        tokens = global_batch_size * info.data.get("seq_length", 1)
        if tokens > MAX_TOKENS_PER_STEP:
            raise ValueError(f"{global_batch_size:,} sequences of {info.data['seq_length']:,} tokens is {tokens:,} "
                             f"tokens a step, above {MAX_TOKENS_PER_STEP:,}, far beyond any published batch "
                             "(DeepSeek-V3: 63 million tokens); check both values for extra digits")
        return global_batch_size

    @field_validator("fp8_recipe")
    @classmethod
    def _recipe_only_for_fp8(cls, recipe: Fp8Recipe, info: ValidationInfo) -> Fp8Recipe:
        # The other low-precision formats carry their own scaling: a recipe beside them would be silently ignored.
        precision = info.data.get("precision", "bf16")
        if precision != "fp8" and recipe != DEFAULT_FP8_RECIPE:
            raise ValueError(f"{recipe} applies only to precision fp8, not {precision} (which scales its own "
                             "blocks or none)")
        return recipe

    @field_validator("optimizer")
    @classmethod
    def _muon_runs_bf16(cls, optimizer: Optimizer, info: ValidationInfo) -> Optimizer:
        # Megatron's get_megatron_muon_optimizer: "muon with fp16 is not supported".
        if optimizer in MUON_OPTIMIZERS and info.data.get("precision") == "fp16":
            raise ValueError(f"{optimizer} does not run with fp16 (Megatron refuses it); use bf16 or an fp8 recipe")
        return optimizer

    @field_validator("grad_reduce_in_bf16")
    @classmethod
    def _bf16_gradients_need_bf16(cls, bf16_gradients: bool, info: ValidationInfo) -> bool:
        # Megatron reads --grad-reduce-in-bf16 only under --bf16: with --fp16 it would be silently ignored.
        if bf16_gradients and info.data.get("precision") == "fp16":
            raise ValueError("bf16 gradients need bf16 training; fp16 keeps its gradients in fp16 already")
        return bf16_gradients

    @property
    def main_grad_bytes(self) -> int:
        """Bytes per value of the gradient buffers DDP accumulates into and reduces (`FP32_GRAD_BYTES` unless
        --grad-reduce-in-bf16, or fp16 training, keeps them at 16 bits)."""
        return HALF_GRAD_BYTES if self.grad_reduce_in_bf16 or self.precision == "fp16" else FP32_GRAD_BYTES

    @property
    def uses_muon(self) -> bool:
        return self.optimizer in MUON_OPTIMIZERS

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size

    @property
    def gemm_format(self) -> str:
        """The GEMMs' format as calibration coverage keeps it: bf16, fp16, or the quantised flavour."""
        return self.quant_flavour or self.precision

    @property
    def quant_flavour(self) -> QuantFlavour | None:
        """The quantised-GEMM flavour of this run; None for bf16/fp16 GEMMs."""
        if self.precision in ("bf16", "fp16"):
            return None
        if self.precision == "fp8":
            return f"fp8-{self.fp8_recipe}"  # type: ignore[return-value]  # the three recipes name the three flavours
        return self.precision  # type: ignore[return-value]  # mxfp8 / nvfp4 / mxfp4 are flavours themselves
