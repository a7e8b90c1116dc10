"""A real PostgreSQL server that the tests start, own and stop.

`initdb` into a fresh temporary directory, `pg_ctl start` on a free loopback port (no Unix socket
outside that directory), trust authentication for the loopback only. As root the server runs as the
`postgres` user (initdb refuses root). Debian keeps the binaries under /usr/lib/postgresql/<ver>/bin;
`$MEGAPILOT_PG_BIN` points elsewhere. Where no server can be installed or started, the fixtures skip
with the reason.

Fixtures (import them into a test module):
    postgres_server  one server for the session, stopped at the end
    postgres_url     a new, empty database on it for each test: postgresql://postgres@127.0.0.1:PORT/NAME
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from megapilot.execute.process import free_port

PG_BIN_ENV = "MEGAPILOT_PG_BIN"
START_TIMEOUT_S = 60


class ServerUnavailable(RuntimeError):
    """PostgreSQL cannot run here (not installed, no unprivileged user, failed to start)."""


def find_bin_dir() -> Path:
    """The directory holding initdb and pg_ctl: $MEGAPILOT_PG_BIN, PATH, or Debian's newest version."""
    candidates = [Path(os.environ[PG_BIN_ENV])] if os.environ.get(PG_BIN_ENV) else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)  # a symlink into the version directory: follow it
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                    if p.parent.name.isdigit() else 0, reverse=True)
    for directory in [*candidates, *debian]:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    raise ServerUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; install the Debian package "
                            "`postgresql` (scripts/apt-packages.txt) or set $MEGAPILOT_PG_BIN")


def _run_as_prefix() -> tuple[list[str], tuple[int, int] | None]:
    """argv prefix and (uid, gid) that run the server unprivileged when we are root."""
    if os.geteuid() != 0:
        return [], None
    import pwd

    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        raise ServerUnavailable("running as root and there is no `postgres` user to run the server") from None
    if not shutil.which("runuser"):
        raise ServerUnavailable("running as root and `runuser` is missing")
    return ["runuser", "-u", "postgres", "--"], (user.pw_uid, user.pw_gid)


class PostgresServer:
    """One running server in its own directory."""

    def __init__(self, bin_dir: Path, root: Path, prefix: list[str]):
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.prefix = prefix
        self.port = 0
        self._names = itertools.count(1)

    @classmethod
    def start(cls) -> PostgresServer:
        bin_dir = find_bin_dir()
        prefix, owner = _run_as_prefix()
        root = Path(tempfile.mkdtemp(prefix="megapilot-pg-"))
        if owner:
            os.chown(root, *owner)
        server = cls(bin_dir, root, prefix)
        try:
            server._initdb()
            server._start()
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, *argv: str) -> None:
        done = subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=START_TIMEOUT_S,
                              check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise ServerUnavailable(f"{Path(argv[0]).name} failed: {' / '.join(output)}")

    def _initdb(self) -> None:
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")

    def _start(self) -> None:
        for _attempt in range(3):  # a free port can be taken between choosing it and binding it
            self.port = free_port()
            options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            try:
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                          "-t", str(START_TIMEOUT_S), "-o", options, "start")
                return
            except ServerUnavailable as exc:
                failure = exc
        log_tail = self.log.read_text(errors="replace").strip().splitlines()[-2:] if self.log.exists() else []
        raise ServerUnavailable(f"{failure}; server log: {' / '.join(log_tail)}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"test_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                            "-w", "stop"], capture_output=True, timeout=START_TIMEOUT_S, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    pytest.importorskip("psycopg", reason="psycopg (the `postgres` extra) is not installed")
    try:
        server = PostgresServer.start()
    except ServerUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()
