"""`megapilot suite check | templates | init`: is a suite config runnable, which templates ship, start one.

`check` exits 0 when the suite would run (cells, backend, executor, threshold file and warnings printed)
and 2 listing every problem with its dotted path; it also renders every cell, so a flag Megatron would
refuse shows up here rather than on the cluster. It takes the options of `suite run` that change the cells
(`--megatron-version`, `--exclude-failing` and the `--out` its `latest` is under, defined once here) and checks
the cells as that run would build them, so it refuses what the run would refuse. `--json` prints
`{"ok", "problems": [{"path", "message", "fix"}], "warnings", "cells", "backend", "executor", "hang_window"}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from megapilot.cli.common import console, emit_json
from megapilot.errors import EXIT_USER_ERROR, MegapilotError

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite, SuiteCheck
    from megapilot.suite.render import CellLaunch


# ---- the options of `suite run` that change the cells it runs, taken by `suite check` too: one name and one help ----
DEFAULT_OUT = Path("runs/suite")
OutOpt = Annotated[Path, typer.Option("--out", help="Parent directory of the run directories: where `suite run` writes "
                                                    "its run, and where --exclude-failing latest looks.")]
MegatronVersionOpt = Annotated[str | None, typer.Option(
    "--megatron-version", help="Megatron-LM release the launches are for, e.g. 0.14 (default: the config's "
                               "megapilot.megatron_version, else the checkout's own, else the newest table).")]
ExcludeFailingOpt = Annotated[str | None, typer.Option(
    "--exclude-failing", help="Leave out the nodes in failing_nodes.txt of this run: 'latest' (the newest under "
                              "--out), a run directory or run id (default: the config's megapilot.exclude_failing).")]


def check(
    config: Annotated[Path, typer.Argument(help="Suite config: a CVS Megatron JSON (or the same in YAML).",
                                           show_default=False)],
    cluster: Annotated[Path | None, typer.Option("--cluster", help="CVS cluster file (nodes, user, key).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the check as JSON.")] = False,
    megatron_version: MegatronVersionOpt = None,
    exclude_failing: ExcludeFailingOpt = None,
    out: OutOpt = DEFAULT_OUT,
) -> None:
    """Check a suite config: every problem with its path, or the cells it would run."""
    result, launches = run_check(config, cluster, megatron_version=megatron_version, exclude_failing=exclude_failing,
                                 out=out)
    if json_output:
        emit_json(check_payload(result, launches))
    else:
        from rich.markup import escape

        _print_check(result, launches)
        for warning in memory_warnings(result, launches):
            console.print(f"[bold yellow]{escape(warning)}[/]", highlight=False, soft_wrap=True)
    if not result.ok or _render_problems(launches):
        raise typer.Exit(EXIT_USER_ERROR)


def run_check(config: Path, cluster: Path | None, *, megatron_version: str | None = None,
              exclude_failing: str | None = None, out: Path = DEFAULT_OUT) -> tuple[SuiteCheck, list[CellLaunch]]:
    """The check, and when the config resolves, every cell as `suite run` would build it with these options, rendered
    into a scratch folder. What the options make impossible (an unknown release, nodes that cannot be left out) is a
    problem naming the option, and no cell is rendered."""
    import tempfile

    from megapilot.suite.config import check_suite
    from megapilot.suite.render import render_cells

    result = check_suite(config, cluster)
    if result.suite is None:
        return result, []
    try:
        suite, notes, _ = suite_as_run(result.suite, megatron_version=megatron_version,
                                       exclude_failing=exclude_failing, out=out)
    except MegapilotError as exc:
        result.add(exc.field or "config", exc.problem, exc.fix or "")
        return result, []
    result.suite = suite
    result.warnings += notes
    with tempfile.TemporaryDirectory(prefix="megapilot-suite-check-") as scratch:
        cells = [suite.smoke, *suite.cells]
        for cell in cells:  # local renders want the script's folder to exist
            (Path(scratch) / cell.slug).mkdir(exist_ok=True)
        return result, render_cells(suite, Path(scratch))


def suite_as_run(suite: LoadedSuite, *, megatron_version: str | None, exclude_failing: str | None,
                 out: Path) -> tuple[LoadedSuite, list[str], Path | None]:
    """The suite with its cells as `suite run` builds them: its launches for --megatron-version (else the config's
    megapilot.megatron_version), that release checked once, without the nodes --exclude-failing (else the config's
    megapilot.exclude_failing) leaves out; the notes that name those nodes, and the run directory they came from
    (None: no node was left out)."""
    from megapilot.suite.render import CONFIG_VERSION_KEY

    if megatron_version is not None:
        block = suite.config.megapilot.model_copy(update={"megatron_version": megatron_version})
        suite = suite.model_copy(update={"config": suite.config.model_copy(update={"megapilot": block})})
    _check_release(suite, "--megatron-version" if megatron_version is not None else CONFIG_VERSION_KEY)
    return _excluding_failing(suite, exclude_failing, out)


def _check_release(suite: LoadedSuite, version_from: str) -> None:
    """The release the launches are for, checked once for the suite before any cell: one without a flag table, a
    checkout that is none or is of another release is one problem under the setting it came from (`version_from`:
    the option the user typed, or the config key; the checkout's config key), not one per cell."""
    from megapilot.suite.render import CONFIG_PATH_KEY, check_release, suite_release_names

    try:
        check_release(suite, suite_release_names(version_from))
    except MegapilotError as exc:
        field = CONFIG_PATH_KEY if exc.field == "megatron_path" else version_from
        raise MegapilotError(exc.problem, field=field, fix=exc.fix) from None


def _excluding_failing(suite: LoadedSuite, run: str | None, out: Path) -> tuple[LoadedSuite, list[str], Path | None]:
    """The suite without the nodes an earlier run failed (`--exclude-failing`, else the config's key), and the notes
    that say so; the suite as it is without either."""
    from megapilot.suite.exclude import FROM_OPTION, ExcludeOrigin, exclude_nodes, failing_run_dir, read_failing

    origin = FROM_OPTION if run else ExcludeOrigin(suite.config_path)  # what an error names: what the user wrote
    run = run or suite.config.megapilot.exclude_failing
    if not run:
        return suite, [], None
    excluded = read_failing(failing_run_dir(run, out, origin))
    return exclude_nodes(suite, excluded, origin), excluded.notes(), excluded.source


def memory_warnings(result: SuiteCheck, launches: list[CellLaunch]) -> list[str]:
    """A WARN line for each cell whose predicted memory exceeds the GPU's (the suite still runs it as written)."""
    from megapilot.suite.predicted import memory_warning

    gpu = result.suite.gpu if result.suite is not None else None
    return [line for launch in launches if (line := memory_warning(launch.key, launch.plan, gpu)) is not None]


RENDER_FIX = "change the cell's layout or flags so Megatron accepts them"
FIX_MARK = " — fix: "  # how a MegapilotError's text carries its fix (megapilot.errors)


def _render_problems(launches: list[CellLaunch]) -> list[dict[str, str]]:
    """A problem per cell that cannot be rendered: the error's own fix where it has one (TP that does not divide the
    GPUs says which), else the general one; never both."""
    problems = []
    for launch in launches:
        if launch.error:
            message, _, fix = launch.error.partition(FIX_MARK)
            problems.append({"path": f"cells.{launch.key}", "message": message, "fix": fix or RENDER_FIX})
    return problems


def _problems(result: SuiteCheck, launches: list[CellLaunch]) -> list[tuple[str, str, str]]:
    """(path, message, fix) of every problem: the config's, then each cell that cannot be rendered."""
    return [(p.path, p.message, p.fix) for p in result.problems] + [
        (p["path"], p["message"], p["fix"]) for p in _render_problems(launches)]


def _problem_lines(result: SuiteCheck, launches: list[CellLaunch]) -> list[str]:
    """Every problem as `check` prints it (rich markup; the values escaped)."""
    from rich.markup import escape

    return [f"[bold red]problem[/] {escape(path)}: {escape(message)}" + (f" — fix: {escape(fix)}" if fix else "")
            for path, message, fix in _problems(result, launches)]


# ---- what `suite run` refuses before anything runs: what `check` refuses, in the same words ---------------------
def checked_suite(config: Path, cluster: Path | None) -> LoadedSuite:
    """The suite of a config `check` finds no problem in; else every problem, one error line each, and exit 2."""
    from megapilot.suite.config import check_suite

    result = check_suite(config, cluster)
    _refuse(_problems(result, []))
    assert result.suite is not None  # a check without problems has its suite
    return result.suite


def refuse_unrenderable(suite: LoadedSuite) -> None:
    """Exit 2 naming each cell Megatron would refuse (as `check` does), before any stage runs: the suite as it will
    run, its Megatron version and the nodes left after exclusions applied (a TP that divides no node's GPUs fails
    every job it starts, after the preflight, and would be recorded as a failing cluster)."""
    import tempfile

    from megapilot.suite.render import render_cells

    with tempfile.TemporaryDirectory(prefix="megapilot-suite-run-") as scratch:
        for cell in [suite.smoke, *suite.cells]:  # local renders want the script's folder to exist
            (Path(scratch) / cell.slug).mkdir(exist_ok=True)
        launches = render_cells(suite, Path(scratch))
    _refuse([(p["path"], p["message"], p["fix"]) for p in _render_problems(launches)])


def _refuse(problems: list[tuple[str, str, str]]) -> None:
    if not problems:
        return
    from rich.markup import escape

    from megapilot.cli.common import err_console

    for path, message, fix in problems:  # each the one-line user error every command prints
        err_console.print(f"[bold red]error:[/] {escape(path)}: {escape(message)}"
                          + (f" — fix: {escape(fix)}" if fix else ""), highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_USER_ERROR)


def check_payload(result: SuiteCheck, launches: list[CellLaunch]) -> dict[str, object]:
    """The stable `suite check --json` document."""
    from megapilot.suite.config import describe_hang_window

    problems = [p.model_dump() for p in result.problems] + _render_problems(launches)
    suite = result.suite
    return {
        "ok": not problems and suite is not None,
        "problems": problems,
        "warnings": result.warnings,
        "memory_warnings": memory_warnings(result, launches),
        "cells": [_cell_json(launch) for launch in launches],
        "backend": suite.backend if suite else None,
        "executor": suite.executor if suite else None,
        "device": suite.device if suite else None,
        "nodes": suite.nodes if suite else None,
        "gpus_per_node": suite.gpus_per_node if suite else None,
        "model": suite.model.name if suite else None,
        "threshold_file": str(suite.threshold_path) if suite and suite.threshold_path else None,
        "config_hash": suite.config_hash if suite else None,
        "hang_window": describe_hang_window(suite.config.megapilot) if suite else None,
    }


def _cell_json(launch: CellLaunch) -> dict[str, object]:
    return {"key": launch.key, "slug": launch.slug, "skipped": launch.skipped, "error": launch.error,
            "command": launch.command, "megatron_args": launch.megatron_args}


def _print_check(result: SuiteCheck, launches: list[CellLaunch]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from megapilot.suite.config import describe_hang_window

    problems = _problem_lines(result, launches)
    for line in problems:
        console.print(line, highlight=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning[/] {escape(warning)}", highlight=False, soft_wrap=True)
    suite = result.suite
    if suite is None:
        console.print(f"{len(problems)} problem(s): the suite cannot run", highlight=False)
        return
    console.print(f"backend {suite.backend}, executor {suite.executor}, device {suite.device}, "
                  f"{suite.nodes} node(s) x {suite.gpus_per_node}, model {suite.model.name}", highlight=False)
    console.print(f"thresholds: {suite.threshold_path or 'none (record only)'}", highlight=False, markup=False)
    console.print(describe_hang_window(suite.config.megapilot), highlight=False, markup=False, soft_wrap=True)
    if not launches:  # an option made the cells impossible to build: its problem above says why
        console.print(f"{len(problems)} problem(s): the suite cannot run", highlight=False)
        return
    table = Table(title="cells", title_justify="left")
    for column in ("cell", "status", "launch"):
        table.add_column(column, overflow="fold")
    for launch in launches:
        status = "error" if launch.error else "skipped" if launch.skipped else "ready"
        error = launch.error.partition(FIX_MARK)[0] if launch.error else None  # its fix is on its problem line
        table.add_row(launch.key, status, escape(error or launch.skipped or _preview(launch.command)))
    console.print(table)
    _print_launches(launches)
    if problems:
        console.print(f"{len(problems)} problem(s): the suite cannot run", highlight=False)


LAUNCH_PREVIEW = 160  # characters of a launch the cells table shows


def _preview(command: str) -> str:
    return command if len(command) <= LAUNCH_PREVIEW else command[:LAUNCH_PREVIEW - 1] + "…"


def _print_launches(launches: list[CellLaunch]) -> None:
    """Off a terminal (a pipe, a file, a CI log) each ready cell's launch whole, on its own line under the table, to
    copy or grep; on a terminal the table's preview keeps it readable, and a line says where the whole ones are."""
    ready = [launch for launch in launches if launch.command and not launch.error and not launch.skipped]
    if not console.is_terminal:
        for launch in ready:
            console.print(f"launch {launch.key}: {launch.command}", highlight=False, markup=False, soft_wrap=True)
    elif any(len(launch.command) > LAUNCH_PREVIEW for launch in ready):
        console.print(f"launches cut at {LAUNCH_PREVIEW} characters: piped (| cat), --json or `suite run --dry-run` "
                      "print them whole", highlight=False, markup=False)


def templates(
    json_output: Annotated[bool, typer.Option("--json", help="Print the templates as JSON.")] = False,
) -> None:
    """List the packaged suite templates."""
    from rich.table import Table

    from megapilot.suite.templates import list_templates

    rows = [{"name": t.name, "description": t.description, "model": t.model, "gpu": t.gpu,
             "calibrated": t.calibrated} for t in list_templates()]
    if json_output:
        emit_json(rows)
        return
    table = Table(title="suite templates (thresholds are examples, uncalibrated)", title_justify="left")
    for column in ("name", "model", "gpu", "description"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(str(row["name"]), str(row["model"]), str(row["gpu"]), str(row["description"]))
    console.print(table)


def init(
    name: Annotated[str, typer.Argument(help="Template name (see `megapilot suite templates`).", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Config file to write; its threshold files go "
                                                                  "next to it.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite files that exist.")] = False,
    gates: Annotated[str, typer.Option(
        "--gates", help="template: the template's threshold files; predicted: one file gating tokens/s, step time "
                        "and memory against megapilot's prediction calibrated on this cluster's runs "
                        "(kind predicted, min_ratio 0.9).")] = "template",
    executor: Annotated[str | None, typer.Option(
        help="Run with this executor (local, slurm, ssh): its settings are written with their defaults and "
             "comments, and for one that needs nodes a cluster.json beside the config.")] = None,
    nodes: Annotated[str | None, typer.Option(help="With --executor ssh: the nodes, comma-separated, node 0 first.")
                     ] = None,
    ssh_user: Annotated[str | None, typer.Option(help="With --executor ssh: the ssh user.")] = None,
    ssh_port: Annotated[int | None, typer.Option(help="With --executor ssh: the ssh port of every node.")] = None,
    ssh_key: Annotated[str | None, typer.Option(help="With --executor ssh: the private key file.")] = None,
    ssh_option: Annotated[list[str] | None, typer.Option(
        help="With --executor ssh: an `ssh -o` option for every node (repeat it).")] = None,
) -> None:
    """Copy a template config and its threshold files to start a suite (and, with --executor, the settings of
    that executor and a cluster file)."""
    import json
    import shutil

    from megapilot.suite.templates import cluster_file, for_executor, template_path, threshold_paths

    if gates not in ("template", "predicted"):
        raise MegapilotError(f"unknown gates {gates!r}", field="--gates", fix="use template or predicted")
    source = template_path(name)
    folder = output.parent
    if output.is_dir():
        raise MegapilotError(f"{output} is a directory", field="--output", fix="pass a file name, e.g. suite.json")
    needs_nodes = executor is not None and _executor_needs_nodes(executor)
    node_options = [flag for flag, value in (("--nodes", nodes), ("--ssh-user", ssh_user), ("--ssh-port", ssh_port),
                                             ("--ssh-key", ssh_key), ("--ssh-option", ssh_option)) if value]
    if node_options and not needs_nodes:
        raise MegapilotError(f"{', '.join(node_options)} describe the nodes of an executor that runs on listed nodes, "
                             f"and {'no --executor' if executor is None else f'--executor {executor}'} is given",
                             field=node_options[0], fix="add --executor ssh, or leave them out")
    cluster = folder / "cluster.json"
    if gates == "predicted":
        _init_predicted(source, output, force=force, cluster=cluster if needs_nodes else None)
        written, check_command = f"wrote {output} and {output.stem}_predicted_threshold.json (predicted gates) in " \
                                 f"{output.parent}", f"megapilot suite check {output}"
    else:
        targets = [(source, output)] + [(p, folder / p.name) for p in threshold_paths(name)]
        existing = [str(target) for _, target in targets if target.exists()] + (
            [str(cluster)] if needs_nodes and cluster.exists() else [])
        if existing and not force:
            raise MegapilotError(f"would overwrite {', '.join(existing)}", field="--output",
                                 fix="choose another -o path, or pass --force")
        folder.mkdir(parents=True, exist_ok=True)
        for src, target in targets:
            shutil.copyfile(src, target)
        written = f"wrote {output} and {len(targets) - 1} threshold file(s) in {folder}"
        check_command = f"megapilot suite check {output}"
    if executor is not None:
        config = for_executor(json.loads(output.read_text(encoding="utf-8")), executor)  # as written, gates and all
        output.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        written += f", set to run with the {executor} executor"
    if needs_nodes:
        hosts = [h.strip() for h in (nodes or "").split(",") if h.strip()]
        data = cluster_file(hosts, user=ssh_user, port=ssh_port, key=ssh_key, options=list(ssh_option or []))
        cluster.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        written += f", and {cluster}" + ("" if hosts else " (fill in the nodes)")
        check_command += f" --cluster {cluster}"
    console.print(f"{written}; next: {check_command}", highlight=False, soft_wrap=True)


def _executor_needs_nodes(name: str) -> bool:
    from megapilot.execute.registry import executor_class

    return executor_class(name, field="--executor").capabilities.needs_node_list


PREDICTED_GATES = {
    "training.tokens_per_gpu": {"kind": "predicted", "min_ratio": 0.9},
    "training.elapsed_time_per_iteration": {"kind": "predicted", "min_ratio": 0.9},
    "training.max_allocated_gib": {"kind": "predicted", "min_ratio": 0.8, "optional": True},
}


def _init_predicted(source: Path, output: Path, *, force: bool, cluster: Path | None) -> None:
    """The template's config with one threshold file of `predicted` gates for each of its sweep cells (the executor's
    settings and cluster file are written after, by init, as for the template's gates)."""
    import json

    config = json.loads(source.read_text(encoding="utf-8"))
    thresholds = output.with_name(f"{output.stem}_predicted_threshold.json")
    existing = [str(path) for path in (output, thresholds, cluster) if path is not None and path.exists()]
    if existing and not force:
        raise MegapilotError(f"would overwrite {', '.join(existing)}", field="--output",
                             fix="choose another -o path, or pass --force")
    cells = list((config.get("sweep") or {}).get("combinations") or {}) or ["default"]
    table: dict[str, object] = {
        "_comment": "Gates from megapilot's prediction of each combo, calibrated on this cluster's runs in the history "
                    "(kind predicted: measured >= min_ratio x predicted tokens/s; step time and memory <= predicted / "
                    "min_ratio). Until the cluster has a measured run, they record instead of gating.",
        **{cell: PREDICTED_GATES for cell in cells}}
    config["threshold_json"] = thresholds.name
    config.pop("_threshold_json_comment", None)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    thresholds.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")


def register(suite_app: typer.Typer) -> None:
    """Add check, templates and init to `megapilot suite`."""
    suite_app.command("check")(check)
    suite_app.command("templates")(templates)
    suite_app.command("init")(init)
