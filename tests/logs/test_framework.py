"""Which framework wrote a log: the iteration lines' dialect first, then the traceback frames' paths."""

from __future__ import annotations

from collections import Counter
from typing import get_args

import pytest

from megapilot.logs.collect import parse_text
from megapilot.logs.framework import DIALECT_FRAMEWORK, Framework, detect_framework, takes_megatron_flags
from megapilot.logs.records import DIALECTS


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_the_parser_speaks_names_a_framework(dialect):
    framework = detect_framework(dialect, Counter())
    assert framework in get_args(Framework) and framework != "unknown"


def test_primus_torchtitan_lines_are_torchtitan_and_the_rest_keep_their_name():
    assert detect_framework("primus-torchtitan", Counter()) == "torchtitan"
    assert all(detect_framework(d, Counter()) == d for d in DIALECTS if d != "primus-torchtitan")


def test_the_dialect_outranks_the_traceback_frames():
    assert detect_framework("nemo", Counter({"megatron-lm": 40})) == "nemo"


@pytest.mark.parametrize("upper", ["gpt-neox", "megatron-deepspeed"])
def test_deepspeed_lines_under_a_framework_built_on_it_name_that_framework(upper):
    # more DeepSpeed engine lines than the framework's own: the framework still wrote the log
    assert detect_framework("deepspeed", Counter(), {"deepspeed": 90, upper: 3}) == upper
    assert detect_framework("deepspeed", Counter(), {"deepspeed": 90, upper: 0}) == "deepspeed"
    assert detect_framework("deepspeed", Counter()) == "deepspeed"


def test_without_iteration_lines_the_most_common_framework_frame_decides():
    hints = Counter({"site-packages": 50, "torchtitan": 7, "megatron-lm": 3})  # a path hint that is no framework
    assert detect_framework("unknown", hints) == "torchtitan"
    assert detect_framework("unknown", Counter({"site-packages": 5})) == "unknown"
    assert detect_framework("unknown", Counter()) == "unknown"


def test_only_megatron_lm_and_the_forks_that_parse_its_arguments_take_its_flags():
    takes = {name for name in get_args(Framework) if takes_megatron_flags(name)}
    assert takes == {"megatron-lm", "primus-megatron", "megatron-deepspeed", "unknown"}
    assert set(DIALECT_FRAMEWORK.values()) - takes == {"megatron-bridge", "gpt-neox", "deepspeed", "nemo",
                                                       "torchtitan"}


def test_a_parsed_traceback_names_the_framework_its_frames_ran_in():
    text = "\n".join([
        "Traceback (most recent call last):",
        '  File "/opt/torchtitan/torchtitan/train.py", line 500, in <module>',
        '  File "/opt/torchtitan/torchtitan/train.py", line 420, in train',
        '  File "/usr/lib/python3/site-packages/megatron/core/utils.py", line 12, in helper',
        "RuntimeError: boom",
    ])
    log = parse_text(text)
    assert log.dialect == "unknown" and log.framework == "torchtitan"


BRIDGE_ERA_ITERATION = (" [2025-09-24 16:15:40] iteration        1/     100 | consumed samples:          128 | elapsed "
                        "time per iteration (ms): 9070.1 | learning rate: 1.000000E-05 | global batch size:   128 | "
                        "lm loss: 1.187500E+01 | loss scale: 1.0 | grad norm: 9.876 |")


def test_bridges_training_line_names_bridge_with_or_without_iteration_lines():
    # Megatron-Bridge printed `Training ...` before Megatron-LM's own iteration lines (no `Step Time` yet);
    # Megatron-LM prints `training ...`
    bridge = parse_text(f"Training ...\n{BRIDGE_ERA_ITERATION}\n")
    assert bridge.dialect == "megatron-bridge" and bridge.framework == "megatron-bridge"
    assert parse_text("Training ...\nRuntimeError: CUDA out of memory.\n").framework == "megatron-bridge"
    megatron = parse_text(f"training ...\n{BRIDGE_ERA_ITERATION}\n")
    assert megatron.dialect == "megatron-lm" and megatron.framework == "megatron-lm"


def test_bridge_frames_or_lines_outrank_the_megatron_lm_lines_bridge_prints_too():
    assert detect_framework("megatron-lm", Counter({"megatron-lm": 30, "megatron-bridge": 1})) == "megatron-bridge"
    assert detect_framework("nemo", Counter({"megatron-bridge": 3})) == "nemo"
    assert detect_framework("megatron-lm", Counter({"megatron-lm": 30})) == "megatron-lm"
