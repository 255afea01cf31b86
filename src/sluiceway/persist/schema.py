"""The jdbc store's tables in PostgreSQL: their definition, its version, and creating, upgrading,
showing and deleting them (what `sluiceway dbmgr` and a starting broker do).

One set of tables serves every cluster in a database: rows carry the cluster id (Open MQ puts it
in the table names instead). docs/cluster.md describes each table.

The schema has a version (SCHEMA_VERSION). A broker creates the tables in an empty database and
upgrades an older schema on its own (every upgrade only adds), inside one transaction, under an
advisory lock so that brokers starting together do it once. A schema newer than the broker is
refused: an older broker could not read what a newer one writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sluiceway import __version__
from sluiceway.persist.database import Database, DatabaseError

if TYPE_CHECKING:
    import psycopg

SCHEMA_VERSION: Final = 3
# pg_advisory_xact_lock key for creating and upgrading the schema: "SLUICEWY" in ASCII.
SCHEMA_LOCK: Final = 0x534C55494345_5759

TABLES: Final = (
    "sluiceway_schema",
    "sluiceway_broker",
    "sluiceway_file",
    "sluiceway_chunk",
    "sluiceway_event",
    "sluiceway_destination",
    "sluiceway_durable",
    "sluiceway_position",
)

# Each version's statements, applied in order from the database's version to SCHEMA_VERSION.
UPGRADES: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """
        CREATE TABLE sluiceway_schema (
            version integer NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            upgraded_at timestamptz,
            written_by text NOT NULL
        )
        """,
        # One row per broker of every cluster: its lease, its state, who took it over, and the
        # messages its store held at its last heartbeat (what `cmd list bkr` shows of others).
        """
        CREATE TABLE sluiceway_broker (
            cluster_id text NOT NULL,
            broker_id text NOT NULL,
            state text NOT NULL,
            epoch bigint NOT NULL DEFAULT 0,
            stomp_address text NOT NULL DEFAULT '',
            admin_address text NOT NULL DEFAULT '',
            host text NOT NULL DEFAULT '',
            pid integer NOT NULL DEFAULT 0,
            version text NOT NULL DEFAULT '',
            started_at timestamptz,
            heartbeat_at timestamptz,
            lease_until timestamptz,
            taken_over_by text,
            takeover_started_at timestamptz,
            takeover_ended_at timestamptz,
            messages bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (cluster_id, broker_id)
        )
        """,
        # A broker's journal: its files and their bytes, in chunks as they were written.
        """
        CREATE TABLE sluiceway_file (
            cluster_id text NOT NULL,
            broker_id text NOT NULL,
            name text NOT NULL,
            size bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (cluster_id, broker_id, name)
        )
        """,
        """
        CREATE TABLE sluiceway_chunk (
            cluster_id text NOT NULL,
            broker_id text NOT NULL,
            name text NOT NULL,
            position bigint NOT NULL,
            data bytea NOT NULL,
            PRIMARY KEY (cluster_id, broker_id, name, position)
        )
        """,
        # What happened in the cluster: joins, failures declared, takeovers, fencing.
        """
        CREATE TABLE sluiceway_event (
            id bigserial PRIMARY KEY,
            cluster_id text NOT NULL,
            at timestamptz NOT NULL DEFAULT now(),
            broker_id text NOT NULL,
            kind text NOT NULL,
            detail text NOT NULL DEFAULT ''
        )
        """,
        "CREATE INDEX sluiceway_event_by_cluster ON sluiceway_event (cluster_id, at)",
        # What each member holds per queue, as it last reported: limits that hold for the cluster.
        """
        CREATE TABLE sluiceway_destination (
            cluster_id text NOT NULL,
            broker_id text NOT NULL,
            destination text NOT NULL,
            messages bigint NOT NULL,
            bytes bigint NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster_id, broker_id, destination)
        )
        """,
    ),
    2: (
        # Every durable subscription of a cluster and the member it lives on: a subscriber that
        # attaches on another member is served from there (cluster.durables).
        """
        CREATE TABLE sluiceway_durable (
            cluster_id text NOT NULL,
            client_id text NOT NULL,
            name text NOT NULL,
            topic text NOT NULL,
            broker_id text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster_id, client_id, name)
        )
        """,
    ),
    3: (
        # Every pipeline reader's lease group and every sink of a cluster, and the member each
        # lives on: the others refuse them, naming it, instead of starting anew (cluster.positions).
        """
        CREATE TABLE sluiceway_position (
            cluster_id text NOT NULL,
            kind text NOT NULL,
            destination text NOT NULL,
            name text NOT NULL,
            broker_id text NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (cluster_id, kind, destination, name)
        )
        """,
    ),
}


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What a database holds: its schema version (0: no tables) and, per table, its rows."""

    version: int
    rows: dict[str, int]

    @property
    def current(self) -> bool:
        return self.version == SCHEMA_VERSION


