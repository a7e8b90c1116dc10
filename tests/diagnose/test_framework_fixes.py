"""Fixes for a framework that does not take Megatron-LM flags are that framework's own settings."""

from __future__ import annotations

from typing import get_args

import pytest

from megapilot.diagnose.framework_fixes import (
    allocator_fix,
    divergence_fixes,
    memory_fixes,
    not_megatron_statement,
    runs_on_rocm,
    synchronous_save_fix,
)
from megapilot.logs.collect import parse_text
from megapilot.logs.framework import Framework, takes_megatron_flags

OWN_SETTINGS = [name for name in get_args(Framework) if not takes_megatron_flags(name)]
MEGATRON_FLAGS = [name for name in get_args(Framework) if takes_megatron_flags(name)]

HIP_OOM = "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 192 GiB"
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 79 GiB"
PRIMUS_STEP = ("[rank-0/8][INFO] iteration        5/     100 | consumed samples:           40 | "
               "elapsed time per iteration (ms): 1000.0/1000.0 | lm loss: 1.0E+01 |")
PRIMUS_FRAME = ("Traceback (most recent call last):\n"
                '  File "/workspace/Primus/primus/modules/trainer/torchtitan/pre_trainer.py", line 92, in run')
TITAN_STEP = "step:  5  loss:  8.1  memory: 61.2GiB(32.1%)  tps: 1,234  tflops: 100.0  mfu: 20.0%"


@pytest.mark.parametrize("framework", MEGATRON_FLAGS)
def test_a_framework_that_takes_megatron_flags_gets_no_settings_of_its_own(framework):
    assert memory_fixes(framework) is None and divergence_fixes(framework) is None


@pytest.mark.parametrize("framework", OWN_SETTINGS)
def test_every_other_framework_gets_config_settings_never_a_megatron_flag(framework):
    fixes = (memory_fixes(framework) or []) + (divergence_fixes(framework) or [])
    assert len(fixes) == 6
    for fix in fixes:
        assert fix.kind == "config", fix
        # torchtitan's overrides are `--section.key`; a bare `--name` would read as a Megatron-LM flag
        assert not fix.flag.startswith("--") or "." in fix.flag, fix


@pytest.mark.parametrize("framework", OWN_SETTINGS)
def test_the_remedies_are_the_same_as_for_megatron(framework):
    memory = memory_fixes(framework) or []
    assert len({fix.option for fix in memory}) == 3 and None not in {fix.option for fix in memory}
    reasons = " ".join(fix.reason for fix in divergence_fixes(framework) or [])
    for remedy in ("learning rate", "warm", "clip"):
        assert remedy in reasons, (framework, remedy)


def test_the_lists_handed_out_are_copies():
    first = memory_fixes("torchtitan")
    assert first is not None
    first.clear()
    assert memory_fixes("torchtitan")


@pytest.mark.parametrize(("lines", "variable"), [
    ([HIP_OOM], "PYTORCH_HIP_ALLOC_CONF"),
    ([CUDA_OOM], "PYTORCH_CUDA_ALLOC_CONF"),
    ([PRIMUS_STEP, CUDA_OOM], "PYTORCH_HIP_ALLOC_CONF"),  # Primus runs on ROCm, whatever a message says
    ([TITAN_STEP], "PYTORCH_CUDA_ALLOC_CONF"),  # upstream torchtitan prints the same step line, on CUDA
    ([TITAN_STEP, PRIMUS_FRAME, CUDA_OOM], "PYTORCH_HIP_ALLOC_CONF"),  # a Primus frame says ROCm
    (["RuntimeError: the chip reported an error"], "PYTORCH_CUDA_ALLOC_CONF"),  # "chip" is not HIP
])
def test_the_allocator_variable_follows_the_device_the_log_names(lines, variable):
    log = parse_text("\n".join(lines))
    fix = allocator_fix(log)
    assert (fix.flag, fix.value, fix.kind) == (variable, "expandable_segments:True", "env")
    assert runs_on_rocm(log) is (variable == "PYTORCH_HIP_ALLOC_CONF")


