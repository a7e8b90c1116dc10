"""Diagnose writes its fixes in the flag names of the Megatron-LM release the log was written by."""

from __future__ import annotations

from megapilot.diagnose.engine import diagnose_log
from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.megatron_version import RecognisedVersion
from megapilot.diagnose.release_names import in_release_names
from megapilot.launch.megatron_args import committed_releases, committed_tables
from megapilot.logs.collect import parse_text
from megapilot.logs.records import Evidence
from megapilot.spec import ParallelConfig
from tests.diagnose.test_megatron_version import _ITERATION, _arguments_block


def _finding(*fixes: Fix) -> Finding:
    return Finding(category="throughput", severity="warning", title="t", cause="c",
                   evidence=[Evidence(file="x.log", line=1, text="t")], fixes=list(fixes))


def _version(release: str) -> RecognisedVersion:
    return RecognisedVersion(release=release, source="arguments", exact=True, detail="test")


def test_a_flag_renamed_between_releases_is_written_in_the_logs_release_spelling() -> None:
    fix = Fix(action="add", flag="--no-tp-comm-overlap-ag", value=None, reason="overlap costs SMs here")
    [adapted], notes = in_release_names([_finding(fix)], _version("core_v0.14.0"))
    assert adapted.fixes[0].flag == "--disable-tp-comm-overlap-ag"
    assert notes == ["--no-tp-comm-overlap-ag is spelled --disable-tp-comm-overlap-ag in Megatron-LM core_v0.14.0, "
                     "the log's release"]
    [same], no_notes = in_release_names([_finding(fix)], _version("core_v0.19.0"))
    assert same.fixes[0].flag == "--no-tp-comm-overlap-ag" and no_notes == []


def test_a_flag_the_logs_release_lacks_says_which_release_brings_it() -> None:
    fix = Fix(action="add", flag="--moe-shared-expert-gate", value=None, reason="gate the shared expert")
    [adapted], notes = in_release_names([_finding(fix)], _version("core_v0.14.0"))
    assert "needs Megatron-LM core_v0.16.0 or newer" in adapted.fixes[0].reason
    assert notes and "core_v0.16.0" in notes[0]


def test_environment_fixes_and_unknown_versions_are_left_alone() -> None:
    env = Fix(action="set", flag="NCCL_DEBUG", value="INFO", reason="r", kind="env")
    finding = _finding(env)
    assert in_release_names([finding], _version("core_v0.14.0")) == ([finding], [])
    assert in_release_names([finding], None) == ([finding], [])


def test_diagnosis_names_the_release_it_recognised() -> None:
    log = parse_text(_arguments_block("core_v0.14.0") + f" [2026-01-01 00:10:00] {_ITERATION}\n")
    assert diagnose_log(log, None).to_dict()["megatron_version"]["release"] == "core_v0.14.0"


def test_a_script_for_an_older_release_reads_its_switches_right() -> None:
    """--use-legacy-models is a switch of core_v0.17.0 that core_v0.19.0 removed: the value after it is not its."""
    from megapilot.diagnose.flags import collect_flags

    flags = collect_flags(["--use-legacy-models", "--num-layers", "4", "--disable-tp-comm-overlap-ag"])
    assert flags.values["--num-layers"] == "4"
    assert "--use-legacy-models" in flags.values and "--disable-tp-comm-overlap-ag" in flags.values


def test_an_unknown_release_is_said_with_what_the_log_names() -> None:
    """A log that tells no Megatron-LM release gets a note saying so (and which names the fixes then use), not a
    silent default; what it does name (a NeMo container) is in that note."""
    from megapilot.diagnose.release_names import release_note

    [note] = release_note(None, ["nemo-container 25.02"])
    assert note.startswith("the log does not say which Megatron-LM release ran (it names nemo-container 25.02")
    assert "flag names of Megatron-LM core_v" in note
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    notes = [n.text for n in diagnose_log(parse_text("== NeMo Framework ==\nNVIDIA Release 25.02\n" + oom), None).notes]
    assert [n for n in notes if "Megatron-LM release" in n] == [
        "the log does not say which Megatron-LM release ran (it names nemo-container 25.02, not its megatron-core "
        f"version): fixes use the flag names of Megatron-LM {committed_releases()[-1]}, the newest known; check them "
        "against yours"]
    stated = [n.text for n in diagnose_log(parse_text("megatron-core==0.14.0\n" + oom), None).notes]
    assert "fixes use the flag names of Megatron-LM core_v0.14.0 (told by the log's version line)" in stated


def _graphs(impl: str, scope: str) -> list[Fix]:
    """CUDA graphs as the options propose them (core_v0.16's words)."""
    return [Fix(action="add", flag="--cuda-graph-impl", value=impl, reason="replay the captured kernels"),
            Fix(action="add", flag="--cuda-graph-scope", value=scope, reason="what the graphs capture"),
            Fix(action="add", flag="--te-rng-tracker", value=None, reason="graph-safe random streams")]


def test_cuda_graphs_are_said_in_each_releases_own_flags() -> None:
    """core_v0.14 names the implementation by a switch; core_v0.15 by --cuda-graph-impl with one scope word;
    core_v0.16 takes the scope as a list."""
    dense = ParallelConfig(tp=2, pp=1, dp=4)
    said = {release: [(f.flag, f.value) for f in in_release_names(
                [_finding(*_graphs("transformer_engine", "attn"))], _version(release), dense)[0][0].fixes]
            for release in ("core_v0.14.0", "core_v0.15.0", "core_v0.16.0")}
    assert said["core_v0.14.0"] == [("--external-cuda-graph", None), ("--cuda-graph-scope", "attn"),
                                    ("--te-rng-tracker", None)]
    assert said["core_v0.15.0"] == said["core_v0.16.0"] == [
        ("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", "attn"), ("--te-rng-tracker", None)]
    for release, fixes in said.items():  # every flag one that release's parser knows
        table = next(t for t in committed_tables() if t.release == release)
        assert all(flag in table.flags for flag, _ in fixes), release


def test_cuda_graphs_a_release_cannot_run_say_why() -> None:
    """A MoE model's router and preprocess graphs are a list of scopes, which core_v0.14 cannot say: the flags stay,
    marked as needing an upgrade, with the reason."""
    moe = ParallelConfig(tp=1, pp=1, dp=8, ep=8)
    [finding], notes = in_release_names([_finding(*_graphs("transformer_engine", "attn moe_router moe_preprocess"))],
                                        _version("core_v0.14.0"), moe)
    assert "needs Megatron-LM core_v0.15.0 or newer" in finding.fixes[0].reason
    assert any("cannot run these CUDA graphs" in note and "one word" in note for note in notes), notes
    # local graphs under activation recompute: refused by core_v0.14's TransformerConfig
    recomputed = ParallelConfig(tp=2, pp=1, dp=4, recompute="full")
    [finding], notes = in_release_names([_finding(*_graphs("local", "full_iteration"))], _version("core_v0.14.0"),
                                        recomputed)
    assert finding.fixes[0].flag == "--cuda-graph-impl" and any("--recompute none" in note for note in notes)
