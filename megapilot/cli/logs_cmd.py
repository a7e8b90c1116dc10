"""`megapilot logs parse`, `megapilot diagnose`, `megapilot optimize`: training-log intelligence.

`logs parse FILE...` prints records and the steady-state summary (`-` reads stdin; `--follow` tails growing
logs, several files of one run at once, until training ends or a timeout). `diagnose FILE...` ranks findings
with evidence and exact fixes. `optimize` ranks flag changes by predicted tokens/s. All have `--json`.
"""

from __future__ import annotations

import csv
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json
from megapilot.errors import MegapilotError

if TYPE_CHECKING:
    from megapilot.diagnose import Diagnosis
    from megapilot.diagnose.findings import Fix
    from megapilot.diagnose.megatron_version import RecognisedVersion
    from megapilot.diagnose.optimize import OptimizeReport
    from megapilot.logs import ParsedLog
    from megapilot.logs.parser import ParseOptions
    from megapilot.logs.records import IterationRecord, Record
    from megapilot.spec import GPUSpec

logs_app = typer.Typer(help="Parse training logs (Megatron-LM, Megatron-Bridge, Primus).", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
Files = Annotated[list[str], typer.Argument(
    help="Log files, directories of logs (searched for *.log, *.out, *.err, ...) or glob patterns, read as one run; "
         "- reads stdin.", show_default=False)]
ScriptOpt = Annotated[Path | None, typer.Option("--script", help="Launch script whose Megatron flags to read.")]
FlagsOpt = Annotated[str | None, typer.Option("--flags",
                                              help='Megatron flags as one string, e.g. "--tensor-model-parallel-size 8 '
                                                   '...".')]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="GPU type (alias or name, e.g. h100, mi300x).")]
GpusOpt = Annotated[int | None, typer.Option("--gpus", help="Total GPUs of the run (default: from torchrun flags).")]

CSV_COLUMNS = ("file", "line", "dialect", "iteration", "train_iters", "rank", "time_s", "elapsed_ms", "tflops_per_gpu",
               "tokens_per_s_per_gpu", "tokens_source", "mfu_pct", "lm_loss", "grad_norm", "lr", "loss_scale", "gbs",
               "skipped_iterations", "nan_iterations", "memory_used_gib", "memory_usage_pct")


def _nothing_recognised(log: ParsedLog) -> bool:
    """No line of any file was a training-log line: an empty file, a binary one, or not a training log."""
    logged = log.summary.iterations_logged if log.summary else 0
    return not (logged or log.iterations or log.memory or log.theoretical_memory or log.timers or log.checkpoints
                or log.errors or log.markers or log.dialect_counts)


def _refuse_empty(log: ParsedLog, *, flag: str = "FILE") -> None:
    """Nothing to read at all. Any text is read (a traceback, dmesg, a SLURM .err file): only emptiness is refused."""
    if log.lines_read == 0 and _nothing_recognised(log):
        names = ", ".join("standard input" if name in ("-", "<stdin>") else name for name in log.files)
        raise MegapilotError(f"{names} {'is' if len(log.files) == 1 else 'are'} empty", field=flag,
                             fix="pass the logs a run printed (a training log, a rank's stderr, a SLURM .out/.err)")


def _check_script(script: Path | None) -> None:
    """The launch script must be a readable text file (a binary one would be read as having no flags)."""
    if script is not None and script.exists():
        from megapilot.cli.common import read_text_file

        read_text_file(script, flag="--script", what="a launch script",
                       fix="pass the bash launch script (e.g. one from `megapilot script`)")


def _gpu(alias: str | None) -> GPUSpec | None:
    if alias is None:
        return None
    from megapilot.catalog.gpus import get_gpu

    try:
        return get_gpu(alias)
    except MegapilotError as error:  # the catalog names its own field; here it is the option that was given
        raise MegapilotError(error.problem, field="--gpu", fix=error.fix) from None


# ---- logs parse -----------------------------------------------------------------------------------

