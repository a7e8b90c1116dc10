"""store.schema: ordered migrations bring any older history up to date once, and a newer one is refused."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager

import pytest

from megapilot.errors import MegapilotError
from megapilot.store.schema import MIGRATIONS, SCHEMA_VERSION, apply_migrations, needs_migration, schema_version


class _Sqlite:
    """A plain SQLite connection speaking the schema's Database protocol (what the history wraps)."""

    dialect = "sqlite"

    def __init__(self, path):
        self.location = str(path)
        self.connection = sqlite3.connect(path, isolation_level=None)

    def execute(self, sql, params=()):
        self.connection.execute(sql, tuple(params))

    def execute_many(self, sql, rows):
        self.connection.executemany(sql, rows)

    def query(self, sql, params=()):
        return self.connection.execute(sql, tuple(params)).fetchall()

    @contextmanager
    def write(self):
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def close(self):
        self.connection.close()

    def tables(self) -> set[str]:
        return {row[0] for row in self.query("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_versions_are_consecutive_and_the_schema_version_is_the_last():
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert MIGRATIONS[-1].version == SCHEMA_VERSION


def test_an_empty_database_gets_every_migration_once(tmp_path):
    db = _Sqlite(tmp_path / "h.sqlite")
    assert schema_version(db) == 0
    assert apply_migrations(db) == list(range(1, SCHEMA_VERSION + 1))
    assert apply_migrations(db) == [] and schema_version(db) == SCHEMA_VERSION
    rows = db.query("SELECT version, description FROM schema_version ORDER BY version")
    assert rows == [(m.version, m.description) for m in MIGRATIONS]
    assert {"runs", "combos", "metrics", "predictions", "measured_runs"} <= db.tables()


def test_an_older_database_is_brought_up_from_where_it_stands(tmp_path):
    db = _Sqlite(tmp_path / "old.sqlite")
    assert apply_migrations(db, target=1) == [1]
    assert "runs" in db.tables() and "measured_runs" not in db.tables()
    assert apply_migrations(db) == list(range(2, SCHEMA_VERSION + 1)) and "measured_runs" in db.tables()


def test_a_database_from_a_newer_megapilot_is_refused_and_left_as_it_was(tmp_path):
    db = _Sqlite(tmp_path / "future.sqlite")
    apply_migrations(db)
    db.execute("INSERT INTO schema_version VALUES (?, 'from the future', 'now')", (SCHEMA_VERSION + 1,))
    with pytest.raises(MegapilotError) as caught:
        apply_migrations(db)
    assert caught.value.field == "--db" and str(tmp_path / "future.sqlite") in caught.value.problem
    assert schema_version(db) == SCHEMA_VERSION + 1


def test_a_failing_migration_leaves_no_half_applied_version(tmp_path):
    db = _Sqlite(tmp_path / "clash.sqlite")
    apply_migrations(db, target=1)
    db.execute("CREATE TABLE predictions (x INTEGER)")  # in the way of version 2's table
    with pytest.raises(sqlite3.OperationalError):
        apply_migrations(db)
    assert schema_version(db) == 1 and "measured_runs" not in db.tables()
    assert "model_family" not in {row[1] for row in db.query("PRAGMA table_info(runs)")}


@pytest.mark.parametrize("table", ["notes", "runs"])
def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path, table):
    """A SQLite file that holds tables but no schema version is not a history: it used to get the history's tables
    added beside its own (by a command that only reads, too), or fail on a table of the same name as 'cannot be
    used as the history (table runs already exists)'."""
    db = _Sqlite(tmp_path / "app.sqlite")
    db.execute(f"CREATE TABLE {table} (x INTEGER)")
    for step in (needs_migration, apply_migrations):
        with pytest.raises(MegapilotError) as caught:
            step(db)
        assert caught.value.field == "--db"
        assert caught.value.problem == (f"{tmp_path / 'app.sqlite'} is not a megapilot history: it holds table(s) "
                                        f"{table} and no schema version")
    assert db.tables() == {table}


def test_needs_migration_is_asked_before_reading_and_refuses_a_newer_database(tmp_path):
    db = _Sqlite(tmp_path / "old.sqlite")
    assert needs_migration(db)  # empty
    apply_migrations(db, target=1)
    assert needs_migration(db)
    apply_migrations(db)
    assert not needs_migration(db)
    db.execute("INSERT INTO schema_version VALUES (?, 'from the future', 'now')", (SCHEMA_VERSION + 1,))
    with pytest.raises(MegapilotError, match=f"schema version {SCHEMA_VERSION + 1}"):
        needs_migration(db)
