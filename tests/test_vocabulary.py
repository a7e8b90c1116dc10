"""The Megatron vocabulary against the per-release parser tables it names, and against its readers."""

from __future__ import annotations

import typing

import pytest

from megapilot.launch.megatron_args import committed_tables
from megapilot.spec import ModelSpec, ParallelConfig, TrainingSpec
from megapilot.trainer.args import FLAGS
from megapilot.vocabulary import TERMS, Term, term

TABLES = committed_tables()


def _releases_with(flag: str) -> list[str]:
    return [table.release for table in TABLES if flag in table.flags]


@pytest.mark.parametrize("row", TERMS, ids=lambda row: row.flag)
def test_every_row_names_the_releases_that_have_its_flag(row: Term) -> None:
    have = _releases_with(row.flag)
    assert have, f"{row.flag} is in no committed release"
    first = None if have[0] == TABLES[0].release else have[0]
    last = None if have[-1] == TABLES[-1].release else have[-1]
    assert (row.since, row.until) == (first, last)
    # and every release between them has it (no gap a since/until pair cannot say)
    names = [table.release for table in TABLES]
    assert have == names[names.index(have[0]):names.index(have[-1]) + 1]


@pytest.mark.parametrize("row", TERMS, ids=lambda row: row.flag)
def test_every_row_has_the_parsers_kind_and_destination(row: Term) -> None:
    parsed = next(table for table in reversed(TABLES) if row.flag in table.flags).flags[row.flag]
    assert parsed.dest == row.dest
    assert (row.kind == "bool") == (not parsed.takes_value)
    assert (row.kind == "bool") == (row.default is False)


def test_flags_are_stated_once() -> None:
    flags = [row.flag for row in TERMS]
    assert len(flags) == len(set(flags))


def test_the_trainer_takes_type_default_and_meaning_from_the_vocabulary() -> None:
    shared = [flag for flag in FLAGS if any(row.flag == flag.name for row in TERMS)]
    assert len(shared) > 80
    for flag in shared:
        row = term(flag.name)
        assert (flag.kind, flag.default, flag.help) == (row.kind, row.default, row.meaning)


def test_a_default_is_stated_once_and_read_back_from_a_script_that_leaves_the_flag_out() -> None:
    from megapilot.diagnose.flags import collect_flags, run_config

    flags = collect_flags(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                           "--seq-length", "32", "--num-experts", "4", "--multi-latent-attention"])
    config = run_config(flags, gpus=1)
    assert config.model is not None and config.model.moe is not None and config.model.mla is not None
    assert config.model.moe.router_topk == term("--moe-router-topk").default
    assert config.model.mla.kv_lora_rank == term("--kv-lora-rank").default
    assert config.model.norm_epsilon == term("--norm-epsilon").default


def _classes(annotation: object) -> list[type]:
    """The classes an annotation admits, through Optional, unions and Annotated."""
    if isinstance(annotation, type):
        return [annotation]
    return [cls for arg in typing.get_args(annotation) for cls in _classes(arg)]


def _has_field(owner: type, path: list[str]) -> bool:
    """Whether a spec class has the field path, through optional and union-typed sub-specs."""
    fields = getattr(owner, "model_fields", {})
    if path[0] not in fields:
        return False
    return len(path) == 1 or any(_has_field(cls, path[1:]) for cls in _classes(fields[path[0]].annotation)
                                 if hasattr(cls, "model_fields"))


@pytest.mark.parametrize("row", [row for row in TERMS if row.field], ids=lambda row: row.flag)
def test_every_field_path_names_a_spec_field(row: Term) -> None:
    roots = {"model": ModelSpec, "parallel": ParallelConfig, "training": TrainingSpec}
    root, *path = (row.field or "").split(".")
    assert _has_field(roots[root], path), f"{row.flag}: {row.field} is not a field of the specs"


def test_the_training_section_is_written_from_the_rows() -> None:
    from megapilot.launch.flags import TRAINING_FLAGS

    assert all(term(flag).field for flag in TRAINING_FLAGS)


# Flags of the model and parallelism sections whose value is neither their row's field as it is nor the row's
# `Derivation` of it (each written by its own rule in launch/, the row says why).
DERIVED_FLAGS = {row.flag: row.own_rule for row in TERMS if row.own_rule}


