"""What the membership tests share: a member's properties with short timings, its
configuration, and reading a member's row straight from the database."""

from __future__ import annotations

from typing import Final

import psycopg

from sluiceway.config import BrokerConfig, build_config
from sluiceway.testing import BrokerProcess

CLUSTER: Final = "c1"
# Short timings: the lease lasts 0.3 x 3 = 0.9 s, a member is declared failed 0.3 s after that.
FAST: Final = {
    "imq.cluster.heartbeat.interval": "0.3",
    "imq.cluster.heartbeat.threshold": "3",
    "imq.cluster.monitor.interval": "0.3",
    "imq.cluster.monitor.threshold": "1",
    "imq.persist.jdbc.connect.timeout": "2",
}


def member_properties(url: str, broker_id: str, **more: str) -> dict[str, str]:
    """The properties of cluster member `broker_id` on the database at `url`."""
    return {
        "imq.cluster.ha": "true",
        "imq.cluster.clusterid": CLUSTER,
        "imq.brokerid": broker_id,
        "imq.persist.store": "jdbc",
        "imq.persist.jdbc.postgresql.property.url": url,
        **FAST,
        **more,
    }


# Timings for broker processes, which a loaded machine may starve for a while: the lease lasts
# 0.5 x 4 = 2 s, a member is declared failed 0.5 s after that.
PROCESS: Final = {
    "imq.cluster.heartbeat.interval": "0.5",
    "imq.cluster.heartbeat.threshold": "4",
    "imq.cluster.monitor.interval": "0.5",
    "imq.cluster.monitor.threshold": "1",
    "imq.persist.jdbc.connect.timeout": "2",
}


def start_member(url: str, broker_id: str, **more: str) -> BrokerProcess:
    """`sluiceway broker` as member `broker_id`, with the process timings."""
    args: list[str] = []
    for name, value in member_properties(url, broker_id, **{**PROCESS, **more}).items():
        args += ["-D", f"{name}={value}"]
    return BrokerProcess(*args)


def member_config(url: str, broker_id: str, **more: str) -> BrokerConfig:
    return build_config(member_properties(url, broker_id, **more))


def row(url: str, broker_id: str) -> dict[str, object]:
    """Member `broker_id`'s row, by column name ({} when there is none)."""
    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(
            "SELECT * FROM sluiceway_broker WHERE cluster_id = %s AND broker_id = %s",
            (CLUSTER, broker_id),
        )
        found = cursor.fetchone()
        if found is None:
            return {}
        assert cursor.description is not None
        return {column.name: value for column, value in zip(cursor.description, found, strict=True)}


def events(url: str, broker_id: str) -> list[str]:
    """The kinds of member `broker_id`'s events, oldest first."""
    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT kind FROM sluiceway_event WHERE cluster_id = %s AND broker_id = %s ORDER BY id",
            (CLUSTER, broker_id),
        ).fetchall()
    return [str(kind) for (kind,) in rows]


def set_lease(url: str, broker_id: str, seconds: float) -> None:
    """Make member `broker_id`'s lease end `seconds` from now (negative: it ran out that long
    ago, as if it had stopped beating; its heartbeat is a second older)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "UPDATE sluiceway_broker SET lease_until = now() + make_interval(secs => %s), "
            "heartbeat_at = least(heartbeat_at, now() + make_interval(secs => %s)) "
            "WHERE cluster_id = %s AND broker_id = %s",
            (seconds, seconds - 1, CLUSTER, broker_id),
        )


def expire(url: str, broker_id: str) -> None:
    """Member `broker_id` stopped beating a minute ago."""
    set_lease(url, broker_id, -60.0)
