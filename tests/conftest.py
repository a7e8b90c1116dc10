"""Shared fixtures: a CLI runner that goes through the real entry point."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

# The real SLURM cluster and loopback sshd fixtures, available to every test that names them (each
# starts its daemons only when a test asks for it).
pytest_plugins = ("tests.slurm_cluster", "tests.sshd")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def cli(capsys):
    """Run `megapilot ARGS...` in-process through `main()` (exit codes and error rendering included)."""
    from megapilot.cli.app import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


def _hypothesis_profiles() -> None:
    """CI replays the same examples every run (a red CI must be reproducible); locally they vary."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile("dev", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


_hypothesis_profiles()