def parse(
    files: Files,
    json_output: JsonFlag = False,
    csv_output: Annotated[bool, typer.Option("--csv", help="Print the iteration records as CSV.")] = False,
    follow: Annotated[bool, typer.Option("--follow", help="Tail growing logs (one file, several, a directory or a "
                                         "glob: one run) until training ends or a timeout; each new iteration is "
                                         "printed with the file it came from.")] = False,
    summary_only: Annotated[bool, typer.Option("--summary-only",
                                               help="Keep no per-record lists (flat memory).")] = False,
    seq_length: Annotated[int | None,
                          typer.Option(help="Sequence length, to compute tokens/s/GPU when not printed.")] = None,
    world_size: Annotated[int | None,
                          typer.Option(help="GPUs of the run, to compute tokens/s/GPU when not printed.")] = None,
    global_batch_size: Annotated[int | None, typer.Option(help="Used when the lines lack `global batch size`.")] = None,
    timeout: Annotated[float | None, typer.Option(help="--follow: stop after this many seconds.")] = None,
    idle_timeout: Annotated[float | None,
                            typer.Option(help="--follow: stop after this many seconds without new bytes.")] = None,
) -> None:
    """Parse training logs into iteration, memory, checkpoint and error records plus a steady-state summary."""
    from megapilot.cli.common import require_positive
    from megapilot.logs import ParseOptions, parse_logs
    from megapilot.logs.sources import expand_follow_paths, expand_log_paths

    if json_output and csv_output:
        raise MegapilotError("--json and --csv exclude each other", field="--csv", fix="pass one of them")
    if csv_output and summary_only:  # the CSV is the iteration records, which --summary-only does not keep
        raise MegapilotError("--csv prints the iteration records, which --summary-only does not keep",
                             field="--csv", fix="drop --summary-only (or --csv)")
    for flag, value in (("--timeout", timeout), ("--idle-timeout", idle_timeout)):
        if value is not None and not follow:
            raise MegapilotError(f"{flag} applies to --follow only: a log read to its end takes no timeout",
                                 field=flag, fix=f"add --follow to tail a growing log, or drop {flag}")
    for flag, value in (("--seq-length", seq_length), ("--world-size", world_size),
                        ("--global-batch-size", global_batch_size), ("--timeout", timeout),
                        ("--idle-timeout", idle_timeout)):
        require_positive(flag, value)
    options = ParseOptions(seq_length=seq_length, world_size=world_size, global_batch_size=global_batch_size)
    if follow:
        paths = expand_follow_paths(files)
        if timeout is None and idle_timeout is None:
            idle_timeout = 600.0
        # one file is a run of one file: the same live lines and hang warning as several
        _follow_several(paths, options, timeout_s=timeout, idle_timeout_s=idle_timeout,
                        quiet=json_output or csv_output)
        if not any(Path(path).exists() for path in paths):
            raise MegapilotError(f"{', '.join(paths)} did not appear before the timeout", field="FILE",
                                 fix="check the log path (a run directory's log is out-node0/training.log)")
        paths = [path for path in paths if Path(path).exists()]  # the files, as they ended, are read as one run
    else:
        paths = expand_log_paths(files)
    if not (json_output or csv_output or summary_only):
        # the table reads no record per iteration line: the logs in bulk, with what the table shows beside them
        from megapilot.cli.logs_table import read_table_log

        table = read_table_log(paths, options)
        if not follow:
            _refuse_empty(table.log)  # (not under --follow: a followed file may still be empty at its timeout)
        _print_log(table.log, memory_reports=table.memory_reports, version=table.version())
        return
    log = parse_logs(paths, options=options, summary_only=summary_only)
    if not follow:
        _refuse_empty(log)
    if json_output:
        version = None
        if log.arguments is not None or log.iterations or any(m.marker.startswith("release:") for m in log.markers):
            # what a release is told by (the flag tables load slowly: only then)
            from megapilot.diagnose.megatron_version import recognise_megatron_version

            version = recognise_megatron_version(log)
        emit_json({**log.to_dict(), "megatron_version": version.to_dict() if version else None})
    elif csv_output:
        _write_csv(log)
    else:  # --summary-only: no memory records kept
        from megapilot.diagnose.megatron_version import recognise_megatron_version

        _print_log(log, memory_reports=None, version=recognise_megatron_version(log))


