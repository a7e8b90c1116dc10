"""The row type of the generated layout options."""

from __future__ import annotations

from typing import get_args

from megapilot.cli.layout_field import LayoutField, OptionKind
from megapilot.cli.layout_fields import LAYOUT_OPTIONS


def test_every_generated_row_is_a_layout_field_of_a_known_kind() -> None:
    assert LAYOUT_OPTIONS and all(isinstance(row, LayoutField) for row in LAYOUT_OPTIONS)
    assert {row.kind for row in LAYOUT_OPTIONS} <= set(get_args(OptionKind))


def test_a_switch_is_named_and_an_on_off_option_names_its_off_form() -> None:
    for row in LAYOUT_OPTIONS:
        if row.kind == "switch":
            assert row.names, row.name
        if row.kind == "on_off":
            assert any("/--no-" in name for name in row.names), row.name
