"""The run history: every suite run's verdicts, metrics and predictions, in SQLite or PostgreSQL.

`open_history()` opens the database, checked whole; a writer creates and migrates it as needed, a reader
(`read_only=True`) changes nothing and so reads a history in a folder it cannot write:
    url None      $MEGAPILOT_HISTORY, else `platformdirs.user_data_dir("megapilot")/history.sqlite`
    a path        a SQLite file (or `sqlite:///path`)
    postgresql:// a PostgreSQL database shared by a team (needs the `postgres` extra: psycopg)

SQLite runs in WAL mode with a busy timeout and takes its write lock up front (BEGIN IMMEDIATE), so
two suite runs recording at the same moment both land; PostgreSQL writers take an advisory lock.

What is stored is what a later run, a comparison or a calibration needs: verdicts, layouts, metric
values and gates, predictions. What may carry a secret is not: no launch command, no environment, no
notes, no log lines; reasons are scrubbed of anything shaped like a token before they are written.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from megapilot.errors import MegapilotError
from megapilot.files import free_bytes, human_size
from megapilot.store import measured as measured_runs
from megapilot.store.regress import METRICS, Change, change_pct, combo_layout, judge, metric_info
from megapilot.store.salvage import SALVAGED_SUFFIX
from megapilot.store.schema import Database, apply_migrations, needs_migration, schema_version
from megapilot.suite.metric_table import measured_quantity, measured_value, zero_unmeasured_metrics
from megapilot.suite.verdicts import RunStatus, Verdict

if TYPE_CHECKING:
    from megapilot.suite.results import ComboResult, SuiteResult

# Every history command reads rows; only recording a suite run reads its result (megapilot.suite.results and
# .outcome: 0.4 CPU-s to import, the findings, the layout types, the estimator), which `record` is handed already
# loaded: the one function that needs the outcome policy imports it itself.

HISTORY_ENV = "MEGAPILOT_HISTORY"
# Left in a run directory whose history row could not be written: `megapilot history record RUN_DIR` writes it.
PENDING_NAME = "history-pending.json"
HISTORY_FILE_NAME = "history.sqlite"
BUSY_TIMEOUT_S = 30.0
PG_WRITE_LOCK = 0x6D70_6869  # one advisory-lock key for every megapilot history writer
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
LIST_RUNS_HINT = "list run ids with `megapilot history list`"
_T = TypeVar("_T")

# A combo that ended with one of these verdicts is not run again by `suite run --resume`; SKIPPED is
# cheap to re-decide and may have been caused by a stage that the resumed run now passes.
TERMINAL_VERDICTS = (Verdict.PASS, Verdict.FAIL, Verdict.RECORD)
UNFINISHED_JOB_STATES = ("PENDING", "RUNNING", "CANCELLED")
# Runs and combos that count for a baseline: RECORD is measured but not gated, so a suite gated only by
# `baseline` thresholds (RECORD until a history exists) builds its first history.
PASSING_VERDICTS = (Verdict.PASS, Verdict.RECORD)
# A run whose gates passed and that regressed without enforcement (WARN) counts too, as it did before it was
# stored as WARN: a lasting change becomes the baseline after a few runs. A regression enforced fails the run, and
# a failed run is no baseline.
BASELINE_RUN_STATUSES = (RunStatus.PASS, RunStatus.RECORD, RunStatus.WARN)
CALIBRATED_QUANTITIES = ("step_time_ms", "tokens_per_s_per_gpu")
PREDICTED_QUANTITIES = ("step_time_ms", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct", "memory_gib")
# A zero below its print's resolution (the metric table's `zero_unmeasured` rows: TFLOP/s/GPU printed with one
# decimal, the MFU computed from it) is stored and read as missing (shown "-", JSON null) like every figure not
# measured, so that it neither compares as "unchanged" nor sets a baseline; rows written before that rule included.


# ---- record types ---------------------------------------------------------------------------------

class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRow(_Record):
    """One stored run, as `history list` shows it: its verdict is the run's one verdict (megapilot.suite.outcome),
    WARN or FAIL for a regression beyond its band whatever the gates said."""

    run_id: str
    started_at: datetime
    ended_at: datetime | None
    duration_s: float
    verdict: RunStatus
    reason: str
    suite_name: str
    model: str
    model_family: str
    gpu: str
    nodes: int
    gpus_per_node: int
    layout: str
    precision: str
    backend: str
    executor: str
    config_hash: str
    run_dir: str
    megapilot_version: str
    git_commit: str | None
    finished: bool
    combos: int
    failed_combos: int


class MetricValue(_Record):
    name: str
    value: float | None
    unit: str
    verdict: Verdict
    threshold: str | None


class PredictionRow(_Record):
    """The estimator's numbers for a combo next to what was measured (None: not predicted / not measured)."""

    predicted_step_time_ms: float | None
    measured_step_time_ms: float | None
    predicted_tokens_per_s_per_gpu: float | None
    measured_tokens_per_s_per_gpu: float | None
    predicted_tflops_per_gpu: float | None
    measured_tflops_per_gpu: float | None
    predicted_mfu_pct: float | None
    measured_mfu_pct: float | None
    predicted_memory_gib: float | None
    measured_memory_gib: float | None


class ComboRow(_Record):
    key: str
    verdict: Verdict
    reason: str
    layout: str
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int | None
    mbs: int | None
    gbs: int | None
    precision: str | None
    seq_length: int | None
    duration_s: float
    job_state: str | None
    metrics: list[MetricValue]
    prediction: PredictionRow | None


class RunDetail(_Record):
    run: RunRow
    combos: list[ComboRow]


class MetricDelta(_Record):
    """One metric of one combo in two runs: B against A."""

    combo: str
    metric: str
    label: str
    unit: str
    value_a: float | None
    value_b: float | None
    delta_pct: float | None
    change: Change


class RunDifference(_Record):
    """What two compared runs (combo None) or a combo both have did not share: their metrics then compare
    different setups (another model, GPU, layout), not one setup run twice."""

    combo: str | None
    field: str
    value_a: str
    value_b: str


class RunComparison(_Record):
    run_a: RunRow
    run_b: RunRow
    differences: list[RunDifference]
    deltas: list[MetricDelta]
    combos_only_in_a: list[str]
    combos_only_in_b: list[str]


# What makes two runs, or two combos of one key, the same setup (the fields a comparison names when they differ).
_RUN_SETUP = ("model", "gpu", "nodes", "gpus_per_node", "precision", "backend")
_COMBO_SETUP = ("layout", "nodes", "gpus_per_node", "gbs", "precision", "seq_length")


