"""The layout's command-line options, one per field of ParallelConfig but DP, with the field's help: every one is an
option of `estimate` and `script` (LayoutFlags), in --help's order."""

from __future__ import annotations

from dataclasses import fields

import annotated_types
import pytest

from megapilot.cli.layout_fields import LAYOUT_OPTIONS
from megapilot.cli.layout_options import LayoutFlags
from megapilot.errors import MegapilotError
from megapilot.estimate.cases import CaseFlags
from megapilot.spec.parallel import LAYOUT_FIELDS, ParallelConfig


def test_every_layout_field_is_an_option_whose_help_is_the_fields_description():
    assert tuple(option.name for option in LAYOUT_OPTIONS) == LAYOUT_FIELDS
    assert set(LAYOUT_FIELDS) <= {item.name for item in fields(LayoutFlags)}
    for option in LAYOUT_OPTIONS:
        field = ParallelConfig.model_fields[option.name]
        assert option.description == field.description, option.name
        assert option.help.startswith(field.description.removesuffix(".").removesuffix(")")), option.name


@pytest.mark.parametrize(("name", "help"), [
    ("tp", "Tensor parallel size (default: 1)."),
    ("recompute", "Activation recomputation granularity: none | selective | full (default: none, as Megatron's)."),
    ("recompute_method", "With full recompute: uniform | block (--recompute-method; default: uniform)."),
    # a None that stands for a value: the CliOption's
    ("etp", "Expert tensor parallel size (default: tp; 1 on a MoE layout with ep > 1, as Megatron-Bridge sets it)."),
    ("sequence_parallel", "Megatron sequence parallelism (needs tp > 1; default: on when tp > 1)."),  # not the field's
    ("fsdp", "Megatron-FSDP: shard weights, grads and optimizer over DP."),  # an off switch: nothing to say
])
def test_an_options_help_ends_with_the_default_a_command_takes(name, help):
    assert next(option for option in LAYOUT_OPTIONS if option.name == name).help == help


def test_the_options_are_listed_hardware_sizes_batch_then_memory_savers_and_split():
    names = [item.name for item in fields(LayoutFlags)]
    assert names[:4] == ["model", "gpu", "gpus", "gpus_per_node"]
    assert names[names.index("mbs") + 1:names.index("mbs") + 5] == ["gbs", "seq_len", "precision", "fp8_recipe"]
    assert names.index("sequence_parallel") == names.index("distributed_optimizer") - 1


def test_each_int_options_bound_is_the_fields_own():
    """The command line declares no bounds of its own: a value below a field's bound reaches LayoutPins, which has
    ParallelConfig's, and is refused there naming the field."""
    base = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 8, "seq_len": 4096}
    checked = []
    for option in (option for option in LAYOUT_OPTIONS if option.kind == "int"):
        bounds = [m.ge for m in ParallelConfig.model_fields[option.name].metadata if isinstance(m, annotated_types.Ge)]
        if not bounds:
            continue
        with pytest.raises(MegapilotError) as refused:
            CaseFlags.parse(LayoutFlags(**{option.name: bounds[0] - 1}).case_flags() | base)
        assert refused.value.field == option.name
        checked.append(option.name)
    assert {"tp", "pp", "mbs", "cpu_offloading_num_layers", "first_stage_layers"} <= set(checked)
