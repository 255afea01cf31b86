"""Destination limits that hold for the cluster: each member reports what its queues hold, and
counts what the others report against its own queues' limits.

A queue's `maxNumMsgs` and `maxTotalMsgBytes` bound the messages held for it in the whole
cluster, wherever they were published: every `interval` a member writes its queues' counts to
sluiceway_destination and reads the sum of every other member's, which its queues then add to
their own (core.model.destination `remote_count`, `remote_bytes`) when a producer's message is
weighed against their limits. The figures are up to one interval old, so the cluster may pass a
limit by what the other members accept in that time; and a message on its way over a link is
counted by both members for that moment. A failed member's report stands until its store is
taken over (its messages are still in the cluster); its taker then reports them as its own.

The database is reached on a thread of this object's own; the counts are read from, and written
into, the broker on its event loop (`on_loop`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Final

from sluiceway.cluster.adoption import OnLoop
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.naming import DestinationKind, parse_destination
from sluiceway.persist.database import Database, DatabaseError

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

Counts = dict[str, tuple[int, int]]  # queue path -> (messages, bytes)

JOIN_TIMEOUT: Final = 10.0  # seconds stop() waits for a round in progress

_WRITE: Final = """
    INSERT INTO sluiceway_destination (cluster_id, broker_id, destination, messages, bytes)
    SELECT %s, %s, destination, messages, bytes
    FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS own(destination, messages, bytes)
    ON CONFLICT (cluster_id, broker_id, destination) DO UPDATE
    SET messages = excluded.messages, bytes = excluded.bytes, updated_at = now()
"""
_FORGET: Final = """
    DELETE FROM sluiceway_destination
    WHERE cluster_id = %s AND broker_id = %s AND NOT destination = ANY(%s::text[])
"""
_OTHERS: Final = """
    SELECT destination, sum(messages)::bigint, sum(bytes)::bigint FROM sluiceway_destination
    WHERE cluster_id = %s AND broker_id <> %s GROUP BY destination
"""


def own_counts(registry: DestinationRegistry) -> Counts:
    """What this broker's queues hold (those holding anything)."""
    counts: Counts = {}
    for destination in registry:
        if isinstance(destination, Queue) and destination.held_count:
            counts[destination.name.path] = (destination.held_count, destination.held_bytes)
    return counts


def apply_remote(registry: DestinationRegistry, others: Counts) -> None:
    """Set every queue's count of what the other members hold for it."""
    for destination in registry:
        if isinstance(destination, Queue):
            count, size = others.pop(destination.name.path, (0, 0))
            destination.remote_count, destination.remote_bytes = count, size
    for path, (count, size) in others.items():
        # A queue other members hold messages for and this one has not seen yet: made, as a
        # producer's first SEND would make it, so its limit holds from the first message here.
        try:
            name = parse_destination(path)
        except ValueError:
            continue
        if name.kind is DestinationKind.QUEUE:
            queue = registry.recovered(name)
            queue.remote_count, queue.remote_bytes = count, size


def exchange(
    connection: psycopg.Connection[tuple[object, ...]],
    cluster_id: str,
    broker_id: str,
    own: Counts,
) -> Counts:
    """One round: write `own`, forget queues no longer held, return the others' sums."""
    paths = list(own)
    with connection.transaction():
        if paths:
            connection.execute(
                _WRITE,
                (
                    cluster_id,
                    broker_id,
                    paths,
                    [own[path][0] for path in paths],
                    [own[path][1] for path in paths],
                ),
            )
        connection.execute(_FORGET, (cluster_id, broker_id, paths))
        rows = connection.execute(_OTHERS, (cluster_id, broker_id)).fetchall()
    return {str(path): (int(count), int(size)) for path, count, size in rows}  # type: ignore[call-overload]


class SharedCounts:
    """Exchanges the queues' counts with the other members every `interval` seconds."""

    def __init__(
        self,
        database: Database,
        cluster_id: str,
        broker_id: str,
        registry: DestinationRegistry,
        on_loop: OnLoop,
        *,
        interval: float,
    ) -> None:
        self._database = database
        self._cluster_id, self._broker_id = cluster_id, broker_id
        self._registry = registry
        self._on_loop = on_loop
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0  # rounds completed, for tests and the log

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sluiceway-counts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT)

    def _run(self) -> None:
        connection: psycopg.Connection[tuple[object, ...]] | None = None
        while not self._stop.is_set():
            try:
                if connection is None or connection.closed:
                    connection = self._database.connect()
                self.round(connection)
            except DatabaseError as error:
                log.warning("cluster counts: %s", error)
            except Exception as error:  # a lost connection: a new one next round
                log.warning("cluster counts: the round failed (%s); trying again", error)
                _closed(connection)
                connection = None
            self._stop.wait(self._interval)
        _closed(connection)

    def round(self, connection: psycopg.Connection[tuple[object, ...]]) -> None:
        own = self._on_loop(lambda: own_counts(self._registry))
        others = exchange(connection, self._cluster_id, self._broker_id, own)
        self._on_loop(lambda: apply_remote(self._registry, others))
        self.rounds += 1


def _closed(
    connection: psycopg.Connection[tuple[object, ...]] | None,
) -> None:
    if connection is not None:
        with contextlib.suppress(Exception):  # closing a connection that already failed
            connection.close()


def forget_member(
    connection: psycopg.Connection[tuple[object, ...]], cluster_id: str, broker_id: str
) -> None:
    """Drop a member's report: a takeover does it in its final commit (the taker reports the
    adopted messages as its own from then on)."""
    connection.execute(
        "DELETE FROM sluiceway_destination WHERE cluster_id = %s AND broker_id = %s",
        (cluster_id, broker_id),
    )