@dataclass(frozen=True)
class MeasuredWrite:
    """What `History.record_measured` did: the rows written, the ids among them that replaced a row of the same id,
    the rows refused with why (their id is another run's), and the ids left as they were because `suite run`
    already recorded that very run (an imported run deck of a suite run megapilot ran)."""

    kept: tuple[measured_runs.MeasuredRow, ...]
    replaced: tuple[str, ...]
    refused: tuple[tuple[measured_runs.MeasuredRow, str], ...]
    already: tuple[str, ...] = ()


# How a measured run's origin is named in a message.
_ORIGIN_NAMES = {"import": "an imported run", "suite": "a suite run's combo", "run": "a `megapilot run`"}


class BaselineStats(_Record):
    """A metric over the last passing runs of the same model/layout/GPU/cell, newest first."""

    metric: str
    median: float
    count: int
    mean: float
    stdev: float | None  # None with fewer than two runs
    values: list[float]
    run_ids: list[str]


class CalibrationRow(_Record):
    """How far the estimator was off, for one GPU, model family and quantity.

    error % = (predicted - measured) / measured x 100: positive means predicted too high.
    """

    gpu: str
    model_family: str
    quantity: Literal["step_time_ms", "tokens_per_s_per_gpu"]
    count: int
    median_abs_error_pct: float
    mean_signed_error_pct: float


# ---- opening --------------------------------------------------------------------------------------

def default_history_path() -> Path:
    # start-up: platformdirs (9 ms) only where the default path is needed
    import platformdirs

    return Path(platformdirs.user_data_dir("megapilot")) / HISTORY_FILE_NAME


def history_url(url: str | None = None) -> str:
    """Which database to open: the URL given, else $MEGAPILOT_HISTORY, else the default SQLite file."""
    return url or os.environ.get(HISTORY_ENV) or str(default_history_path())


def connect_database(url: str | None = None, *, read_only: bool = False) -> Database:
    """A connection to the history database as it is, not migrated (open_history migrates).

    read_only: a SQLite file is opened without changing it (its journal mode left alone, no folder or file
    created), so that a history in a folder this user cannot write still reads; a --db path that does not exist
    is a user error (a typo would read as an empty history), while the configured location ($MEGAPILOT_HISTORY,
    else the default) reads as an empty history until a first run records into it.
    """
    if url is not None and not url.strip():  # `--db "$HISTORY"` with the variable unset: not the default history
        raise MegapilotError("the history path or URL is empty", field="--db",
                             fix=f"pass a SQLite file's path or a postgresql:// URL, or leave --db out for "
                                 f"${HISTORY_ENV} or the default history")
    target = history_url(url)
    if target.startswith(POSTGRES_SCHEMES):
        return _open_postgres(target)
    _refuse_other_url(target, source="--db" if url else f"${HISTORY_ENV}" if os.environ.get(HISTORY_ENV) else "")
    source = "" if url else None
    return _open_sqlite(target, read_only=read_only, source=source)


# A URL's scheme: `mysql://`, SQLAlchemy's `postgresql+psycopg://`, `sqlite://` with two slashes.
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _refuse_other_url(target: str, *, source: str) -> None:
    """A URL of another database or driver is refused: read as a SQLite path it made a folder `mysql:` (or
    `postgresql+psycopg:`) and wrote the runs there, while the team's database got nothing."""
    scheme = _URL_SCHEME.match(target)
    if scheme is None or target.startswith("sqlite:///"):
        return
    name = scheme.group(1)
    base = name.split("+", 1)[0].lower()
    if base in ("postgresql", "postgres"):
        fix = f"write it {scrub_secrets('postgresql://' + target[scheme.end():])} (psycopg is the one driver)"
    elif base == "sqlite":
        fix = "write sqlite:///relative/path or sqlite:////absolute/path, or give the file's path alone"
    else:
        fix = "give a SQLite file's path or a postgresql:// URL"
    raise MegapilotError(f"{scrub_secrets(target)} is a {name}:// URL; the history is a SQLite file or a "
                         "PostgreSQL database", field=source or "--db", fix=fix)


def open_history(url: str | None = None, *, read_only: bool = False) -> History:
    """Open the run history, checked whole (SQLite: PRAGMA quick_check when it is opened, so a damaged file is
    refused before anything reads from or writes into it).

    For writing (the default) it is created and migrated to the current schema as needed. read_only: nothing is
    created or changed, except that a history written by an older megapilot is reopened for writing once to
    migrate it (its rows could not be read otherwise).
    """
    database = connect_database(url, read_only=read_only)
    try:
        if not read_only:
            apply_migrations(database)
        elif needs_migration(database) and schema_version(database) == 0:
            # no history in it yet (an empty file, a new PostgreSQL database; one holding other tables was refused):
            # read as an empty history, left as it is, as the default location not made yet reads
            location = database.location
            database.close()
            database = _SqliteDatabase.empty(location)
        elif needs_migration(database):
            database.close()
            database = connect_database(url)
            apply_migrations(database)
    except BaseException:
        database.close()
        raise
    return History(database)


def _refuse_damaged(connection: sqlite3.Connection, location: str) -> None:
    """A SQLite history whose pages fail the quick check (b-trees and free list, not index contents: linear in
    the file's size, a fraction of a second for a history of hundreds of MiB) is refused as damaged."""
    problems = [str(row[0]) for row in connection.execute("PRAGMA quick_check").fetchall() if str(row[0]) != "ok"]
    if problems:
        raise _damaged(location, f"malformed pages; integrity check: {'; '.join(problems[:3])}")


def _damaged(location: str, detail: str) -> MegapilotError:
    # the salvage is megapilot's own: the sqlite3 shell's .recover needs sqlite_dbpage, which common builds leave
    # out (megapilot.store.salvage); the path quoted for the shell
    return MegapilotError(f"{location} is damaged ({detail})", field="--db",
                          fix=f"`megapilot history salvage {shlex.quote(location)}` copies the rows still readable "
                              f"into {location}{SALVAGED_SUFFIX}; or move it aside (a new history then starts at that "
                              "path), or restore it from a backup")


