"""The layout's command-line options, one per field of ParallelConfig but DP, with the field's help: every one is an
option of `estimate` and `script` (LayoutFlags), in --help's order."""

from __future__ import annotations

from dataclasses import fields

from megapilot.cli.layout_fields import LAYOUT_OPTIONS
from megapilot.cli.layout_options import LayoutFlags
from megapilot.spec.parallel import LAYOUT_FIELDS, CliOption, ParallelConfig


def test_every_layout_field_is_an_option_with_the_fields_help():
    assert tuple(option.name for option in LAYOUT_OPTIONS) == LAYOUT_FIELDS
    assert set(LAYOUT_FIELDS) <= {item.name for item in fields(LayoutFlags)}
    for option in LAYOUT_OPTIONS:
        (declared,) = [m for m in ParallelConfig.model_fields[option.name].metadata if isinstance(m, CliOption)]
        assert option.help == declared.help, option.name


def test_the_options_are_listed_hardware_sizes_batch_then_memory_savers_and_split():
    names = [item.name for item in fields(LayoutFlags)]
    assert names[:4] == ["model", "gpu", "gpus", "gpus_per_node"]
    assert names[names.index("mbs") + 1:names.index("mbs") + 5] == ["gbs", "seq_len", "precision", "fp8_recipe"]
    assert names.index("sequence_parallel") == names.index("distributed_optimizer") - 1
