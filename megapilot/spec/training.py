"""TrainingSpec: what is trained — sequence, batch, precision, optimizer and schedule."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Precision = Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4"]
# Megatron-LM --fp8-recipe: "delayed" scaling (history of amax) or "tensorwise" current scaling.
Fp8Recipe = Literal["delayed", "tensorwise"]
LrDecayStyle = Literal["cosine", "linear", "constant", "WSD", "inverse-square-root"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4")


class TrainingSpec(BaseModel):
    """Sequence length, batch, numerics and the optimizer schedule of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_length: int = Field(gt=0, description="Tokens per sample (--seq-length).")
    global_batch_size: int = Field(gt=0, description="Samples per optimizer step (--global-batch-size).")
    precision: Precision = Field(default="bf16", description="GEMM precision; master weights stay fp32.")
    fp8_recipe: Fp8Recipe = Field(
        default="tensorwise",
        description="Scaling recipe when precision is fp8: per-tensor current scaling by default (Megatron-Bridge's "
                    "fp8_cs, the recipe of its H100/B200 performance tables); delayed keeps an amax history.",
    )
    optimizer: Literal["adam"] = "adam"
    train_iters: int = Field(default=100, gt=0, description="--train-iters.")
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

    @property
    def tokens_per_step(self) -> int:
        return self.seq_length * self.global_batch_size