def _sqlite_problem(location: str, exc: BaseException, path: Path | None = None) -> MegapilotError:
    """A SQLite error said plainly: damaged, not a history, locked, not writable, full, or cannot be opened."""
    text = str(exc)
    if "malformed" in text or "corrupt" in text:  # SQLITE_CORRUPT
        return _damaged(location, text)
    if "not a database" in text:  # SQLITE_NOTADB
        return MegapilotError(f"{location} is not a megapilot history ({text})", field="--db",
                              fix="point --db / $MEGAPILOT_HISTORY at a history file, or a new path")
    if "locked" in text or "busy" in text:
        return MegapilotError(f"{location} is locked by another process (still after {BUSY_TIMEOUT_S:g} s)",
                              field="--db", fix="wait for the other megapilot (or sqlite3 shell) to finish, or use "
                                                "another --db")
    if "full" in text:
        return MegapilotError(f"the disk under {location} is full ({text})", field="--db",
                              fix="free space there, or use another --db")
    if "disk I/O error" in text and path is not None and (free := free_bytes(path)) < MIN_FREE_BYTES:
        # SQLite says only "disk I/O error" when its -wal or -shm file cannot grow on a full disk
        return MegapilotError(f"the disk under {location} is full ({text}; {human_size(free)} free)", field="--db",
                              fix="free space there, or use another --db")
    if "disk I/O error" in text and (limit := _file_size_limit(path)) is not None:
        # a write past `ulimit -f` fails with EFBIG, which SQLite reports as a plain I/O error (as its -shm file
        # of 32 KiB cannot be made under a smaller limit, even a reader fails)
        return MegapilotError(f"{location} cannot grow: this process may not write files larger than "
                              f"{human_size(limit)} (the file size limit, `ulimit -f`; {text})", field="--db",
                              fix="raise the limit (`ulimit -f unlimited`) and run the command again")
    if "disk I/O error" in text:
        # the history itself is not at fault: a failing disk, or a network file system that lost its server
        return MegapilotError(f"reading or writing {location} failed ({text}"
                              f"{', ' + name if (name := getattr(exc, 'sqlite_errorname', None)) else ''})",
                              field="--db", fix="check the disk and file system under it (the kernel log says why), "
                                                "then run the command again; or use another --db on a local disk")
    if "unable to open" in text and path is not None and path.exists() and not os.access(path, os.R_OK):
        return MegapilotError(f"{location} cannot be read ({text})", field="--db",
                              fix="make the file readable by this user, or use another --db")
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        # SQLITE_CANTOPEN for a writer is most often a folder where the file, or its -wal and -shm, cannot be made
        unwritable = _unwritable(path)
        if unwritable is not None or "unable to open" not in text:
            return MegapilotError(f"{location} cannot be written: {unwritable or 'the file'} is not writable ({text})",
                                  field="--db", fix="make it writable by this user, or use another --db")
        return MegapilotError(f"cannot open the history at {location} ({text})", field="--db",
                              fix="check that the file and its folder can be read and written by this user, or use "
                                  "another --db")
    return MegapilotError(f"{location} cannot be used as the history ({text})", field="--db",
                          fix="point --db / $MEGAPILOT_HISTORY at a history file, or a new path")


