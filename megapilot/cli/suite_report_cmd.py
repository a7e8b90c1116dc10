"""`megapilot suite report RUN_DIR`: re-render report.html, the run deck and JUnit XML from a run directory.

Reads `<run_dir>/suite.json` only (and the combo logs it names), so a report can be made again after an
interrupted run, on another machine, or with a newer megapilot. A run directory it cannot write (a full disk, a
read-only mount) is a user error naming RUN_DIR, suite.json left as it was. Prints the paths it wrote; `--json`
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
    try:
        files = render_run_dir(run_dir)
    except OSError as exc:  # the run's own files are read by now: what failed is writing the report beside them
        raise _unwritable(run_dir, exc) from None
    if as_json:
        emit_json(files.as_json())
        return
    console.print(f"report    {files.html}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"run deck  {files.run_deck}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"junit     {files.junit}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"logs      {files.logs_dir} ({len(files.log_files)} file{'s' if len(files.log_files) != 1 else ''})",
                  highlight=False, markup=False, soft_wrap=True)


def _unwritable(run_dir: Path, exc: OSError) -> MegapilotError:
    """A report that could not be written, said plainly: a full disk, or a run directory this user cannot write
    (suite.json and the logs are left as they were; each report file is whole or absent)."""
    from megapilot.files import DiskFullError, is_disk_full

    elsewhere = "or copy the run directory to where it can be written and run `megapilot suite report` on the copy"
    if is_disk_full(exc):
        target = exc.filename or run_dir
        why = str(exc) if isinstance(exc, DiskFullError) else f"no space left on the device of {target}"
        return MegapilotError(f"cannot write the report into {run_dir}: {why}", field="RUN_DIR",
                              fix=f"free space there, {elsewhere}")
    where = f" ({exc.filename})" if exc.filename else ""
    return MegapilotError(f"cannot write the report into {run_dir}: {exc.strerror or exc}{where}", field="RUN_DIR",
                          fix=f"make it writable (a read-only mount, a folder of another user), {elsewhere}")


def register(suite_app: typer.Typer) -> None:
    """Add `report` to the `megapilot suite` sub-app."""
    suite_app.command("report")(report)
