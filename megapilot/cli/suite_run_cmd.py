"""`megapilot suite run`: run a validation suite end to end, then write its report and history row.

Exit codes (megapilot.suite.outcome, the one verdict): 0 PASS, WARN (a regression not enforced), RECORD or
SKIPPED; 1 FAIL (a gate, or a regression with `regressions.enforce` / `--enforce-regressions`); 2 a config error
(nothing ran; under `--json`, printed as the `suite check --json` document); 128 + N when stopped by
signal N: 130 Ctrl-C (SIGINT), 143 SIGTERM (`timeout`, systemd, scancel), 129 SIGHUP (a closed SSH session).
Every job is stopped first; finished results, the report, the run deck, JUnit and the history row are still
written, and the last line is the command that resumes the run. Resuming a run that had finished runs nothing: its
stored results (or `--json` document) are printed and it exits as it did.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json, err_console
from megapilot.cli.suite_check_cmd import (
    DEFAULT_OUT,
    ExcludeFailingOpt,
    MegatronVersionOpt,
    OutOpt,
    check_payload,
    run_check,
)
from megapilot.errors import EXIT_USER_ERROR, MegapilotError

if TYPE_CHECKING:
    from megapilot.report import ReportFiles
    from megapilot.store.history import History
    from megapilot.store.regress import HistoryBaselines
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.dry_run import DryRunPlan
    from megapilot.suite.results import SuiteResult

EXIT_INTERRUPTED = 130  # Ctrl-C; another signal N exits 128 + N
LATEST = "latest"

ConfigArg = Annotated[Path, typer.Argument(help="Suite config (CVS Megatron JSON/YAML, or a megapilot template).",
                                           show_default=False)]
ClusterOpt = Annotated[Path | None, typer.Option("--cluster", help="CVS cluster file (nodes, user, key).")]


def run(
    config: ConfigArg,
    cluster: ClusterOpt = None,
    # written out, not imported: --help loads no library module (tests check the list against suite.stages.STAGES)
    stage: Annotated[str | None, typer.Option(help="Run only this stage (prepare, results and teardown always run): "
                                                   "prepare, preflight, collectives, tokenizer, smoke, checkpoint, "
                                                   "train, metrics, loss_curve, results, teardown.")] = None,
    combo: Annotated[str | None, typer.Option(
        help="Run only this sweep cell, e.g. 'MBS=4,GBS=128,PRECISION=FP8'.")] = None,
    out: OutOpt = DEFAULT_OUT,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the stages and each combo's exact launch; "
                                                            "run nothing.")] = False,
    resume: Annotated[str | None, typer.Option("--resume", help="Run id, run directory or 'latest' (the newest run "
                                                                "under --out) of an interrupted run: finished stages "
                                                                "and combos are kept, the rest run.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="History database: a SQLite path or postgresql:// URL "
                                                        "(default: the user data dir, or $MEGAPILOT_HISTORY).")] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Do not record this run in the history.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the results (or the dry run) as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress while it runs: only the summary and the "
                                                               "paths of the report, run deck and JUnit.")] = False,
    enforce_regressions: Annotated[bool | None, typer.Option(
        "--enforce-regressions/--warn-regressions",
        help="A regression beyond its band against the history fails the run (exit 1), or is a WARN (default: the "
             "config's regressions.enforce, else WARN).")] = None,
    megatron_version: MegatronVersionOpt = None,
    cluster_name: Annotated[str | None, typer.Option(
        "--cluster-name", help="Record (and calibrate) this run under this cluster (default: the cluster file's "
                               "name; `local` for a CPU suite without one).")] = None,
    calibration: Annotated[str, typer.Option(
        "--calibration", help="history: calibrate each combo's prediction on the cluster's runs in the history; "
                              "none: the uncalibrated model.")] = "history",
    exclude_failing: ExcludeFailingOpt = None,  # --megatron-version and this: `suite check` takes them too
) -> None:
    """Run the suite: prepare, preflight, tokenizer, smoke, checkpoint, every combo, results, teardown."""
    from megapilot.cli.suite_check_cmd import checked_suite, refuse_unrenderable, suite_as_run
    from megapilot.suite.outcome import run_outcome
    from megapilot.suite.stages import STAGES

    if stage is not None and stage not in STAGES:
        from megapilot.errors import MegapilotError

        raise MegapilotError(f"unknown stage {stage!r}", field="--stage", fix="use one of: " + ", ".join(STAGES))
    calibrate = _calibration_mode(calibration)  # a dry run refuses what the run would, before it shows the launches
    combo = _canonical_combo(combo)
    if dry_run and resume is not None:
        from megapilot.errors import MegapilotError

        raise MegapilotError("a dry run shows every stage and combo of the suite; it does not read the run to resume",
                             field="--resume", fix="drop --dry-run to resume the run, or --resume to see the launches")
    _check_out(out)
    if json_output:
        # stdout stays one JSON document: a config `suite check` refuses is printed as its `--json` document, run or
        # dry run alike (the run below then checks it again, as text, which finds nothing)
        checked = _checked_as_json(config, cluster, combo=combo, out=out, megatron_version=megatron_version,
                                   exclude_failing=exclude_failing)
        if dry_run:
            from megapilot.suite.dry_run import dry_run_plan  # here, not at the top: --help loads no library module

            emit_json(dry_run_plan(checked, out_dir=out.resolve(), only_stage=stage, only_combo=combo)
                      .model_dump(mode="json"))
            return
    suite = checked_suite(config, cluster)  # what `suite check` refuses stops the run here, as check says it
    if combo is not None:
        _check_combo(suite, combo)
    # the cells as `suite check` with the same options checks them
    suite, exclusion_notes, excluded_from = suite_as_run(suite, megatron_version=megatron_version,
                                                         exclude_failing=exclude_failing, out=out)
    refuse_unrenderable(suite)  # a cell Megatron would refuse: nothing runs, nothing is recorded
    if dry_run:
        from megapilot.suite.dry_run import dry_run_plan

        _print_dry_run(dry_run_plan(suite, out_dir=out.resolve(), only_stage=stage, only_combo=combo))
        return
    from megapilot.execute.interrupt import Interrupted, stop_on_signals

    enforce = suite.config.regressions.enforce if enforce_regressions is None else enforce_regressions
    resume_command = _resume_command(config, cluster, out, stage, combo, megatron_version, excluded_from)
    try:
        with stop_on_signals():
            ran = _run(suite, out=out, stage=stage, combo=combo, resume=resume, db=None if no_history else db,
                       use_history=not no_history, quiet=quiet or json_output, enforce_regressions=bool(enforce),
                       cluster_name=cluster_name, calibrate=calibrate, notes=tuple(exclusion_notes))
    except Interrupted as exc:  # before the run started or after it ended: nothing to stop or to resume
        err_console.print(f"stopped: {exc.name}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    result, files = ran
    try:
        if json_output:
            from megapilot.suite.summary import result_json

            emit_json(result_json(result))
        else:
            _print_result(result)
            if files is not None:
                from megapilot.cli.suite_progress import print_paths

                print_paths(files.html, files.run_deck, files.junit)  # last, where the eye ends
        if not result.finished:
            err_console.print(f"resume with: {resume_command} --resume {result.run_id}", highlight=False,
                              markup=False, soft_wrap=True)
    except OSError:  # the terminal is gone (SIGHUP of a closed SSH session): every file is written already
        pass
    if not result.finished:
        raise typer.Exit(_interrupted_exit_code())
    exit_code = run_outcome(result).exit_code  # the verdict the banner, deck and JUnit show
    if exit_code:
        raise typer.Exit(exit_code)


def _interrupted_exit_code() -> int:
    from megapilot.execute.interrupt import received_signal

    signum = received_signal()
    return 128 + signum if signum is not None else EXIT_INTERRUPTED


def _check_out(out: Path) -> None:
    """--out is a folder this user may write, or can become one: said before the config is read or anything runs."""
    import os

    from megapilot.errors import MegapilotError

    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise MegapilotError(f"{existing} is a file, not a folder", field="--out",
                             fix="pass a folder for the run directories (or one that does not exist yet)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise MegapilotError(f"{existing} cannot be written", field="--out",
                             fix="pass a folder you may write, on a writable file system")


def _resume_command(config: Path, cluster: Path | None, out: Path, stage: str | None, combo: str | None,
                    megatron_version: str | None, excluded_from: Path | None = None) -> str:
    """The exact command line that resumes this run, shell-quoted, with absolute paths (any directory works)."""
    import shlex

    argv = ["megapilot", "suite", "run", str(config.absolute())]
    argv += ["--cluster", str(cluster.absolute())] if cluster else []
    argv += ["--out", str(out.absolute())]
    argv += ["--stage", stage] if stage else []
    argv += ["--combo", combo] if combo else []
    argv += ["--megatron-version", megatron_version] if megatron_version else []
    # the run the nodes were excluded from, by its directory: `latest` would now be this run itself
    argv += ["--exclude-failing", str(excluded_from.absolute())] if excluded_from else []
    return shlex.join(argv)


def register(suite_app: typer.Typer) -> None:
    suite_app.command("run")(run)


def _canonical_combo(combo: str | None) -> str | None:
    """The sweep cell --combo names, written as the config's cells are keyed (`MBS=1, GBS=8, PRECISION=bf16` is
    MBS=1,GBS=8,PRECISION=BF16, as a threshold file's key is read); as given when it is no cell key."""
    if combo is None:
        return None
    from megapilot.suite.cells import parse_cell_key

    try:
        return parse_cell_key(combo).key
    except ValueError:
        return combo