def read_version(connection: psycopg.Connection[tuple[object, ...]]) -> int:
    """The schema version the database holds; 0 when it holds none."""
    found = connection.execute("SELECT to_regclass('sluiceway_schema') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return 0
    row = connection.execute("SELECT max(version) FROM sluiceway_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0  # type: ignore[call-overload]


def _too_new(database: Database, version: int) -> DatabaseError:
    return DatabaseError(
        f"the database {database.shown} holds schema version {version}, newer than this broker's "
        f"{SCHEMA_VERSION} (sluiceway {__version__}): run the newer Sluiceway that wrote it, or "
        "point this broker at another database"
    )


def ensure_schema(database: Database, *, create: bool = True) -> tuple[int, int]:
    """Create or upgrade the tables to SCHEMA_VERSION; returns (version before, version now).
    With `create` False, an empty database is refused rather than given tables."""
    with database.connect() as connection:
        with connection.transaction():
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            before = read_version(connection)
            if before > SCHEMA_VERSION:
                raise _too_new(database, before)
            if before == 0 and not create:
                raise DatabaseError(
                    f"the database {database.shown} has no Sluiceway tables: create them with "
                    "`sluiceway dbmgr create tbl` (a broker creates them itself when it starts)"
                )
            for version in range(before + 1, SCHEMA_VERSION + 1):
                for statement in UPGRADES[version]:
                    connection.execute(statement)
            if before == 0:
                connection.execute(
                    "INSERT INTO sluiceway_schema (version, written_by) VALUES (%s, %s)",
                    (SCHEMA_VERSION, f"sluiceway {__version__}"),
                )
            elif before < SCHEMA_VERSION:
                connection.execute(
                    "UPDATE sluiceway_schema SET version = %s, upgraded_at = now(), "
                    "written_by = %s",
                    (SCHEMA_VERSION, f"sluiceway {__version__}"),
                )
        return before, SCHEMA_VERSION


def check_schema(database: Database) -> None:
    """Refuse a database whose schema this broker cannot use (none, older, or newer)."""
    with database.connect() as connection:
        version = read_version(connection)
    if version > SCHEMA_VERSION:
        raise _too_new(database, version)
    if version < SCHEMA_VERSION:
        raise DatabaseError(
            f"the database {database.shown} holds schema version {version}, older than this "
            f"broker's {SCHEMA_VERSION}: upgrade it with `sluiceway dbmgr upgrade tbl`"
        )


def show_schema(database: Database) -> SchemaState:
    """The schema version and the rows in each table, for `sluiceway dbmgr show`."""
    with database.connect() as connection:
        version = read_version(connection)
        rows: dict[str, int] = {}
        if version:
            for table in TABLES:
                there = connection.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
                found = there.fetchone()
                if not found or not found[0]:
                    continue  # a table of a later version than the database's
                row = connection.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
                rows[table] = int(row[0]) if row else 0  # type: ignore[call-overload]
    return SchemaState(version, rows)


def delete_schema(database: Database) -> int:
    """Drop every Sluiceway table, with everything the clusters kept in them; the version
    that was there."""
    with database.connect() as connection, connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        version = read_version(connection)
        if version > SCHEMA_VERSION:
            raise _too_new(database, version)
        for table in reversed(TABLES):
            connection.execute(f"DROP TABLE IF EXISTS {table}")
    return version