def _follow_several(paths: list[str], options: ParseOptions, *, timeout_s: float | None,
                    idle_timeout_s: float | None, quiet: bool) -> None:
    """Follow every file of the run at once, printing each new iteration and error line with its file (to stderr
    under --json/--csv, whose stdout is the report); the caller then reads the files, as they ended, as one run."""
    from rich.markup import escape

    from megapilot.cli.common import err_console
    from megapilot.logs.follow_run import follow_run
    from megapilot.logs.sources import source_labels

    labels = source_labels(paths)
    out = err_console if quiet else console

    def show(record: Record) -> None:
        line = _live_line(record)
        if line is not None:
            name = labels.get(record.file, Path(record.file).name)
            out.print(f"{escape(name)}  {escape(line)}", highlight=False)

    def hang(silent_s: float, last: IterationRecord) -> None:
        name = labels.get(last.file, Path(last.file).name)
        out.print(f"no new iteration in any file for {silent_s:.0f} s (last: {escape(name)} iteration "
                  f"{last.iteration}): a hang? `py-spy dump --pid <pid>` on each rank shows where it waits",
                  highlight=False)

    follow_run(list(paths), options=options, on_record=show, on_hang=hang, timeout_s=timeout_s,
               idle_timeout_s=idle_timeout_s)


def _live_line(record: Record) -> str | None:
    """One line of the live view: an iteration's step time, loss and throughput, or an error line."""
    from megapilot.logs.records import ErrorRecord, IterationRecord

    if isinstance(record, IterationRecord):
        of = f"/{record.train_iters}" if record.train_iters else ""
        parts = [f"iteration {record.iteration}{of}", f"step {_fmt(record.elapsed_ms)} ms",
                 f"loss {_fmt(record.lm_loss, '.4f')}"]
        if record.tokens_per_s_per_gpu is not None:
            parts.append(f"{_fmt_rate(record.tokens_per_s_per_gpu)} tokens/s/GPU")
        return " | ".join(parts)
    if isinstance(record, ErrorRecord):
        return f"{record.category}: {record.text.strip()[:160]}"
    return None


def _write_csv(log: ParsedLog) -> None:
    writer = csv.writer(sys.stdout)
    writer.writerow(CSV_COLUMNS)
    for record in log.iterations:
        row = record.to_dict()
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in CSV_COLUMNS])


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "—" if value is None else format(value, spec)


def _fmt_rate(value: float | None) -> str:
    """A throughput with three significant digits below 100 (a CPU run's 0.0012 TFLOP/s must not read 0.0)."""
    if value is None or value == 0 or abs(value) >= 100:
        return _fmt(value, ",.0f")
    return f"{value:.3g}"


# A measured step this many times off the prediction was most likely taken on another device than --gpu.
_CALIBRATION_SANE = (0.2, 5.0)


