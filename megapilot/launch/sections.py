"""ArgSection: one titled group of Megatron-LM arguments.

Its own module so that the model mapping (`model_flags`) and the rest of the argument list
(`flags`) build sections without importing each other. A flag whose vocabulary row says how it carries a spec
field (`--num-layers` is `model.num_layers` as it is; `--disable-bias-linear` is `model.add_bias_linear`
inverted) is written from that row (`add_terms`), so the field a flag renders is the field it is read back into,
by the same rule.
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
        path starts at: `model.mla.v_head_dim` from the ModelSpec, `parallel.tp` from the ParallelConfig) and
        rendered as the row says (`Term.rendered`). A switch is written when that is true; a valued flag unless it
        is None (or, with `left_out_at_default`, holds Megatron's default)."""
        for flag in flags:
            row = vocabulary.term(flag)
            assert row.field is not None, flag
            context = (vocabulary.field_value(spec, path.partition(".")[2]) for path in row.context_paths)
            value = row.rendered(vocabulary.field_value(spec, row.field.partition(".")[2]), *context)
            if row.kind == "bool":
                assert isinstance(value, bool), flag  # a switch carries a yes/no field
                if value:
                    self.add(flag)
            elif value is not None and not (left_out_at_default and value == row.default):
                self.add(flag, value)


def _format(value: object) -> str:
    return str(value)  # floats print as Python's shortest round-trip form (3e-05, 0.0003)