def _check_combo(suite: LoadedSuite, combo: str) -> None:
    from megapilot.errors import MegapilotError

    keys = [c.key for c in suite.cells]
    if combo not in keys:
        raise MegapilotError(f"no sweep cell {combo!r} in the config", field="--combo",
                             fix="use one of: " + ", ".join(keys))


def _checked_as_json(config: Path, cluster: Path | None, *, combo: str | None, out: Path,
                     megatron_version: str | None, exclude_failing: str | None) -> LoadedSuite:
    """The suite as the run builds it; for a config `suite check` refuses (a cell Megatron would refuse, a --combo the
    sweep lacks included), the document `suite check --json` prints of it, and exit 2."""
    result, launches = run_check(config, cluster, megatron_version=megatron_version,
                                 exclude_failing=exclude_failing, out=out)
    if result.suite is not None and combo is not None:
        try:
            _check_combo(result.suite, combo)
        except MegapilotError as exc:
            result.add(exc.field or "--combo", exc.problem, exc.fix or "")
    payload = check_payload(result, launches)
    if not payload["ok"] or result.suite is None:
        emit_json(payload)
        raise typer.Exit(EXIT_USER_ERROR)
    return result.suite


def _run(suite: LoadedSuite, *, out: Path, stage: str | None, combo: str | None, resume: str | None, db: str | None,
         use_history: bool, quiet: bool, enforce_regressions: bool, cluster_name: str | None = None,
         calibrate: bool = True, notes: tuple[str, ...] = ()) -> tuple[SuiteResult, ReportFiles | None]:
    """Run (or resume) the suite. A run to resume that had already finished is returned as it was stored, with no
    report files: nothing runs or is rewritten, and the caller prints it and exits with its verdict."""
    from megapilot.cli.suite_progress import suite_display
    from megapilot.execute.interrupt import finishing
    from megapilot.suite.executors import make_executor
    from megapilot.suite.lifecycle import RunRequest, run_suite
    from megapilot.suite.outcome import run_outcome
    from megapilot.suite.resume import check_resumable

    history = _open_history(db) if use_history else None
    if history is not None:
        history.check()  # a damaged, locked, read-only or full history is found now, before anything trains
    previous = _previous_run(resume, history, out) if resume else None
    if previous is not None:
        # The config first, finished run or not: "nothing to do" for a run of another config would pass its verdict
        # off as this config's.
        check_resumable(previous, suite)
        if previous.finished:
            # Its stored verdict, exit code and --json document, as the run itself ended: a CI retry of a finished
            # FAIL (after a preemption, say) must not turn green.
            err_console.print(f"run {previous.run_id} finished ({run_outcome(previous).status.value}): nothing to do",
                              highlight=False, markup=False, soft_wrap=True)
            return previous, None
    # A resumed run stays in its own directory, wherever --out points now (found by id in the history).
    out_dir = Path(previous.run_dir).parent if previous is not None else out.resolve()
    from megapilot.suite.lifecycle import cluster_name as cluster_of

    request = RunRequest(out_dir=out_dir, only_stage=stage, only_combo=combo, resume_from=previous,
                         baseline=_baseline_source(history), cluster_name=cluster_name, calibrate=calibrate,
                         notes=notes)
    name = cluster_of(suite, request)
    if history is not None and name is not None and calibrate:
        # late: the history's reading of a combo, needed only where the history calibrates (not by --no-calibrate)
        from megapilot.store.measured import calibration_run_of

        request = replace(request, history_runs=history.calibration_runs(name), measured_run_of=calibration_run_of)
    executor = make_executor(suite)
    # The display prints reasons (paths, log lines: `[/tmp/x]`, `[rank0]:`) as text, never as markup.
    with suite_display(quiet=quiet) as display:
        result = run_suite(suite, request, executor, display.event if display else None,
                           display.job if display else None)
    finishing()  # a signal from here on waits for the report and the history row
    result.regressions_enforced = enforce_regressions
    return _after_run(result, history)


