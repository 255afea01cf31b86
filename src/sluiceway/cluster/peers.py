"""The other members of the cluster a broker links to: who they are and where their STOMP
listener is.

The membership records every member in `sluiceway_broker`, with the address its STOMP listener
serves on; the links read the operating members from there (`DatabasePeers`) every monitor
interval (`imq.cluster.monitor.interval`). A test, or a cluster of fixed members, gives the list
itself (`StaticPeers`). Reading the database blocks, so the links call `current` on a thread of
the default executor, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from sluiceway.errors import SluicewayError
from sluiceway.persist.database import Database, DatabaseError

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")

log = logging.getLogger(__name__)

OPERATING: Final = "OPERATING"  # the state of a member that serves (sluiceway_broker.state)

_OPERATING_PEERS: Final = (
    "SELECT broker_id, stomp_address FROM sluiceway_broker "
    "WHERE cluster_id = %s AND state = %s AND broker_id <> %s ORDER BY broker_id"
)


class PeerAddressError(ValueError):
    """A member's STOMP address that is not host:port."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Another member: its broker id (`imq.brokerid`) and its STOMP listener."""

    broker_id: str
    host: str
    port: int

    @classmethod
    def parse(cls, broker_id: str, address: str) -> Peer:
        """A member from its row: `address` is host:port ([host]:port for IPv6)."""
        host, separator, port = address.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not separator or not host or not port.isascii() or not port.isdigit():
            raise PeerAddressError(
                f"member {broker_id} gives its STOMP address as {address!r}: expected host:port"
            )
        number = int(port)
        if not 0 < number < 65536:
            raise PeerAddressError(
                f"member {broker_id} gives its STOMP address as {address!r}: the port must be "
                "from 1 to 65535"
            )
        return cls(broker_id, host, number)

    def __str__(self) -> str:
        return f"{self.broker_id} ({self.host}:{self.port})"


class Peers(Protocol):
    """Where the links learn of the other members. `current` may block (a database query): the
    links call it off the event loop."""

    def current(self) -> list[Peer]:
        """The members to link to now, this broker left out."""
        ...


class StaticPeers:
    """A fixed list of members (tests, and clusters whose members never change)."""

    def __init__(self, peers: Iterable[Peer]) -> None:
        self.peers = list(peers)

    def current(self) -> list[Peer]:
        return list(self.peers)


class KeptConnection:
    """One connection to the shared database, kept open between the reads a broker makes every
    monitor interval and opened again after a failure. Blocking: call it off the event loop.

    `close` may come from another thread while a read runs (the links stop while a read is on
    its way): the read's connection is closed then, and no read opens one afterwards, so no
    connection outlives the broker's links."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._connection: object | None = None
        self._lock = threading.Lock()  # guards _connection and _closed
        self._closed = False

    def run(self, query: Callable[[psycopg.Connection[tuple[object, ...]]], T], what: str) -> T:
        """`query` on the connection; a failure closes it and raises DatabaseError saying
        what could not be done (`what`: "read the members of cluster 'c1'")."""
        import psycopg  # noqa: PLC0415  (late: the driver is the cluster extra's)

        try:
            with self._lock:
                if self._closed:
                    raise DatabaseError(f"cannot {what}: this broker's links have stopped")
                connection = self._connection
                if not isinstance(connection, psycopg.Connection) or connection.closed:
                    connection = self._connection = self.database.connect(autocommit=True)
            return query(connection)
        except psycopg.Error as error:
            self._drop()
            reason = " ".join(str(error).split()) or type(error).__name__
            raise DatabaseError(
                f"cannot {what} from the database {self.database.shown}: {reason}"
            ) from error

    def _drop(self) -> None:
        """Close the connection; the next read opens another."""
        with self._lock:
            connection, self._connection = self._connection, None
        _close(connection)

    def close(self) -> None:
        """Close the connection for good."""
        with self._lock:
            self._closed = True
            connection, self._connection = self._connection, None
        _close(connection)


def _close(connection: object | None) -> None:
    close = getattr(connection, "close", None)
    if close is not None:
        close()


class DatabasePeers:
    """The operating members of `cluster_id` as the shared database records them.

    One connection is kept open between reads (a read every monitor interval would otherwise
    open one each time) and opened again after a failure. A member whose address cannot be read
    is left out, with a warning, rather than taking the others with it.
    """

    def __init__(self, database: Database, cluster_id: str, broker_id: str) -> None:
        self.database = database
        self.cluster_id = cluster_id
        self.broker_id = broker_id
        self._kept = KeptConnection(database)
        self._bad: set[tuple[str, str]] = set()  # rows warned about, so each is told once

    def current(self) -> list[Peer]:
        """The members; raises DatabaseError when the database cannot be read."""
        rows = self._kept.run(self._read, f"read the members of cluster {self.cluster_id!r}")
        peers = []
        for broker_id, address in rows:
            try:
                peers.append(Peer.parse(broker_id, address))
            except PeerAddressError as error:
                if (broker_id, address) not in self._bad:
                    self._bad.add((broker_id, address))
                    log.warning("not linking to a member: %s", error)
        return peers

    def _read(self, connection: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(_OPERATING_PEERS, (self.cluster_id, OPERATING, self.broker_id))
            return [(str(row[0]), str(row[1])) for row in cursor.fetchall()]

    def close(self) -> None:
        self._kept.close()


class Reading:
    """A reading of the shared database the links make every monitor interval, off the event
    loop: a failure is logged once per outage, and what was read last is kept meanwhile."""

    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "exchange the cluster's durable subscriptions"
        self.failing = False

    async def run(self, read: Callable[[], T]) -> T | None:
        """`read()` on a thread; None when it failed (told once until it works again)."""
        try:
            result = await asyncio.to_thread(read)
        except SluicewayError as exc:
            if not self.failing:
                log.warning("cannot %s: %s", self.what, exc)
            self.failing = True
            return None
        self.failing = False
        return result
