"""suite.parsing: JSON and YAML read within bounds of size, depth, expanded size and finite numbers."""

from __future__ import annotations

import json
import time

import pytest

from megapilot.suite.parsing import (
    MAX_BYTES,
    MAX_DEPTH,
    MAX_NODES,
    ParseLimitError,
    check_tree,
    json_hint,
    parse_json,
    parse_yaml,
)


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_nesting_up_to_the_bound_is_read_and_one_level_more_is_refused():
    assert parse_json(_nested(MAX_DEPTH)) == parse_yaml(_nested(MAX_DEPTH))
    for parse in (parse_json, parse_yaml):
        with pytest.raises(ParseLimitError, match=f"nested more than {MAX_DEPTH} levels"):
            parse(_nested(MAX_DEPTH + 1))


def test_deep_nesting_is_refused_before_any_parser_recurses():
    started_s = time.perf_counter()
    with pytest.raises(ParseLimitError):
        parse_json(_nested(100_000))
    assert time.perf_counter() - started_s < 1.0


def test_text_over_the_size_bound_is_refused_with_its_size():
    text = '{"a": "' + "x" * MAX_BYTES + '"}'
    with pytest.raises(ParseLimitError, match=r"4\.0 MiB of text; a suite file is at most 4 MiB"):
        parse_json(text)


@pytest.mark.parametrize("text", ['{"gates": {"max_slope": [1, NaN]}}', '{"gates": {"max_slope": [1, -Infinity]}}'])
def test_non_finite_json_numbers_are_refused_at_their_path(text):
    with pytest.raises(ParseLimitError) as caught:
        parse_json(text)
    assert caught.value.path == "gates.max_slope[1]" and "finite number" in str(caught.value)


def test_non_finite_yaml_numbers_are_refused_at_their_path():
    with pytest.raises(ParseLimitError) as caught:
        parse_yaml("checkpoint:\n  loss_rtol: .inf\n")
    assert caught.value.path == "checkpoint.loss_rtol"


def test_an_alias_bomb_is_refused_fast_while_a_few_aliases_are_fine():
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]\n" for level in range(1, 9))
    started_s = time.perf_counter()
    with pytest.raises(ParseLimitError, match="alias bomb"):
        parse_yaml(bomb)
    assert time.perf_counter() - started_s < 5.0
    shared = parse_yaml("base: &b {lr: 0.1, wd: 0.01}\none: *b\ntwo: *b\n")
    assert shared["one"] is shared["two"] and shared["two"] == {"lr": 0.1, "wd": 0.01}


def test_the_expanded_size_counts_a_shared_value_each_time_it_is_reached():
    leaf = list(range(MAX_NODES // 4))
    check_tree({"a": leaf, "b": leaf, "c": leaf})  # 3/4 of the bound once expanded
    with pytest.raises(ParseLimitError, match=f"more than {MAX_NODES:,} values"):
        check_tree({"a": leaf, "b": leaf, "c": leaf, "d": leaf, "e": leaf})


def test_broken_yaml_is_a_plain_value_error_and_json_keeps_its_pairs_hook():
    with pytest.raises(ValueError) as caught:
        parse_yaml("a: [1, 2\n")
    assert not isinstance(caught.value, ParseLimitError)
    assert parse_json('{"b": 1, "a": 2}', object_pairs_hook=lambda pairs: [k for k, _ in pairs]) == ["b", "a"]


def test_a_key_given_twice_in_one_mapping_is_noted_in_json_and_yaml_alike():
    json_dups: list[str] = []
    assert parse_json('{"a": {"x": 1, "x": 2}, "b": 3}', duplicates=json_dups) == {"a": {"x": 2}, "b": 3}
    yaml_dups: list[str] = []
    assert parse_yaml("a:\n  x: 1\n  x: 2\nb: 3\n", duplicates=yaml_dups) == {"a": {"x": 2}, "b": 3}
    assert json_dups == yaml_dups == ["x"]


def test_a_yaml_merge_key_overridden_beside_it_is_no_duplicate():
    duplicates: list[str] = []
    text = "base: &b {lr: 0.1, wd: 0.01}\none:\n  <<: *b\n  lr: 0.2\n"
    assert parse_yaml(text, duplicates=duplicates)["one"] == {"lr": 0.2, "wd": 0.01}
    assert duplicates == []


def test_a_trailing_comma_is_pointed_at_by_its_line() -> None:
    with pytest.raises(json.JSONDecodeError) as trailing:
        json.loads('{\n "a": 1,\n "b": 2,\n}')
    assert json_hint(trailing.value) == (": the comma ending line 3 comes before a closing bracket, "
                                         "which JSON does not allow")
    with pytest.raises(json.JSONDecodeError) as other:
        json.loads('{"a": }')
    assert json_hint(other.value) == "" and json_hint(ValueError("x")) == ""


@pytest.mark.parametrize("text", ['// the 8B suite\n{"a": 1}', '{"a": 1, /* why */ "b": 2}', '{"a": 1 # why\n}'])
def test_a_comment_in_json_is_named_with_the_comment_key_to_use_instead(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        parse_json(text)
    assert json_hint(caught.value).startswith(": a comment at line ")
    assert '"_comment" key' in json_hint(caught.value)


def test_a_script_given_as_the_config_is_named_one_not_a_comment_to_rewrite() -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        parse_json("#!/bin/bash\ntorchrun pretrain_gpt.py\n")
    assert "a script, not a config" in json_hint(caught.value) and "_comment" not in json_hint(caught.value)


def test_a_byte_order_mark_is_read_past_as_windows_editors_write_it() -> None:
    assert parse_json('\ufeff{"a": 1}') == {"a": 1}
