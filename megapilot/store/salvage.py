"""Salvage the rows still readable from a damaged SQLite history into a new file (`megapilot history salvage`).

The sqlite3 shell's `.recover` reads raw pages through the `sqlite_dbpage` virtual table, which many builds leave
out: Debian 12's sqlite3 3.40.1 then says only "SQL logic error" and writes an empty file, and Python's own sqlite3
module has no `.recover` at all. So this reads what SQLite's b-tree walk can still reach: the schema from
sqlite_master, then each table's rows by rowid windows, halving a window that fails until it is one rowid, so that
a bad page costs the rows on it and not the table. Rows whose run was lost go with it (the foreign keys' ON DELETE
CASCADE), the schema_version rows are rebuilt from the tables where they were lost, and the new file is written
beside the damaged one, checked whole (quick_check), and renamed into place only when complete.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from megapilot.errors import MegapilotError
from megapilot.store.schema import MIGRATIONS

WINDOW_ROWIDS = 256  # rows read per query while the pages hold; a failing window is halved
EMPTY_WINDOWS_PAST_END = 64  # with the last rowid unreadable: scan on until this many windows in a row are empty
SALVAGED_SUFFIX = ".recovered"


@dataclass(frozen=True)
class TableSalvage:
    """What came out of one table."""

    table: str
    copied: int  # rows written into the new file
    unreadable: int | None  # rowids whose rows could not be read (on a damaged page); None: how many is unknown
    orphans: int  # rows dropped because the run they belong to was lost


@dataclass(frozen=True)
class Salvage:
    source: Path
    target: Path
    tables: tuple[TableSalvage, ...]
    rebuilt_versions: bool  # the schema_version rows were lost and rebuilt from the tables that exist

    @property
    def copied(self) -> int:
        return sum(t.copied for t in self.tables)

    @property
    def lost(self) -> int:
        """Rows known lost (a table read from none of its pages counts none: how many it held is unknown)."""
        return sum((t.unreadable or 0) + t.orphans for t in self.tables)


def salvaged_path(source: Path) -> Path:
    return source.with_name(source.name + SALVAGED_SUFFIX)


def salvage_history(source: Path, target: Path | None = None) -> Salvage:
    """Copy every readable row of the SQLite history at `source` into a new file (`source`.recovered unless
    `target` is given); MegapilotError when the source cannot be read at all or the target exists."""
    target = target or salvaged_path(source)
    if not source.is_file():
        raise MegapilotError(f"there is no history file at {source}", field="PATH",
                             fix="pass the damaged history's path (the one the error named)")
    if target.exists():
        raise MegapilotError(f"{target} exists already", field="--output",
                             fix="move it aside, or pass --output another path")
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        with closing(sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)) as damaged:  # only read
            schema = _schema(damaged, source)
            salvaged = sqlite3.connect(partial)
            try:
                tables, rebuilt = _copy(damaged, salvaged, schema)
                salvaged.commit()
                problems = [row[0] for row in salvaged.execute("PRAGMA quick_check") if row[0] != "ok"]
            finally:
                salvaged.close()
        if problems:  # a fresh file that fails the check is this code's fault: said plainly, not handed on
            raise MegapilotError(f"the salvaged copy fails SQLite's check: {problems[0]}", field="PATH",
                                 fix="restore the history from a backup")
        partial.rename(target)
    except (sqlite3.Error, OSError) as exc:  # the copy's folder unwritable or full, the source unreadable
        partial.unlink(missing_ok=True)
        raise MegapilotError(f"the salvage stopped: {exc}", field="--output",
                             fix="give --output a path on a disk with room that this user can write") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return Salvage(source, target, tuple(tables), rebuilt)


def _copy(damaged: sqlite3.Connection, salvaged: sqlite3.Connection,
          schema: list[tuple[str, str, str]]) -> tuple[list[TableSalvage], bool]:
    for sql in (sql for kind, _, sql in schema if kind == "table"):
        salvaged.execute(sql)
    tables = [_copy_table(damaged, salvaged, name) for kind, name, _ in schema if kind == "table"]
    tables = _drop_orphans(salvaged, tables)
    for sql in (sql for kind, _, sql in schema if kind == "index"):
        salvaged.execute(sql)
    return tables, _rebuild_versions(salvaged, {name for kind, name, _ in schema if kind == "table"})


def _schema(damaged: sqlite3.Connection, source: Path) -> list[tuple[str, str, str]]:
    """(kind, name, sql) of the tables and explicit indexes, tables first; the internal ones left to SQLite."""
    try:
        rows = damaged.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('table', 'index') "
                               "AND sql IS NOT NULL AND name NOT LIKE 'sqlite_%'").fetchall()
    except sqlite3.DatabaseError as exc:
        raise MegapilotError(f"{source}'s schema cannot be read ({exc}): nothing in it can be reached",
                             field="PATH", fix="restore the history from a backup") from None
    return sorted(rows, key=lambda row: row[0] != "table")


def _copy_table(damaged: sqlite3.Connection, salvaged: sqlite3.Connection, table: str) -> TableSalvage:
    columns = [row[1] for row in damaged.execute(f'PRAGMA table_info("{table}")')]
    names = ", ".join(f'"{c}"' for c in columns)
    select = f'SELECT rowid, {names} FROM "{table}" WHERE rowid >= ? AND rowid < ?'
    insert = f'INSERT OR IGNORE INTO "{table}" (rowid, {names}) VALUES ({", ".join("?" * (len(columns) + 1))})'
    copied, highest, failed = 0, 0, []

    def read(low: int, high: int) -> None:
        nonlocal copied, highest
        try:
            rows = damaged.execute(select, (low, high)).fetchall()
        except sqlite3.DatabaseError:
            if high - low == 1:
                failed.append(low)
                return
            middle = (low + high) // 2
            read(low, middle)
            read(middle, high)
            return
        if rows:
            copied += salvaged.executemany(insert, rows).rowcount
            highest = max(highest, max(row[0] for row in rows))

    first, last = _rowid_bound(damaged, table, "min"), _rowid_bound(damaged, table, "max")
    if first is None or last is None:  # an empty table
        return TableSalvage(table, 0, 0, 0)
    low, misses = (1 if first == _UNREADABLE else first), 0
    # with the last rowid unreadable, read on until EMPTY_WINDOWS_PAST_END windows in a row yield no row
    while low <= last or (last == _UNREADABLE and misses < EMPTY_WINDOWS_PAST_END):
        before = copied
        read(low, low + WINDOW_ROWIDS)
        misses = 0 if copied > before else misses + 1
        low += WINDOW_ROWIDS
    if last != _UNREADABLE:
        return TableSalvage(table, copied, len(failed), 0)
    # past the last row read, a failing rowid may be one that never held a row: counted up to it; with no row read
    # at all, how many rows the table held is unknown
    return TableSalvage(table, copied, sum(1 for rowid in failed if rowid < highest) if copied else None, 0)


_UNREADABLE = -(2**63)  # a bound whose page is damaged (no rowid is this small)


def _rowid_bound(damaged: sqlite3.Connection, table: str, function: str) -> int | None:
    """The first or last rowid (min or max: the leftmost or rightmost page alone); None for an empty table,
    _UNREADABLE where the page that holds it is damaged (the scan then starts at 1, or runs on past the rows)."""
    try:
        value = damaged.execute(f'SELECT {function}(rowid) FROM "{table}"').fetchone()[0]
    except sqlite3.DatabaseError:
        return _UNREADABLE
    return None if value is None else int(value)


def _drop_orphans(salvaged: sqlite3.Connection, tables: list[TableSalvage]) -> list[TableSalvage]:
    """Rows whose parent row was lost go (what ON DELETE CASCADE would have done had the run been deleted)."""
    dropped: dict[str, int] = {}
    for table, rowid, *_ in salvaged.execute("PRAGMA foreign_key_check").fetchall():
        salvaged.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (rowid,))
        dropped[table] = dropped.get(table, 0) + 1
    return [TableSalvage(t.table, t.copied - dropped.get(t.table, 0), t.unreadable, dropped.get(t.table, 0))
            for t in tables]


def _rebuild_versions(salvaged: sqlite3.Connection, tables: set[str]) -> bool:
    """Where every schema_version row was lost, write those of the migrations whose tables the schema holds (the
    history is opened by its version): True if it did."""
    if "schema_version" not in tables or salvaged.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0]:
        return False
    for migration in MIGRATIONS:
        made = set(re.findall(r"CREATE TABLE (\w+)", " ".join(migration.statements("sqlite"))))
        if not made <= tables:
            break
        salvaged.execute("INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                         (migration.version, migration.description, "salvaged"))
    return True
