"""The units `make test` schedules its pytest-xdist workers by (tests/conftest.py): each expensive fixture is
built once per run, and a test without a shared fixture is free to run on any worker."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import xdist_scope

ROOT = Path(__file__).resolve().parents[1]


def test_modules_that_start_the_same_daemons_share_one_unit() -> None:
    scopes = {xdist_scope(ROOT, f"{module}::test_x") for module in (
        "tests/execute/test_slurm.py", "tests/e2e/test_sbatch_test_only.py", "tests/e2e/test_suite_remote.py",
        "tests/execute/test_ssh.py")}
    assert scopes == {"daemons"}
    assert xdist_scope(ROOT, "tests/store/test_postgres.py::t") == xdist_scope(ROOT, "tests/store/test_history.py::t")


def test_a_module_with_module_scoped_fixtures_is_one_unit() -> None:
    assert xdist_scope(ROOT, "tests/plan/test_space.py::a") == xdist_scope(ROOT, "tests/plan/test_space.py::b")
    # its fixtures are in the conftest above it
    assert xdist_scope(ROOT, "tests/report/test_charts.py::a") == "tests/report/test_charts.py"


def test_any_other_test_is_a_unit_of_its_own() -> None:
    assert xdist_scope(ROOT, "tests/spec/test_pipeline.py::a") != xdist_scope(ROOT, "tests/spec/test_pipeline.py::b")
