"""The generator of the layout's command-line options (megapilot/cli/layout_fields.py) from ParallelConfig's fields:
the committed file is what it writes now, a change in the spec changes it, a field without its option is refused."""

from __future__ import annotations

import pytest

from megapilot.cli import gen_layout_fields
from megapilot.cli.layout_fields import LAYOUT_OPTIONS
from megapilot.spec.parallel import CliOption, ParallelConfig


def test_the_committed_options_are_what_the_generator_writes_from_the_spec():
    committed = gen_layout_fields.TARGET.read_text(encoding="utf-8")
    assert committed == gen_layout_fields.render(), (
        "megapilot/cli/layout_fields.py differs from ParallelConfig's fields: run "
        "`python -m megapilot.cli.gen_layout_fields` and commit the file")


def test_a_description_or_default_changed_in_the_spec_changes_the_generated_file(monkeypatch):
    field = ParallelConfig.model_fields["tp"]
    monkeypatch.setattr(field, "description", "Tensor parallel size, changed.")
    assert '"Tensor parallel size, changed."' in gen_layout_fields.render()
    assert gen_layout_fields.render() != gen_layout_fields.TARGET.read_text(encoding="utf-8")
    changed = [CliOption(default="8 on one node") if isinstance(m, CliOption) else m for m in field.metadata]
    monkeypatch.setattr(field, "metadata", changed)
    assert '"8 on one node"' in gen_layout_fields.render()


def test_a_layout_field_without_a_description_is_refused(monkeypatch):
    monkeypatch.setattr(ParallelConfig.model_fields["cp"], "description", None)
    with pytest.raises(TypeError, match=r"ParallelConfig\.cp has no description"):
        gen_layout_fields.render()


def test_a_layout_field_without_its_option_is_refused(monkeypatch):
    field = ParallelConfig.model_fields["pp"]
    monkeypatch.setattr(field, "metadata", [m for m in field.metadata if not isinstance(m, CliOption)])
    with pytest.raises(TypeError, match=r"ParallelConfig\.pp has no CliOption"):
        gen_layout_fields.render()


@pytest.mark.parametrize(("name", "kind"), [("tp", "int"), ("etp", "int"), ("recompute", "str"),
                                            ("recompute_modules", "str"), ("pipeline_layout", "str"),
                                            ("sequence_parallel", "on_off"), ("fsdp", "switch")])
def test_each_field_type_is_taken_as_the_command_line_types_it(name, kind):
    assert next(option for option in LAYOUT_OPTIONS if option.name == name).kind == kind


def test_a_long_help_is_split_over_lines_and_read_back_whole():
    text = gen_layout_fields.render()
    assert max(len(line) for line in text.splitlines()) <= 120
    namespace: dict = {}
    exec(compile(text, "layout_fields.py", "exec"), namespace)  # the file as Python reads it
    modules = next(o for o in namespace["LAYOUT_OPTIONS"] if o.name == "recompute_modules")
    assert modules.description.startswith("With selective recompute") and "shared_experts" in modules.description
