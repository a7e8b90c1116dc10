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
from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import FlagTable, committed_tables
from megapilot.launch.perf_flags import cuda_graph_section
from megapilot.launch.versions import renamed_flag
from megapilot.spec import ParallelConfig
from megapilot.spec.cuda_graphs import CudaGraphs


def in_release_names(findings: list[Finding], version: RecognisedVersion | None,
                     parallel: ParallelConfig | None = None) -> tuple[list[Finding], list[str]]:
    """The findings with each Megatron flag fix in the release's spelling, and a note per change made. `parallel`:
    the run's layout, which decides whether an older release can run CUDA graphs a fix proposes."""
    if version is None:
        return findings, []
    table = version.table()
    notes: list[str] = []
    adapted = []
    for finding in findings:
        fixes = [_in_release(fix, table, notes) for fix in _graphs_in_release(finding.fixes, table, parallel, notes)]
        adapted.append(replace(finding, fixes=fixes) if fixes != finding.fixes else finding)
    return adapted, sorted(set(notes))


def fixes_in_release(fixes: list[Fix], version: RecognisedVersion | None,
                     parallel: ParallelConfig | None = None) -> tuple[list[Fix], list[str]]:
    """`fixes` (an optimize change's flag edits) in the release's spelling, and a note per change made."""
    if version is None:
        return fixes, []
    notes: list[str] = []
    table = version.table()
    return [_in_release(fix, table, notes) for fix in _graphs_in_release(fixes, table, parallel, notes)], notes


def _graphs_in_release(fixes: list[Fix], table: FlagTable, parallel: ParallelConfig | None,
                       notes: list[str]) -> list[Fix]:
    """CUDA graphs proposed as `--cuda-graph-impl X --cuda-graph-scope Y` (core_v0.16's words) said as `megapilot
    script` writes them for the release (`cuda_graph_section`, the one per-release rendering): core_v0.14 names the
    implementation by a switch (`--enable-cuda-graph`, `--external-cuda-graph`), releases before core_v0.16 take one
    scope word, core_v0.18 says the whole iteration by its implementation. A release that cannot run them (its
    scope words cannot say them, or it refuses them beside this layout's recompute) is left to the per-flag reading,
    which says which flag needs an upgrade; so is a run whose layout is not known."""
    impl = next((fix for fix in fixes if fix.kind == "megatron_flag" and fix.flag == "--cuda-graph-impl"
                 and fix.action != "remove" and fix.value), None)
    if impl is None or parallel is None:
        return fixes
    scope = next((fix for fix in fixes if fix.kind == "megatron_flag" and fix.flag == "--cuda-graph-scope"), None)
    try:
        graphs = CudaGraphs.model_validate({"impl": impl.value, "scope": (scope.value or "").split() if scope else []})
        words = _flag_words(cuda_graph_section(graphs, parallel, table).args)
    except MegapilotError as exc:  # the release cannot run them: say why, beside what needs an upgrade
        notes.append(exc.problem)
        return fixes
    except ValueError:  # not graphs this project can say (pydantic's refusal): the fixes as they are
        return fixes
    proposed = {fix.flag: fix for fix in fixes if fix.kind == "megatron_flag"}
    said = [replace(proposed.get(flag, impl), action=proposed[flag].action if flag in proposed else "add",
                    flag=flag, value=value) for flag, value in words]
    graph_flags = {flag for flag, _ in words} | {"--cuda-graph-impl", "--cuda-graph-scope"}
    first = next(index for index, fix in enumerate(fixes) if fix.kind == "megatron_flag" and fix.flag in graph_flags)
    rest = [fix for fix in fixes if not (fix.kind == "megatron_flag" and fix.flag in graph_flags)]
    adapted = rest[:first] + said + rest[first:]
    if [(f.flag, f.value) for f in adapted] != [(f.flag, f.value) for f in fixes]:
        before = " ".join(f"{f.flag} {f.value}" for f in (impl, scope) if f is not None)
        # what replaced the implementation and scope (the companions were proposed already)
        instead = " ".join(f"{flag} {value}" if value else flag for flag, value in words
                           if flag not in proposed or flag in ("--cuda-graph-impl", "--cuda-graph-scope"))
        notes.append(f"CUDA graphs {before} are said {instead} in Megatron-LM {table.release}, the log's release")
    return adapted


def _flag_words(args: list[str]) -> list[tuple[str, str | None]]:
    """An argument list as (flag, its value or values joined, None for a switch)."""
    words: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("--"):
            words.append((arg, []))
        else:
            words[-1][1].append(arg)
    return [(flag, " ".join(values) or None) for flag, values in words]


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