def _file_size_limit(path: Path | None) -> int | None:
    """This process's file size limit in bytes (`ulimit -f`) where the history's files may have reached it (its
    largest file, -wal or -shm included, within MIN_FREE_BYTES of it); None when it is unlimited or far above."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return None
    sizes = [0] if path is None else [
        p.stat().st_size for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        if p.is_file()]
    return soft if max(sizes, default=0) + MIN_FREE_BYTES >= soft else None


def _unwritable(path: Path | None) -> str | None:
    """Which of a database file and its folder (the nearest that exists) this user cannot write; None: neither."""
    if path is None:
        return None
    if path.exists() and not os.access(path, os.W_OK):
        return "the file"
    folder = next((p for p in path.absolute().parents if p.exists()), None)
    return f"its folder {folder}" if folder is not None and not os.access(folder, os.W_OK) else None


# A suite writes a few hundred KiB of rows at most; less free space than this fails before training.
MIN_FREE_BYTES = 16 << 20


class _SqliteDatabase:
    """A SQLite connection whose errors reach the caller as MegapilotErrors naming --db (damaged, locked, ...)."""

    dialect = "sqlite"

    def __init__(self, connection: sqlite3.Connection, location: str, path: Path | None):
        self._connection = connection
        self.location = location
        self._path = path  # None: in memory

    @classmethod
    def for_writing(cls, path: Path) -> _SqliteDatabase:
        # isolation_level=None: no implicit transactions; writes open theirs with BEGIN IMMEDIATE.
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            _refuse_damaged(connection, str(path))  # before the journal mode is set: nothing is written into it
            database = cls(connection, str(path), path)
            needs_migration(database)  # so is another program's database, or a newer megapilot's: refused as they are
            _use_wal(connection)
            connection.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            connection.close()
            raise
        return database

    @classmethod
    def for_reading(cls, path: Path) -> _SqliteDatabase:
        """Read-only, the journal mode as the file has it. A WAL file whose -shm cannot be created (a folder this
        user cannot write) is opened immutable: no WAL writer can change it there either, as none can make its
        -wal file."""
        uri = path.absolute().as_uri()
        for options in ("?mode=ro", "?mode=ro&immutable=1"):
            connection = sqlite3.connect(uri + options, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            try:
                connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()  # opens the file and WAL index
                _refuse_damaged(connection, str(path))
                return cls(connection, str(path), path)
            except sqlite3.OperationalError as exc:
                connection.close()
                if "unable to open" not in str(exc) or "immutable" in options:
                    raise
                _refuse_unread_wal(path)
            except BaseException:
                connection.close()
                raise
        raise AssertionError("unreachable: the immutable open returns or raises")

    @classmethod
    def empty(cls, location: str) -> _SqliteDatabase:
        """An empty history in memory, shown as `location`: the default history before anything was recorded,
        read without creating it."""
        database = cls(sqlite3.connect(":memory:", isolation_level=None), location, None)
        apply_migrations(database)
        return database

    @contextmanager
    def _plainly(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise _sqlite_problem(self.location, exc, self._path) from None

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        with self._plainly():
            self._connection.execute(sql, tuple(params))

    def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        with self._plainly():
            self._connection.executemany(sql, [tuple(row) for row in rows])

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._plainly():
            return self._connection.execute(sql, tuple(params)).fetchall()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._plainly():
            self._connection.execute("BEGIN IMMEDIATE")  # the write lock now, not at the first write (no deadlock)
        try:
            yield
        except BaseException:
            with suppress(sqlite3.Error):  # a rollback that fails too (connection gone) must not hide why
                self._connection.execute("ROLLBACK")
            raise
        with self._plainly():
            self._connection.execute("COMMIT")

    def close(self) -> None:
        self._connection.close()


def _refuse_unread_wal(path: Path) -> None:
    """An immutable open reads the main file alone: the runs still in a -wal file left beside it (its writer
    stopped before the -wal was merged, and its -shm is gone) would be missing from the history without a word."""
    wal = path.with_name(path.name + "-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        folder = path.absolute().parent
        merge = f"sqlite3 {shlex.quote(str(path))} 'PRAGMA wal_checkpoint(TRUNCATE)'"
        raise MegapilotError(f"{wal} holds writes not yet merged into {path}, and without its -shm file, which "
                             f"cannot be made in {folder}, they cannot be read", field="--db",
                             fix=f"copy {path.name} and {wal.name} into a folder you can write and pass the copy to "
                                 f"--db, or have a user who may write {folder} merge them: `{merge}`")


def _use_wal(connection: sqlite3.Connection) -> None:
    """Switch a new file to WAL. Two processes creating the same history at once race for this switch,
    and SQLite answers the loser "database is locked" at once, without its busy timeout: retry it."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _open_sqlite(target: str, *, read_only: bool, source: str | None) -> _SqliteDatabase:
    """source: None for the default location, else how the path was named (for messages: '' or a variable)."""
    path = Path(target.removeprefix("sqlite:///") if target.startswith("sqlite:///") else target).expanduser()
    fix = "pass a file path or a postgresql:// URL to --db (or $MEGAPILOT_HISTORY)"
    if path.is_dir():
        raise MegapilotError(f"{path} is a directory, not a history database", field="--db", fix=fix)
    if read_only and not path.exists():
        if source is None:
            return _SqliteDatabase.empty(str(path))
        raise MegapilotError(f"there is no history at {path}{source}", field="--db",
                             fix="check the path, or record one there with `megapilot suite run` or "
                                 "`megapilot history import`")
    try:
        if read_only:
            return _SqliteDatabase.for_reading(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _SqliteDatabase.for_writing(path)
    except PermissionError as exc:
        raise MegapilotError(f"{path} cannot be written: {_unwritable(path) or 'its folder'} is not writable "
                             f"({exc.strerror})", field="--db",
                             fix="make it writable by this user, or use another --db") from None
    except OSError as exc:
        raise MegapilotError(f"cannot open the history at {path} ({exc})", field="--db", fix=fix) from None
    except sqlite3.Error as exc:
        raise _sqlite_problem(str(path), exc, path) from None


class _PostgresDatabase:
    """A PostgreSQL connection whose errors reach the caller as MegapilotErrors naming --db (no privilege, a
    standby, the connection lost, ...). A suite holds its connection for hours: one the server closed since its
    last use (a restart, an idle timeout, a proxy's) is opened again once, outside a transaction, so the run's
    rows still land."""

    dialect = "postgresql"

    def __init__(self, connection: Any, location: str, url: str):
        self._connection = connection
        self.location = location
        self._url = url
        self._in_transaction = False

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")  # the schema's and history's SQL holds no literal '?' or '%'

    def _run(self, work: Callable[[Any], _T]) -> _T:
        """work(connection), its errors said plainly; again on a new connection when this one turned out closed
        and no transaction was open on it (inside one, what it wrote is gone with it: the caller's error)."""
        import psycopg  # optional (the `postgres` extra): loaded only for a PostgreSQL URL

        try:
            return work(self._connection)
        except psycopg.OperationalError as exc:
            if self._in_transaction or not self._connection.broken:
                raise _postgres_problem(self.location, exc) from None
        except psycopg.Error as exc:
            raise _postgres_problem(self.location, exc) from None
        self._connection.close()
        self._connection = _connect_postgres(self._url, self.location)
        try:
            return work(self._connection)
        except psycopg.Error as exc:
            raise _postgres_problem(self.location, exc) from None

    def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        self._run(lambda connection: connection.execute(self._sql(sql), tuple(params)))

    def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        def many(connection: Any) -> None:
            with connection.cursor() as cursor:
                cursor.executemany(self._sql(sql), [tuple(row) for row in rows])

        self._run(many)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        # psycopg's default row factory gives tuples (the connection is typed Any: psycopg is an optional extra)
        rows: list[tuple[Any, ...]] = self._run(
            lambda connection: connection.execute(self._sql(sql), tuple(params)).fetchall())
        return rows

    @contextmanager
    def write(self) -> Iterator[None]:
        # BEGIN and COMMIT by hand (the connection is in autocommit): the lock is taken in the transaction's first
        # statement, where a closed connection can still be opened again
        def begin(connection: Any) -> None:
            connection.execute("BEGIN")
            try:
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (PG_WRITE_LOCK,))
            except BaseException:
                self._rollback()
                raise

        self._run(begin)
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        finally:
            self._in_transaction = False
        self._in_transaction = True  # a COMMIT on a closed connection is not tried again: its writes are gone
        try:
            self._run(lambda connection: connection.execute("COMMIT"))
        finally:
            self._in_transaction = False

    def _rollback(self) -> None:
        import psycopg  # optional (the `postgres` extra): loaded only for a PostgreSQL URL

        with suppress(psycopg.Error):  # a rollback that fails too (connection gone) must not hide why
            self._connection.execute("ROLLBACK")

    def close(self) -> None:
        self._connection.close()


def _postgres_problem(location: str, exc: BaseException) -> MegapilotError:
    """A PostgreSQL error said plainly: no privilege, a read-only server, a full disk, the connection lost."""
    import psycopg  # optional (the `postgres` extra): loaded only for a PostgreSQL URL
    from psycopg import errors

    detail = scrub_secrets(" ".join(str(exc).split()))
    if isinstance(exc, errors.InsufficientPrivilege):
        return MegapilotError(f"the role of {location} may not use the history's tables ({detail})", field="--db",
                              fix="grant the role CREATE on the schema (for a new history) and SELECT, INSERT, "
                                  "DELETE on the history's tables, or use another role or --db")
    if isinstance(exc, errors.ReadOnlySqlTransaction):
        return MegapilotError(f"{location} is read-only, a standby or a read-only role ({detail})", field="--db",
                              fix="point --db / $MEGAPILOT_HISTORY at the primary server, or a role that may write")
    if isinstance(exc, errors.DiskFull):
        return MegapilotError(f"the disk of the server under {location} is full ({detail})", field="--db",
                              fix="free space on the database server, or use another --db")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return MegapilotError(f"lost the connection to {location} ({detail})", field="--db",
                              fix="check that the server is up and reachable, then run the command again")
    return MegapilotError(f"{location} cannot be used as the history ({detail})", field="--db",
                          fix="point --db / $MEGAPILOT_HISTORY at a megapilot history database")