def _print_log(log: ParsedLog, *, memory_reports: int | None, version: RecognisedVersion | None) -> None:
    """The table of `logs parse`: `memory_reports` None when not counted (--summary-only), `version` the release
    `recognise_megatron_version` tells of the log."""
    from rich.table import Table

    s = log.summary
    assert s is not None
    from megapilot.logs.framework import DIALECT_FRAMEWORK  # late, as this module's others: the CLI's start-up

    # the framework where the dialect does not say it (error lines alone, Bridge's `Training ...`, NeoX on DeepSpeed)
    told = log.framework not in ("unknown", DIALECT_FRAMEWORK.get(log.dialect))
    table = Table(title=f"{_files_title(log.files)} — dialect {log.dialect}"
                        f"{f', framework {log.framework}' if told else ''}, {log.lines_read:,} lines",
                  show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("iterations logged / counted / steady",
         f"{s.iterations_logged} / {s.iterations_counted} / {s.steady_iterations}"),
        ("iteration range",
         f"{_fmt(s.first_iteration, ',')} → {_fmt(s.last_iteration, ',')} of {_fmt(s.train_iters, ',')}"),
        ("step time mean / p50 / p95 (ms)",
         f"{_fmt(s.step_time_mean_ms)} / {_fmt(s.step_time_p50_ms)} / {_fmt(s.step_time_p95_ms)}"),
        ("step time CV", _fmt(s.step_time_cv, ".3f")),
        # the hint only where steady records exist to average: with none (one logged step) the shape would not help
        ("tokens/s/GPU (mean)", _fmt_rate(s.tokens_per_s_per_gpu_mean) if s.tokens_per_s_per_gpu_mean is not None
         or not s.steady_iterations else "— (pass --seq-length and --world-size)"),
        ("TFLOP/s/GPU (mean)", _fmt_rate(s.tflops_per_gpu_mean)),
        ("loss first / min / final",
         f"{_fmt(s.first_loss, '.4f')} / {_fmt(s.min_loss, '.4f')} / {_fmt(s.final_loss, '.4f')}"),
        # --summary-only keeps no memory records: say "not kept" rather than a misleading 0
        ("memory reports / checkpoints / errors",
         f"{'not kept' if memory_reports is None else memory_reports} / {len(log.checkpoints)} / {len(log.errors)}"),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"[dim]steady state: {s.rule}[/]")
    if version is not None:
        from rich.markup import escape

        closest = "" if version.exact else " (closest)"
        console.print(f"[dim]Megatron-LM {version.release}{closest}: {escape(version.detail)}[/]", highlight=False)
    if not s.iterations_logged:
        from megapilot.cli.common import err_console

        err_console.print("note: no iteration line found: no step time, throughput or loss (did training start? "
                          "with pipeline parallelism the last stage's rank prints them)", highlight=False)
    for skipped in log.binary_skipped:  # a crash's NUL padding or garbage: the text around it was read
        from megapilot.cli.common import err_console

        err_console.print(f"note: {Path(skipped.file).name}: {skipped.describe()}", highlight=False)
    if log.errors:
        errors = Table(title="error lines (first 10)")
        for column in ("category", "rank", "file:line", "text"):
            errors.add_column(column, overflow="fold")
        from rich.markup import escape

        from megapilot.logs.sources import source_labels

        labels = source_labels(log.files)  # `out-node1/training.log`, not a bare `training.log` per node
        for error in log.errors[:10]:
            where = f"{labels.get(error.file, Path(error.file).name)}:{error.line}"
            errors.add_row(error.category, "—" if error.rank is None else str(error.rank), escape(where),
                           escape(error.text.strip()))
        console.print(errors)


def _files_title(files: list[str]) -> str:
    from megapilot.logs.sources import shown_name

    names = [shown_name(name) for name in files]
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:2])} and {len(names) - 2} more files"


# ---- diagnose --------------------------------------------------------------------------------------

def diagnose_command(
    files: Files,
    script: ScriptOpt = None,
    flags: FlagsOpt = None,
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    json_output: JsonFlag = False,
) -> None:
    """Find what went wrong in a run: its logs (files, a directory, a glob; any text a failed job left) read as one
    run, the first failure told before its consequences, ranked findings with evidence lines and exact fixes."""
    from megapilot.cli.common import require_at_most, require_positive
    from megapilot.diagnose import diagnose
    from megapilot.limits import MAX_GPUS, MAX_GPUS_REASON

    require_positive("--gpus", gpus)
    require_at_most("--gpus", gpus, MAX_GPUS, MAX_GPUS_REASON)  # the bound plan holds it to
    _check_script(script)
    result = diagnose(files, script=script, flags=flags, gpu=_gpu(gpu), gpus=gpus)
    if not result.findings:
        _refuse_empty(result.log)  # "no problem found" in nothing at all would mislead
    not_a_log = not result.findings and not result.log.arguments and _nothing_recognised(result.log)
    if json_output:
        emit_json({**result.to_dict(), "training_log": not not_a_log})
    elif not_a_log:  # "no problem found" in a file that is no training log would mislead
        from rich.markup import escape

        from megapilot.cli.common import err_console
        from megapilot.logs.sources import shown_name

        names = ", ".join(result.labels.get(name, shown_name(name)) for name in result.log.files)
        error = _launch_script_given(result.log.files) or MegapilotError(
            f"{names}: this is not a training log: none of its {result.log.lines_read:,} lines is an iteration, "
            "error, checkpoint or start-up line of a training framework",
            field="FILE", fix="pass the log a training job printed (a rank's output, a SLURM .out/.err file, a run "
                              "directory's training.log)")
        err_console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
    else:
        _print_diagnosis(result)
    if not_a_log:  # exit 1, not the usage error's 2: the file was read, it holds nothing to diagnose
        raise typer.Exit(1)


_SCRIPT_SUFFIXES = (".sh", ".bash", ".sbatch", ".slurm")


