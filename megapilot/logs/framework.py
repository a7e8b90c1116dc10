"""Which training framework wrote a log: the dialect of its iteration lines, else the paths of its traceback frames.

It decides which fixes a diagnosis may offer: Megatron-LM flags fit Megatron-LM and the forks that parse the same
arguments (Megatron-DeepSpeed, Megatron-LLM, Primus's Megatron backend); torchtitan, GPT-NeoX, DeepSpeed, NeMo and
Megatron-Bridge take their settings from config files or overrides of their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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


#: Frameworks that run on another one print its lines too: every GPT-NeoX and Megatron-DeepSpeed log carries
#: DeepSpeed's engine lines (`steps: N loss: ...`, `[Rank 0] step=N, ...`), often more of them than their own.
BUILT_ON: dict[str, tuple[str, ...]] = {"deepspeed": ("gpt-neox", "megatron-deepspeed")}


#: Frameworks that print another one's iteration lines as they are: Megatron-Bridge runs Megatron-LM's
#: `training_log` layout, so only its own lines (`Training ...`, `Step Time : ...`) or frames tell it apart.
PRINTS_LINES_OF: dict[str, tuple[Framework, ...]] = {"megatron-lm": ("megatron-bridge",)}


def detect_framework(dialect: str, frame_hints: Counter[str],
                     dialect_counts: Mapping[str, int] | None = None) -> Framework:
    """The framework of the dialect most iteration lines spoke (or of the framework built on it, when any of that
    one's own lines appear; or of one that prints that dialect's lines as they are, when its own lines or frames
    appear); without iteration lines, the one most traceback frames ran in; else unknown."""
    for upper in BUILT_ON.get(dialect, ()):
        if dialect_counts and dialect_counts.get(upper):
            return DIALECT_FRAMEWORK[upper]
    for printer in PRINTS_LINES_OF.get(dialect, ()):
        if frame_hints.get(printer):
            return printer
    if dialect in DIALECT_FRAMEWORK:
        return DIALECT_FRAMEWORK[dialect]
    for name, _count in frame_hints.most_common():
        if name in _FRAMEWORKS:
            return _FRAMEWORKS[name]
    return UNKNOWN_FRAMEWORK


def takes_megatron_flags(framework: str) -> bool:
    """Whether fixes may be written as Megatron-LM command-line flags."""
    return framework in MEGATRON_FLAG_FRAMEWORKS
