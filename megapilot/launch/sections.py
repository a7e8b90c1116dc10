"""ArgSection: one titled group of Megatron-LM arguments.

Its own module so that the model mapping (`model_flags`) and the rest of the argument list
(`flags`) build sections without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ArgSection:
    """One titled group of arguments, rendered as a commented block in the script."""

    title: str
    args: list[str] = field(default_factory=list)

    def add(self, flag: str, *values: object) -> None:
        self.args.append(flag)
        self.args.extend(_format(v) for v in values)


def _format(value: object) -> str:
    return str(value)  # floats print as Python's shortest round-trip form (3e-05, 0.0003)
