"""Fixes written for the framework that wrote the log: its own settings, not Megatron-LM flags.

A torchtitan run is configured by its TOML job config (or `--section.key value` overrides), GPT-NeoX by its YAML
config, DeepSpeed by its JSON config, NeMo and Megatron-Bridge by recipe overrides (`model.x=y`). Offering
`--recompute-granularity` to any of them would be advice the user cannot apply. The settings below are the
frameworks' own names for the same remedies the Megatron-LM rules offer; `kind="config"` says where they go.

Allocator settings are environment variables: PyTorch reads `PYTORCH_HIP_ALLOC_CONF` on ROCm builds and
`PYTORCH_CUDA_ALLOC_CONF` on CUDA builds, so the name follows the device the log names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from megapilot.diagnose.findings import Fix
from megapilot.logs.collect import ParsedLog
from megapilot.logs.framework import takes_megatron_flags
from megapilot.logs.parser import BRIDGE_TRAINING_LINE, PRIMUS_HINT

_MEMORY: dict[str, list[Fix]] = {
    "torchtitan": [
        Fix("set", "--activation_checkpoint.mode", "full", "recompute activations in the backward pass",
            kind="config", option="activation checkpointing"),
        Fix("set", "--training.local_batch_size", "1", "fewest activations per step (older releases: "
            "--training.batch_size)", kind="config", option="smaller local batch"),
        Fix("set", "--parallelism.data_parallel_shard_degree", "-1", "shard parameters, gradients and optimizer "
            "states over every data-parallel rank (FSDP2)", kind="config", option="FSDP sharding"),
    ],
    "gpt-neox": [
        Fix("set", "checkpoint-activations", "true", "recompute activations (YAML config)", kind="config",
            option="activation checkpointing"),
        Fix("set", "train_micro_batch_size_per_gpu", "1", "fewest activations per micro-batch", kind="config",
            option="micro-batch 1"),
        Fix("set", "zero_optimization.stage", "1", "shard the optimizer states over the DP ranks", kind="config",
            option="ZeRO-1"),
    ],
    "deepspeed": [
        Fix("set", "zero_optimization.stage", "3", "shard parameters, gradients and optimizer states (ds_config)",
            kind="config", option="ZeRO-3"),
        Fix("set", "train_micro_batch_size_per_gpu", "1", "fewest activations per micro-batch", kind="config",
            option="micro-batch 1"),
        Fix("set", "activation_checkpointing.partition_activations", "true", "split checkpointed activations over "
            "the model-parallel ranks", kind="config", option="activation checkpointing"),
    ],
    "nemo": [
        Fix("set", "model.activations_checkpoint_granularity", "selective", "recompute the attention core",
            kind="config", option="selective recompute"),
        Fix("set", "model.micro_batch_size", "1", "fewest activations per micro-batch", kind="config",
            option="micro-batch 1"),
        Fix("set", "model.optim.name", "distributed_fused_adam", "shard the optimizer states over the DP ranks",
            kind="config", option="distributed optimizer"),
    ],
    "megatron-bridge": [
        Fix("set", "model.recompute_granularity", "selective", "recompute the attention core (recipe override)",
            kind="config", option="selective recompute"),
        Fix("set", "train.micro_batch_size", "1", "fewest activations per micro-batch", kind="config",
            option="micro-batch 1"),
        Fix("set", "ddp.use_distributed_optimizer", "true", "shard the optimizer states over the DP ranks",
            kind="config", option="distributed optimizer"),
    ],
}

_DIVERGENCE: dict[str, list[Fix]] = {
    "torchtitan": [
        Fix("set", "--optimizer.lr", "<half the current>", "halve the peak learning rate", kind="config"),
        Fix("set", "--lr_scheduler.warmup_steps", "<1% of the steps, at least 100>", "warm the learning rate up",
            kind="config"),
        Fix("set", "--training.max_norm", "1.0", "clip the global grad norm at 1.0", kind="config"),
    ],
    "gpt-neox": [
        Fix("set", "optimizer.params.lr", "<half the current>", "halve the peak learning rate", kind="config"),
        Fix("set", "warmup", "0.01", "warm the learning rate up over the first 1% of the steps", kind="config"),
        Fix("set", "gradient_clipping", "1.0", "clip the global grad norm at 1.0", kind="config"),
    ],
    "deepspeed": [
        Fix("set", "optimizer.params.lr", "<half the current>", "halve the peak learning rate", kind="config"),
        Fix("set", "scheduler.params.warmup_num_steps", "<1% of the steps, at least 100>",
            "warm the learning rate up", kind="config"),
        Fix("set", "gradient_clipping", "1.0", "clip the global grad norm at 1.0", kind="config"),
    ],
    "nemo": [
        Fix("set", "model.optim.lr", "<half the current>", "halve the peak learning rate", kind="config"),
        Fix("set", "model.optim.sched.warmup_steps", "<1% of the steps, at least 100>", "warm the learning rate up",
            kind="config"),
        Fix("set", "trainer.gradient_clip_val", "1.0", "clip the global grad norm at 1.0", kind="config"),
    ],
    "megatron-bridge": [
        Fix("set", "optimizer.lr", "<half the current>", "halve the peak learning rate", kind="config"),
        Fix("set", "scheduler.lr_warmup_iters", "<1% of the steps, at least 100>", "warm the learning rate up",
            kind="config"),
        Fix("set", "optimizer.clip_grad", "1.0", "clip the global grad norm at 1.0", kind="config"),
    ],
}


def runs_on_rocm(log: ParsedLog) -> bool:
    """Whether the log names a ROCm device: Primus's Megatron lines or Primus frames (Primus is AMD's), HIP or
    amdgpu errors. torchtitan's step line reads the same upstream (on CUDA) and under Primus, so that dialect alone
    does not say ROCm."""
    if log.dialect == "primus-megatron" or log.frame_hints.get(PRIMUS_HINT):
        return True
    return any(_ROCM_WORD_RE.search(error.text) for error in log.errors)


# `HIP out of memory`, `hipErrorNoDevice`, `amdgpu: ...`, `/opt/rocm/...`; a word start, so "chip" does not count
_ROCM_WORD_RE = re.compile(r"\b(?:hip|amdgpu|rocm)", re.IGNORECASE)


def allocator_fix(log: ParsedLog) -> Fix:
    """Expandable segments, under the variable name the device's PyTorch build reads."""
    name = "PYTORCH_HIP_ALLOC_CONF" if runs_on_rocm(log) else "PYTORCH_CUDA_ALLOC_CONF"
    return Fix("set", name, "expandable_segments:True", "less allocator fragmentation", kind="env", option="allocator")