def _launch_script_given(files: list[str]) -> MegapilotError | None:
    """The error for a launch script given where its log goes (it has Megatron flags and no log line): what it is
    and where it goes instead."""
    from megapilot.diagnose import read_flags

    for name in files:
        path = Path(name)
        if not path.is_file() or not (path.suffix in _SCRIPT_SUFFIXES or _starts_with_shebang(path)):
            continue  # a log that echoed its command line is still a log
        try:
            read_flags(script=name, training_script=True)
        except MegapilotError:  # no Megatron flag in it: not a launch script either
            continue
        return MegapilotError(f"{name} is a launch script, not a training log", field="FILE",
                              fix=f"pass it with --script beside the log it wrote: megapilot diagnose LOG --script "
                                  f"{name}")
    return None


def _starts_with_shebang(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


_SEVERITY_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "dim"}


def _print_diagnosis(result: Diagnosis) -> None:
    from rich.markup import escape
    from rich.table import Table

    from megapilot.diagnose.engine import NoteKind

    if not result.findings:
        console.print("[green]No problem found in the log.[/]")
        # the headline says the verdict; what the fixes were built from says nothing when there is no fix
        for note in result.notes:
            if note.kind not in (NoteKind.VERDICT, NoteKind.FIXES):
                console.print(f"note: {note.text}", highlight=False)
        return
    for note in result.notes:  # a log of another framework says so before any finding is read
        if note.kind is NoteKind.FRAMEWORK:
            console.print(f"note: {escape(note.text)}", highlight=False)
    if len(result.story) > 1:  # a cascade across ranks or files: the story before the findings
        console.print("[bold]what happened[/] (root cause first):")
        for sentence in result.story:
            console.print(f"   {escape(sentence)}", highlight=False)
    for number, finding in enumerate(result.findings, start=1):
        style = _SEVERITY_STYLE[finding.severity]
        console.print(f"[{style}]{number}. {finding.severity.upper()} {finding.category}[/]: {escape(finding.title)}")
        for evidence in finding.evidence[:3]:
            name = result.labels.get(evidence.file, Path(evidence.file).name)
            # the whole line, folded by the terminal: a cut (`| throu`) hides the value the finding is about
            console.print(f"   [dim]{escape(name)}:{evidence.line}[/] {escape(evidence.text.strip())}", highlight=False)
        console.print(f"   cause: {escape(finding.cause)}", highlight=False)
        if finding.fixes:
            fixes = Table(show_edge=False, pad_edge=False)
            for column in ("option", "change", "pred. GiB", "why"):
                fixes.add_column(column, overflow="fold")
            for fix in finding.fixes[:12]:
                fixes.add_row(escape(fix.option or ""), escape(fix.text), _fmt(fix.predicted_memory_gib),
                              escape(fix.reason))
            console.print(fixes)
    for note in result.notes:
        if note.kind is not NoteKind.FRAMEWORK:
            console.print(f"[dim]note: {note.text}[/]")


# ---- optimize --------------------------------------------------------------------------------------

