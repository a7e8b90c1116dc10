"""report.render: one call writes the report, deck, JUnit and log copies; a re-render from the run directory
alone gives the same files."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from megapilot.report.render import render_report, render_run_dir
from megapilot.suite.results import read_suite_result
from tests.report.factory import write_run_dir

WHEN = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)


def test_every_file_is_written_inside_the_run_directory_and_named_in_the_json(tmp_path):
    result = write_run_dir(tmp_path)
    files = render_report(result, tmp_path, generated_at=WHEN)
    assert (files.html.name, files.run_deck.name, files.junit.name) == ("report.html", "megatron_run_deck.json",
                                                                         "junit.xml")
    assert files.log_files and all(path.is_file() and files.logs_dir in path.parents for path in files.log_files)
    listed = files.as_json()
    assert listed["html"] == str(files.html) and listed["log_files"] == [str(p) for p in files.log_files]
    assert json.loads(files.run_deck.read_text())["run_id"] == result.run_id
    assert not list(tmp_path.glob(".*.tmp"))  # written whole, then moved into place


def test_a_re_render_from_suite_json_alone_gives_the_same_deck_and_junit(tmp_path):
    write_run_dir(tmp_path)
    first = render_report(read_suite_result(tmp_path), tmp_path, generated_at=WHEN)
    deck, junit = first.run_deck.read_text(), first.junit.read_text()
    again = render_run_dir(tmp_path)
    assert again.junit.read_text() == junit
    strip = lambda text: {k: v for k, v in json.loads(text).items() if k != "generated_at"}  # noqa: E731
    assert strip(again.run_deck.read_text()) == strip(deck)


def test_a_missing_run_directory_is_created(tmp_path):
    files = render_report(write_run_dir(tmp_path / "src"), tmp_path / "new" / "place", generated_at=WHEN)
    assert files.html.parent == (tmp_path / "new" / "place").resolve() and files.html.is_file()