@pytest.mark.parametrize(("framework", "flag", "kind"), [
    ("megatron-lm", "--async-save", "megatron_flag"), ("primus-megatron", "--async-save", "megatron_flag"),
    ("nemo", "trainer.strategy.ckpt_async_save", "config"), ("megatron-bridge", "checkpoint.async_save", "config"),
    ("torchtitan", "--checkpoint.async_mode", "config"),
])
def test_a_synchronous_save_is_each_frameworks_own_switch(framework, flag, kind):
    fix = synchronous_save_fix(framework, "isolate the writer")
    assert fix is not None and (fix.flag, fix.kind, fix.reason) == (flag, kind, "isolate the writer")


@pytest.mark.parametrize("framework", ["gpt-neox", "deepspeed"])
def test_frameworks_that_save_synchronously_get_no_switch(framework):
    assert synchronous_save_fix(framework, "why") is None


DEEPSPEED_STEP = ("[2026-02-03 11:00:01,000] [INFO] [engine.py:3174:_take_model_step] steps: 10 loss: 7.0500 "
                  "iter time (s): 2.350 samples/sec: 27.200")
DEEPSPEED_FRAME = ("Traceback (most recent call last):\n"
                   '  File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 3137, in save\n'
                   "RuntimeError: boom")


def test_a_deepspeed_log_is_said_to_be_deepspeeds_with_what_is_read_of_it():
    stepped = not_megatron_statement(parse_text(DEEPSPEED_STEP), config_fixes=True)
    assert stepped == ("this log is DeepSpeed's, not Megatron-LM's (its `steps: N loss: ...` lines are DeepSpeed's): "
                       "megapilot reads each step's loss and time and the error lines; it cannot read the run's config "
                       "(DeepSpeed's ds_config JSON; --script/--flags are for Megatron-LM launches), so no memory or "
                       "throughput is predicted, and the fixes are settings of that config")
    crashed = not_megatron_statement(parse_text(DEEPSPEED_FRAME), config_fixes=False)
    assert crashed is not None and crashed.startswith("this log is DeepSpeed's, not Megatron-LM's (its traceback runs "
                                                      "in DeepSpeed's code): megapilot reads its error lines and "
                                                      "tracebacks; ")
    assert crashed.endswith("so no memory or throughput is predicted")


BRIDGE_STEP = ("Step Time : 9.07s GPU utilization: 744.0MODEL_TFLOP/s/GPU\n"
               "[2026-01-01 00:10:00] iteration       10/      50 | consumed samples:         1280 | elapsed time per "
               "iteration (ms): 9070.1 | global batch size:   128 | lm loss: 7.123456E+00 |")


@pytest.mark.parametrize("text", [CUDA_OOM, PRIMUS_STEP])
def test_no_statement_for_a_log_of_megatron_or_a_framework_it_is_not_said_of(text: str):
    assert not_megatron_statement(parse_text(text), config_fixes=True) is None


NEMO_STEP = ("Training epoch 0, iteration 3/149 | lr: 3e-05 | consumed_samples: 32 | global_batch_size: 8 | "
             "global_step: 3 | reduced_train_loss: 8.24 | train_step_timing in s: 2.053")
NEMO_LOGGER = ("[NeMo I 2025-10-08 23:27:54 nemo_logging:393] Global Checkpoint Save : Rank: 0 : Iteration: 937\n"
               "[c608-061:2760180:0:2760180] Caught signal 11 (Segmentation fault: address not mapped to object)")