def memory_fixes(framework: str) -> list[Fix] | None:
    """The framework's own memory settings; None for a framework that takes Megatron-LM flags."""
    return list(_MEMORY[framework]) if framework in _MEMORY else None


def divergence_fixes(framework: str) -> list[Fix] | None:
    """The framework's own learning-rate, warm-up and clipping settings; None for Megatron-LM flag frameworks."""
    return list(_DIVERGENCE[framework]) if framework in _DIVERGENCE else None


# Each framework's switch for asynchronous checkpoint saves (Megatron-LM `--async-save`; NeMo 2's
# MegatronStrategy(ckpt_async_save=...); Megatron-Bridge's CheckpointConfig.async_save; torchtitan's
# [checkpoint] async_mode). GPT-NeoX and DeepSpeed save synchronously: nothing to turn off.
_SYNCHRONOUS_SAVE: dict[str, Fix] = {
    "megatron": Fix("remove", "--async-save", None, ""),
    "nemo": Fix("set", "trainer.strategy.ckpt_async_save", "false", "", kind="config"),
    "megatron-bridge": Fix("set", "checkpoint.async_save", "false", "", kind="config"),
    "torchtitan": Fix("set", "--checkpoint.async_mode", "disabled", "", kind="config"),
}


def synchronous_save_fix(framework: str, reason: str) -> Fix | None:
    """The framework's own way to save checkpoints synchronously, or None where saves are already synchronous."""
    key = "megatron" if takes_megatron_flags(framework) else framework
    template = _SYNCHRONOUS_SAVE.get(key)
    return None if template is None else replace(template, reason=reason)


