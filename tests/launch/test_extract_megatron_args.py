"""The flag-list extractor's pure parts: argparse actions -> the JSON rows of megatron_args_<release>.json.

Built on a small argparse parser here; the real run needs a Megatron-LM checkout and is a maintenance step.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from importlib import resources

import pytest

from megapilot.errors import MegapilotError
from megapilot.launch.data import extract_megatron_args as extractor
from megapilot.launch.megatron_args import pinned_flags, split_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("positional")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--no-load-rng", action="store_false", dest="load_rng")
    parser.add_argument("--num-layers", type=int)
    parser.add_argument("--split", default="969,30,1")
    parser.add_argument("--data-path", nargs="*")
    parser.add_argument("--lr-warmup", nargs=2, type=float)
    parser.add_argument("--position-embedding-type", choices=["rope", "learned_absolute", "none"])
    parser.add_argument("--tensor-model-parallel-size", "--tp", "-t", dest="tp", type=int)
    parser.add_argument("--verbose-level", action="count")
    parser.add_argument("-q")
    return parser


def test_every_long_option_gets_a_row_and_positionals_short_options_and_help_do_not():
    flags = extractor.parser_flags(_parser())
    assert list(flags) == sorted(flags)
    assert "--help" not in flags and "positional" not in flags and "-q" not in flags and "-t" not in flags
    assert set(flags) == {"--bf16", "--no-load-rng", "--num-layers", "--split", "--data-path", "--lr-warmup",
                          "--position-embedding-type", "--tensor-model-parallel-size", "--tp", "--verbose-level"}


def test_switches_take_no_value_and_name_their_action_and_destination():
    flags = extractor.parser_flags(_parser())
    assert flags["--bf16"] == {"dest": "bf16", "action": "store_true", "takes_value": False, "nargs": 0,
                               "choices": None}
    assert flags["--no-load-rng"]["action"] == "store_false" and flags["--no-load-rng"]["dest"] == "load_rng"
    assert flags["--verbose-level"]["action"] == "_CountAction" and not flags["--verbose-level"]["takes_value"]


def test_valued_options_record_how_many_values_they_take():
    flags = extractor.parser_flags(_parser())
    assert flags["--num-layers"] == {"dest": "num_layers", "action": "store", "takes_value": True, "nargs": None,
                                     "choices": None}
    assert flags["--data-path"]["nargs"] == "*"
    assert flags["--lr-warmup"]["nargs"] == 2


def test_choices_are_recorded_sorted_as_strings():
    flags = extractor.parser_flags(_parser())
    assert flags["--position-embedding-type"]["choices"] == ["learned_absolute", "none", "rope"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--level", type=int, choices=[2, 1])
    assert extractor.parser_flags(parser)["--level"]["choices"] == ["1", "2"]


def test_aliases_share_one_description():
    flags = extractor.parser_flags(_parser())
    assert flags["--tp"] == flags["--tensor-model-parallel-size"]
    assert flags["--tp"]["dest"] == "tp"


def test_rows_are_json_and_shaped_like_the_committed_pinned_list():
    rows = json.loads(json.dumps(extractor.parser_flags(_parser())))
    pinned_file = next(f for f in resources.files("megapilot.launch.data").iterdir()
                       if f.name.startswith("megatron_args_") and f.name.endswith(".json"))
    pinned = json.loads(pinned_file.read_text())
    assert set(pinned) == {"source", "release", "commit", "flags"}
    assert {frozenset(row) for row in pinned["flags"].values()} == {frozenset(row) for row in rows.values()}
    assert pinned["flags"]["--bf16"] == rows["--bf16"]  # the same switch reads the same


def test_missing_import_time_dependencies_become_permissive_stubs(monkeypatch):
    name = "megapilot_test_absent_module_xyz"
    monkeypatch.delitem(sys.modules, name, raising=False)
    extractor._stub_modules([name, "json"])
    stub = sys.modules[name]
    monkeypatch.delitem(sys.modules, name)
    assert sys.modules["json"] is json  # an importable module is left alone

    @stub.some.decorator
    def kept() -> str:
        return "kept"

    assert kept() == "kept"  # a stub used as a decorator keeps the function
    assert stub.anything(1, key=2).deeper is not None
    with pytest.raises(AttributeError):
        stub.__wrapped__  # noqa: B018 - dunder look-ups stay honest, so inspect/copy do not loop


class _Backend(enum.Enum):
    flash = 1
    fused = 2


class _Format(enum.Enum):
    HYBRID = "hybrid"
    E4M3 = "e4m3"


def test_enum_choices_are_recorded_as_the_text_the_parser_accepts() -> None:
    # Megatron's --attention-backend: type looks the member up by name, choices are the members.
    parser = argparse.ArgumentParser()
    parser.add_argument("--attention-backend", type=lambda name: _Backend[name], choices=list(_Backend))
    parser.add_argument("--fp8-format", type=_Format, choices=list(_Format))  # looked up by value
    flags = extractor.parser_flags(parser)
    assert flags["--attention-backend"]["choices"] == ["flash", "fused"]
    assert flags["--fp8-format"]["choices"] == ["e4m3", "hybrid"]
    for name, rows in flags.items():  # what was recorded is what the parser itself takes
        for text in rows["choices"]:
            parser.parse_args([name, text])


def test_the_pinned_attention_backend_takes_megatrons_names_and_refuses_anything_else() -> None:
    assert split_args(["--attention-backend", "fused"]) == [("--attention-backend", ["fused"])]
    for text in ("AttnBackend.fused", "flashy"):
        with pytest.raises(MegapilotError, match="is not one of auto, flash, fused, local, unfused"):
            split_args(["--attention-backend", text])
    dotted = sorted(flag.name for flag in pinned_flags().values() if any("." in c for c in flag.choices or ()))
    assert dotted == []  # no other choice was recorded as an enum's repr