def _open_postgres(url: str) -> _PostgresDatabase:
    location = scrub_secrets(url)
    try:
        # optional and heavy: psycopg only for a PostgreSQL URL
        import psycopg  # noqa: F401 - only whether it is installed
    except ImportError:
        raise MegapilotError(f"{location} needs the PostgreSQL driver, which is not installed", field="--db",
                             fix="pip install 'megapilot[postgres]'") from None
    return _PostgresDatabase(_connect_postgres(url, location), location, url)


def _connect_postgres(url: str, location: str) -> Any:
    import psycopg  # optional (the `postgres` extra): loaded only for a PostgreSQL URL

    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        reason = scrub_secrets(" ".join(str(exc).split()))
        raise MegapilotError(f"cannot connect to {location} ({reason})", field="--db",
                             fix="check the host, port, database and credentials in the URL") from None


# ---- secrets --------------------------------------------------------------------------------------

_SECRET_PATTERNS = (
    (re.compile(r"\bhf_[A-Za-z0-9]{8,}"), "<redacted>"),
    (re.compile(r"(?i)\bbearer\s+\S+"), "Bearer <redacted>"),
    (re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY)[A-Z0-9_]*)(\s*[=:]\s*)\S+"),
     r"\1\2<redacted>"),
    (re.compile(r"(?i)(--[\w-]*(?:token|secret|password|api-key)[\w-]*)(=|\s+)\S+"), r"\1\2<redacted>"),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)[^@\s]+@"), r"\1<redacted>@"),
)


def scrub_secrets(text: str) -> str:
    """Text with anything shaped like a token, password or credentialed URL replaced by <redacted>."""
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# ---- the history ----------------------------------------------------------------------------------

_RUN_COLUMNS = ("run_id", "started_at", "ended_at", "duration_s", "verdict", "reason", "suite_name", "model",
                "model_family", "gpu", "nodes", "gpus_per_node", "layout", "precision", "backend", "executor",
                "config_hash", "run_dir", "megapilot_version", "git_commit", "finished", "recorded_at")
_COMBO_COLUMNS = ("run_id", "combo_key", "verdict", "reason", "layout", "nodes", "gpus_per_node", "tp", "pp", "cp",
                  "ep", "vpp", "mbs", "gbs", "precision", "seq_length", "duration_s", "job_state")
_METRIC_COLUMNS = ("run_id", "combo_key", "name", "value", "unit", "verdict", "threshold")
_PREDICTION_COLUMNS = ("run_id", "combo_key", *(f"{side}_{quantity}" for quantity in PREDICTED_QUANTITIES
                                                for side in ("predicted", "measured")))
_CHILD_TABLES = ("predictions", "metrics", "combos")  # deleted before runs (their rows reference it)
_RUN_SELECT = (f"SELECT {', '.join('r.' + c for c in _RUN_COLUMNS if c != 'recorded_at')}, "
               "(SELECT COUNT(*) FROM combos c WHERE c.run_id = r.run_id), "
               "(SELECT COUNT(*) FROM combos c WHERE c.run_id = r.run_id AND c.verdict = 'FAIL') FROM runs r")


