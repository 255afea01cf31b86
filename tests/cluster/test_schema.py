"""The jdbc store's tables on a real PostgreSQL: created once, upgraded, shown, deleted, and a
database the broker cannot use refused with a message that says why and what to do."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sluiceway.persist.database import Database, DatabaseError
from sluiceway.persist.schema import (
    SCHEMA_VERSION,
    TABLES,
    UPGRADES,
    check_schema,
    delete_schema,
    ensure_schema,
    show_schema,
)
from sluiceway.testing.postgres import free_port


def test_the_tables_are_created_once_and_shown(pg_url: str) -> None:
    database = Database(pg_url)
    assert show_schema(database).version == 0
    assert ensure_schema(database) == (0, SCHEMA_VERSION)
    assert ensure_schema(database) == (SCHEMA_VERSION, SCHEMA_VERSION)
    state = show_schema(database)
    assert state.current
    assert set(state.rows) == set(TABLES)
    assert state.rows["sluiceway_schema"] == 1
    check_schema(database)


def test_a_version_1_database_is_upgraded_keeping_its_rows(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as connection:
        for statement in UPGRADES[1]:
            connection.execute(statement)
        connection.execute("INSERT INTO sluiceway_schema (version, written_by) VALUES (1, 'old')")
        connection.execute(
            "INSERT INTO sluiceway_broker (cluster_id, broker_id, state) VALUES ('c', 'a', 'UP')"
        )
    database = Database(pg_url)
    with pytest.raises(DatabaseError, match="version 1, older than this broker's"):
        check_schema(database)
    before = show_schema(database)
    assert before.version == 1
    assert "sluiceway_durable" not in before.rows
    assert "sluiceway_position" not in before.rows
    assert ensure_schema(database, create=False) == (1, SCHEMA_VERSION)
    check_schema(database)
    after = show_schema(database)
    assert after.rows["sluiceway_broker"] == 1
    assert after.rows["sluiceway_durable"] == 0
    assert after.rows["sluiceway_position"] == 0


def test_a_newer_schema_is_refused_naming_both_versions(pg_url: str) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute("UPDATE sluiceway_schema SET version = %s", (SCHEMA_VERSION + 1,))
    for attempt in (ensure_schema, check_schema, delete_schema):
        with pytest.raises(DatabaseError, match=rf"schema version {SCHEMA_VERSION + 1}, newer"):
            attempt(database)


def test_an_empty_database_is_refused_when_creating_is_not_asked(pg_url: str) -> None:
    database = Database(pg_url)
    with pytest.raises(DatabaseError, match="has no Sluiceway tables: create them"):
        ensure_schema(database, create=False)
    with pytest.raises(DatabaseError, match="older than this broker's"):
        check_schema(database)


def test_delete_drops_every_table(pg_url: str) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    assert delete_schema(database) == SCHEMA_VERSION
    assert show_schema(database).version == 0


def test_an_unreachable_database_is_named_without_its_password(postgres: object) -> None:
    url = f"postgresql://someone:secret@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(DatabaseError) as raised:
        Database(url, connect_timeout=1.0).connect()
    text = str(raised.value)
    assert "cannot reach the database postgresql://someone@127.0.0.1:" in text
    assert "secret" not in text


def test_a_password_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("s3cret\n")
    path.chmod(0o644)
    with pytest.raises(DatabaseError, match=r"may be read by others \(mode 644\): .*chmod 600"):
        Database.from_config("postgresql://u@127.0.0.1/db", "", str(path), 5.0)
    path.chmod(0o600)
    database = Database.from_config("postgresql://u@127.0.0.1/db", "", str(path), 5.0)
    assert database.password == "s3cret"  # noqa: S105 - the file's first line
