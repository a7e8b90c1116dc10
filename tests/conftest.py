"""Shared fixtures: a CLI runner that goes through the real entry point."""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

# pytest-xdist hands its workers COLUMNS=80 (the controller's terminal); a serial run on a pipe has none. The CLI
# reads COLUMNS as the user's own width, so every worker starts as a serial run does; a test that wants a width
# sets it itself.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

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


# Under pytest-xdist (`make test` runs `-n logical --dist loadscope`) tests are scheduled in groups, so that every
# expensive fixture is still built once per run: a module that uses one of these session fixtures runs with the
# other modules that use it (one group for the SLURM clusters and sshd: a module such as the remote suite test uses
# both), a module with fixtures scoped to it (or a conftest above it with such fixtures) runs as one unit, and
# every other test is scheduled on its own.
_SESSION_FIXTURE_GROUPS = {
    "slurm_cluster": "daemons", "slurm_host_node": "daemons", "slurm_two_runnable_nodes": "daemons",
    "loopback_sshd": "daemons", "postgres_server": "postgres", "postgres_url": "postgres",
    "trainer_runs": "trainer-runs",
}
_SHARED_SCOPE = re.compile(r"""scope\s*=\s*["'](?:module|class|package)["']""")


@functools.cache
def _source(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def xdist_scope(root: Path, nodeid: str) -> str:
    """The unit a test is scheduled in: a session fixture's group, its module, or the test alone."""
    module = nodeid.split("::", 1)[0]
    source = _source(root / module)
    for fixture, group in _SESSION_FIXTURE_GROUPS.items():
        if re.search(rf"\b{fixture}\b", source):
            return group
    conftests = [directory / "conftest.py" for directory in (root / module).parents if root in directory.parents]
    if any(_SHARED_SCOPE.search(text) for text in (source, *map(_source, conftests))):
        return module
    return nodeid


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadscope` with the scopes above (xdist's own `loadgroup` marks are lost on pytest >= 9.2, which no
    longer reads the node ids xdist rewrites)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FixtureScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(config.rootpath, nodeid)

    return FixtureScopeScheduling(config, log)


def _hypothesis_profiles() -> None:
    """CI replays the same examples every run (a red CI must be reproducible); locally they vary."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile("dev", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


_hypothesis_profiles()
