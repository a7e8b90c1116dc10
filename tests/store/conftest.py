"""The PostgreSQL server fixtures, shared by the history tests that run against a real server."""

from tests.store.pg_server import postgres_server, postgres_url

__all__ = ["postgres_server", "postgres_url"]
