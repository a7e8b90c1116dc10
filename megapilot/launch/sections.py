"""ArgSection: one titled group of Megatron-LM arguments.

Its own module so that the model mapping (`model_flags`) and the rest of the argument list
(`flags`) build sections without importing each other. A flag that carries a spec field as it is
(`--num-layers` is `model.num_layers`) is written from the vocabulary's row (`add_terms`), so the
field a flag renders is the field it is read back into.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megapilot import vocabulary


@dataclass
class ArgSection:
    """One titled group of arguments, rendered as a commented block in the script."""

    title: str
    args: list[str] = field(default_factory=list)

    def add(self, flag: str, *values: object) -> None:
        self.args.append(flag)
        self.args.extend(_format(v) for v in values)

    def add_terms(self, spec: object, *flags: str, left_out_at_default: bool = False) -> None:
        """Each flag with the value of the field its vocabulary row names, read from `spec` (the object the row's
        path starts at: `model.mla.v_head_dim` from the ModelSpec, `parallel.tp` from the ParallelConfig). A
        switch is written when its field is true; a valued flag unless its field is None (or, with
        `left_out_at_default`, holds Megatron's default)."""
        for flag in flags:
            row = vocabulary.term(flag)
            assert row.field is not None, flag
            value = vocabulary.field_value(spec, row.field.partition(".")[2])
            if row.kind == "bool":
                assert isinstance(value, bool), flag  # a switch carries a yes/no field
                if value:
                    self.add(flag)
            elif value is not None and not (left_out_at_default and value == row.default):
                self.add(flag, value)


def _format(value: object) -> str:
    return str(value)  # floats print as Python's shortest round-trip form (3e-05, 0.0003)
