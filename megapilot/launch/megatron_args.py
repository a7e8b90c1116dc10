"""The pinned Megatron-LM flag list: which `pretrain_gpt.py` options exist, take a value, have choices.

The list is data (`data/megatron_args_core_v0.16.0.json`), extracted from Megatron-LM's own argument
parser at the release that matches the megatron-core the embedded trainer uses (the extraction tool
sits next to it). Every argument list megapilot renders is checked against it before a script is
written, so a renamed or misspelled flag fails here rather than on the cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from megapilot.errors import MegapilotError

MEGATRON_RELEASE = "core_v0.16.0"
MEGATRON_COMMIT = "3bec9aa97dda898d16ff5a89bac0ed2b6682b172"
_DATA_FILE = f"megatron_args_{MEGATRON_RELEASE}.json"


@dataclass(frozen=True)
class MegatronFlag:
    """One option of Megatron-LM's parser."""

    name: str
    dest: str
    action: str  # store | store_true | store_false | BooleanOptionalAction
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None

    @property
    def takes_many(self) -> bool:
        """nargs '+' / '*': one or more values follow the flag."""
        return self.nargs in ("+", "*")


@lru_cache(maxsize=1)
def pinned_flags() -> dict[str, MegatronFlag]:
    """All flags of the pinned release, keyed by name (`--num-layers`)."""
    raw = json.loads(resources.files("megapilot.launch.data").joinpath(_DATA_FILE).read_text())
    if raw["release"] != MEGATRON_RELEASE:
        raise RuntimeError(f"{_DATA_FILE} records release {raw['release']}, expected {MEGATRON_RELEASE}")
    return {
        name: MegatronFlag(
            name=name, dest=info["dest"], action=info["action"], takes_value=info["takes_value"],
            nargs=info["nargs"], choices=tuple(info["choices"]) if info["choices"] else None,
        )
        for name, info in raw["flags"].items()
    }


def flag(name: str) -> MegatronFlag:
    """Look up one flag; an unknown name is a MegapilotError naming the pinned release."""
    known = pinned_flags()
    if name not in known:
        close = sorted(n for n in known if n.split("-")[2:3] == name.split("-")[2:3])[:3]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise MegapilotError(
            f"{name} is not a flag of Megatron-LM {MEGATRON_RELEASE} pretrain_gpt.py{hint}",
            field="megatron_args",
            fix=f"use a flag from Megatron-LM {MEGATRON_RELEASE} megatron/training/arguments.py",
        )
    return known[name]


def split_args(args: list[str]) -> list[tuple[str, list[str]]]:
    """Group a flat argument list into (flag, values) pairs, checking each against the pinned parser.

    Raises MegapilotError for an unknown flag, a missing or extra value, or a value outside the
    flag's choices.
    """
    pairs: list[tuple[str, list[str]]] = []
    index = 0
    while index < len(args):
        name = args[index]
        if not name.startswith("--"):
            raise MegapilotError(f"value {name!r} does not follow a flag that takes one",
                                 field="megatron_args", fix="remove it or add the flag it belongs to")
        spec = flag(name)
        index += 1
        values: list[str] = []
        while index < len(args) and not _looks_like_flag(args[index]):
            values.append(args[index])
            index += 1
        _check_arity(spec, values)
        _check_choices(spec, values)
        pairs.append((name, values))
    return pairs


def _looks_like_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2 and not token[2].isdigit()


def _check_arity(spec: MegatronFlag, values: list[str]) -> None:
    if not spec.takes_value and values:
        raise MegapilotError(f"{spec.name} is a switch but got {values}", field="megatron_args",
                             fix=f"pass {spec.name} without a value")
    if spec.takes_value and spec.nargs != "*" and not values:
        raise MegapilotError(f"{spec.name} needs a value", field="megatron_args",
                             fix=f"pass {spec.name} VALUE")
    if spec.takes_value and not spec.takes_many and len(values) > 1:
        raise MegapilotError(f"{spec.name} takes one value, got {values}", field="megatron_args",
                             fix=f"pass a single value after {spec.name}")


def _check_choices(spec: MegatronFlag, values: list[str]) -> None:
    if spec.choices is None:
        return
    for value in values:
        if value not in spec.choices:
            raise MegapilotError(
                f"{spec.name} {value!r} is not one of {', '.join(spec.choices)}",
                field="megatron_args", fix=f"use one of the choices of {spec.name}",
            )