def test_a_row_with_its_own_rule_says_it_instead_of_a_derivation() -> None:
    assert set(DERIVED_FLAGS) == {"--max-position-embeddings", "--recompute-num-layers", "--use-rope-scaling",
                                  "--position-embedding-type", "--multi-latent-attention", "--qk-layernorm",
                                  "--moe-layer-freq",
                                  "--use-distributed-optimizer", "--hybrid-override-pattern", "--hybrid-layer-pattern"}
    assert all(row.field and row.derived is None for row in TERMS if row.own_rule)


def test_the_model_and_parallel_sections_write_each_field_from_its_row() -> None:
    from megapilot.launch.flags import megatron_arg_sections
    from megapilot.vocabulary import field_value
    from tests.launch.plans import GOLDEN_PLANS
    from tests.launch.variants import MEGATRON_MOCK, VARIANT_PLANS

    checked = set()
    for plan in [*GOLDEN_PLANS.values(), *VARIANT_PLANS.values()]:
        sections = megatron_arg_sections(plan, MEGATRON_MOCK)
        args = [arg for section in sections if section.title.startswith(("model", "parallelism", "activation"))
                for arg in section.args]
        for index, flag in enumerate(args):
            rows = [row for row in TERMS if row.flag == flag and row.field and flag not in DERIVED_FLAGS]
            if not rows:
                continue
            context = (field_value(plan, path) for path in rows[0].context_paths)
            value = rows[0].rendered(field_value(plan, rows[0].field), *context)
            if rows[0].kind == "bool":
                assert value is True, f"{flag} written while {rows[0].field} is {value!r}"
            else:
                assert args[index + 1] == str(value), f"{flag} {args[index + 1]} but {rows[0].field} is {value!r}"
            checked.add(flag)
    assert len(checked) >= 30  # the field-carrying flags of dense, GQA, MLA, MoE, hybrid and parallel layouts


def _as_a_script_has_it(row: Term, rendered: object) -> object:
    """A rendered flag as reading a script gives it back: a switch, whether it is written; else its text."""
    return rendered if row.kind == "bool" or rendered is None else str(rendered)


_AS_IS_SAMPLES = {"int": (7,), "float": (0.25,), "str": ("RMSNorm",), "bool": (True, False)}


@pytest.mark.parametrize("row", [row for row in TERMS if row.field], ids=lambda row: row.flag)
def test_every_row_reads_back_what_it_renders(row: Term) -> None:
    values = row.derived.examples if row.derived is not None else _AS_IS_SAMPLES[row.kind]
    context = row.derived.example_context if row.derived is not None else ()
    for value in values:
        assert row.read(_as_a_script_has_it(row, row.rendered(value, *context)), *context) == value, (row.flag, value)


def _with_field(spec: object, path: list[str], value: object) -> object:
    """`spec` with the field at `path` (through sub-specs) set to `value`."""
    name, *rest = path
    return spec.model_copy(update={name: _with_field(getattr(spec, name), rest, value) if rest else value})


@pytest.mark.parametrize("row", [row for row in TERMS if row.derived and row.field and row.field.startswith("model.")],
                         ids=lambda row: row.flag)
def test_a_derived_model_flag_goes_through_the_script_and_back_to_its_field(row: Term) -> None:
    """The launch's model section writes each example of the row's field, and diagnose reads the script back to it."""
    from megapilot.catalog import get_model
    from megapilot.diagnose.flags import collect_flags, run_config
    from megapilot.launch.model_flags import model_section
    from megapilot.vocabulary import field_value

    path = (row.field or "").removeprefix("model.")
    base = get_model("glm-5" if path.startswith("mla.dsa.") else "gpt-oss-20b" if path.startswith("rope_scaling.")
                     else "llama3.1-8b")  # a model that has the field
    for value in row.derived.examples:
        model = _with_field(base, path.split("."), value)
        written = model_section(model).args
        context = (field_value(model, path.removeprefix("model.")) for path in row.context_paths)
        assert (row.flag in written) == (row.rendered(value, *context) not in (False, None)), (row.flag, value)
        read = run_config(collect_flags([*written, "--seq-length", "4096"]), gpus=1).model
        assert read is not None and field_value(read, path) == value, (row.flag, value)
