"""The way out that a refusal names itself.

Megatron-LM's `validate_args`, its config classes and argparse say in their messages which flags to change:
"Use --cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion", "--enable-cuda-graph is
deprecated, use --cuda-graph-impl=local instead", "--logits-save-top-k is required when --logits-save-dir is
set", "argument --fp8-recipe: invalid choice: 'x' (choose from ...)". This module reads those words into
fixes, so a refused run gets the message's own flags rather than "re-check the flags".

The reading walks the message word by word: a verb that asks for a flag (use, pass, set, specify, requires,
together with, ...) makes the flags after it additions, with the value that follows them; a verb that
forbids one (omit, remove, drop, do not use) makes them removals; any other word ends the verb's reach. A
flag that is itself the subject of "is deprecated" / "is no longer valid" / "is not supported" is a removal,
of "is required" / "must be set" / "should be set" an addition; so is an argument the message names as the code
holds it ("overlap_grad_reduce is only supported with ..."), read as its flag from Megatron-LM's own parser tables.
A Transformer Engine release the message asks for ("requires TE version >= 2.12.0") is a way out of its own: a newer
image, with the command that says which one the ranks have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from megapilot.launch.megatron_args import committed_tables

Action = Literal["add", "set", "remove"]

_FLAG = re.compile(r"--[a-z][a-z0-9_-]*[a-z0-9]")
_WORD = re.compile(r"`?--[a-z][a-z0-9_-]*[a-z0-9](?:=[^\s,;`'\")]+)?`?|[A-Za-z0-9_.+/<>-]+|[,;:()]|\.(?=\s|$)")
_ASKS = {"use", "pass", "set", "specify", "add", "enable", "requires", "require", "required", "setting", "provide",
         "try"}
# "together with --x", "in conjunction with --x", "used with --x": the flag after "with" is asked for
_ASKS_WITH = {"together", "conjunction", "used"}
_FORBIDS = {"omit", "remove", "drop", "unset", "disable"}
_NEGATIONS = {"not", "don't", "dont", "never"}
_JOINERS = {",", "or", "and", ":", "(", ")", "the", "flag", "flags", "argument", "arguments", "`"}
# Words that end a flag rather than give it a value.
_NOT_VALUES = {"or", "and", "with", "when", "to", "instead", "for", "if", "in", "is", "are", "only", "as", "together",
               "must", "should", "cannot", "can", "not", "be", "argument", "flag", "which", "that", "but", "on", "at",
               "by", "of", "from", "it", "this", "so", "because", "since", "unless", "while", "then", "was",
               "without", *_ASKS, *_FORBIDS}
# A switch's state said after it ("requires --ddp-average-in-collective off"): not a value, the action.
_SWITCH_STATES: dict[str, Action] = {"off": "remove", "false": "remove", "disabled": "remove", "on": "add",
                                     "true": "add", "enabled": "add"}
_SUBJECT_REMOVED = re.compile(
    r"^(?:is|are) (?:deprecated|no longer (?:valid|supported|used)|not (?:supported|allowed|compatible)|disabled|"
    r"obsolete|removed)|^should not be (?:used|set)|^(?:can ?not|must not) be used|"
    # "--x only supported with the distributed optimizer", "--x not supported with fp16 yet", "--x must be empty
    # when ...": the flag is the feature the rest conditions, and leaving it out is always a way out
    r"^(?:(?:is|are) )?(?:only|not) supported\b|^must be empty\b", re.IGNORECASE)
_SUBJECT_ASKED = re.compile(
    r"^(?:is|are) required|^(?:must|should|needs? to) be (?:set|specified|provided|given|passed|enabled)",
    re.IGNORECASE)
_INVALID_CHOICE = re.compile(r"argument (--[a-z][\w-]*)(?:/[^:]*)?: invalid choice: '([^']*)' \(choose from ([^)]*)\)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments:(.*)")
# "set `NVTE_ROCM_ENABLE_MXFP8=1`", "setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1", "Setting
# NCCL_GRAPH_REGISTER=0 to avoid ..." (the verb in any case; the variable's name in capitals)
_ENV_ASKED = re.compile(r"\b(?i:set(?:ting)?|export|requires?)\s+(?:the\s+)?(?:environment\s+variable\s+)?"
                        r"`?([A-Z][A-Z0-9_]{2,})`?\s*(?:=|\bto\b)\s*`?([\w.:/-]+?)`?(?=[\s.,;]|$)")
# the variable first: "NVTE_CPU_OFFLOAD_V1 should be set to 1" (core_v0.19.0 validate_args, fine-grained offloading)
_ENV_TO_BE_SET = re.compile(r"\b([A-Z][A-Z0-9_]{2,})`?\s+(?i:should|must|needs?\s+to)\s+be\s+set\s+to\s+"
                            r"`?([\w.:/-]+?)`?(?=[\s.,;]|$)")

# "unset NVTE_FLASH_ATTN, NVTE_FUSED_ATTN and NVTE_UNFUSED_ATTN" (Megatron-Core's attention-backend check)
_ENV_UNSET = re.compile(r"\b(?i:unset)\s+((?:`?[A-Z][A-Z0-9_]{2,}`?(?:\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)?)+)")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{2,}")
# "requires TE version >= 2.12.0", "only supported with TE >= 2.8.0", "Please install TE >= 2.1.0", "requires
# TransformerEngine version >= 1.5", "TE version >= 2.3.0 is required", "Only TE >= 2.3.0 supports ...": Megatron-Core's
# is_te_min_version checks, where the ranks' Transformer Engine is older than a feature the flags turn on. Asked for,
# not a condition ("For fine-grained activation offloading with TE >= 2.10.0, NVTE_CPU_OFFLOAD_V1 should be set").
_TE = r"(?:TE|Transformer ?Engine|transformer_engine)(?:\s+version)?\s*(?:>=|≥)\s*v?(\d+\.\d+(?:\.\d+)?)"
_TE_VERSION_NEEDED = re.compile(
    r"\b(?:requires?|install|upgrade|supported with|only|us(?:e|ing)(?: a compatible)?)\s+" + _TE
    + r"|\b" + _TE + r"\s+(?:is required|supports)\b", re.IGNORECASE)
TE_VERSION_CHECK = "python -c 'import transformer_engine as te; print(te.__version__)'"


@dataclass(frozen=True)
class NamedChange:
    """One change a refusal's message asks for: a Megatron flag, or an environment variable (`kind` env);
    `value` when the message gives one."""

    action: Action
    flag: str
    value: str | None
    reason: str
    kind: Literal["megatron_flag", "env", "advice", "command"] = "megatron_flag"
    alternative: int = 0  # "use --a, or omit --b": two ways out, numbered in the message's order


def changes_named_in(message: str) -> list[NamedChange]:
    """The flag changes the message asks for, in its order, each flag once."""
    changes = _argparse_changes(message) or _worded_changes(_DEST.sub(_as_flag, message))
    changes += [NamedChange("set", name, value, "named in the refusal", kind="env")
                for name, value in _ENV_ASKED.findall(message) + _ENV_TO_BE_SET.findall(message)]
    changes += [NamedChange("remove", name, None, "named in the refusal", kind="env")
                for names in _ENV_UNSET.findall(message) for name in _ENV_NAME.findall(names)]
    if (version := transformer_engine_needed(message)) is not None:  # a way out beside turning the feature off
        upgrade = max((change.alternative + 1 for change in changes), default=0)
        changes += [NamedChange("add", f"run Transformer Engine {version} or newer (a newer container image)", None,
                                "what the feature needs", kind="advice", alternative=upgrade),
                    NamedChange("add", TE_VERSION_CHECK, None, "the version the ranks' image has", kind="command",
                                alternative=upgrade)]
    seen: set[str] = set()
    unique = []
    for change in changes:
        if change.flag not in seen:
            seen.add(change.flag)
            unique.append(change)
    return unique


# An argument named as the code holds it, not as args.<name> and not as a call: read as its flag where it is the
# subject of a removal or a request ("overlap_grad_reduce is only supported with ...", "linear_key_head_dim must be
# set for ..."), and only there (after "set", "enable" or "in" the sentence says more than the word walk reads:
# "set use_te_activation_func to False", "moe_act in recompute_modules").
_DEST = re.compile(r"(?<![\w.`-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w.(`-])")


@lru_cache(maxsize=1)
def _flag_of_dest() -> dict[str, str]:
    """Megatron-LM's flags by the argument name they set, the newest release's first: switches and one-value flags.
    An inverted switch (--no-x, whose argument is x) is left out, its argument's name says the opposite of the flag;
    so is a list (--recompute-modules), where a message names one of its entries, not the whole flag."""
    flags: dict[str, str] = {}
    for table in reversed(committed_tables()):
        for flag in table.flags.values():
            if flag.action != "store_false" and not flag.takes_many and flag.name == "--" + flag.dest.replace("_", "-"):
                flags.setdefault(flag.dest, flag.name)
    return flags


def _as_flag(found: re.Match[str]) -> str:
    rest = found.string[found.end():].lstrip()
    subject = _SUBJECT_REMOVED.match(rest) or _SUBJECT_ASKED.match(rest)
    return _flag_of_dest().get(found.group(0), found.group(0)) if subject else found.group(0)


def transformer_engine_needed(message: str) -> str | None:
    """The Transformer Engine release the message asks for ("2.12.0"), or None."""
    found = _TE_VERSION_NEEDED.search(message)
    return (found.group(1) or found.group(2)) if found else None


def _argparse_changes(message: str) -> list[NamedChange]:
    choice = _INVALID_CHOICE.search(message)
    if choice:
        flag, given, allowed = choice.groups()
        return [NamedChange("set", flag, None, f"{given!r} is not one of {allowed}")]
    unrecognized = _UNRECOGNIZED.search(message)
    if unrecognized:
        return [NamedChange("remove", flag, None, "not a flag of this Megatron-LM version")
                for flag in _FLAG.findall(unrecognized.group(1))]
    return []


def _worded_changes(message: str) -> list[NamedChange]:
    words = [w.strip("`") for w in _WORD.findall(message)]
    changes: list[NamedChange] = []
    mode: Action | None = None
    alternative, after_or = 0, False
    for index, word in enumerate(words):
        lower = word.lower().rstrip(".")
        if _FLAG.fullmatch(word.split("=", 1)[0]):
            flag, value = _flag_and_value(words, index)
            subject = _subject_change(flag, words, index)
            if mode is not None:
                if after_or and mode != "remove" and changes:  # "requires --load or --pretrained-checkpoint"
                    alternative += 1
                action: Action = "remove" if mode == "remove" else ("set" if value is not None else "add")
                if value is not None and value.lower() in _SWITCH_STATES and mode != "remove":
                    action, value = _SWITCH_STATES[value.lower()], None
                changes.append(NamedChange(action, flag, None if mode == "remove" else value,
                                           "named in the refusal", alternative=alternative))
            elif subject is not None:
                changes.append(subject)
            after_or = False
            continue
        if _is_value_of_previous_flag(words, index):
            continue
        new_mode = _mode_after(lower, words, index, mode)
        if new_mode is not None and new_mode != mode and after_or and changes:  # "..., or omit --b"
            alternative += 1
            after_or = False
        mode = new_mode
        after_or = after_or or lower == "or"
    return changes


def _mode_after(lower: str, words: list[str], index: int, mode: Action | None) -> Action | None:
    """The verb's reach after this word: asked-for flags, forbidden ones, or none."""
    previous = words[index - 1].lower() if index else ""
    if lower in _ASKS:
        if previous == "to":  # "To use --x without UVM, ...": a condition, not an instruction
            return None
        return "remove" if previous in _NEGATIONS else "add"
    if lower == "with" and previous in _ASKS_WITH:  # but not "should not be used with --x"
        return None if _NEGATIONS & {w.lower() for w in words[max(0, index - 4):index]} else "add"
    if lower in _FORBIDS:
        return "remove"
    if lower in _JOINERS and mode is not None:
        return mode
    return None


