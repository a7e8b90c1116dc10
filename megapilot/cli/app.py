"""The `megapilot` command: a thin shell over the library.

Each command module registers its commands on the app. User errors (`MegapilotError`) are printed
on one line and exit with code 2; nothing a user can cause ends in a traceback.
"""

from __future__ import annotations

import sys

import typer

from megapilot.errors import EXIT_USER_ERROR, MegapilotError

app = typer.Typer(
    name="megapilot",
    help="Plan, script, run, validate and diagnose Megatron-Core training runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Plan, script, run, validate and diagnose Megatron-Core training runs."""


def _register_commands() -> None:
    # Imported here so `megapilot.cli.app` stays importable on its own; each module keeps its heavy
    # imports inside its command functions so that start-up stays fast.
    from megapilot.cli import catalog_cmd, data_cmd, estimate_cmd, logs_cmd, plan_cmd, run_cmd, script_cmd

    for module in (catalog_cmd, estimate_cmd, plan_cmd, script_cmd, logs_cmd, run_cmd, data_cmd):
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from megapilot.cli.common import err_console

    try:
        app(args=argv, standalone_mode=True)
    except MegapilotError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_USER_ERROR)


if __name__ == "__main__":
    main()
