"""The members' rows and the cluster's events in the shared database, as the members read and
write them: the statements every part of membership shares, and the snapshot of the cluster
that the admin API, `sluiceway cmd list bkr` and /metrics show.

Every time compared here is the database's (now()): members never compare two machines' clocks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[object, ...]]

RECENT_EVENTS: Final = 20  # the events a snapshot carries, newest first

# The kinds of sluiceway_event rows membership writes.
JOINED: Final = "joined"
REJOINED: Final = "rejoined"
DECLARED_FAILED: Final = "declared-failed"
TAKEOVER_STARTED: Final = "takeover-started"
TAKEOVER_COMPLETE: Final = "takeover-complete"
TAKEOVER_FAILED: Final = "takeover-failed"
FENCED: Final = "fenced"
SHUTDOWN: Final = "shutdown"


@dataclass(frozen=True, slots=True)
class Member:
    """One row of sluiceway_broker, with the age of its heartbeat by the database's clock."""

    broker_id: str
    state: str
    epoch: int
    stomp_address: str
    admin_address: str
    host: str
    pid: int
    version: str
    messages: int
    started_at: datetime | None
    heartbeat_at: datetime | None
    heartbeat_age: float | None  # seconds since heartbeat_at, by the database's clock
    taken_over_by: str | None
    takeover_started_at: datetime | None
    takeover_ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class Event:
    """One row of sluiceway_event."""

    at: datetime
    broker_id: str
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The members of one cluster and its recent events, as read at one instant."""

    cluster_id: str
    members: tuple[Member, ...]
    events: tuple[Event, ...]


def record_event(
    connection: Connection, cluster_id: str, broker_id: str, kind: str, detail: str
) -> None:
    """Add an event row (in the connection's transaction, if one is open)."""
    connection.execute(
        "INSERT INTO sluiceway_event (cluster_id, broker_id, kind, detail) VALUES (%s, %s, %s, %s)",
        (cluster_id, broker_id, kind, detail),
    )


_MEMBERS: Final = """
    SELECT broker_id, state, epoch, stomp_address, admin_address, host, pid, version, messages,
           started_at, heartbeat_at, extract(epoch FROM now() - heartbeat_at),
           taken_over_by, takeover_started_at, takeover_ended_at
    FROM sluiceway_broker WHERE cluster_id = %s ORDER BY broker_id
"""
_EVENTS: Final = """
    SELECT at, broker_id, kind, detail FROM sluiceway_event
    WHERE cluster_id = %s ORDER BY id DESC LIMIT %s
"""


def read_snapshot(connection: Connection, cluster_id: str) -> ClusterSnapshot:
    """Every member of `cluster_id` and its latest events."""
    members = tuple(
        Member(
            broker_id=str(row[0]),
            state=str(row[1]),
            epoch=int(row[2]),  # type: ignore[call-overload]
            stomp_address=str(row[3]),
            admin_address=str(row[4]),
            host=str(row[5]),
            pid=int(row[6]),  # type: ignore[call-overload]
            version=str(row[7]),
            messages=int(row[8]),  # type: ignore[call-overload]
            started_at=_time(row[9]),
            heartbeat_at=_time(row[10]),
            heartbeat_age=float(row[11]) if row[11] is not None else None,  # type: ignore[arg-type]
            taken_over_by=str(row[12]) if row[12] is not None else None,
            takeover_started_at=_time(row[13]),
            takeover_ended_at=_time(row[14]),
        )
        for row in connection.execute(_MEMBERS, (cluster_id,)).fetchall()
    )
    events = tuple(
        Event(at=row[0], broker_id=str(row[1]), kind=str(row[2]), detail=str(row[3]))  # type: ignore[arg-type]
        for row in connection.execute(_EVENTS, (cluster_id, RECENT_EVENTS)).fetchall()
    )
    return ClusterSnapshot(cluster_id, members, events)


def _time(value: object) -> datetime | None:
    return value if isinstance(value, datetime) else None


def close_quietly(connection: Connection | None) -> None:
    """Close a connection that may be broken already (nothing to report if it fails)."""
    if connection is not None:
        with contextlib.suppress(Exception):
            connection.close()
