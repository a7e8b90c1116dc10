"""Fixes written in the flag names of the Megatron-LM release that wrote the log.

The rules name flags as the newest release spells them; a run on an older (or newer) release needs its own
spelling, and a flag its release does not have is no fix there. The release is the one `logs` recognised
(`recognise_megatron_version`); renames come from the committed flag tables (same destination and action
under another name), as the launch renderers adapt them.
"""

from __future__ import annotations

from dataclasses import replace

from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.megatron_version import RecognisedVersion
from megapilot.launch.megatron_args import FlagTable, committed_tables
from megapilot.launch.versions import renamed_flag


def in_release_names(findings: list[Finding], version: RecognisedVersion | None) -> tuple[list[Finding], list[str]]:
    """The findings with each Megatron flag fix in the release's spelling, and a note per change made."""
    if version is None:
        return findings, []
    table = version.table()
    notes: list[str] = []
    adapted = []
    for finding in findings:
        fixes = [_in_release(fix, table, notes) for fix in finding.fixes]
        adapted.append(replace(finding, fixes=fixes) if fixes != finding.fixes else finding)
    return adapted, sorted(set(notes))


def fixes_in_release(fixes: list[Fix], version: RecognisedVersion | None) -> tuple[list[Fix], list[str]]:
    """`fixes` (an optimize change's flag edits) in the release's spelling, and a note per change made."""
    if version is None:
        return fixes, []
    notes: list[str] = []
    return [_in_release(fix, version.table(), notes) for fix in fixes], notes


def _in_release(fix: Fix, table: FlagTable, notes: list[str]) -> Fix:
    if fix.kind != "megatron_flag" or not fix.flag.startswith("--") or fix.flag in table.flags:
        return fix
    renamed = renamed_flag(fix.flag, table)
    if renamed is not None:
        notes.append(f"{fix.flag} is spelled {renamed} in Megatron-LM {table.release}, the log's release")
        return replace(fix, flag=renamed)
    newer = [t.release for t in committed_tables() if fix.flag in t.flags and t.version > table.version]
    if not newer or fix.action == "remove":
        return fix
    notes.append(f"{fix.flag} needs Megatron-LM {newer[0]} or newer; the log is from {table.release}")
    return replace(fix, reason=f"{fix.reason} (needs Megatron-LM {newer[0]} or newer: upgrade first)")


def release_note(version: RecognisedVersion | None, seen: list[str] | None = None) -> list[str]:
    """One note naming the release the fixes are written for; when the log tells none, that it does not (with what
    it does name: a NeMo container, a Megatron-Bridge version) and which release's names the fixes use then."""
    if version is None:
        named = f" (it names {', '.join(seen)}, not its megatron-core version)" if seen else ""
        return [f"the log does not say which Megatron-LM release ran{named}: fixes use the flag names of "
                f"Megatron-LM {committed_tables()[-1].release}, the newest known; check them against yours"]
    closeness = "" if version.exact else ", the closest table"
    told = f"told by the log's {version.source}{closeness}"
    return [f"fixes use the flag names of Megatron-LM {version.release} ({told})"]
