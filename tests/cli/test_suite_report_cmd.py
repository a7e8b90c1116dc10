"""`megapilot suite report RUN_DIR [--json]` through the real entry point (cli.suite_report_cmd)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.report.factory import write_run_dir

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
    # every number, as every duration: a measured value written as "Infinity" would pass its gate in the report
    write_run_dir(tmp_path)
    data = json.loads((tmp_path / "suite.json").read_text())
    data["combos"][0]["metrics"][0]["value"] = "Infinity"
    (tmp_path / "suite.json").write_text(json.dumps(data))
    result = cli("suite", "report", str(tmp_path))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "(combos.0.metrics.0.value: Input should be a finite number (found 'Infinity'))" in result.stderr
    assert not (tmp_path / "megatron_run_deck.json").exists()
