"""`diagnose()`: parse the logs, read the launch flags, run every rule, rank the findings."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from megapilot.compat import StrEnum
from megapilot.diagnose.cascade import Cascade, build_cascade, lead_with_root
from megapilot.diagnose.device import CPU_RUN_EVIDENCE, trained_on_cpu
from megapilot.diagnose.findings import Finding, ranked
from megapilot.diagnose.flags import LaunchFlags, RunConfig, flags_from_log, read_flags, run_config
from megapilot.diagnose.framework_fixes import not_megatron_statement
from megapilot.diagnose.megatron_version import recognise_megatron_version, release_lines
from megapilot.diagnose.mismatch import log_mismatches, mismatch_finding
from megapilot.diagnose.release_names import in_release_names, release_note
from megapilot.diagnose.rules import cascade_errors, line_findings, metric_findings, restarts, slower_than_predicted
from megapilot.diagnose.runs import RunFingerprints, RunGroup, mixed_runs_finding
from megapilot.diagnose.series import RuleRecords
from megapilot.errors import MegapilotError
from megapilot.logs import ParsedLog, ParseOptions, parse_logs
from megapilot.logs.bulk import RowHook, RowLine
from megapilot.logs.records import Record
from megapilot.logs.sources import expand_log_paths, source_labels, stdin_read_again
from megapilot.spec import GPUSpec


class NoteKind(StrEnum):
    """What a diagnosis note is about: how a reader (the CLI) chooses which to show, whatever its wording."""

    FRAMEWORK = "framework"  # which framework wrote the log, when not Megatron-LM, and what megapilot reads of it
    FIXES = "fixes"  # what the fixes were written for (generic without flags; a release's flag names): moot without one
    ASSUMPTION = "assumption"  # what reading the script or flags assumed (a vocabulary, a GPU count)
    LOG = "log"  # what the log showed beside the findings (a restart, a CPU run, skipped binary data)
    VERDICT = "verdict"  # that no problem was found


@dataclass(frozen=True)
class Note:
    """One thing a diagnosis says beside its findings; `--json` gives its text alone."""

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class Diagnosis:
    """Ranked findings plus what the diagnosis assumed."""

    findings: list[Finding]
    log: ParsedLog
    config: RunConfig | None
    notes: list[Note] = field(default_factory=list)
    cascade: Cascade | None = None  # the first failure and what followed it, across every file
    labels: dict[str, str] = field(default_factory=dict)  # file path → the short name findings use

    @property
    def story(self) -> list[str]:
        """The cascade told root cause first (empty without errors)."""
        return self.cascade.story(self.labels) if self.cascade is not None else []

    def to_dict(self) -> dict[str, Any]:
        """The stable `--json` schema of `megapilot diagnose`."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "dialect": self.log.dialect,
            "framework": self.log.framework,
            "files": self.log.files,
            "story": self.story,
            "summary": self.log.summary.to_dict() if self.log.summary else None,
            "notes": [note.text for note in self.notes],
            "megatron_version": version.to_dict() if (version := recognise_megatron_version(self.log)) else None,
        }


def parse_options_for(config: RunConfig | None) -> ParseOptions:
    """What the flags tell the parser (to compute tokens/s/GPU when the log does not print it)."""
    if config is None or config.training is None:
        return ParseOptions(world_size=config.world_size if config else None)
    return ParseOptions(seq_length=config.training.seq_length, world_size=config.world_size,
                        global_batch_size=config.training.global_batch_size)