def _after_run(result: SuiteResult, history: History | None) -> tuple[SuiteResult, ReportFiles | None]:
    """Regressions against the history, the report, then the history row: the report, run deck and JUnit come
    first, so a history that breaks now costs only its own row, which is retried and else queued."""
    from megapilot.files import is_disk_full
    from megapilot.report import render_report
    from megapilot.suite.results import Verdict

    if history is not None:
        _add_regressions(result, history)
    files: ReportFiles | None = None
    try:
        result.write()  # with the regressions and their policy, so `suite report` renders the same verdict
        files = render_report(result, Path(result.run_dir))
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        # Nothing more fits on that disk: the verdict says so, the terminal and the history keep the results.
        result.verdict = Verdict.FAIL
        result.reason = "; ".join(p for p in (result.reason, f"report not written: {exc}") if p)
    if history is not None:
        _record(result, history)
    return result, files


def _calibration_mode(value: str) -> bool:
    if value not in ("history", "none"):
        from megapilot.errors import MegapilotError

        raise MegapilotError(f"unknown calibration {value!r}", field="--calibration", fix="use history or none")
    return value == "history"


HISTORY_RETRIES = 3
HISTORY_RETRY_WAIT_S = 1.0


def _add_regressions(result: SuiteResult, history: History) -> None:
    from megapilot.store.regress import find_regressions

    try:
        result.regressions = find_regressions(result, history)
    except Exception as exc:  # noqa: BLE001 - a history that broke mid-run costs the comparison, not the report
        result.notes.append(f"no comparison with the history: it could not be read ({_one_line(exc)})")


