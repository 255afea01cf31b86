"""Properties of a broker cluster and of the PostgreSQL store it shares (Open MQ's enhanced
cluster: `imq.cluster.*`, `imq.brokerid`, `imq.persist.jdbc.*`).

A single broker needs none of them: it keeps its journal on local disk (`imq.persist.store=file`).
Brokers started with `imq.cluster.ha=true`, the same `imq.cluster.clusterid` and the same database
join one cluster by themselves. docs/cluster.md says what each setting decides; the failure
detection defaults declare a broker failed about 8 s after its last heartbeat, so a takeover
starts within about 10 s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sluiceway.config.properties import float_parser, int_parser, parse_bool, prop
from sluiceway.config.service import ServiceConfig, parse_optional_path

# Names that go into the store's keys and the log: letters, digits, '_' and '-'; Open MQ limits
# a broker id to 23 characters (it becomes part of table names there).
_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,23}")


def parse_cluster_id(text: str) -> str:
    value = text.strip()
    if value and not _ID.fullmatch(value):
        raise ValueError("up to 23 letters, digits, '_' or '-' (empty: no cluster id)")
    return value


def parse_broker_id(text: str) -> str:
    value = text.strip()
    if value and not _ID.fullmatch(value):
        raise ValueError("up to 23 letters, digits, '_' or '-', unique in the cluster")
    return value


def parse_database_url(text: str) -> str:
    value = text.strip()
    if value and not value.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            "a libpq connection URI such as postgresql://sluiceway@127.0.0.1:5432/sluiceway"
        )
    return value


def parse_vendor(text: str) -> str:
    value = text.strip().lower()
    if value != "postgresql":
        raise ValueError("postgresql (the one database vendor supported)")
    return value


@dataclass(frozen=True, slots=True)
class ClusterConfig(ServiceConfig):
    """Cluster membership, failure detection and the shared PostgreSQL store."""

    cluster_ha: bool = prop(
        "imq.cluster.ha",
        parse_bool,
        False,
        "Run as a member of an enhanced (high-availability) cluster: every member keeps its "
        "persistent state in one PostgreSQL database (imq.persist.store=jdbc), renews a lease "
        "there with its heartbeat, and takes over the messages of a member whose heartbeat "
        "stops. Needs imq.brokerid and imq.persist.store=jdbc. See docs/cluster.md.",
    )
    cluster_id: str = prop(
        "imq.cluster.clusterid",
        parse_cluster_id,
        "",
        "Names the cluster in the shared database: brokers with the same cluster id and database "
        "form one cluster; another cluster id keeps apart in the same database. The same on "
        "every member.",
    )
    broker_id: str = prop(
        "imq.brokerid",
        parse_broker_id,
        "",
        "This broker's name in its cluster and in the shared store, unique among the members "
        "(set per broker, never in a configuration file the members share). Required with "
        "imq.persist.store=jdbc.",
    )
    jdbc_vendor: str = prop(
        "imq.persist.jdbc.dbVendor",
        parse_vendor,
        "postgresql",
        "The database of the jdbc store: postgresql.",
    )
    jdbc_url: str = prop(
        "imq.persist.jdbc.postgresql.property.url",
        parse_database_url,
        "",
        "The PostgreSQL database of the jdbc store, as a libpq connection URI "
        "(postgresql://user@host:5432/database, with ?sslmode=... and other libpq parameters). "
        "A password in it is used, but imq.persist.jdbc.postgresql.password.file keeps it out of "
        "the configuration.",
    )
    jdbc_user: str = prop(
        "imq.persist.jdbc.postgresql.user",
        lambda text: text.strip(),
        "",
        "The database user, when the URL names none (or to override it).",
    )
    jdbc_password_file: str = prop(
        "imq.persist.jdbc.postgresql.password.file",
        parse_optional_path,
        "",
        "A file holding the database password on its first line (readable by the broker only: "
        "it refuses a file others may read). Empty: the URL's password, or libpq's own "
        "(PGPASSWORD, ~/.pgpass).",
    )
    jdbc_connect_timeout: float = prop(
        "imq.persist.jdbc.connect.timeout",
        float_parser(0.5, 300.0),
        5.0,
        "Seconds to wait for the database to answer a connection attempt before the broker "
        "reports it unreachable.",
    )
    heartbeat_interval: float = prop(
        "imq.cluster.heartbeat.interval",
        float_parser(0.1, 60.0),
        2.0,
        "Seconds between heartbeats: each renews this broker's lease in the database. The lease "
        "lasts imq.cluster.heartbeat.interval x imq.cluster.heartbeat.threshold; a broker that "
        "cannot renew it within that time stops serving (it fences itself) before any other "
        "member may take over.",
    )
    heartbeat_threshold: int = prop(
        "imq.cluster.heartbeat.threshold",
        int_parser(2, 100),
        3,
        "Heartbeats a broker may miss before its lease runs out (the lease is this many "
        "intervals long).",
    )
    monitor_interval: float = prop(
        "imq.cluster.monitor.interval",
        float_parser(0.1, 300.0),
        2.0,
        "Seconds between checks of the other members' leases.",
    )
    monitor_threshold: int = prop(
        "imq.cluster.monitor.threshold",
        int_parser(1, 100),
        1,
        "Monitor intervals a member's lease must have run out before it is declared failed and "
        "taken over: the margin between a broker fencing itself and another taking over. With "
        "the defaults a member is declared failed 6 + 2 = 8 s after its last heartbeat.",
    )
    cluster_flow_limit: int = prop(
        "imq.cluster.consumerFlowLimit",
        int_parser(minimum=1),
        1000,
        "Most messages a broker forwards to another member's consumers of one destination "
        "before they acknowledge some (the window of a link between brokers).",
    )

    link_username: str = prop(
        "imq.cluster.link.username",
        lambda text: text.strip(),
        "",
        "The user the links between members log in as, at the other members and at this "
        "broker, when imq.authentication.enabled is true: it must be allowed to consume from and "
        "produce to every destination that crosses brokers. Empty: links log in without a user.",
    )
    link_password_file: str = prop(
        "imq.cluster.link.password.file",
        parse_optional_path,
        "",
        "A file holding the password of imq.cluster.link.username on its first line (readable "
        "by the broker only: it refuses a file others may read).",
    )

    @property
    def lease_seconds(self) -> float:
        """How long a renewed lease lasts."""
        return self.heartbeat_interval * self.heartbeat_threshold

    @property
    def failure_seconds(self) -> float:
        """How long after its last heartbeat a member is declared failed."""
        return self.lease_seconds + self.monitor_interval * self.monitor_threshold
