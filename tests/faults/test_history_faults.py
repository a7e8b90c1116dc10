"""A history that is damaged, locked or breaks mid-run: found before anything trains, or costing only its own row.

- pages of the database overwritten: `suite run` stops at once (exit 2) naming the file as damaged, before
  any run directory exists;
- a database another process holds locked past the busy timeout is called locked, not "not a history";
- the history breaking after the suite trained: the report, run deck and JUnit are written, the row is
  retried, then queued in the run directory, and `history record RUN_DIR` writes it later.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.store import history as history_module
from megapilot.store.history import PENDING_NAME, open_history
from tests.faults.helpers import megapilot_argv, tiny_suite
from tests.report.factory import suite_result


def _history_with_pages(path: Path) -> None:
    open_history(str(path)).close()
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")  # everything in the main file, so the damage is there
        connection.execute("CREATE TABLE filler (x BLOB)")
        connection.executemany("INSERT INTO filler VALUES (?)", [(b"x" * 1000,) for _ in range(200)])


def test_a_damaged_history_stops_the_suite_before_anything_trains(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    _history_with_pages(db)
    data = bytearray(db.read_bytes())
    page = 4096
    data[3 * page:6 * page] = b"\xde\xad\xbe\xef" * (3 * page // 4)  # pages 4-6: a table's b-tree, not the header
    db.write_bytes(bytes(data))
    config = tiny_suite(tmp_path)
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--db",
                                         str(db)), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "damaged" in done.stderr and str(db) in done.stderr and "internal error" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing trained, no run directory


def test_a_history_locked_past_the_timeout_is_named_locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "history.sqlite"
    open_history(str(db)).close()
    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_S", 0.5)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(MegapilotError, match="locked by another process") as caught:
            history = open_history(str(db))
            history.check()
        assert "not a megapilot history" not in str(caught.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_history_that_breaks_after_training_costs_only_its_row_which_is_queued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from megapilot.cli import suite_run_cmd

    monkeypatch.setattr(suite_run_cmd, "HISTORY_RETRY_WAIT_S", 0.0)
    db = tmp_path / "history.sqlite"
    run_dir = tmp_path / "run"
    result = suite_result(run_dir)
    result.write(run_dir)
    history = open_history(str(db))
    history._db._connection.close()  # type: ignore[attr-defined]  # the database goes away mid-run
    suite_run_cmd._after_run(result, history)
    for name in ("report.html", "megatron_run_deck.json", "junit.xml"):
        assert (run_dir / name).is_file(), name  # the run's own files come first
    assert (run_dir / PENDING_NAME).is_file()
    assert "history record" in capsys.readouterr().err
    done = subprocess.run(megapilot_argv("history", "record", str(run_dir), "--db", str(db)), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert not (run_dir / PENDING_NAME).exists()
    with open_history(str(db)) as reopened:
        assert [row.run_id for row in reopened.runs()] == [result.run_id]


def test_a_history_found_damaged_when_the_row_is_written_costs_only_its_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from megapilot.cli import suite_run_cmd
    from tests.store.test_history import write_damaged_history

    monkeypatch.setattr(suite_run_cmd, "HISTORY_RETRY_WAIT_S", 0.0)
    db = tmp_path / "history.sqlite"
    write_damaged_history(db)
    monkeypatch.setattr(history_module, "_refuse_damaged", lambda connection, location: None)
    history = open_history(str(db))  # as if the damage came after the check made when the suite started
    run_dir = tmp_path / "run"
    result = suite_result(run_dir)
    result.write(run_dir)
    suite_run_cmd._after_run(result, history)
    for name in ("report.html", "megatron_run_deck.json", "junit.xml", "suite.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / PENDING_NAME).is_file()
    warning = capsys.readouterr().err
    assert warning.startswith("warning:") and "damaged" in warning and "internal error" not in warning
