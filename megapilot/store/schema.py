"""The run-history schema as ordered migrations, applied when a history database is opened.

The same SQL serves SQLite and PostgreSQL: plain types (TEXT, INTEGER, a float type chosen per dialect),
`?` placeholders (the PostgreSQL connection rewrites them), no vendor functions. Each migration is a
version number, a one-line description and its statements; `schema_version` keeps one row per applied
migration, so a database written by an older megapilot is brought up to date on open and one written
by a newer megapilot is refused instead of being misread.

Version history:
    1  runs, combos, metrics: what a suite run measured.
    2  predictions (the estimator's numbers next to the measured ones, for calibration), the model
       family and git commit of a run, and the job state of a combo (so `--resume` re-runs a combo that
       was cancelled).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from megapilot.errors import MegapilotError


class Database(Protocol):
    """What the schema and the history need from a connection (SQLite or PostgreSQL)."""

    dialect: str  # "sqlite" or "postgresql"
    location: str  # a file path or a URL without its password, for messages

    def execute(self, sql: str, params: Sequence[object] = ()) -> None: ...

    def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...

    def write(self) -> AbstractContextManager[None]:
        """One transaction that no other writer interleaves with (SQLite: BEGIN IMMEDIATE; PG: a lock)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: Callable[[str], list[str]]  # dialect -> SQL statements


def _float_type(dialect: str) -> str:
    # PostgreSQL's REAL is 4 bytes: a tokens/s of 12345.678 would come back as 12345.68.
    return "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"


def _v1(dialect: str) -> list[str]:
    real = _float_type(dialect)
    return [
        f"""CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            duration_s {real} NOT NULL DEFAULT 0,
            verdict TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            suite_name TEXT NOT NULL,
            model TEXT NOT NULL,
            gpu TEXT NOT NULL,
            nodes INTEGER NOT NULL,
            gpus_per_node INTEGER NOT NULL,
            layout TEXT NOT NULL DEFAULT '',
            precision TEXT NOT NULL DEFAULT '',
            backend TEXT NOT NULL DEFAULT '',
            executor TEXT NOT NULL DEFAULT '',
            config_hash TEXT NOT NULL DEFAULT '',
            run_dir TEXT NOT NULL DEFAULT '',
            megapilot_version TEXT NOT NULL DEFAULT '',
            finished INTEGER NOT NULL DEFAULT 0,
            recorded_at TEXT NOT NULL
        )""",
        f"""CREATE TABLE combos (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            combo_key TEXT NOT NULL,
            verdict TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            layout TEXT NOT NULL DEFAULT '',
            nodes INTEGER NOT NULL DEFAULT 1,
            gpus_per_node INTEGER NOT NULL DEFAULT 1,
            tp INTEGER NOT NULL DEFAULT 1,
            pp INTEGER NOT NULL DEFAULT 1,
            cp INTEGER NOT NULL DEFAULT 1,
            ep INTEGER NOT NULL DEFAULT 1,
            vpp INTEGER,
            mbs INTEGER,
            gbs INTEGER,
            precision TEXT,
            seq_length INTEGER,
            duration_s {real} NOT NULL DEFAULT 0,
            PRIMARY KEY (run_id, combo_key)
        )""",
        f"""CREATE TABLE metrics (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            combo_key TEXT NOT NULL,
            name TEXT NOT NULL,
            value {real},
            unit TEXT NOT NULL DEFAULT '',
            verdict TEXT NOT NULL,
            threshold TEXT,
            PRIMARY KEY (run_id, combo_key, name)
        )""",
        "CREATE INDEX runs_by_model_gpu ON runs (model, gpu, started_at)",
        "CREATE INDEX metrics_by_name ON metrics (name, combo_key)",
    ]


def _v2(dialect: str) -> list[str]:
    real = _float_type(dialect)
    quantities = ("step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct", "memory_gib")
    columns = ",\n".join(f"            {side}_{name} {real}" for name in quantities
                         for side in ("predicted", "measured"))
    return [
        "ALTER TABLE runs ADD COLUMN model_family TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE runs ADD COLUMN git_commit TEXT",
        "ALTER TABLE combos ADD COLUMN job_state TEXT",
        f"""CREATE TABLE predictions (
            run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
            combo_key TEXT NOT NULL,
{columns},
            PRIMARY KEY (run_id, combo_key)
        )""",
    ]