def _record(result: SuiteResult, history: History) -> None:
    """The history row, tried a few times; when it still cannot be written, queued in the run directory for
    `megapilot history record RUN_DIR` (the run's own files are all written by then)."""
    import json
    import time

    from megapilot.files import atomic_write_text
    from megapilot.store.history import PENDING_NAME

    error: Exception | None = None
    for attempt in range(HISTORY_RETRIES):
        try:
            history.record(result)
            return
        except Exception as exc:  # noqa: BLE001 - any failure of the database: retried, then queued
            error = exc
            if attempt + 1 < HISTORY_RETRIES:
                time.sleep(HISTORY_RETRY_WAIT_S)
    pending = Path(result.run_dir) / PENDING_NAME
    payload = json.dumps({"run_id": result.run_id, "db": history.location, "error": _one_line(error)}, indent=2)
    try:
        atomic_write_text(pending, payload + "\n")
        queued = f"queued in {pending}"
    except OSError as exc:
        queued = f"not queued either ({_one_line(exc)})"
    err_console.print(f"warning: the history row of run {result.run_id} was not written to {history.location} "
                      f"({_one_line(error)}); {queued}; write it later with: megapilot history record "
                      f"{result.run_dir} --db {history.location}", highlight=False, markup=False, soft_wrap=True)


