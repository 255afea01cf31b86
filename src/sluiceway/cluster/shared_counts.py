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

A message a member has delivered to another member's link is counted there (once stored), not
here: the member it went to would otherwise count it twice (its own copy and this report), and
could refuse or hold the link's SEND whose acknowledgement is what lowers this member's count.
When the others' counts fall, held SENDs are looked at again (the core's RoomSignal).

The database is reached on a thread of this object's own; the counts are read from, and written
into, the broker on its event loop (`on_loop`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Final

from sluiceway.cluster.adoption import OnLoop
from sluiceway.cluster.demand import LocalConsumers, is_link
from sluiceway.core.broker import Broker
from sluiceway.core.model.context import RoomSignal
from sluiceway.core.model.queue import Queue, QueueSubscription
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


def own_counts(local: LocalConsumers, registry: DestinationRegistry) -> Counts:
    """What this broker's queues hold (those holding anything), less what they delivered to
    other members' links (counted there)."""
    counts: Counts = {}
    for destination in registry:
        if isinstance(destination, Queue) and destination.held_count:
            counts[destination.name.path] = (destination.held_count, destination.held_bytes)
    for connection in local.connections.values():
        if not is_link(connection):
            continue
        for subscription in connection.subscriptions.values():
            path = subscription.destination.name.path
            if not isinstance(subscription, QueueSubscription) or path not in counts:
                continue
            gone = [*subscription.staged, *subscription.unacked.values()]
            count, size = counts[path]
            count -= len(gone)
            size -= sum(message.size for message in gone)
            counts[path] = (max(count, 0), max(size, 0))
    return {path: held for path, held in counts.items() if held[0]}


def apply_remote(registry: DestinationRegistry, others: Counts, room: RoomSignal) -> None:
    """Set every queue's count of what the other members hold for it; where it fell, held
    SENDs may go on."""
    for destination in registry:
        if isinstance(destination, Queue):
            count, size = others.pop(destination.name.path, (0, 0))
            if count < destination.remote_count or size < destination.remote_bytes:
                room.raised = True
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
        broker: Broker,
        on_loop: OnLoop,
        *,
        interval: float,
    ) -> None:
        self._database = database
        self._cluster_id, self._broker_id = cluster_id, broker_id
        self._broker = broker
        self._registry = broker.registry
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
        broker = self._broker
        own = self._on_loop(lambda: own_counts(broker, self._registry))
        others = exchange(connection, self._cluster_id, self._broker_id, own)
        self._on_loop(lambda: self._apply(others))
        self.rounds += 1

    def _apply(self, others: Counts) -> None:
        apply_remote(self._registry, others, self._broker.context.room)
        self._broker.settle()  # held SENDs the lower counts let go are looked at now


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
