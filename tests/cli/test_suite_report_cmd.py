"""`megapilot suite report RUN_DIR [--json]` through the real entry point (cli.suite_report_cmd)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.report.factory import write_run_dir
from tests.tmpfs import small_tmpfs

# A run directory as the version before wrote it: each combo's layout as flat fields (tests/data/suite_results).
EARLIER_RUN = Path(__file__).resolve().parents[1] / "data" / "suite_results" / "flat_layout"


def test_report_prints_the_paths(cli, tmp_path):
    write_run_dir(tmp_path)
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert f"report    {tmp_path.resolve() / 'report.html'}" in result.stdout
    assert "logs" in result.stdout and "(2 files)" in result.stdout


def test_report_json_lists_every_file(cli, tmp_path):
    write_run_dir(tmp_path)
    result = cli("suite", "report", str(tmp_path), "--json")
    assert result.exit_code == 0, result.stderr
    paths = result.json()
    assert set(paths) == {"html", "run_deck", "junit", "logs_dir", "log_files"}
    assert json.loads((tmp_path / "megatron_run_deck.json").read_text())["overall_status"] == "fail"
    assert len(paths["log_files"]) == 2


def test_a_run_written_by_the_version_before_reports_its_combos_layouts(cli, tmp_path):
    run_dir = shutil.copytree(EARLIER_RUN, tmp_path / "earlier")
    result = cli("suite", "report", str(run_dir), "--json")
    assert result.exit_code == 0, result.stderr
    deck = json.loads((run_dir / "megatron_run_deck.json").read_text())
    assert "TP=1 PP=2 CP=1 EP=1 VPP=2" in (run_dir / "report.html").read_text()
    assert '"ep": 2' in json.dumps(deck)


def test_a_directory_without_suite_json_is_a_user_error(cli, tmp_path):
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 2
    assert "has no suite.json" in result.stderr and "Traceback" not in result.stderr


def test_a_missing_directory_is_a_user_error(cli, tmp_path):
    result = cli("suite", "report", str(tmp_path / "nope"))
    assert result.exit_code == 2 and "is not a directory" in result.stderr


def test_a_damaged_suite_json_is_a_user_error(cli, tmp_path):
    (tmp_path / "suite.json").write_text("{not json")
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 2 and "is not a suite result" in result.stderr


def test_a_suite_json_with_a_nan_duration_is_refused_by_its_field_and_writes_no_deck(cli, tmp_path):
    # the deck's schema holds a number there: written as null, the deck would fail its own schema
    write_run_dir(tmp_path)
    data = json.loads((tmp_path / "suite.json").read_text())
    data["duration_s"] = "NaN"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 2 and "(duration_s: Input should be a finite number (found 'NaN'))" in result.stderr
    assert not (tmp_path / "megatron_run_deck.json").exists()


def test_a_suite_json_with_a_damaged_gate_value_is_refused_by_its_path_and_value(cli, tmp_path):
    # every number, as every duration: a measured value written as text would reach the report as a number
    write_run_dir(tmp_path)
    data = json.loads((tmp_path / "suite.json").read_text())
    data["combos"][0]["metrics"][0]["value"] = "950"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "(combos.0.metrics.0.value: Input should be a finite number (found '950'))" in result.stderr
    assert not (tmp_path / "megatron_run_deck.json").exists()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (mounting needs root: skipped with the reason otherwise)."""
    with small_tmpfs(tmp_path, "1m") as mount:
        yield mount


def _fill(mount: Path, leave_bytes: int) -> None:
    free = shutil.disk_usage(mount).free
    with open(mount / "filler", "wb") as filler:
        filler.write(b"\0" * max(free - leave_bytes, 0))


def test_a_full_disk_is_a_user_error_naming_the_run_dir_and_keeps_suite_json(cli, small_fs):
    run_dir = small_fs / "run"
    write_run_dir(run_dir)
    suite_json = (run_dir / "suite.json").read_bytes()
    _fill(small_fs, 8 << 10)  # room for a log copy, not for the report
    result = cli("suite", "report", str(run_dir))
    assert result.exit_code == 2, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert f"RUN_DIR: cannot write the report into {run_dir}: no space left" in result.stderr
    assert "free space there" in result.stderr
    assert (run_dir / "suite.json").read_bytes() == suite_json


def test_a_read_only_run_dir_is_a_user_error_naming_it(cli, small_fs):
    run_dir = small_fs / "run"
    write_run_dir(run_dir)
    done = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot remount read-only ({done.stderr.strip()})")
    result = cli("suite", "report", str(run_dir))
    assert result.exit_code == 2, result.stderr
    assert f"RUN_DIR: cannot write the report into {run_dir}: Read-only file system" in result.stderr
    assert "internal error" not in result.stderr
