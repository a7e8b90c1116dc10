"""Megatron-LM flag tables, one per release: which `pretrain_gpt.py` options exist, take a value, have choices.

Each table is data (`data/megatron_args_<release>.json`), extracted from Megatron-LM's own argument parser
at that release tag (the extraction tool sits next to them). Users run many releases, and flags are added,
renamed and removed between them, so every argument list megapilot renders is checked against the table
of the release the user runs (`--megatron-version`, or the checkout's own `arguments.py` read by
`megatron_source`), and a renamed or misspelled flag fails here rather than on the cluster.
The newest committed table is the default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from megapilot.errors import MegapilotError

_TABLE_NAME = re.compile(r"^megatron_args_(core_v\d+\.\d+\.\d+)\.json$")
_VERSION_TEXT = re.compile(r"^(?:core_)?[vr]?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(?:rc|a|b|dev)\d*)?$")

Version = tuple[int, int, int]


@dataclass(frozen=True)
class MegatronFlag:
    """One option of Megatron-LM's parser."""

    name: str
    dest: str
    action: str  # store | store_true | store_false | BooleanOptionalAction
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None

    @property
    def takes_many(self) -> bool:
        """nargs '+' / '*': one or more values follow the flag."""
        return self.nargs in ("+", "*")


@dataclass(frozen=True)
class FlagTable:
    """Every flag of one Megatron-LM release (a committed table, or a checkout's own arguments.py)."""

    release: str  # core_vX.Y.Z
    commit: str | None  # the tag's commit for a committed table; None for a checkout read here
    flags: Mapping[str, MegatronFlag]
    origin: str  # where the flags were read: the committed table's file or the checkout's arguments.py

    @property
    def version(self) -> Version:
        return parse_version(self.release)

    def label(self) -> str:
        """How scripts and messages name the flags' source."""
        return self.release if self.commit else f"{self.release} ({self.origin})"

    def flag(self, name: str) -> MegatronFlag:
        """Look up one flag; an unknown name is a MegapilotError naming this release and, if another
        release has the flag, the releases that do."""
        if name in self.flags:
            return self.flags[name]
        elsewhere = [table.release for table in committed_tables() if name in table.flags]
        if elsewhere and all(parse_version(r) > self.version for r in elsewhere):
            raise MegapilotError(
                f"{name} is not a flag of Megatron-LM {self.label()}: it was added in Megatron-LM {elsewhere[0]}",
                field="megatron_version",
                fix=f"run Megatron-LM {elsewhere[0]} or newer (--megatron-version {elsewhere[0]}, or a checkout of "
                    "it) or choose a plan that does not need it",
            )
        if elsewhere:
            raise MegapilotError(
                f"{name} is not a flag of Megatron-LM {self.label()}: the last release with it is {elsewhere[-1]}",
                field="megatron_version",
                fix=f"run Megatron-LM {elsewhere[-1]} (--megatron-version {elsewhere[-1]}, or a checkout of it) "
                    "or choose a plan that does not need it",
            )
        close = sorted(n for n in self.flags if n.split("-")[2:3] == name.split("-")[2:3])[:3]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise MegapilotError(
            f"{name} is not a flag of Megatron-LM {self.label()} pretrain_gpt.py{hint}",
            field="megatron_args",
            fix=f"use a flag from Megatron-LM {self.release} megatron/training/arguments.py",
        )

    def split_args(self, args: list[str]) -> list[tuple[str, list[str]]]:
        """Group a flat argument list into (flag, values) pairs, checking each against this release.

        Raises MegapilotError for an unknown flag, a missing or extra value, or a value outside the
        flag's choices.
        """
        pairs: list[tuple[str, list[str]]] = []
        index = 0
        while index < len(args):
            name = args[index]
            if not name.startswith("--"):
                raise MegapilotError(f"value {name!r} does not follow a flag that takes one",
                                     field="megatron_args", fix="remove it or add the flag it belongs to")
            spec = self.flag(name)
            index += 1
            values: list[str] = []
            while index < len(args) and not _looks_like_flag(args[index]):
                values.append(args[index])
                index += 1
            _check_arity(spec, values)
            self._check_choices(spec, values)
            pairs.append((name, values))
        return pairs

    def _check_choices(self, spec: MegatronFlag, values: list[str]) -> None:
        if spec.choices is None:
            return
        for value in values:
            if value in spec.choices:
                continue
            later = [t.release for t in committed_tables() if t.version > self.version
                     and value in (t.flags[spec.name].choices or () if spec.name in t.flags else ())]
            added = f" ({value!r} was added in Megatron-LM {later[0]})" if later else ""
            raise MegapilotError(
                f"{spec.name} {value!r} is not one of {', '.join(spec.choices)} in Megatron-LM {self.label()}{added}",
                field="megatron_version" if later else "megatron_args",
                fix=(f"run Megatron-LM {later[0]} or newer (--megatron-version {later[0]})" if later
                     else f"use one of the choices of {spec.name}"),
            )


def parse_version(text: str) -> Version:
    """`core_v0.16.0`, `v0.16.0`, `0.16`, `0.16.1rc0` -> (0, 16, 0/1); anything else is a MegapilotError."""
    match = _VERSION_TEXT.match(text.strip())
    if match is None:
        raise MegapilotError(f"{text!r} is not a Megatron-LM version", field="megatron_version",
                             fix="pass a release such as 0.16.0 or core_v0.16.0")
    major, minor, patch = match.group(1, 2, 3)
    return int(major), int(minor), int(patch or 0)