# Runs megapilot reads the lines of but not the configuration of: whose log it is, what tells it without a step line
# (traceback frames, a logger's prefix), where its settings live, what its step lines give. GPT-NeoX runs on
# DeepSpeed's engine (its logs carry DeepSpeed's `steps: N loss: ...` lines).
@dataclass(frozen=True)
class _Reader:
    whose: str
    told_without_steps: str
    config: str
    steps_give: str = "each step's loss and time"


_NOT_MEGATRON: dict[str, _Reader] = {
    "deepspeed": _Reader("DeepSpeed's", "its traceback runs in DeepSpeed's code", "DeepSpeed's ds_config JSON"),
    "gpt-neox": _Reader("GPT-NeoX's on DeepSpeed", "its traceback runs in GPT-NeoX's code", "GPT-NeoX's YAML config"),
    "torchtitan": _Reader("torchtitan's", "its traceback runs in torchtitan's code",
                          "torchtitan's TOML job config, or its --section.key overrides",
                          "each step's loss, memory, tokens/s and MFU"),
    # NeMo's logger (`[NeMo I ...`) names it as its frames do (`LineParser.framework_hints`)
    "nemo": _Reader("NeMo's", "its `[NeMo I ...]` logger lines or its traceback frames are NeMo's",
                    "NeMo's recipe or YAML config, or their `model.x=y` overrides"),
    # Bridge builds its run in Python (a recipe's ConfigContainer) and prints no Megatron-LM arguments block
    # (or its `Training ...` line, `_told_by_bridge_line`)
    "megatron-bridge": _Reader("Megatron-Bridge's", "its traceback runs in Megatron-Bridge's code",
                               "the recipe's ConfigContainer its run_recipe script builds, or that script's "
                               "`model.x=y` overrides",
                               "each step's loss, time and TFLOP/s/GPU"),
}
_STEP_LINES = (("deepspeed", "its `steps: N loss: ...` lines are DeepSpeed's"),
               ("gpt-neox", "its `iteration N/ M | ... | lm_loss: ...` lines are GPT-NeoX's"),
               ("primus-torchtitan", "its `step: N  loss: ...` lines are torchtitan's"),
               ("nemo", "its progress lines with `reduced_train_loss` are NeMo's"),
               ("megatron-bridge", "its iteration lines follow Megatron-Bridge's own `Step Time : ...` lines, "
                "`memory (GB)` reports or `Training ...` line"))


def not_megatron_statement(log: ParsedLog, config_fixes: bool) -> str | None:
    """For a log of a framework megapilot reads but does not configure (DeepSpeed, GPT-NeoX, torchtitan, NeMo,
    Megatron-Bridge): that it is not Megatron-LM's, what megapilot reads of it and what it cannot; None for any other
    log (Megatron-LM and the forks that take its flags). `config_fixes`: the findings offer settings of the run's
    config."""
    reader = _NOT_MEGATRON.get(log.framework)
    if reader is None:
        return None
    told = ", ".join(lines for dialect, lines in _STEP_LINES if log.dialect_counts.get(dialect)) \
        or _told_by_bridge_line(log) or reader.told_without_steps
    stepped = bool(log.iterations or (log.summary and log.summary.iterations_logged))
    read = f"{reader.steps_give} and the error lines" if stepped else "its error lines and tracebacks"
    fixes = ", and the fixes are settings of that config" if config_fixes else ""
    return (f"this log is {reader.whose}, not Megatron-LM's ({told}): megapilot reads {read}; it cannot read the "
            f"run's config ({reader.config}; --script/--flags are for Megatron-LM launches), so no memory or "
            f"throughput is predicted{fixes}")


def _told_by_bridge_line(log: ParsedLog) -> str | None:
    """Megatron-Bridge's `Training ...` line, where the log has one (Megatron-LM prints `training ...`)."""
    if log.framework == "megatron-bridge" and any(m.text.strip() == BRIDGE_TRAINING_LINE for m in log.markers):
        return f"its `{BRIDGE_TRAINING_LINE}` line is Megatron-Bridge's; Megatron-LM prints `training ...`"
    return None
