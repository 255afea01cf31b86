"""The suite's own PostgreSQL server: started in a temporary directory, on loopback, as the
postgres user when the suite runs as root, one empty database per test."""

from __future__ import annotations

import psycopg

from sluiceway.testing.postgres import PostgresServer


def test_each_test_gets_an_empty_database_on_loopback(
    postgres: PostgresServer, pg_url: str
) -> None:
    assert pg_url.startswith("postgresql://postgres@127.0.0.1:")
    with psycopg.connect(pg_url) as connection:
        tables = connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
        address = connection.execute("SELECT inet_server_addr()::text").fetchone()
    assert tables == (0,)
    assert address is not None
    assert address[0].startswith("127.0.0.1")