def release_name(version: Version) -> str:
    return "core_v{}.{}.{}".format(*version)


@cache
def committed_tables() -> tuple[FlagTable, ...]:
    """Every committed table, oldest release first."""
    folder = resources.files("megapilot.launch.data")
    tables = []
    for entry in folder.iterdir():
        match = _TABLE_NAME.match(entry.name)
        if match is None:
            continue
        raw = json.loads(entry.read_text())
        if raw["release"] != match.group(1):
            raise RuntimeError(f"{entry.name} records release {raw['release']}")
        tables.append(FlagTable(release=raw["release"], commit=raw["commit"], flags=table_rows(raw["flags"]),
                                origin=entry.name))
    return tuple(sorted(tables, key=lambda t: t.version))


def table_rows(raw: Mapping[str, Mapping[str, object]]) -> dict[str, MegatronFlag]:
    """The JSON rows of a table (as the extractor writes them) as typed flags."""
    rows = {}
    for name, info in raw.items():
        choices = info["choices"]
        nargs = info["nargs"]
        rows[name] = MegatronFlag(
            name=name, dest=str(info["dest"]), action=str(info["action"]), takes_value=bool(info["takes_value"]),
            nargs=nargs if isinstance(nargs, (int, str)) else None,
            choices=tuple(str(c) for c in choices) if isinstance(choices, list) and choices else None,
        )
    return rows


def committed_releases() -> tuple[str, ...]:
    return tuple(table.release for table in committed_tables())


@dataclass(frozen=True)
class ReleaseNames:
    """How a command takes the release and the Megatron-LM checkout, as the errors about them word their fixes. The
    fix for a release without a table reads `{pick}, or {checkout} to read that checkout's own arguments.py`.
    `megapilot script` takes --megatron-version, --megatron-path and --entrypoint; a suite takes its own (its config's
    keys, and --megatron-version), so it passes its own."""

    pick: str  # how to choose one of the shipped releases
    checkout: str  # how to point at a checkout of the release instead
    version: str  # where the release was asked for: a checkout of another release names it
    path: str  # the setting that names the checkout: `point {path} at the root of a Megatron-LM checkout`
    no_checkout: str  # the fix when Megatron-LM's entry point is given no checkout at all
    megatron_entrypoint: str  # how to run Megatron-LM's own entry point: `{megatron_entrypoint} for this model`


SCRIPT_RELEASE_NAMES = ReleaseNames(pick="pass one of those to --megatron-version",
                                    checkout="--megatron-path /abs/Megatron-LM", version="--megatron-version",
                                    path="--megatron-path",
                                    no_checkout="pass --megatron-path /abs/Megatron-LM (or --entrypoint megapilot)",
                                    megatron_entrypoint="use --entrypoint megatron with --megatron-path")


def flag_table(version: str | None = None, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> FlagTable:
    """The committed table for a Megatron-LM version (None = the newest).

    A patch release is checked against its minor release's table (0.15.3 -> core_v0.15.0): patch releases
    fix bugs and keep the parser. A minor release without a table is refused, naming those there are, with a fix
    in the words of the command that asked (`names`).
    """
    tables = committed_tables()
    if version is None:
        return tables[-1]
    major, minor, _ = parse_version(version)
    for table in tables:
        if table.version[:2] == (major, minor):
            return table
    raise MegapilotError(
        f"no flag table for Megatron-LM {version}; megapilot ships {', '.join(committed_releases())}",
        field="megatron_version",
        fix=f"{names.pick}, or {names.checkout} to read that checkout's own arguments.py",
    )


# The default release and its commit: the newest committed table.
MEGATRON_RELEASE = committed_tables()[-1].release
MEGATRON_COMMIT = committed_tables()[-1].commit or ""


@cache
def pinned_flags() -> dict[str, MegatronFlag]:
    """All flags of the default (newest) release, keyed by name (`--num-layers`); shared, not to be changed."""
    return dict(flag_table().flags)


def flag(name: str) -> MegatronFlag:
    """Look up one flag of the default release."""
    return flag_table().flag(name)


def split_args(args: list[str], table: FlagTable | None = None) -> list[tuple[str, list[str]]]:
    """FlagTable.split_args for `table` (None = the default release)."""
    return (table or flag_table()).split_args(args)


def _looks_like_flag(token: str) -> bool:
    return token.startswith("--") and len(token) > 2 and not token[2].isdigit()


def _check_arity(spec: MegatronFlag, values: list[str]) -> None:
    if not spec.takes_value and values:
        raise MegapilotError(f"{spec.name} is a switch but got {values}", field="megatron_args",
                             fix=f"pass {spec.name} without a value")
    if spec.takes_value and spec.nargs != "*" and not values:
        raise MegapilotError(f"{spec.name} needs a value", field="megatron_args",
                             fix=f"pass {spec.name} VALUE")
    if spec.takes_value and not spec.takes_many and len(values) > 1:
        raise MegapilotError(f"{spec.name} takes one value, got {values}", field="megatron_args",
                             fix=f"pass a single value after {spec.name}")
