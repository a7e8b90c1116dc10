"""Salvaging a damaged SQLite history: a bad page costs the rows on it, not the table; what is copied opens as a
history; rows whose run was lost go with it; nothing is overwritten."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.store.history import open_history
from megapilot.store.salvage import salvage_history, salvaged_path
from tests.store.test_history import make_suite_result

RUNS = 120
PAGE = 4096


def _history(path: Path, runs: int = RUNS) -> list[str]:
    """A history of `runs` runs (one combo each), all in the main file; their ids."""
    ids = [f"run-{index:04d}" for index in range(runs)]
    with open_history(str(path)) as history:
        for index, run_id in enumerate(ids):
            history.record(make_suite_result(run_id, hour=index))
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode = DELETE")
    return ids


def _damage_a_middle_runs_leaf(path: Path) -> None:
    """Overwrite one leaf page of the runs table (one whose rows carry the runs' config hash), neither its first
    nor its last, so the table's bounds stay readable."""
    data = bytearray(path.read_bytes())
    leaves = [start for start in range(PAGE, len(data), PAGE)
              if data[start] == 0x0D and b"sha256:feed" in data[start:start + PAGE]]
    assert len(leaves) >= 3, "the runs table must span several leaf pages for this test"
    middle = leaves[len(leaves) // 2]
    data[middle:middle + PAGE] = b"\xde\xad\xbe\xef" * (PAGE // 4)
    path.write_bytes(bytes(data))


def test_a_damaged_leaf_costs_its_rows_and_not_the_table(tmp_path):
    path = tmp_path / "history.sqlite"
    ids = _history(path)
    _damage_a_middle_runs_leaf(path)
    with pytest.raises(MegapilotError, match="is damaged"):
        open_history(str(path), read_only=True)
    done = salvage_history(path)
    assert done.target == salvaged_path(path) and done.target.is_file()
    with open_history(str(done.target), read_only=True) as history:
        kept = {row.run_id for row in history.runs(limit=1000)}
    lost = set(ids) - kept
    assert kept <= set(ids) and 0 < len(lost) < len(ids) // 3  # one page's rows, not the table's
    runs = next(t for t in done.tables if t.table == "runs")
    assert runs.copied == len(kept) and runs.unreadable == len(lost)
    combos = next(t for t in done.tables if t.table == "combos")
    assert combos.orphans == len(lost) and combos.copied == len(kept)  # each lost run's combo went with it
    with sqlite3.connect(done.target) as salvaged:
        assert salvaged.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert salvaged.execute("PRAGMA foreign_key_check").fetchall() == []


def test_an_intact_history_is_copied_whole(tmp_path):
    path = tmp_path / "history.sqlite"
    ids = _history(path, runs=20)
    before = path.read_bytes()
    done = salvage_history(path, tmp_path / "copy.sqlite")
    assert done.lost == 0 and not done.rebuilt_versions
    with open_history(str(done.target), read_only=True) as history:
        assert sorted(row.run_id for row in history.runs(limit=100)) == ids
        assert history.run(ids[3]).combos  # a run's detail reads back whole
    assert path.read_bytes() == before  # the source is only read


def test_lost_version_rows_are_rebuilt_from_the_tables_so_the_copy_opens_as_a_history(tmp_path):
    path = tmp_path / "history.sqlite"
    _history(path, runs=2)
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM schema_version")
    done = salvage_history(path)
    assert done.rebuilt_versions
    with open_history(str(done.target), read_only=True) as history:
        assert len(history.runs()) == 2


def test_nothing_is_overwritten_and_nothing_half_written_is_left(tmp_path):
    path = tmp_path / "history.sqlite"
    _history(path, runs=2)
    target = salvaged_path(path)
    target.write_text("an earlier salvage")
    with pytest.raises(MegapilotError) as caught:
        salvage_history(path)
    assert caught.value.field == "--output" and target.read_text() == "an earlier salvage"
    not_a_database = tmp_path / "random.sqlite"
    not_a_database.write_bytes(b"\x00\x01garbage" * 512)
    with pytest.raises(MegapilotError) as refused:
        salvage_history(not_a_database)
    assert refused.value.field == "PATH" and "backup" in (refused.value.fix or "")
    with pytest.raises(MegapilotError) as unwritable:  # a folder that is not there: said, not a traceback
        salvage_history(path, tmp_path / "no such folder" / "history.sqlite")
    assert unwritable.value.field == "--output"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, target.name, not_a_database.name])
