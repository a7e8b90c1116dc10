"""The `megapilot` command: a thin shell over the library.

Each command module registers its commands on the app. User errors (`MegapilotError`) are printed
on one line and exit with code 2; nothing a user can cause ends in a traceback. Anything else that
escapes a command is a bug: one line saying so and exit code 1, with the traceback only under
`--debug` or `MEGAPILOT_DEBUG=1`.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

import typer

from megapilot.errors import EXIT_USER_ERROR, MegapilotError

app = typer.Typer(
    name="megapilot",
    help="Plan, script, run, validate and diagnose Megatron-Core training runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


EXIT_INTERNAL_ERROR = 1
DEBUG_ENV = "MEGAPILOT_DEBUG"


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("megapilot")
        except PackageNotFoundError:  # run from a checkout that was never installed
            installed = "unknown (not installed)"
        typer.echo(f"megapilot {installed}")
        raise typer.Exit()


@app.callback()  # its examples: help_examples.GROUP_EXAMPLES
def _root(
    debug: bool = typer.Option(False, "--debug",
                               help=f"Show the traceback of an internal error (or set {DEBUG_ENV}=1)."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print megapilot's version and exit."),
) -> None:
    """Plan, script, run, validate and diagnose Megatron-Core training runs."""
    del debug, version  # read by main() from the arguments: an error can come before this callback runs


def _debug_enabled(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _register_commands() -> None:
    # Imported here so `megapilot.cli.app` stays importable on its own; each module keeps its heavy
    # imports inside its command functions so that start-up stays fast.
    import importlib

    for name in ("catalog_cmd", "estimate_cmd", "plan_cmd", "script_cmd", "logs_cmd", "run_cmd", "suite_cmd",
                 "history_cmd", "data_cmd"):
        importlib.import_module(f"megapilot.cli.{name}").register(app)


def _flags_show_no_value() -> None:
    """typer's rich help prints an on/off flag as `--json <bool>`, as if it took a value (and `--json true`
    is then an error); its plain help shows the flag alone. Flags (`--json`, `--force`, `--fsdp/--no-fsdp`)
    are shown without a value type here too."""
    from typer.core import TyperOption

    show_type = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        return None if self.is_flag else show_type(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign,assignment]  # see the docstring


_register_commands()
_flags_show_no_value()


def _add_help_examples() -> None:
    from megapilot.cli.help_examples import add_examples

    add_examples(app)


_add_help_examples()


def _file_error(exc: Exception) -> MegapilotError | None:
    """A user-caused file error as a MegapilotError; None for an OSError that names no file (not the user's)."""
    if isinstance(exc, UnicodeDecodeError):  # raised while reading a file the user named
        return MegapilotError(f"an input file is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                              f"{exc.start})", field="input", fix="pass the text file the command expects")
    filename = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if filename is None:
        return None
    fix = _PATH_FIXES.get(getattr(exc, "errno", None) or 0, "check the path: an existing, readable file in an "
                                                               "existing directory")
    return MegapilotError(f"{filename}: {getattr(exc, 'strerror', None) or exc}", field="path", fix=fix)


# The fix for a path error by its cause: an output path that cannot be made is not fixed by "an existing file".
_PATH_FIXES = {
    errno.ENOTDIR: "a part of the path is a file, not a folder: pass a path whose parents are folders",
    errno.EEXIST: "a file is in the way of a folder to create: pass another path, or move the file",
    errno.EISDIR: "pass a file, not a folder",
    errno.EACCES: "pass a path you may read (an input) or a folder you may write (an output)",
    errno.EPERM: "pass a path you may read (an input) or a folder you may write (an output)",
    errno.EROFS: "pass a folder on a writable file system",
    errno.ENOSPC: "free space on that file system, or pass a folder on another one",
}


# Help piped or redirected (`megapilot estimate --help | less`, a CI log) has no terminal to measure; rich's
# fallback of 80 columns cuts option help and examples short. TERMINAL_WIDTH, typer's own setting, still wins.
PIPED_HELP_WIDTH = 160


def _help_width_off_a_terminal() -> None:
    if sys.stdout.isatty() or os.environ.get("TERMINAL_WIDTH"):
        return
    from typer import rich_utils

    rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


def _one_line_usage_errors() -> None:
    """click prints a usage error (a mistyped command, `--gpus x`) as a usage line, a hint and a four-line box;
    like every other user error it is one line here (`error: ... — see megapilot plan --help`), exit code 2."""
    from typer import rich_utils

    from megapilot.cli.common import err_console

    def one_line(error: Exception) -> None:
        from rich.markup import escape

        message = " ".join(getattr(error, "format_message", lambda: str(error))().split())
        # a group called without its command: click printed the group's help and raises with no message
        message = message or "missing command: name one of those above"
        context = getattr(error, "ctx", None)
        where = f" — see {context.command_path} --help" if context is not None else ""
        err_console.print(f"[bold red]error:[/] {escape(message)}{where}", highlight=False, soft_wrap=True)

    rich_utils.rich_format_error = one_line  # type: ignore[assignment]  # see the docstring


def _help_tables_fold() -> None:
    """typer's help tables cut a long option name to `--tp,--tensor-model-pa…` on an 80-column terminal: their
    cells fold onto a second line instead, so every name can still be read and typed."""
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    def fold(renderable: Any) -> None:
        if isinstance(renderable, Text):
            renderable.overflow = "fold"
        for part in getattr(renderable, "renderables", ()):
            fold(part)

    class FoldingTable(Table):
        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            for renderable in renderables:
                fold(renderable)
            super().add_row(*renderables, **kwargs)
            for column in self.columns:
                column.overflow, column.no_wrap = "fold", False

    rich_utils.Table = FoldingTable  # type: ignore[misc]  # see the docstring


def _pipe_closed() -> bool:
    """Whether stdout's reader went away (`megapilot plan | head`): click then wraps it to swallow the EPIPE."""
    return type(sys.stdout).__name__.lstrip("_") == "PacifyFlushWrapper"  # click's private class, renamed in 8.2


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from rich.markup import escape

    from megapilot.cli.common import err_console

    args = sys.argv[1:] if argv is None else list(argv)
    if not args or "--help" in args:
        _help_width_off_a_terminal()
    _one_line_usage_errors()
    _help_tables_fold()
    try:
        app(args=args, prog_name="megapilot", standalone_mode=True)
    except SystemExit as exit_:
        if exit_.code == 1 and _pipe_closed():  # the reader had what it wanted: not a failure
            sys.exit(0)
        raise
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: nothing escapes as a bare traceback
        user_error = exc if isinstance(exc, MegapilotError) else _file_error(exc)
        if user_error is not None:
            err_console.print(f"[bold red]error:[/] {escape(str(user_error))}", highlight=False, soft_wrap=True)
            sys.exit(EXIT_USER_ERROR)
        if _debug_enabled(args):
            import traceback

            traceback.print_exc(file=sys.stderr)
        message = " ".join(str(exc).split()) or "(no message)"
        err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(message)}; please report with "
                          f"--debug output", highlight=False, soft_wrap=True)
        sys.exit(EXIT_INTERNAL_ERROR)


if __name__ == "__main__":
    main()
