"""`megapilot suite report RUN_DIR`: re-render report.html, the run deck and JUnit XML from a run directory.

Reads `<run_dir>/suite.json` only (and the combo logs it names), so a report can be made again after an
interrupted run, on another machine, or with a newer megapilot. Prints the paths it wrote; `--json`
prints them as one JSON object (keys: html, run_deck, junit, logs_dir, log_files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from megapilot.cli.common import console, emit_json
from megapilot.errors import MegapilotError

RunDirArg = Annotated[Path, typer.Argument(help="The run directory `megapilot suite run` printed (holds suite.json).",
                                           show_default=False)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the written paths as JSON.")]


def report(run_dir: RunDirArg, as_json: JsonFlag = False) -> None:
    """Render report.html, megatron_run_deck.json and junit.xml (and copy the logs) from RUN_DIR/suite.json."""
    from megapilot.report import render_run_dir

    if not run_dir.is_dir():
        raise MegapilotError(f"{run_dir} is not a directory", field="RUN_DIR",
                             fix="pass the run directory `megapilot suite run` printed")
    files = render_run_dir(run_dir)
    if as_json:
        emit_json(files.as_json())
        return
    console.print(f"report    {files.html}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"run deck  {files.run_deck}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"junit     {files.junit}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"logs      {files.logs_dir} ({len(files.log_files)} file{'s' if len(files.log_files) != 1 else ''})",
                  highlight=False, markup=False, soft_wrap=True)


def register(suite_app: typer.Typer) -> None:
    """Add `report` to the `megapilot suite` sub-app."""
    suite_app.command("report")(report)