def _flag_and_value(words: list[str], index: int) -> tuple[str, str | None]:
    flag, _, value = words[index].partition("=")
    if value:
        return flag, value.rstrip(".,;")
    following = words[index + 1] if index + 1 < len(words) else ""
    if not following or following.startswith("--") or following.lower().rstrip(".") in _NOT_VALUES:
        return flag, None
    if not re.fullmatch(r"[\w.+/-]+", following) or following in {".", ","}:
        return flag, None
    return flag, following.rstrip(".")


def _is_value_of_previous_flag(words: list[str], index: int) -> bool:
    if index == 0 or not words[index - 1].startswith("--") or "=" in words[index - 1]:
        return False
    return _flag_and_value(words, index - 1)[1] is not None


def _subject_change(flag: str, words: list[str], index: int) -> NamedChange | None:
    """What "FLAG is deprecated" / "FLAG is required" asks of the flag it is said of."""
    rest = " ".join(w for w in words[index + 1:index + 6] if w not in {",", "`"})
    for action, pattern in (("remove", _SUBJECT_REMOVED), ("add", _SUBJECT_ASKED)):
        said = pattern.search(rest)
        if said:
            return NamedChange(action, flag, None, f"the refusal says it {said.group(0)}")  # type: ignore[arg-type]
    return None
