"""The pinned Megatron-LM flag list, and that everything the renderer emits is in it."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch import flags as flags_module
from megapilot.launch import model_flags as model_flags_module
from megapilot.launch import perf_flags as perf_flags_module
from megapilot.launch import render_megatron_args
from megapilot.launch.megatron_args import MEGATRON_COMMIT, MEGATRON_RELEASE, pinned_flags, split_args
from tests.launch.variants import OPTION_VARIANTS, PAIRED_VARIANTS, VARIANT_PLANS


def test_pinned_list_records_release_and_has_the_core_flags() -> None:
    known = pinned_flags()
    assert MEGATRON_RELEASE == "core_v0.16.0" and len(MEGATRON_COMMIT) == 40
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
