"""Regenerate `megatron_args_<release>.json`: the flags Megatron-LM's `pretrain_gpt.py` accepts.

Maintenance tool, not imported by megapilot. It builds Megatron-LM's own argument parser
(`megatron.training.arguments.add_megatron_arguments`) from a source tree of the pinned release and
records, for every option: its names, whether it takes a value (and how many), its choices, and
its destination. Many options are generated from config dataclasses at parser-build time, so
reading the parser object is the only faithful way to list them.

    git --git-dir=<Megatron-LM mirror> archive core_v0.16.0 megatron | tar -x -C /tmp/mlm
    PYTHONPATH=/tmp/mlm python megapilot/launch/data/extract_megatron_args.py \
        --release core_v0.16.0 --commit <sha> -o megapilot/launch/data/megatron_args_core_v0.16.0.json

Needs torch and Megatron-LM's import-time dependencies; modules listed in --stub (pure helpers
such as `six`, only used by tokenizers, and triton, imported by kernels the parser never runs) are
replaced by empty modules so the parser can be built. Every release from core_v0.14.0 to core_v0.19.0
extracts this way on Python 3.11 with the CPU torch of the `train` extra.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import types
import typing
from typing import Any


class _Anything:
    """Stands in for any attribute of a stubbed module: callable, usable as a decorator."""

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()


class _StubModule(types.ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package, so its submodules import
        self.__version__ = "0.0"  # core_v0.19.0 parses triton.__version__ at import time

    def __getattr__(self, name: str) -> _Anything:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


def _stub_modules(names: list[str]) -> None:
    """Replace import-time-only dependencies (not used by the parser) with permissive stubs."""
    for name in names:
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = _StubModule(name)


def _describe(action: argparse.Action) -> dict[str, Any]:
    takes_value = action.nargs != 0
    nargs = action.nargs
    kinds: dict[type[argparse.Action], str] = {
        argparse._StoreTrueAction: "store_true", argparse._StoreFalseAction: "store_false"}
    return {
        "names": sorted(s for s in action.option_strings if s.startswith("--")),
        "dest": action.dest,
        "action": kinds.get(type(action), "store" if takes_value else type(action).__name__),
        "takes_value": takes_value,
        "nargs": nargs if isinstance(nargs, (int, type(None))) else str(nargs),
        "choices": sorted(_choice_text(action, c) for c in action.choices) if action.choices else None,
    }


def _choice_text(action: argparse.Action, choice: object) -> str:
    """What a user types on the command line to get `choice`.

    argparse compares choices after `type` has converted the text, so a choice that is an enum member
    (Megatron's `--attention-backend`: `type=lambda name: AttnBackend[name], choices=list(AttnBackend)`)
    is typed as the member's name (or value, whichever `type` maps back to it); `str(member)` would
    record `AttnBackend.fused`, which the parser itself refuses.
    """
    if not isinstance(choice, enum.Enum):
        return str(choice)
    convert = action.type
    for text in (choice.name, str(choice.value)):
        try:
            if callable(convert) and convert(text) == choice:
                return text
        except (KeyError, ValueError, TypeError):
            continue
    return choice.name


def parser_flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """One row per long option name (aliases get a row each), sorted; positionals and --help left out."""
    flags: dict[str, dict[str, Any]] = {}
    for action in parser._actions:  # the parser's public surface has no iterator over options
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        info = _describe(action)
        for name in info["names"]:
            flags[name] = {k: v for k, v in info.items() if k != "names"}
    return dict(sorted(flags.items()))


def _backport_typing_override() -> None:
    """core_v0.19.0 imports typing.override (Python 3.12); on 3.11 an identity decorator is the same at runtime."""
    if not hasattr(typing, "override"):
        typing.override = lambda function: function  # type: ignore[attr-defined]  # 3.12's decorator, shimmed


def extract(release: str, commit: str) -> dict[str, Any]:
    # heavy: Megatron-LM's training package, only when extracting its arguments
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    return {
        "source": "NVIDIA/Megatron-LM megatron/training/arguments.py (add_megatron_arguments)",
        "release": release,
        "commit": commit,
        "flags": parser_flags(parser),
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--release", required=True)
    cli.add_argument("--commit", required=True)
    cli.add_argument("--stub", nargs="*", default=[
        "six", "regex", "megatron.core.transformer.custom_layers.batch_invariant_kernels", "triton", "triton.language",
    ])
    cli.add_argument("-o", "--output", required=True)
    args = cli.parse_args()
    _backport_typing_override()
    _stub_modules(args.stub)
    data = extract(args.release, args.commit)
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
    print(f"{len(data['flags'])} flags -> {args.output}")


if __name__ == "__main__":
    main()
