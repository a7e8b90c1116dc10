"""The Megatron-LM flag tables (one per release), and that everything the renderer emits is in the default one."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import replace

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import flags as flags_module
from megapilot.launch import model_flags as model_flags_module
from megapilot.launch import perf_flags as perf_flags_module
from megapilot.launch import render_megatron_args
from megapilot.launch.megatron_args import (
    MEGATRON_COMMIT,
    MEGATRON_RELEASE,
    SCRIPT_RELEASE_NAMES,
    committed_releases,
    flag_table,
    parse_version,
    pinned_flags,
    split_args,
)
from tests.launch.variants import OPTION_VARIANTS, PAIRED_VARIANTS, VARIANT_PLANS


def test_pinned_list_records_release_and_has_the_core_flags() -> None:
    known = pinned_flags()
    assert committed_releases()[-1] == MEGATRON_RELEASE and len(MEGATRON_COMMIT) == 40
    assert len(known) > 600
    assert known["--num-layers"].takes_value and not known["--bf16"].takes_value
    assert known["--disable-bias-linear"].action == "store_false"
    assert "hybrid" in (known["--fp8-format"].choices or ())
    assert known["--moe-router-load-balancing-type"].takes_many


def _flag_literals_in_renderer() -> set[str]:
    """Every '--flag' string literal in flags.py, model_flags.py and perf_flags.py: what the renderer can emit."""
    modules = (flags_module, model_flags_module, perf_flags_module)
    trees = [ast.parse(inspect.getsource(module)) for module in modules]
    return {
        node.value for tree in trees for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and re.fullmatch(r"--[a-z0-9][a-z0-9-]*", node.value)
    }


def test_every_flag_literal_of_the_renderer_is_in_the_pinned_list() -> None:
    literals = _flag_literals_in_renderer()
    assert len(literals) > 80
    unknown = sorted(literals - pinned_flags().keys())
    assert unknown == []


@pytest.mark.parametrize("plan_name", sorted(VARIANT_PLANS))
@pytest.mark.parametrize("options_name", sorted(OPTION_VARIANTS))
def test_rendered_arguments_parse_against_the_pinned_parser(plan_name: str, options_name: str) -> None:
    args = render_megatron_args(VARIANT_PLANS[plan_name], OPTION_VARIANTS[options_name])
    pairs = split_args(args)  # raises on unknown flags, wrong arity or values outside choices
    assert [name for name, _ in pairs] == [a for a in args if a.startswith("--") and a[2:3].isalpha()]


def test_variants_reach_every_flag_literal_of_the_renderer() -> None:
    emitted = {
        a for plan in VARIANT_PLANS.values() for options in OPTION_VARIANTS.values()
        for a in render_megatron_args(plan, options) if a.startswith("--")
    }
    emitted |= {a for plan, options in PAIRED_VARIANTS for a in render_megatron_args(plan, options)
                if a.startswith("--")}
    assert _flag_literals_in_renderer() - emitted == set()


@pytest.mark.parametrize(("args", "problem"), [
    (["--num-layer", "4"], "not a flag of Megatron-LM"),
    (["--num-layers"], "needs a value"),
    (["--bf16", "yes"], "is a switch"),
    (["--seq-length", "4", "8"], "takes one value"),
    (["--fp8-format", "e5m2"], "is not one of"),
    (["4096"], "does not follow a flag"),
])
def test_split_args_refuses_malformed_argument_lists(args: list[str], problem: str) -> None:
    with pytest.raises(MegapilotError, match=problem):
        split_args(args)


def test_tables_cover_every_release_from_014_to_the_newest_with_their_commits() -> None:
    assert committed_releases() == ("core_v0.14.0", "core_v0.15.0", "core_v0.16.0", "core_v0.17.0",
                                    "core_v0.18.0", "core_v0.19.0")
    for release in committed_releases():
        table = flag_table(release)
        assert table.release == release and re.fullmatch(r"[0-9a-f]{40}", table.commit or "")
        assert len(table.flags) > 500 and "--num-layers" in table.flags
    assert len({flag_table(r).commit for r in committed_releases()}) == len(committed_releases())


@pytest.mark.parametrize(("text", "release"), [
    ("0.14", "core_v0.14.0"), ("core_v0.15.0", "core_v0.15.0"), ("v0.16.1", "core_v0.16.0"),
    ("0.15.3", "core_v0.15.0"), ("core_r0.17.0", "core_v0.17.0"), ("0.19.1rc0", "core_v0.19.0"), (None, "core_v0.19.0"),
])
def test_versions_pick_the_table_of_their_minor_release(text: str | None, release: str) -> None:
    assert flag_table(text).release == release


@pytest.mark.parametrize("text", ["0.12", "1.0.0", "0.20.0"])
def test_a_release_without_a_table_is_refused_naming_those_there_are(text: str) -> None:
    with pytest.raises(MegapilotError, match=r"core_v0.14.0") as info:
        flag_table(text)
    assert info.value.field == "megatron_version"
    assert info.value.fix == ("pass one of those to --megatron-version, or --megatron-path /abs/Megatron-LM to read "
                              "that checkout's own arguments.py")


def test_the_fix_for_a_release_without_a_table_is_worded_by_the_command_that_asked() -> None:
    names = replace(SCRIPT_RELEASE_NAMES, pick="set release.version to one of those",
                    checkout="release.checkout to a checkout")
    with pytest.raises(MegapilotError) as info:
        flag_table("0.99", names)
    assert info.value.fix == ("set release.version to one of those, or release.checkout to a checkout to read that "
                              "checkout's own arguments.py")


def test_tables_differ_where_megatron_changed_between_releases() -> None:
    """The facts the version-aware renderer rests on, as the extracted tables record them."""
    v14, v16, v19 = flag_table("0.14"), flag_table("0.16"), flag_table("0.19")
    assert "--moe-shared-expert-gate" not in v14.flags and "--moe-shared-expert-gate" in v16.flags
    assert "--fp4-format" not in v14.flags and "--fp4-format" in flag_table("0.15").flags
    assert "--disable-tp-comm-overlap-ag" in v14.flags and "--no-tp-comm-overlap-ag" in v16.flags
    assert "--use-legacy-models" in flag_table("0.17").flags and "--use-legacy-models" not in v19.flags
    assert "yarn" in (v19.flags["--position-embedding-type"].choices or ())
    assert "yarn" not in (v16.flags["--position-embedding-type"].choices or ())
    assert v14.flags["--norm-epsilon"].dest == "norm_epsilon"
    assert v16.flags["--norm-epsilon"].dest == "layernorm_epsilon"


def test_a_flag_added_later_is_refused_for_the_older_release_naming_the_release_that_added_it() -> None:
    with pytest.raises(MegapilotError, match=r"added in Megatron-LM core_v0.16.0") as info:
        flag_table("0.14").split_args(["--moe-shared-expert-gate"])
    assert info.value.field == "megatron_version"
    assert "--megatron-version core_v0.16.0" in info.value.fix
    flag_table("0.16").split_args(["--moe-shared-expert-gate"])


def test_a_removed_flag_is_refused_naming_the_last_release_that_has_it() -> None:
    with pytest.raises(MegapilotError, match=r"last release with it is core_v0.17.0"):
        flag_table("0.19").split_args(["--use-legacy-models"])


def test_a_choice_added_later_is_refused_naming_the_release_that_added_it() -> None:
    with pytest.raises(MegapilotError, match=r"'yarn' was added in Megatron-LM core_v0.18.0"):
        flag_table("0.16").split_args(["--position-embedding-type", "yarn"])
    flag_table("0.19").split_args(["--position-embedding-type", "yarn"])


@pytest.mark.parametrize("text", ["", "sixteen", "0"])
def test_malformed_versions_are_refused(text: str) -> None:
    with pytest.raises(MegapilotError, match="not a Megatron-LM version"):
        parse_version(text)