def diagnose_log(log: ParsedLog, config: RunConfig | None, gpu: GPUSpec | None = None) -> Diagnosis:
    """Findings for an already parsed log.

    A log of another run than the script describes is a finding of its own, and the rules then read
    the log alone: the script's layout would size fixes and predictions for a run the log is not of.
    """
    on_cpu = trained_on_cpu(config, log)
    if on_cpu and (gpu is not None or (config is not None and config.gpu is not None)):
        gpu, config = None, replace(config, gpu=None) if config is not None else None
    mismatch = mismatch_finding(log_mismatches(log, config)) if config is not None else None
    rules_config = None if mismatch is not None else config
    found = line_findings(log, rules_config) + metric_findings(log, rules_config, gpu)
    if config is None and gpu is not None and not on_cpu and not any(f.category == "low_throughput" for f in found):
        slower = slower_than_predicted(log, _config_from_arguments(log, gpu))  # predicted for the logged run
        found += [slower] if slower is not None else []
    findings = ranked(found + ([mismatch] if mismatch is not None else []))
    labels = source_labels(log.files)
    cascade = build_cascade(cascade_errors(log), log.files)
    findings = lead_with_root(findings, cascade, labels)
    version = recognise_megatron_version(log)
    findings, release_notes = in_release_names(findings, version,
                                               rules_config.parallel if rules_config is not None else None)
    if on_cpu:
        findings = [_without_gpu_fixes(finding) for finding in findings]
    framework = not_megatron_statement(log, any(fix.kind == "config" for f in findings for fix in f.fixes))
    notes = [Note(NoteKind.FRAMEWORK, framework)] if framework else []
    if config is not None:
        notes += [Note(NoteKind.ASSUMPTION, text) for text in config.notes]
    elif framework is None:  # another framework's fixes are its own settings, not generic Megatron-LM ones
        notes.append(Note(NoteKind.FIXES, "no --script/--flags given: fixes are generic"))
    if on_cpu:
        notes.append(Note(NoteKind.LOG, f"the run trained on CPU ({CPU_RUN_EVIDENCE}): no GPU throughput, MFU or "
                                        "precision advice"))
    if any(fix.kind == "megatron_flag" for finding in findings for fix in finding.fixes):
        notes += [Note(NoteKind.FIXES, text) for text in release_note(version, release_lines(log)) + release_notes]
    if not (log.iterations or (log.summary and log.summary.iterations_logged)):
        notes.append(Note(NoteKind.LOG, "no training progress found (no iteration line)"
                                        + (": only error lines were read" if log.errors else "")))
    for before, resumed in restarts(log):
        label = labels.get(before.file, Path(before.file).name)
        notes.append(Note(NoteKind.LOG, f"{label}: the run restarted after iteration {before.iteration} and resumed "
                                        f"at iteration {resumed.iteration} (line {resumed.line}): iterations "
                                        f"{resumed.iteration}-{before.iteration} ran twice, counted once"))
    if mismatch is not None:
        notes.append(Note(NoteKind.LOG, "the log is not of the run the script describes: the script's flags were not "
                                        "used"))
    for skipped in log.binary_skipped:  # a crash's NUL padding or garbage: the text around it was read
        notes.append(Note(NoteKind.LOG, f"{labels.get(skipped.file, Path(skipped.file).name)}: {skipped.describe()}"))
    if not findings:
        notes.append(Note(NoteKind.VERDICT, "no problem found in the log"))
    return Diagnosis(findings=findings, log=log, config=config, notes=notes, cascade=cascade, labels=labels)


# Fixes that only a GPU run can take (its tools, its precisions, its overlap switches): not offered to a CPU run.
GPU_ONLY_FIX_WORDS = ("nvidia-smi", "amd-smi", "rocm-smi", "fp8", "tp-comm-overlap", "nccl_", "cuda_device_max")


def _without_gpu_fixes(finding: Finding) -> Finding:
    fixes = [fix for fix in finding.fixes
             if not any(word in f"{fix.flag} {fix.value or ''}".lower() for word in GPU_ONLY_FIX_WORDS)]
    return finding if len(fixes) == len(finding.fixes) else replace(finding, fixes=fixes)


def diagnose(
    paths: Iterable[str | Path],
    *,
    script: str | Path | None = None,
    flags: str | None = None,
    gpu: GPUSpec | None = None,
    gpus: int | None = None,
) -> Diagnosis:
    """Diagnose a run from its logs (files, directories of logs or glob patterns, read as one run) and (optionally)
    its launch script or flags and GPU type. The `Diagnosis.log` holds what the rules read, bounded whatever the logs'
    size (`megapilot.diagnose.series`); `megapilot.logs.parse_logs` gives every record."""
    launch = read_flags(script=script, flags=flags, training_script=True)
    config = run_config(launch, gpu=gpu, gpus=gpus) if launch is not None else None
    paths = expand_log_paths([str(path) for path in paths])
    # flags that turn out not to be the log's run, or logs of several runs (one file may hold several), make a
    # second reading: standard input is then read from a copy
    with stdin_read_again() if "-" in paths else nullcontext():
        fingerprints = RunFingerprints()
        log = parse_for_rules(paths, parse_options_for(config), fingerprints=fingerprints)
        groups = fingerprints.groups(paths)
        if len(groups) > 1:  # logs of several runs: each judged on its own, never one run's records over another's
            return _diagnose_each(groups, log, config, launch, gpu=gpu, gpus=gpus)
        if launch is not None:
            config = with_log_tokenizer(config, launch, log, gpu=gpu, gpus=gpus)
        if config is not None and log_mismatches(log, config):
            log = parse_for_rules(paths, None)  # the log's own arguments block, not the script, sizes its tokens/s
    return diagnose_log(log, config, gpu)


