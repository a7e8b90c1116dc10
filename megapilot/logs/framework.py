"""Which training framework wrote a log: the dialect of its iteration lines, else the paths of its traceback frames.

It decides which fixes a diagnosis may offer: Megatron-LM flags fit Megatron-LM and the forks that parse the same
arguments (Megatron-DeepSpeed, Megatron-LLM, Primus's Megatron backend); torchtitan, GPT-NeoX, DeepSpeed, NeMo and
Megatron-Bridge take their settings from config files or overrides of their own.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal, get_args

Framework = Literal["megatron-lm", "megatron-bridge", "primus-megatron", "megatron-deepspeed", "gpt-neox",
                    "deepspeed", "nemo", "torchtitan", "unknown"]
UNKNOWN_FRAMEWORK: Framework = "unknown"

DIALECT_FRAMEWORK: dict[str, Framework] = {
    "megatron-lm": "megatron-lm", "megatron-bridge": "megatron-bridge", "primus-megatron": "primus-megatron",
    "primus-torchtitan": "torchtitan", "megatron-deepspeed": "megatron-deepspeed", "gpt-neox": "gpt-neox",
    "deepspeed": "deepspeed", "nemo": "nemo",
}
_FRAMEWORKS: dict[str, Framework] = {name: name for name in get_args(Framework)}
#: Frameworks whose runs take Megatron-LM's command-line flags (and so the fixes written as such flags). A log that
#: names no framework gets them too: the product's runs are Megatron's.
MEGATRON_FLAG_FRAMEWORKS: frozenset[str] = frozenset({"megatron-lm", "primus-megatron", "megatron-deepspeed",
                                                      UNKNOWN_FRAMEWORK})


def detect_framework(dialect: str, frame_hints: Counter[str]) -> Framework:
    """The framework of the dialect most iteration lines spoke; without iteration lines, the one most traceback
    frames ran in; else unknown."""
    if dialect in DIALECT_FRAMEWORK:
        return DIALECT_FRAMEWORK[dialect]
    for name, _count in frame_hints.most_common():
        if name in _FRAMEWORKS:
            return _FRAMEWORKS[name]
    return UNKNOWN_FRAMEWORK


def takes_megatron_flags(framework: str) -> bool:
    """Whether fixes may be written as Megatron-LM command-line flags."""
    return framework in MEGATRON_FLAG_FRAMEWORKS