def _insert(table: str, columns: Sequence[str]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


class History:
    """A run-history database. Use `open_history()`; close it (or use it as a context manager)."""

    def __init__(self, database: Database):
        self._db = database

    @property
    def location(self) -> str:
        """The file path or URL (password removed)."""
        return self._db.location

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    # -- writing --

    def check(self) -> None:
        """Before anything trains: the history is writable, not locked, and its disk has room (open_history has
        checked it whole). One MegapilotError naming the problem, so a broken history is found before a suite,
        not after it."""
        with self._db.write():  # takes the write lock, writes nothing
            pass
        if self._db.dialect == "sqlite":
            free = shutil.disk_usage(Path(self.location).parent).free
            if free < MIN_FREE_BYTES:
                raise MegapilotError(f"the disk under {self.location} has {free / 2**20:.1f} MiB free; a run's rows "
                                     f"need up to {MIN_FREE_BYTES >> 20} MiB", field="--db",
                                     fix="free space there, or use another --db")

    def record(self, result: SuiteResult) -> None:
        """Store a run; recording the same run id again (after a resume) replaces all of its rows."""
        combos = _unique_combos(result.combos)
        with self._db.write():
            for table in (*_CHILD_TABLES, "runs"):
                self._db.execute(f"DELETE FROM {table} WHERE run_id = ?", (result.run_id,))
            self._db.execute(_insert("runs", _RUN_COLUMNS), _run_values(result))
            self._db.execute_many(_insert("combos", _COMBO_COLUMNS),
                                  [_combo_values(result.run_id, c) for c in combos])
            self._db.execute_many(_insert("metrics", _METRIC_COLUMNS),
                                  [row for c in combos for row in _metric_values(result.run_id, c)])
            self._db.execute_many(_insert("predictions", _PREDICTION_COLUMNS),
                                  [_prediction_values(result.run_id, c) for c in combos if c.predicted])
            # the run's combos as measured runs of its cluster: the next prediction's calibration
            self._db.execute("DELETE FROM measured_runs WHERE origin = 'suite' AND source = ?", (result.run_id,))
            now = _iso(datetime.now(timezone.utc)) or ""
            rows = self._under_stored_names([row for c in combos if c.key != "smoke"
                                             and (row := measured_runs.from_combo(result, c, now)) is not None])
            rows = self._over_imported_copies(rows)
            self._db.execute_many(_insert("measured_runs", measured_runs.COLUMNS), [r.values() for r in rows])

    def _over_imported_copies(self, rows: list[measured_runs.MeasuredRow]) -> list[measured_runs.MeasuredRow]:
        """A suite run's measured rows where its run deck was imported before it was recorded (a run whose row was
        left pending, recorded later with `history record`): the deck's rows carry the same ids (`<run_id>/<cell>`).
        One of the same cluster is the same run, and the suite's fuller row replaces it; one held otherwise (another
        cluster's, a `megapilot run`'s) is left as it is and the suite's row not written: either way the run's own
        rows land, where the clash failed the whole record."""
        kept = []
        for row in rows:
            held = self._db.query("SELECT cluster, origin FROM measured_runs WHERE id = ?", (row.id,))
            if not held:
                kept.append(row)
            elif held[0][1] == "import" and measured_runs.cluster_key(held[0][0]) == measured_runs.cluster_key(
                    row.cluster):
                self._db.execute("DELETE FROM measured_runs WHERE id = ?", (row.id,))
                kept.append(row)
        return kept

    def record_measured(self, rows: Sequence[measured_runs.MeasuredRow]) -> MeasuredWrite:
        """Store measured runs (imported, or of `megapilot run`). An id the same cluster already holds from the same
        origin is recorded again: its row is replaced. An id held by another cluster's run, or by a run of another
        origin (a suite combo, an imported run), is left as it is and the row refused: replacing it would move that
        run out of its cluster, or drop it, without a word."""
        replaced: list[str] = []
        refused: list[tuple[measured_runs.MeasuredRow, str]] = []
        kept: list[measured_runs.MeasuredRow] = []
        already: list[str] = []
        with self._db.write():
            for row in self._under_stored_names(rows):
                held = self._db.query("SELECT cluster, origin FROM measured_runs WHERE id = ?", (row.id,))
                same_cluster = bool(held) and measured_runs.cluster_key(held[0][0]) == measured_runs.cluster_key(
                    row.cluster)
                if same_cluster and held[0][1] == "suite" and row.origin == "import":
                    already.append(row.id)  # a run deck's id is its suite run's combo: the same run, kept as run
                    continue
                if held and (not same_cluster or held[0][1] != row.origin):
                    cluster, origin = held[0]
                    refused.append((row, f"{row.id!r} is already the id of {_ORIGIN_NAMES.get(origin, origin)} of "
                                         f"cluster {cluster!r} in the history"))
                    continue
                if held:
                    self._db.execute("DELETE FROM measured_runs WHERE id = ?", (row.id,))
                    replaced.append(row.id)
                kept.append(row)
            self._db.execute_many(_insert("measured_runs", measured_runs.COLUMNS), [r.values() for r in kept])
        return MeasuredWrite(kept=tuple(kept), replaced=tuple(replaced), refused=tuple(refused), already=tuple(already))

    def measured(self, cluster: str | None = None) -> list[measured_runs.MeasuredRow]:
        """The measured runs of a cluster, under any spelling of its name (`cluster_key`; every cluster's when None),
        oldest first."""
        params: tuple[str, ...] = ()
        where = ""
        if cluster is not None:
            params = tuple(self._spellings(cluster))
            if not params:
                return []
            where = f"WHERE cluster IN ({', '.join('?' for _ in params)}) "
        rows = self._db.query(f"SELECT {', '.join(measured_runs.COLUMNS)} FROM measured_runs {where}"
                              "ORDER BY recorded_at, id", params)
        return [measured_runs.MeasuredRow.from_values(row) for row in rows]

    def _stored_names(self) -> list[str]:
        return [str(row[0]) for row in self._db.query("SELECT DISTINCT cluster FROM measured_runs ORDER BY cluster")]

    def _spellings(self, cluster: str) -> list[str]:
        """The names the history holds a cluster's runs under (one, unless written before names were normalised)."""
        key = measured_runs.cluster_key(cluster)
        return [name for name in self._stored_names() if measured_runs.cluster_key(name) == key]

    def _under_stored_names(self, rows: Sequence[measured_runs.MeasuredRow]) -> list[measured_runs.MeasuredRow]:
        """The rows under the name each one's cluster already has here (the first spelling recorded), else under the
        first one's among them: one cluster, one name."""
        names: dict[str, str] = {}
        held = []
        for row in rows:
            key = measured_runs.cluster_key(row.cluster)
            if key not in names:
                names[key] = next(iter(self._spellings(row.cluster)), row.cluster)
            held.append(row if row.cluster == names[key] else replace(row, cluster=names[key]))
        return held

    def clusters(self) -> list[str]:
        """The clusters with measured runs, each once (by `cluster_key`), under the name the history holds it by."""
        names: dict[str, str] = {}
        for name in self._stored_names():
            names.setdefault(measured_runs.cluster_key(name), name)
        return sorted(names.values())

    def require_cluster(self, cluster: str, *, field: str = "--cluster") -> None:
        """A cluster a user named must have measured runs here, under any spelling of its name: a misspelt name would
        read as a cluster with none."""
        known = self.clusters()
        if not self._spellings(cluster):
            raise MegapilotError(f"no measured run of cluster {cluster!r} in the history at {self.location}",
                                 field=field, fix=("use one of: " + ", ".join(known)) if known else
                                 "record runs with `megapilot suite run` or `megapilot history import`")

    def calibration_runs(self, cluster: str) -> tuple[Any, ...]:
        """The cluster's runs the calibration fits on (measured and predicted, not failed), as `MeasuredRun`s."""
        return tuple(measured_runs.to_calibration_run(row) for row in self.measured(cluster) if row.calibrates)

    # -- reading --

    def runs(self, limit: int = 20, model: str | None = None, gpu: str | None = None) -> list[RunRow]:
        """The newest runs first, optionally only one model (exact name) or GPU (any case)."""
        where, params = [], []
        if model:
            where.append("r.model = ?")
            params.append(model)
        if gpu:
            where.append("LOWER(r.gpu) = LOWER(?)")
            params.append(gpu)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        # a limit past every run is all of them: held below both databases' 64-bit integers, which refuse it
        rows = self._db.query(f"{_RUN_SELECT}{clause} ORDER BY r.started_at DESC, r.run_id LIMIT ?",
                              (*params, min(limit, 2**62)))
        return [_run_row(row) for row in rows]

    def resolve(self, ref: str) -> str:
        """A run id from what a user typed: the id, a unique prefix of one, or `latest`."""
        if not ref.strip():  # the empty prefix of every id: not a choice of one
            raise MegapilotError("the run id is empty", field="RUN", fix=f"{LIST_RUNS_HINT}, or pass `latest`")
        if ref == "latest":
            newest = self.runs(limit=1)
            if not newest:
                raise MegapilotError(f"the history at {self.location} has no runs yet", field="RUN",
                                     fix="record one with `megapilot suite run`")
            return newest[0].run_id
        if self._db.query("SELECT 1 FROM runs WHERE run_id = ?", (ref,)):
            return ref
        matches = [str(row[0]) for row in self._db.query(
            "SELECT run_id FROM runs WHERE substr(run_id, 1, ?) = ? ORDER BY started_at DESC", (len(ref), ref))]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise MegapilotError(f"no run {ref!r} in the history at {self.location}", field="RUN",
                                 fix=f"{LIST_RUNS_HINT}, or pass `latest`")
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise MegapilotError(f"{ref!r} matches {len(matches)} runs ({shown})", field="RUN",
                             fix="type more of the run id")

    def run(self, run_id: str) -> RunDetail:
        """A run with its combos, metrics and predictions (run_id may be a prefix or `latest`)."""
        run_id = self.resolve(run_id)
        run = _run_row(self._db.query(f"{_RUN_SELECT} WHERE r.run_id = ?", (run_id,))[0])
        metrics = self._metrics_by_combo(run_id)
        predictions = self._predictions_by_combo(run_id)
        rows = self._db.query(f"SELECT {', '.join(_COMBO_COLUMNS[1:])} FROM combos WHERE run_id = ? "
                              "ORDER BY combo_key", (run_id,))
        combos = [_combo_row(row, metrics.get(row[0], []), predictions.get(row[0])) for row in rows]
        return RunDetail(run=run, combos=combos)

    def compare(self, a: str, b: str) -> RunComparison:
        """Every metric of the combos both runs have, B against A, judged by the metric's direction."""
        first, second = self.run(a), self.run(b)
        if first.run.run_id == second.run.run_id:
            raise MegapilotError(f"{b!r} is the run A names ({first.run.run_id}): a run compared with itself "
                                 "changes nothing", field="RUN_B", fix=f"name another run; {LIST_RUNS_HINT}")
        combos_a = {combo.key: combo for combo in first.combos}
        combos_b = {combo.key: combo for combo in second.combos}
        deltas = [delta for key in combos_a if key in combos_b
                  for delta in _metric_deltas(key, combos_a[key], combos_b[key])]
        differences = _differences(None, first.run, second.run, _RUN_SETUP) + [
            difference for key in combos_a if key in combos_b
            for difference in _differences(key, combos_a[key], combos_b[key], _COMBO_SETUP)]
        return RunComparison(run_a=first.run, run_b=second.run, differences=differences, deltas=deltas,
                             combos_only_in_a=[k for k in combos_a if k not in combos_b],
                             combos_only_in_b=[k for k in combos_b if k not in combos_a])

    def finished_combos(self, run_id: str) -> set[str]:
        """Combos of a run that ended (PASS/FAIL/RECORD, job not cancelled): `suite run --resume` skips them."""
        run_id = self.resolve(run_id)
        terminal = ", ".join(f"'{v.value}'" for v in TERMINAL_VERDICTS)
        unfinished = ", ".join(f"'{state}'" for state in UNFINISHED_JOB_STATES)
        rows = self._db.query(f"SELECT combo_key FROM combos WHERE run_id = ? AND verdict IN ({terminal}) "
                              f"AND (job_state IS NULL OR job_state NOT IN ({unfinished}))", (run_id,))
        return {row[0] for row in rows}

    def baseline(self, metric: str, *, model: str, layout: str, gpu: str, combo_key: str, last_n: int = 5,
                 exclude_run: str | None = None) -> BaselineStats | None:
        """Median (and spread) of a metric over the last N passing runs of the same model/layout/GPU/cell."""
        passing = ", ".join(f"'{v.value}'" for v in PASSING_VERDICTS)
        counted = ", ".join(f"'{v.value}'" for v in BASELINE_RUN_STATUSES)
        rows = self._db.query(
            "SELECT m.value, r.run_id FROM metrics m "
            "JOIN combos c ON c.run_id = m.run_id AND c.combo_key = m.combo_key "
            "JOIN runs r ON r.run_id = m.run_id "
            f"WHERE m.name = ? AND r.model = ? AND LOWER(r.gpu) = LOWER(?) AND c.layout = ? AND c.combo_key = ? "
            f"AND r.run_id <> ? AND r.verdict IN ({counted}) AND c.verdict IN ({passing}) "
            "AND m.verdict <> 'FAIL' AND m.value IS NOT NULL "
            + ("AND m.value <> 0 " if metric in zero_unmeasured_metrics() else "")  # zeros written before: unmeasured
            + "ORDER BY r.started_at DESC, r.run_id LIMIT ?",
            (metric, model, gpu, layout, combo_key, exclude_run or "", last_n))
        if not rows:
            return None
        values = [float(row[0]) for row in rows]
        return BaselineStats(metric=metric, median=statistics.median(values), count=len(values),
                             mean=statistics.fmean(values),
                             stdev=statistics.stdev(values) if len(values) > 1 else None,
                             values=values, run_ids=[row[1] for row in rows])

    def calibration(self) -> list[CalibrationRow]:
        """Predicted-vs-measured error of step time and tokens/s over every stored combo, by GPU and model family."""
        columns = ", ".join(f"p.predicted_{q}, p.measured_{q}" for q in CALIBRATED_QUANTITIES)
        rows = self._db.query(f"SELECT r.gpu, r.model_family, r.model, {columns} FROM predictions p "
                              "JOIN runs r ON r.run_id = p.run_id")
        errors: dict[tuple[str, str, str], list[float]] = {}
        for gpu, family, model, *pairs in rows:
            for index, quantity in enumerate(CALIBRATED_QUANTITIES):
                predicted, measured = pairs[2 * index], pairs[2 * index + 1]
                if predicted is not None and measured:
                    key = (gpu, family or model, quantity)
                    errors.setdefault(key, []).append((predicted - measured) / measured * 100.0)
        return [CalibrationRow(gpu=gpu, model_family=family, quantity=quantity, count=len(values),  # type: ignore[arg-type]  # CALIBRATED_QUANTITIES
                               median_abs_error_pct=statistics.median(abs(v) for v in values),
                               mean_signed_error_pct=statistics.fmean(values))
                for (gpu, family, quantity), values in sorted(errors.items())]

    def _metrics_by_combo(self, run_id: str) -> dict[str, list[MetricValue]]:
        grouped: dict[str, list[MetricValue]] = {}
        for combo_key, name, value, unit, verdict, threshold in self._db.query(
                "SELECT combo_key, name, value, unit, verdict, threshold FROM metrics WHERE run_id = ? "
                "ORDER BY combo_key, name", (run_id,)):
            grouped.setdefault(combo_key, []).append(MetricValue(
                name=name, value=_measured_value(name, value), unit=unit, verdict=verdict, threshold=threshold))
        return grouped

    def _predictions_by_combo(self, run_id: str) -> dict[str, PredictionRow]:
        names = _PREDICTION_COLUMNS[2:]
        rows = self._db.query(f"SELECT combo_key, {', '.join(names)} FROM predictions WHERE run_id = ?", (run_id,))
        return {row[0]: _prediction_row(dict(zip(names, row[1:], strict=True))) for row in rows}


# ---- rows in and out ------------------------------------------------------------------------------

def _iso(moment: datetime | None) -> str | None:
    """UTC with a fixed width, so that text order is time order in both databases (naive = local time)."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def _finite(value: float | None) -> float | None:
    """NaN/inf are stored as missing: SQLite cannot hold NaN, and both databases then read back the same."""
    return value if value is not None and math.isfinite(value) else None


def _measured_value(metric: str, value: float | None) -> float | None:
    """A metric's value as measured, by the metric table's zero rule (rows written before that rule included)."""
    return measured_value(metric, value)


def _prediction_row(fields: dict[str, Any]) -> PredictionRow:
    """A stored prediction, its measured zeros below resolution (rows written before that rule) read as missing."""
    for quantity in PREDICTED_QUANTITIES:
        fields[f"measured_{quantity}"] = measured_quantity(quantity, fields[f"measured_{quantity}"])
    return PredictionRow(**fields)


def _unique_combos(combos: list[ComboResult]) -> list[ComboResult]:
    """One combo per key (the last one wins, as a resumed run re-ran it)."""
    return list({combo.key: combo for combo in combos}.values())


def _run_values(result: SuiteResult) -> tuple[object, ...]:
    # start-up: the outcome policy loads the suite's results (see the imports above)
    from megapilot.suite.outcome import stored_verdict

    card = result.card
    status, reason = stored_verdict(result)  # the one verdict, as suite.json stores it
    return (result.run_id, _iso(result.started_at), _iso(result.ended_at), result.duration_s,
            _run_verdict(status, finished=result.finished).value,
            scrub_secrets(reason), card.suite_name, card.model, card.model_family, card.gpu, card.nodes,
            card.gpus_per_node, card.layout, card.precision, card.backend, card.executor, card.config_hash,
            result.run_dir, card.megapilot_version, card.git_commit, int(result.finished),
            _iso(datetime.now(timezone.utc)))


def _combo_values(run_id: str, combo: ComboResult) -> tuple[object, ...]:
    held = combo.layout  # the store's columns stay flat: rows written before read the same
    return (run_id, combo.key, combo.verdict.value, scrub_secrets(combo.reason), combo_layout(combo), combo.nodes,
            combo.gpus_per_node, held.tp, held.pp, held.cp, held.ep, held.vpp, held.mbs, combo.gbs,
            combo.precision, combo.seq_length, combo.duration_s, combo.job.state if combo.job else None)


def _metric_values(run_id: str, combo: ComboResult) -> list[tuple[object, ...]]:
    latest = {row.name: row for row in combo.metrics}  # a name twice: the last reading wins
    return [(run_id, combo.key, row.name, _finite(_measured_value(row.name, row.value)), row.unit, row.verdict.value,
             row.threshold)
            for row in latest.values()]


def _prediction_values(run_id: str, combo: ComboResult) -> tuple[object, ...]:
    predicted = combo.predicted
    assert predicted is not None
    values: list[float | None] = []
    for quantity in PREDICTED_QUANTITIES:
        values += [_finite(getattr(predicted, quantity)), _finite(_measured(combo, quantity))]
    return (run_id, combo.key, *values)


def _measured(combo: ComboResult, quantity: str) -> float | None:
    """The measured value of a predicted quantity: the first metric of the table that measures it."""
    for info in METRICS.values():
        if info.quantity == quantity and (value := _measured_value(info.name, combo.actual(info.name))) is not None:
            return value
    return None


def _parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _run_verdict(verdict: RunStatus | str, *, finished: bool) -> RunStatus:
    """A run's one verdict: INTERRUPTED when it did not finish. Rows written before that was a verdict of its own
    say FAIL (or what suite.json said mid-run) with finished false, and read as INTERRUPTED too. Rows written before
    the verdict was the run's one verdict say what the gates said (PASS for a run that regressed), and read so."""
    return RunStatus(verdict) if finished else RunStatus.INTERRUPTED


def _run_row(row: tuple[Any, ...]) -> RunRow:
    fields = dict(zip([c for c in _RUN_COLUMNS if c != "recorded_at"] + ["combos", "failed_combos"], row,
                      strict=True))
    fields["started_at"] = _parse_time(fields["started_at"])
    fields["ended_at"] = _parse_time(fields["ended_at"])
    fields["finished"] = bool(fields["finished"])
    fields["verdict"] = _run_verdict(fields["verdict"], finished=fields["finished"])
    return RunRow(**fields)


def _combo_row(row: tuple[Any, ...], metrics: list[MetricValue], prediction: PredictionRow | None) -> ComboRow:
    fields = dict(zip(_COMBO_COLUMNS[1:], row, strict=True))
    fields["key"] = fields.pop("combo_key")
    return ComboRow(**fields, metrics=metrics, prediction=prediction)


def _differences(combo: str | None, a: BaseModel, b: BaseModel, fields: Sequence[str]) -> list[RunDifference]:
    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    return [RunDifference(combo=combo, field=name, value_a=shown(getattr(a, name)), value_b=shown(getattr(b, name)))
            for name in fields if shown(getattr(a, name)).lower() != shown(getattr(b, name)).lower()]


def _metric_deltas(key: str, a: ComboRow, b: ComboRow) -> list[MetricDelta]:
    values_a = {m.name: m for m in a.metrics}
    values_b = {m.name: m for m in b.metrics}
    names = list(values_a) + [name for name in values_b if name not in values_a]
    deltas = []
    for name in names:
        first, second = values_a.get(name), values_b.get(name)
        value_a = first.value if first else None
        value_b = second.value if second else None
        delta = change_pct(value_b, value_a) if value_a is not None and value_b is not None else None
        if value_a is not None and value_a == value_b:
            delta = 0.0  # 0 -> 0 too: unchanged, not a percentage of nothing
        unit = (first or second).unit  # type: ignore[union-attr]  # the name came from one of them
        deltas.append(MetricDelta(combo=key, metric=name, label=metric_info(name).label, unit=unit,
                                  value_a=value_a, value_b=value_b, delta_pct=delta, change=judge(name, delta)))
    return deltas


__all__ = [
    "HISTORY_ENV",
    "PENDING_NAME",
    "BaselineStats",
    "CalibrationRow",
    "ComboRow",
    "History",
    "MeasuredWrite",
    "MetricDelta",
    "MetricValue",
    "PredictionRow",
    "RunComparison",
    "RunDetail",
    "RunDifference",
    "RunRow",
    "connect_database",
    "default_history_path",
    "history_url",
    "open_history",
    "scrub_secrets",
]