def _v3(dialect: str) -> list[str]:
    """Measured runs by cluster (suite combos and imported runs), each with the uncalibrated prediction of its own
    layout: the calibration's rows (megapilot.store.measured)."""
    real = _float_type(dialect)
    integers = ",\n".join(f"            {name} INTEGER" for name in
                          ("gpus", "tp", "pp", "cp", "ep", "vpp", "mbs", "gbs", "seq_len", "multi_node"))
    reals = ",\n".join(f"            {name} {real}" for name in (
        "predicted_step_time_s", "predicted_compute_s", "predicted_bubble_s", "predicted_scaleup_comm_s",
        "predicted_scaleout_comm_s", "predicted_fixed_s", "predicted_tokens_per_s_per_gpu",
        "predicted_tflops_per_gpu", "predicted_memory_gib", "measured_step_time_s", "measured_tokens_per_s_per_gpu",
        "measured_tflops_per_gpu", "measured_memory_gib"))
    return [
        f"""CREATE TABLE measured_runs (
            id TEXT PRIMARY KEY,
            cluster TEXT NOT NULL,
            origin TEXT NOT NULL,
            source TEXT NOT NULL DEFAULT '',
            verdict TEXT NOT NULL DEFAULT 'RECORD',
            recorded_at TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL DEFAULT '',
            precision TEXT NOT NULL DEFAULT '',
            gpu TEXT NOT NULL,
{integers},
            case_json TEXT NOT NULL DEFAULT '{{}}',
            software_json TEXT NOT NULL DEFAULT '{{}}',
{reals}
        )""",
        "CREATE INDEX measured_runs_by_cluster ON measured_runs (cluster, gpu)",
    ]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "runs, combos, metrics", _v1),
    Migration(2, "predictions; run model family and git commit; combo job state", _v2),
    Migration(3, "measured runs by cluster: the calibration's rows", _v3),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def schema_version(db: Database) -> int:
    """The highest migration applied (0 for an empty database)."""
    if not _has_version_table(db):
        return 0
    rows = db.query("SELECT MAX(version) FROM schema_version")
    return int(rows[0][0] or 0)


def apply_migrations(db: Database, *, target: int = SCHEMA_VERSION) -> list[int]:
    """Bring the database up to `target`, in order, each under the write lock; the versions applied.

    Two processes opening a new database at once both get here: the lock makes the second one
    re-read the version after the first finished, so every migration runs once.
    """
    applied: list[int] = []
    with db.write():
        if not _has_version_table(db):
            # only where it is missing: PostgreSQL checks the CREATE privilege on the schema before IF NOT EXISTS,
            # so a team's role granted SELECT, INSERT and DELETE on a history made by its owner could not record
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, "
                       "description TEXT NOT NULL, applied_at TEXT NOT NULL)")
        current = schema_version(db)
        _refuse_newer(db, current)
        _refuse_foreign(db, current)
        for migration in _pending(current, target):
            for statement in migration.statements(db.dialect):
                db.execute(statement)
            db.execute("INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                       (migration.version, migration.description, datetime.now(timezone.utc).isoformat()))
            applied.append(migration.version)
    return applied


def needs_migration(db: Database) -> bool:
    """Whether the database is older than this megapilot's schema (a newer one is refused): a reader, which
    cannot migrate, asks before reading."""
    current = schema_version(db)
    _refuse_newer(db, current)
    _refuse_foreign(db, current)
    return current < SCHEMA_VERSION


def _pending(current: int, target: int) -> Iterator[Migration]:
    return (m for m in MIGRATIONS if current < m.version <= target)


def _refuse_newer(db: Database, current: int) -> None:
    if current > SCHEMA_VERSION:
        raise MegapilotError(f"the history at {db.location} has schema version {current}; this megapilot reads up "
                             f"to version {SCHEMA_VERSION}", field="--db",
                             fix="upgrade megapilot, or point --db / $MEGAPILOT_HISTORY at another database")


# The tables the migrations create: a database that holds one of them with no schema version is not a history.
HISTORY_TABLES = ("runs", "combos", "metrics", "predictions", "measured_runs")


def _refuse_foreign(db: Database, current: int) -> None:
    """A database with no schema version that already holds tables is another program's, not a history written
    before: migrating it would add the history's tables beside its own (or fail on a table of the same name). A
    SQLite file is one database, so any table of its own refuses it; a PostgreSQL database is shared by many
    programs, so only a table of the history's names does."""
    if current:
        return
    if db.dialect == "postgresql":
        names = ", ".join("?" for _ in HISTORY_TABLES)
        rows = db.query("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                        f"AND table_name IN ({names}) ORDER BY table_name", HISTORY_TABLES)
    else:
        rows = db.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
                        "ESCAPE '\\' AND name <> 'schema_version' ORDER BY name")
    if rows:
        tables = ", ".join(str(row[0]) for row in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise MegapilotError(f"{db.location} is not a megapilot history: it holds table(s) {tables} and no schema "
                             "version", field="--db",
                             fix="point --db / $MEGAPILOT_HISTORY at a history file, or a new path")


def _has_version_table(db: Database) -> bool:
    if db.dialect == "postgresql":
        rows = db.query("SELECT to_regclass('schema_version') IS NOT NULL")
        return bool(rows[0][0])
    rows = db.query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
    return bool(rows)


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Database", "Migration", "apply_migrations", "needs_migration",
           "schema_version"]