def _diagnose_each(groups: list[RunGroup], log: ParsedLog, config: RunConfig | None, launch: LaunchFlags | None, *,
                   gpu: GPUSpec | None, gpus: int | None) -> Diagnosis:
    """Logs of several runs: a finding that names the files and what sets them apart, and each run's findings from
    its own files, titled with their names. `log` (every file read as one) is kept as what was read."""
    labels = source_labels(log.files)
    findings = [mixed_runs_finding(groups, labels)]
    notes: list[Note] = []
    cascade: Cascade | None = None
    for group in groups:
        name = group.name(labels)
        own = parse_for_rules(group.paths, parse_options_for(config), windows=group.windows)
        own_config = with_log_tokenizer(config, launch, own, gpu=gpu, gpus=gpus) if launch is not None else config
        if own_config is not None and log_mismatches(own, own_config):
            own = parse_for_rules(group.paths, None, windows=group.windows)
        judged = diagnose_log(own, own_config, gpu)
        findings += [replace(finding, title=f"{name}: {finding.title}") for finding in judged.findings]
        cascade = cascade or judged.cascade
        for note in judged.notes:
            told = Note(NoteKind.LOG, f"{name}: no problem found in its log") if note.kind == NoteKind.VERDICT \
                else note
            if told not in notes:
                notes.append(told)
    return Diagnosis(findings=ranked(findings), log=log, config=config, notes=notes, cascade=cascade, labels=labels)


def _config_from_arguments(log: ParsedLog, gpu: GPUSpec) -> RunConfig | None:
    """The run the log's own `arguments` block describes, on `gpu` (no script given): what a prediction needs."""
    launch = flags_from_log(log)
    if launch is None:
        return None
    try:
        return run_config(launch, gpu=gpu)
    except MegapilotError:  # a block whose values make no run the estimator can price: no prediction, no finding
        return None


def with_log_tokenizer(config: RunConfig | None, launch: LaunchFlags, log: ParsedLog, *, gpu: GPUSpec | None,
                       gpus: int | None) -> RunConfig | None:
    """The run config again with the tokenizer and vocabulary the log's arguments block printed where the flags are
    silent (the vocabulary the run used, not an assumed one); `config` where the block adds nothing."""
    told = _tokenizer_from_log(launch, log)
    if told is None:
        return config
    refined = run_config(told, gpu=gpu, gpus=gpus)
    refined.notes.append("tokenizer/vocabulary from the log's arguments block")
    return refined


def _tokenizer_from_log(launch: LaunchFlags, log: ParsedLog) -> LaunchFlags | None:
    """The launch flags plus the tokenizer and vocabulary size the log's arguments block printed, where the flags
    are silent (a script that leaves the tokenizer to its trainer's default); None when that adds nothing."""
    printed = log.arguments.values if log.arguments is not None else {}
    extra: dict[str, str | None] = {}
    if not launch.has("--tokenizer-type") and printed.get("tokenizer_type") not in (None, "None"):
        extra["--tokenizer-type"] = printed["tokenizer_type"]
    if not launch.has("--vocab-size") and (printed.get("vocab_size") or "").isdigit():
        extra["--vocab-size"] = printed["vocab_size"]
    return replace(launch, values={**launch.values, **extra}) if extra else None


def parse_for_rules(paths: list[str], options: ParseOptions | None, *, bulk: bool = True,
                    fingerprints: RunFingerprints | None = None,
                    windows: dict[str, tuple[int, int | None]] | None = None) -> ParsedLog:
    """The logs parsed with only what the rules read kept (`megapilot.diagnose.series`): memory stays flat
    whatever the logs' size. `bulk`: canonical iteration lines are read in bulk and only the kept ones become
    records (~10x faster on a long log); False feeds every line to the line parser (the same result, the
    reference the tests compare with). `fingerprints` also gets every record (which run each file is of). `windows`:
    of a file that holds several runs, the lines of one (`parse_logs`)."""
    kept = RuleRecords()
    on_record: Callable[[Record], None] = kept.add
    on_row: RowHook | None = kept.add_row if bulk else None
    if fingerprints is not None:
        prints = fingerprints

        def on_record(record: Record) -> None:
            kept.add(record)
            prints.add(record)

        def both_rows(row: RowLine) -> None:
            kept.add_row(row)
            prints.add_row(row)

        on_row = both_rows if bulk else None
    return kept.fill(parse_logs(paths, options=options, summary_only=True, on_record=on_record, on_row=on_row,
                                windows=windows))
