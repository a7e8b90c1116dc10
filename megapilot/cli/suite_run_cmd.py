"""`megapilot suite run`: run a validation suite end to end, then write its report and history row.

Exit codes: 0 every row PASS (or RECORD/SKIPPED), 1 any FAIL, 2 a config error (nothing ran),
130 interrupted with Ctrl-C (the running job is stopped; finished results, the report and the history
row are still written).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json, err_console

if TYPE_CHECKING:
    from megapilot.store.history import History
    from megapilot.store.regress import HistoryBaselines
    from megapilot.suite.config import LoadedSuite
    from megapilot.suite.dry_run import DryRunPlan
    from megapilot.suite.results import SuiteResult

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

ConfigArg = Annotated[Path, typer.Argument(help="Suite config (CVS Megatron JSON/YAML, or a megapilot template).",
                                           show_default=False)]
ClusterOpt = Annotated[Path | None, typer.Option("--cluster", help="CVS cluster file (nodes, user, key).")]


def run(
    config: ConfigArg,
    cluster: ClusterOpt = None,
    stage: Annotated[str | None, typer.Option(help="Run only this stage (prepare, results and teardown always run): "
                                                   "preflight, tokenizer, smoke, checkpoint, train.")] = None,
    combo: Annotated[str | None, typer.Option(
        help="Run only this sweep cell, e.g. 'MBS=4,GBS=128,PRECISION=FP8'.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Parent directory of the run directory.")] = Path("runs/suite"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the stages and each combo's exact launch; "
                                                            "run nothing.")] = False,
    resume: Annotated[str | None, typer.Option("--resume", help="Run id (or run directory) of an interrupted run: "
                                                                "finished combos are kept, the rest run.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="History database: a SQLite path or postgresql:// URL "
                                                        "(default: the user data dir, or $MEGAPILOT_HISTORY).")] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Do not record this run in the history.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the results (or the dry run) as JSON.")] = False,
    megatron_version: Annotated[str | None, typer.Option(
        help="Megatron-LM release the launches are for, e.g. 0.14 (default: the config's megapilot.megatron_version, "
             "else the checkout's own, else the newest table).")] = None,
) -> None:
    """Run the suite: prepare, preflight, tokenizer, smoke, checkpoint, every combo, results, teardown."""
    from megapilot.suite.config import load_suite
    from megapilot.suite.lifecycle import STAGES

    if stage is not None and stage not in STAGES:
        from megapilot.errors import MegapilotError

        raise MegapilotError(f"unknown stage {stage!r}", field="--stage", fix="use one of: " + ", ".join(STAGES))
    suite = load_suite(config, cluster)
    if megatron_version is not None:
        suite = _for_megatron_version(suite, megatron_version)
    if combo is not None:
        _check_combo(suite, combo)
    if dry_run:
        from megapilot.suite.dry_run import dry_run_plan

        plan = dry_run_plan(suite, out_dir=out.resolve(), only_stage=stage, only_combo=combo)
        if json_output:
            emit_json(plan.model_dump(mode="json"))
        else:
            _print_dry_run(plan)
        return
    result = _run(suite, out=out, stage=stage, combo=combo, resume=resume, db=None if no_history else db,
                  use_history=not no_history, quiet=json_output)
    if json_output:
        from megapilot.suite.summary import result_json

        emit_json(result_json(result))
    else:
        _print_result(result)
    if not result.finished:
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.verdict.value == "FAIL":
        raise typer.Exit(EXIT_FAILED)


def register(suite_app: typer.Typer) -> None:
    suite_app.command("run")(run)


def _for_megatron_version(suite: LoadedSuite, version: str) -> LoadedSuite:
    """The suite with its launches checked against `version` (refused here, before any stage, when unknown)."""
    from megapilot.launch.megatron_args import flag_table

    flag_table(version)
    block = suite.config.megapilot.model_copy(update={"megatron_version": version})
    return suite.model_copy(update={"config": suite.config.model_copy(update={"megapilot": block})})


def _check_combo(suite: LoadedSuite, combo: str) -> None:
    from megapilot.errors import MegapilotError

    keys = [c.key for c in suite.cells]
    if combo not in keys:
        raise MegapilotError(f"no sweep cell {combo!r} in the config", field="--combo",
                             fix="use one of: " + ", ".join(keys))


def _run(suite: LoadedSuite, *, out: Path, stage: str | None, combo: str | None, resume: str | None, db: str | None,
         use_history: bool, quiet: bool) -> SuiteResult:
    from megapilot.suite.executors import make_executor
    from megapilot.suite.lifecycle import RunRequest, run_suite

    history = _open_history(db) if use_history else None
    previous = _previous_run(resume, history, out) if resume else None
    request = RunRequest(out_dir=out.resolve(), only_stage=stage, only_combo=combo, resume_from=previous,
                         baseline=_baseline_source(history))
    executor = make_executor(suite)
    on_event = None if quiet else (lambda message: err_console.print(f"[dim]{message}[/]", highlight=False,
                                                                     markup=True, soft_wrap=True))
    result = run_suite(suite, request, executor, on_event)
    return _after_run(result, history, quiet=quiet)


def _after_run(result: SuiteResult, history: History | None, *, quiet: bool) -> SuiteResult:
    """Regressions against the history, the history row, the report: each even when training failed."""
    from megapilot.report import render_report

    if history is not None:
        from megapilot.store.regress import find_regressions

        result.regressions = find_regressions(result, history)
        result.write()
        history.record(result)
    files = render_report(result, Path(result.run_dir))
    if not quiet:
        err_console.print(f"report: {files.html}", highlight=False, soft_wrap=True)
        err_console.print(f"run deck: {files.run_deck}", highlight=False, soft_wrap=True)
    return result


def _open_history(db: str | None) -> History:
    from megapilot.store.history import open_history

    return open_history(db)


def _baseline_source(history: History | None) -> HistoryBaselines | None:
    if history is None:
        return None
    from megapilot.store.regress import HistoryBaselines

    return HistoryBaselines(history)


def _previous_run(resume: str, history: History | None, out: Path) -> SuiteResult:
    """The result of the run to resume: a run directory, a run id under --out, or a run id in the history."""
    from megapilot.errors import MegapilotError
    from megapilot.suite.results import SUITE_RESULT_NAME, read_suite_result

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
                         fix="pass a run id from `megapilot history list` or the run directory `suite run` printed")


def _print_dry_run(plan: DryRunPlan) -> None:
    from megapilot.cli.common import console

    for stage in plan.stages:
        console.print(f"stage {stage.name}" + (f" [{stage.combo}]" if stage.combo else ""), highlight=False)
    for combo in plan.combos:
        console.print(f"\n[bold]{combo.key}[/] backend={combo.backend} nodes={combo.nodes} "
                      f"gpus_per_node={combo.gpus_per_node}", highlight=False)
        if combo.skipped:
            console.print(f"  SKIPPED: {combo.skipped}", highlight=False)
        else:
            console.print(f"  {combo.command}", highlight=False, soft_wrap=True)
    if plan.scripts:
        console.print(f"\n{len(plan.scripts)} launch script(s) written under {plan.folder}:", highlight=False,
                      soft_wrap=True)
        for script in plan.scripts:
            console.print(f"  {script}", highlight=False, soft_wrap=True)


def _print_result(result: SuiteResult) -> None:
    from megapilot.suite.summary import print_summary

    print_summary(result, console)
