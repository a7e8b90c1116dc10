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
    description: str  # the field's own (ParallelConfig's Field description)
    default: str | None  # what `estimate` and `script` take when the option is left out; None: nothing to say

    @property
    def help(self) -> str:
        """The option's help in `estimate` and `script`: the description with the default they take."""
        return with_default(self.description, self.default)


def with_default(description: str, default: str | None) -> str:
    """`Tensor parallel size.` with `1` is `Tensor parallel size (default: 1).`; a description that ends in a
    parenthesis takes the default inside it: `... (--recompute-method; default: uniform).`"""
    if default is None:
        return description
    text = description.removesuffix(".")
    if text.endswith(")"):
        return f"{text[:-1]}; default: {default})."
    return f"{text} (default: {default})."
