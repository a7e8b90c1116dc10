"""What only the PostgreSQL backend can get wrong, on a real server the tests start: concurrent writers, a v1
database migrated, nothing secret in a dump of the database, passwords kept out of messages, a missing driver.
The API tests shared with SQLite run on both backends in test_history.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megapilot.errors import MegapilotError
from megapilot.execute.process import free_port
from megapilot.spec import Prediction
from megapilot.store.history import connect_database, open_history
from megapilot.store.schema import SCHEMA_VERSION, apply_migrations, schema_version
from tests.store.test_history import (
    BASE,
    CELL,
    FAKE_TOKEN,
    T0,
    TOKENS,
    make_combo,
    make_suite_result,
    run_concurrent_writers,
)


def test_two_processes_writing_at_once_both_land(postgres_url, tmp_path):
    run_concurrent_writers(postgres_url, tmp_path)
    with open_history(postgres_url) as history:
        ids = {row.run_id for row in history.runs(limit=100)}
    assert ids == {f"writer{n}-{i}" for n in range(2) for i in range(15)}


def test_a_version_1_database_is_migrated_on_open(postgres_url):
    database = connect_database(postgres_url)
    try:
        assert apply_migrations(database, target=1) == [1]
        with database.write():
            database.execute("INSERT INTO runs (run_id, started_at, verdict, suite_name, model, gpu, nodes, "
                             "gpus_per_node, recorded_at) VALUES ('old-run', ?, 'PASS', 'suite', 'llama3.1-8b', "
                             "'MI300X', 1, 8, ?)", (T0.isoformat(), T0.isoformat()))
            database.execute("INSERT INTO combos (run_id, combo_key, verdict, layout) VALUES ('old-run', ?, 'PASS', ?)",
                             (CELL, BASE["layout"]))
            database.execute("INSERT INTO metrics (run_id, combo_key, name, value, verdict) "
                             "VALUES ('old-run', ?, ?, 950.0, 'PASS')", (CELL, TOKENS))
        assert schema_version(database) == 1
    finally:
        database.close()

    with open_history(postgres_url) as history:
        assert history.baseline(TOKENS, **BASE).median == 950.0
        history.record(make_suite_result("new-run", combos=[make_combo(predicted=Prediction(step_time_ms=1.0))]))
        assert history.run("new-run").combos[0].prediction is not None
    database = connect_database(postgres_url)
    try:
        assert schema_version(database) == SCHEMA_VERSION
    finally:
        database.close()


def test_nothing_secret_in_a_dump_of_the_database(postgres_server, postgres_url):
    leaky = make_combo(reason=f"HF_TOKEN={FAKE_TOKEN}", command=f"HF_TOKEN={FAKE_TOKEN} torchrun pretrain_gpt.py")
    with open_history(postgres_url) as history:
        history.record(make_suite_result("run-secret", combos=[leaky], notes=[FAKE_TOKEN]))
    dump = subprocess.run([str(postgres_server.bin_dir / "pg_dump"), "--data-only", postgres_url],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    assert "run-secret" in dump and "HF_TOKEN=<redacted>" in dump  # the rows are there ...
    assert FAKE_TOKEN not in dump and "torchrun" not in dump  # ... the secret and the command are not


def test_an_unreachable_server_is_a_user_error_without_the_password():
    url = f"postgresql://megapilot:s3cretPassw0rd@127.0.0.1:{free_port()}/history"
    with pytest.raises(MegapilotError) as caught:
        open_history(url)
    message = str(caught.value)
    assert caught.value.field == "--db" and "cannot connect" in message
    assert "s3cretPassw0rd" not in message and "megapilot:<redacted>@127.0.0.1" in message


def test_a_missing_driver_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` now raises ImportError
    with pytest.raises(MegapilotError, match=r"megapilot\[postgres\]"):
        open_history("postgresql://postgres@127.0.0.1:1/history")


def _role_url(postgres_url: str, role: str) -> str:
    """The same database as another role (the test server trusts every role on the loopback)."""
    return postgres_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)


def test_a_role_without_privileges_is_told_what_to_grant(postgres_url):
    import psycopg

    with open_history(postgres_url) as history:
        history.record(make_suite_result("run-1"))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS reader_without_grants")
        admin.execute("CREATE ROLE reader_without_grants LOGIN")
    url = _role_url(postgres_url, "reader_without_grants")
    for read_only in (True, False):
        with pytest.raises(MegapilotError) as caught, open_history(url, read_only=read_only) as history:
            history.runs()
        assert caught.value.field == "--db" and "may not use the history's tables" in str(caught.value)
        assert "grant the role" in caught.value.fix


def test_a_role_granted_what_the_fix_names_records_into_a_history_its_owner_made(postgres_url):
    """A team's history is made once by its owner; each member's role gets SELECT, INSERT, DELETE on its tables, as
    the fix above says, and no CREATE on the schema (PostgreSQL 15 gives none on public by default). Opening it to
    record ran CREATE TABLE IF NOT EXISTS schema_version, which PostgreSQL refuses without CREATE even when the
    table is there: every such role was told 'may not use the history's tables'."""
    import psycopg

    with open_history(postgres_url) as history:
        history.record(make_suite_result("run-1"))
    member = f"member_of_{postgres_url.rsplit('/', 1)[1]}"  # roles are the server's: one per test database
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # as PostgreSQL 15 has it, on any version
        admin.execute(f"CREATE ROLE {member} LOGIN")
        admin.execute(f"GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA public TO {member}")
    with open_history(_role_url(postgres_url, member)) as history:
        history.record(make_suite_result("run-2", hour=1))
        assert [row.run_id for row in history.runs()] == ["run-2", "run-1"]


def test_a_reader_of_a_database_with_no_history_yet_creates_nothing(postgres_url):
    """A team's new database, read (`history list`) before anything was recorded: the reader migrated it, so a role
    that may only read it was refused, and one that may create made the history's tables by reading."""
    import psycopg

    member = f"reader_of_{postgres_url.rsplit('/', 1)[1]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        admin.execute(f"CREATE ROLE {member} LOGIN")
    for url in (_role_url(postgres_url, member), postgres_url):
        with open_history(url, read_only=True) as history:
            assert history.runs() == [] and history.calibration() == []
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        assert admin.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                             ).fetchall() == []


def test_a_connection_the_server_closed_since_is_opened_again_and_the_run_lands(postgres_url):
    """A suite opens the history before hours of training; the server may have dropped that connection since."""
    import psycopg

    with open_history(postgres_url) as history:
        backend = history._db.query("SELECT pg_backend_pid()")[0][0]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        history.record(make_suite_result("run-after-drop"))
        backend = history._db.query("SELECT pg_backend_pid()")[0][0]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        assert [row.run_id for row in history.runs()] == ["run-after-drop"]  # a read too


def test_a_connection_lost_inside_a_write_is_a_plain_error_and_writes_nothing(postgres_url):
    import psycopg

    with open_history(postgres_url) as history:
        history.record(make_suite_result("run-1"))
        database = history._db
        with pytest.raises(MegapilotError) as caught, database.write():
            database.execute("DELETE FROM combos")
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (database.query("SELECT pg_backend_pid()")[0][0],))
            database.execute("DELETE FROM metrics")
        assert caught.value.field == "--db" and "lost the connection" in str(caught.value)
        history.record(make_suite_result("run-2", hour=1))  # the next write opens a new connection
        assert [row.run_id for row in history.runs()] == ["run-2", "run-1"]
        assert history.run("run-1").combos  # the delete before the connection was lost was rolled back
