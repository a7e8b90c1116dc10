"""`megapilot suite ...`: the validation suite (CVS Megatron configs accepted as they are).

The sub-app lives here; its commands are registered by their own modules so each stays small:
`suite_check_cmd` (check, templates, init), `suite_run_cmd` (run), `suite_report_cmd` (report).
"""

from __future__ import annotations

import typer

suite_app = typer.Typer(help="Validate a cluster with a training suite (CVS Megatron configs accepted as-is).",
                        no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add `megapilot suite` and its commands to the app."""
    from megapilot.cli import suite_check_cmd, suite_report_cmd, suite_run_cmd

    for module in (suite_check_cmd, suite_run_cmd, suite_report_cmd):
        module.register(suite_app)
    app.add_typer(suite_app, name="suite")
