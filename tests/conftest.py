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


# Tests that start the same expensive session fixture run on one worker under pytest-xdist (`make test` runs
# `-n auto --dist loadgroup`), so each fixture starts once per run as it does without xdist: the SLURM clusters
# (three fixtures, one group: their daemons share the host's name), the loopback sshd, the PostgreSQL server and
# the tiny model the suite tests train once.
_SHARED_FIXTURE_GROUPS = {
    "slurm_cluster": "slurm", "slurm_host_node": "slurm", "slurm_two_runnable_nodes": "slurm",
    "loopback_sshd": "sshd", "postgres_server": "postgres", "postgres_url": "postgres",
    "trainer_runs": "trainer-runs",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses an expensive session fixture joins that fixture's xdist group; one that uses a fixture
    scoped to its module (or class) joins its module's group, so the fixture is built once, on one worker; every
    other test is free to run on any worker. Without xdist the marks do nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        fixtures = getattr(item, "fixturenames", ())
        shared = sorted({group for name, group in _SHARED_FIXTURE_GROUPS.items() if name in fixtures})
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether a fixture the test uses lives for its module or class (pytest's fixture info; a test without it,
    a doctest say, is taken to use one, the safe side)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    return any(definitions[-1].scope in ("module", "class", "package")
               for definitions in info.name2fixturedefs.values() if definitions)


def _hypothesis_profiles() -> None:
    """CI replays the same examples every run (a red CI must be reproducible); locally they vary."""
    import os

    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile("dev", deadline=None)
    settings.load_profile("ci" if os.environ.get("CI") else "dev")


_hypothesis_profiles()
