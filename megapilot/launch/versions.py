"""The Megatron-LM release a script is for, and the renderers' adaptations to it.

The release comes from, in order: the checkout at `--megatron-path` when it is on this machine (its
`megatron/core/package_info.py` version, its own `megatron/training/arguments.py` read statically), else
`--megatron-version`, else the newest committed table. Against that release the rendered arguments are
adapted where Megatron-LM changed between releases:
- renamed: a flag the renderers write under another release's name is written under this release's name
  (found in the tables, not by hand: the same destination and action under another name);
- new default: where a release changed a default the renderers rely on, the old value is written out;
- removed or not yet added: refused by the table's check, naming the release that has the flag.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from megapilot import vocabulary
from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import (
    SCRIPT_RELEASE_NAMES,
    FlagTable,
    ReleaseNames,
    Version,
    committed_tables,
    flag_table,
    parse_version,
)
from megapilot.launch.megatron_source import read_checkout_table, read_checkout_version
from megapilot.launch.options import LaunchOptions
from megapilot.launch.sections import ArgSection


@dataclass(frozen=True)
class PinnedDefault:
    """A default a release changed under the renderers: written out from `since` on."""

    flag: str
    values: tuple[str, ...]
    since: Version
    why: str


# From the Megatron vocabulary's rows that say from which release their default must be written out.
PINNED_DEFAULTS = tuple(PinnedDefault(row.flag, (str(row.default),), parse_version(row.pinned_from), row.pinned_why)
                        for row in vocabulary.TERMS if row.pinned_from is not None)


def resolve_flag_table(options: LaunchOptions, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> FlagTable:
    """The flags the script is checked against: the local checkout's own, else the chosen release's (a release
    without a table is refused in the words of `names`, the command's)."""
    checkout = _local_checkout(options)
    if checkout is None:
        return flag_table(options.megatron_version, names)
    version = read_checkout_version(checkout, names)
    if options.megatron_version is not None and parse_version(options.megatron_version)[:2] != version[:2]:
        raise MegapilotError(
            f"{names.version} {options.megatron_version} but the checkout at {checkout} is "
            f"{'.'.join(map(str, version))} (megatron/core/package_info.py)",
            field="megatron_version",
            fix=f"drop {names.version} (the checkout decides) or point {names.path} at the right checkout",
        )
    return _checkout_table(str(checkout), os.stat(checkout / "megatron/training/arguments.py").st_mtime_ns, names)


def target_release(options: LaunchOptions, table: FlagTable) -> Version:
    """The release the script runs, patch included: the checkout's own (its table's), else the version asked for (a
    patch release shares its minor's table, but may change what the code does with a flag: core_v0.16.1's hybrid
    stack reads the uneven-split flags 0.16.0's ignores), else the table's."""
    if table.commit is None or options.megatron_version is None:
        return table.version
    return parse_version(options.megatron_version)


@lru_cache(maxsize=8)
def _checkout_table(checkout: str, mtime_ns: int, names: ReleaseNames) -> FlagTable:
    """Cached per arguments.py version (the mtime), so rendering many combos reads the file once."""
    return read_checkout_table(Path(checkout), names)


def _local_checkout(options: LaunchOptions) -> Path | None:
    """The Megatron-LM checkout the script runs, when it is on this machine with its arguments.py."""
    if options.entrypoint != "megatron" or options.megatron_path is None or options.remote:
        return None
    root = Path(options.megatron_path)
    return root if (root / "megatron/training/arguments.py").is_file() else None


def adapt_sections(sections: list[ArgSection], table: FlagTable) -> list[str]:
    """Rename flags to this release's names and write out changed defaults, in place; notes for the user."""
    notes = []
    for section in sections:
        for index, token in enumerate(section.args):
            if token.startswith("--") and token not in table.flags:
                renamed = renamed_flag(token, table)
                if renamed is not None:
                    section.args[index] = renamed
                    notes.append(f"{token} is spelled {renamed} in Megatron-LM {table.release}")
    given = {token for section in sections for token in section.args if token.startswith("--")}
    for pinned in PINNED_DEFAULTS:
        if table.version >= pinned.since and pinned.flag in table.flags and pinned.flag not in given:
            _section_for(sections, "training").add(pinned.flag, *pinned.values)
            notes.append(f"{pinned.flag} {' '.join(pinned.values)} written out: {pinned.why}")
    return notes


def renamed_flag(name: str, table: FlagTable) -> str | None:
    """This release's name for a flag another release calls `name` (same destination and action), if any."""
    for other in reversed(committed_tables()):
        row = other.flags.get(name)
        if row is None:
            continue
        same = [f.name for f in table.flags.values() if f.dest == row.dest and f.action == row.action]
        return same[0] if len(same) == 1 else None
    return None


def _section_for(sections: list[ArgSection], title_start: str) -> ArgSection:
    for section in sections:
        if section.title.startswith(title_start):
            return section
    sections.append(ArgSection(title_start))
    return sections[-1]