def _one_line(exc: BaseException | None) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split()) if exc is not None else "unknown error"


def _open_history(db: str | None) -> History:
    from megapilot.store.history import open_history

    return open_history(db)


def _baseline_source(history: History | None) -> HistoryBaselines | None:
    if history is None:
        return None
    from megapilot.store.regress import HistoryBaselines

    return HistoryBaselines(history)


def _previous_run(resume: str, history: History | None, out: Path) -> SuiteResult:
    """The result of the run to resume: 'latest' (the newest run under --out), a run directory, a run id under
    --out, or a run id in the history."""
    from megapilot.errors import MegapilotError
    from megapilot.suite.results import SUITE_RESULT_NAME, read_suite_result
    from megapilot.suite.resume import latest_run_dir

    if resume == LATEST:
        return read_suite_result(latest_run_dir(out))
    for candidate in (Path(resume), out / resume):
        if (candidate / SUITE_RESULT_NAME).is_file():
            return read_suite_result(candidate)
    if history is not None:
        try:
            detail = history.run(resume)
        except MegapilotError:
            detail = None
        if detail is not None and (Path(detail.run.run_dir) / SUITE_RESULT_NAME).is_file():
            return read_suite_result(Path(detail.run.run_dir))
    raise MegapilotError(f"no run {resume!r} to resume", field="--resume",
                         fix="pass 'latest', a run id from `megapilot history list` or the run directory `suite run` "
                             "printed")


def _print_dry_run(plan: DryRunPlan) -> None:
    from rich.markup import escape

    from megapilot.cli.common import console

    for stage in plan.stages:
        console.print(f"stage {stage.name}" + (f" [{stage.combo}]" if stage.combo else ""), highlight=False,
                      markup=False)
    for combo in ([plan.smoke] if plan.smoke else []) + plan.checkpoint + plan.combos:  # in the order they run
        console.print(f"\n[bold]{escape(combo.key)}[/] backend={combo.backend} nodes={combo.nodes} "
                      f"gpus_per_node={combo.gpus_per_node}", highlight=False)
        if combo.skipped:
            console.print(f"  SKIPPED: {combo.skipped}", highlight=False, markup=False)
        else:
            console.print(f"  {combo.command}", highlight=False, markup=False, soft_wrap=True)
        if combo.memory_warning:
            console.print(f"  [bold yellow]{escape(combo.memory_warning)}[/]", highlight=False, soft_wrap=True)
    if plan.scripts:
        console.print(f"\n{len(plan.scripts)} launch script(s) written under {plan.folder}:", highlight=False,
                      markup=False, soft_wrap=True)
        for script in plan.scripts:
            console.print(f"  {script}", highlight=False, markup=False, soft_wrap=True)


def _print_result(result: SuiteResult) -> None:
    from megapilot.suite.summary import print_summary

    print_summary(result, console)
