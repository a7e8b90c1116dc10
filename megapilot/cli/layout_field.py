"""One layout field as a command-line option: the row type of the generated `megapilot.cli.layout_fields`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# int / str: a value (none given: not given); on_off: `--x/--no-x` (none given: not given); switch: `--x` alone.
OptionKind = Literal["int", "str", "on_off", "switch"]


@dataclass(frozen=True)
class LayoutField:
    """One field of ParallelConfig as a command-line option."""

    name: str  # ParallelConfig's field
    kind: OptionKind
    names: tuple[str, ...]  # as declared to the parser; none: `--<name>` with `-` for `_`
    help: str