def optimize_command(
    script: ScriptOpt = None,
    flags: FlagsOpt = None,
    log: Annotated[list[str] | None, typer.Option(
        "--log", help="Training log: its measured step time calibrates predictions; without --script/--flags, the "
                      "arguments block Megatron printed in it gives the run.")] = None,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="GPU type, e.g. h100 (default: the GPU named in a megapilot-rendered script).")] = None,
    gpus: GpusOpt = None,
    json_output: JsonFlag = False,
) -> None:
    """Rank flag changes by predicted tokens/s gain, against the planner's best layout for the same run."""
    from megapilot.cli.common import require_at_most, require_positive
    from megapilot.diagnose import read_flags, run_config
    from megapilot.diagnose.engine import parse_for_rules, parse_options_for, with_log_tokenizer
    from megapilot.diagnose.flags import flags_from_log
    from megapilot.diagnose.optimize import optimize
    from megapilot.limits import MAX_GPUS, MAX_GPUS_REASON
    from megapilot.logs.sources import expand_log_paths, stdin_read_again

    require_positive("--gpus", gpus)
    require_at_most("--gpus", gpus, MAX_GPUS, MAX_GPUS_REASON)  # the bound plan holds it to
    _check_script(script)
    log_paths = expand_log_paths(log or [], flag="--log")
    with stdin_read_again() if "-" in log_paths else nullcontext():  # the log may be read twice: once for its flags
        launch = read_flags(script=script, flags=flags, training_script=True)
        from_log = launch is None and bool(log_paths)
        if from_log:
            launch = flags_from_log(parse_for_rules(log_paths, None))
        if launch is None:
            raise MegapilotError("no launch given", field="--script",
                                 fix="pass --script train.sh or --flags \"...\", or a --log that printed Megatron's "
                                     "arguments block")
        config = run_config(launch, gpu=_gpu(gpu), gpus=gpus)
        if config.gpu is None:
            raise MegapilotError(f"GPU type unknown: the {'log' if from_log else 'script'} does not name it",
                                 field="--gpu", fix="pass the GPU type, e.g. --gpu h100")
        if from_log:
            config.notes.append(f"the run's flags are the log's own arguments block ({launch.source})")
        parsed = None
        if log:
            # what diagnose reads: summary, arguments and a bounded share of the records (a long log in flat memory)
            parsed = parse_for_rules(log_paths, parse_options_for(config))
            if parsed.summary is None or parsed.summary.step_time_p50_ms is None:
                raise MegapilotError("no step time found in the log", field="--log",
                                     fix="pass a log with iteration lines, or leave --log out")
            if not from_log:  # a script silent on its tokenizer: the vocabulary the log's run used, as diagnose
                config = with_log_tokenizer(config, launch, parsed, gpu=config.gpu, gpus=gpus) or config
    report = optimize(config, log=parsed)
    if json_output:
        emit_json(report.to_dict())
        return
    _print_optimize(report)


def _print_optimize(report: OptimizeReport) -> None:
    from rich.table import Table

    console.print(f"current: {report.current_layout} — predicted {_fmt(report.current_tokens_per_s_per_gpu, ',.0f')} "
                  f"tokens/s/GPU, {_fmt(report.current_memory_gib)} GiB"
                  + (f" (calibrated ×{report.calibration_scale:.2f} to the measured step)"
                     if report.calibration_scale else ""))
    if report.best_layout:
        console.print(f"planner's best: {report.best_layout} — {_fmt(report.best_tokens_per_s_per_gpu, ',.0f')} "
                      "tokens/s/GPU")
    table = Table(title="changes, best predicted gain first")
    for column in ("change", "flags", "tokens/s/GPU", "gain", "GiB", "fits"):
        table.add_column(column, overflow="fold")
    for item in report.changes:
        flag_text = " ".join(_change_text(f) for f in item.fixes)
        gain = "not modelled" if not item.modelled else (f"{item.gain_pct:+.1f}%" if item.gain_pct is not None else "—")
        table.add_row(item.label, flag_text, _fmt(item.predicted_tokens_per_s_per_gpu, ",.0f"), gain,
                      _fmt(item.predicted_memory_gib), "—" if item.fits is None else ("yes" if item.fits else "no"))
    console.print(table)
    if report.log_mismatch is not None:
        from rich.markup import escape

        console.print(f"[red]{escape(report.log_mismatch.title)}[/]", highlight=False)
        for evidence in report.log_mismatch.evidence:
            console.print(f"   [dim]{Path(evidence.file).name}:{evidence.line}[/] "
                          f"{escape(evidence.text.strip()[:150])}",
                          highlight=False)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/]")
    scale = report.calibration_scale
    if scale and not _CALIBRATION_SANE[0] <= scale <= _CALIBRATION_SANE[1]:
        console.print(f"[yellow]warning:[/] the log's step time is {scale:,.1f}× the prediction for this GPU: was it "
                      "measured on another device (a CPU test run?) or with other flags? Gains are relative, but "
                      "check --gpu and --script.", highlight=False)


def _change_text(fix: Fix) -> str:
    """A flag edit as the script would read it; an environment edit as its export or unset; anything else (a
    command, advice) as `Fix.text` says it."""
    if fix.kind == "env":
        return f"(unset {fix.flag})" if fix.action == "remove" else f"{fix.flag}={fix.value}"
    if fix.kind != "megatron_flag":
        return f"({fix.text})"
    return f"(remove {fix.flag})" if fix.action == "remove" else fix.flag + (f" {fix.value}" if fix.value else "")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    logs_app.command("parse")(parse)
    app.add_typer(logs_app, name="logs")
    app.command("diagnose")(diagnose_command)
    app.command("optimize")(optimize_command)