TITAN_FRAME = ("Traceback (most recent call last):\n"
               '  File "/workspace/torchtitan/torchtitan/train.py", line 512, in train_step\n'
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 11.74 GiB.")


@pytest.mark.parametrize(("text", "told", "read", "config"), [
    (TITAN_STEP, "its `step: N  loss: ...` lines are torchtitan's", "each step's loss, memory, tokens/s and MFU and "
     "the error lines", "torchtitan's TOML job config, or its --section.key overrides"),
    (TITAN_FRAME, "its traceback runs in torchtitan's code", "its error lines and tracebacks",
     "torchtitan's TOML job config, or its --section.key overrides"),
    (NEMO_STEP, "its progress lines with `reduced_train_loss` are NeMo's", "each step's loss and time and the error "
     "lines", "NeMo's recipe or YAML config, or their `model.x=y` overrides"),
    (NEMO_LOGGER, "its `[NeMo I ...]` logger lines or its traceback frames are NeMo's", "its error lines and "
     "tracebacks", "NeMo's recipe or YAML config, or their `model.x=y` overrides"),
], ids=["torchtitan-steps", "torchtitan-frames", "nemo-steps", "nemo-logger"])
def test_a_torchtitan_or_nemo_log_is_said_to_be_that_frameworks_with_where_its_settings_live(text, told, read, config):
    log = parse_text(text)
    whose = "torchtitan's" if log.framework == "torchtitan" else "NeMo's"
    assert not_megatron_statement(log, config_fixes=True) == (
        f"this log is {whose}, not Megatron-LM's ({told}): megapilot reads {read}; it cannot read the run's config "
        f"({config}; --script/--flags are for Megatron-LM launches), so no memory or throughput is predicted, and "
        "the fixes are settings of that config")


BRIDGE_CONFIG = ("the recipe's ConfigContainer its run_recipe script builds, or that script's `model.x=y` overrides")
BRIDGE_FRAME = ("Traceback (most recent call last):\n"
                '  File "/opt/Megatron-Bridge/src/megatron/bridge/training/train.py", line 210, in train\n'
                f"{CUDA_OOM}")


@pytest.mark.parametrize(("text", "told", "read"), [
    (BRIDGE_STEP, "its iteration lines follow Megatron-Bridge's own `Step Time : ...` lines, `memory (GB)` reports "
     "or `Training ...` line", "each step's loss, time and TFLOP/s/GPU and the error lines"),
    (BRIDGE_FRAME, "its traceback runs in Megatron-Bridge's code", "its error lines and tracebacks"),
    ("Training ...\n" + CUDA_OOM, "its `Training ...` line is Megatron-Bridge's; Megatron-LM prints `training ...`",
     "its error lines and tracebacks"),
], ids=["bridge-steps", "bridge-frames", "bridge-training-line"])
def test_a_megatron_bridge_log_is_said_to_be_bridges_with_its_recipe_as_where_its_settings_live(text, told, read):
    log = parse_text(text)
    assert log.framework == "megatron-bridge"
    assert not_megatron_statement(log, config_fixes=True) == (
        f"this log is Megatron-Bridge's, not Megatron-LM's ({told}): megapilot reads {read}; it cannot read the run's "
        f"config ({BRIDGE_CONFIG}; --script/--flags are for Megatron-LM launches), so no memory or throughput is "
        "predicted, and the fixes are settings of that config")


@pytest.mark.parametrize("framework", OWN_SETTINGS)
def test_every_framework_with_settings_of_its_own_is_said_by_name(framework: str):
    """Fixes in a framework's own settings stand beside a statement of whose log it is, never 'fixes are generic'."""
    from megapilot.diagnose.framework_fixes import _NOT_MEGATRON

    assert framework in _NOT_MEGATRON


def test_a_megatron_bridge_oom_gets_recipe_overrides_and_never_the_generic_note():
    from megapilot.diagnose.engine import diagnose_log

    result = diagnose_log(parse_text(BRIDGE_STEP + "\n" + CUDA_OOM), None)
    fixes = [fix for finding in result.findings for fix in finding.fixes]
    assert {"model.recompute_granularity", "train.micro_batch_size"} <= {fix.flag for fix in fixes}
    notes = [note.text for note in result.notes]
    assert notes[0].startswith("this log is Megatron-Bridge's") and notes[0].endswith("settings of that config")
    assert not any("fixes are generic" in note for note in notes)
