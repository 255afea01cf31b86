"""Durable subscriptions across the members of a cluster: where each lives, and the queue a
subscriber reads when it attaches on another member.

A durable subscription lives on the member it was created on (its *home*), which keeps the
topic's messages for it, from every member, while its subscriber is away (cluster.demand: a
durable subscription is demand for its topic). Every member records its own in the shared
database (`sluiceway_durable`: cluster, client id, name, topic, member) and reads the others'
every monitor interval (`DurableRecords.exchange`, off the event loop).

A subscriber that attaches on member B to a subscription that lives on member A is not given a
second subscription of that name on B. It reads a queue of B's own instead, named after the
subscription (`durable_queue`: `/queue/sluiceway.durable.<client id>.<name>.<hash>`), and B's
links attach at A to the subscription itself, as its client id, with the subscriber's topic and
selector (cluster.durable_link). What A kept for it, and what A's subscription gets from then
on, crosses into that queue within the room the subscriber's window leaves, and is
acknowledged at A only after B stored it: one subscription in the cluster, so nothing arrives
twice, and nothing is lost if either member fails. An UNSUBSCRIBE that ends the subscription on
B ends it on A (done by the links, `DurableDirectory.removals`), and drops B's queue.

A takeover moves the failed member's subscriptions with its store: the taker's final commit
makes it their home (cluster.store_takeover), and the links attach there from then on.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from sluiceway.cluster.demand import LINK_CLIENT_PREFIX, LocalConsumers
from sluiceway.cluster.peers import OPERATING, KeptConnection
from sluiceway.naming import DURABLE_QUEUE_PREFIX, DestinationKind, DestinationName
from sluiceway.persist.database import Database

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_$:\-]")
_SHOWN: Final = 40  # characters of the client id and of the name kept in the queue's name

Key = tuple[str, str]  # (client id, subscription name)


def durable_queue(client_id: str, name: str) -> DestinationName:
    """The queue a member keeps for a subscriber of durable subscription `name` of `client_id`
    that lives on another member. Readable, and unique by a hash of both (characters a
    destination name cannot hold become `_`)."""
    digest = hashlib.sha256(f"{client_id}\0{name}".encode()).hexdigest()[:12]
    shown = ".".join(_UNSAFE.sub("_", part)[:_SHOWN] for part in (client_id, name))
    return DestinationName(DestinationKind.QUEUE, f"{DURABLE_QUEUE_PREFIX}{shown}.{digest}")


def is_durable_queue(name: DestinationName) -> bool:
    return name.kind is DestinationKind.QUEUE and name.name.startswith(DURABLE_QUEUE_PREFIX)


def own_durables(local: LocalConsumers) -> list[tuple[str, str, str]]:
    """This broker's durable subscriptions as (client id, name, topic path), links' left out.
    Call on the broker's event loop."""
    return sorted(
        (client_id, name, topic.name.path)
        for (client_id, name), topic in local.durables.items()
        if not client_id.startswith(LINK_CLIENT_PREFIX)
    )


class DurableRecords(Protocol):
    """The cluster's record of its durable subscriptions. `exchange` may block (a database
    transaction): the links call it off the event loop."""

    def exchange(self, own: list[tuple[str, str, str]]) -> dict[Key, str]:
        """Record `own` (client id, name, topic path) as living on this broker and forget this
        broker's others; returns where every other member's subscriptions live."""
        ...


class SharedDurables:
    """The record kept in memory and shared by brokers of one process (tests, and clusters of
    fixed members without a database)."""

    def __init__(self) -> None:
        self.rows: dict[Key, tuple[str, str]] = {}  # key -> (topic path, member)
        self.gone: set[str] = set()  # members whose subscriptions another may claim

    def member(self, broker_id: str) -> DurableRecords:
        return _SharedView(self, broker_id)


class _SharedView:
    def __init__(self, shared: SharedDurables, broker_id: str) -> None:
        self.shared = shared
        self.broker_id = broker_id

    def exchange(self, own: list[tuple[str, str, str]]) -> dict[Key, str]:
        rows, me = self.shared.rows, self.broker_id
        keys = {(client_id, name) for client_id, name, _ in own}
        for key, (_, member) in list(rows.items()):
            if member == me and key not in keys:
                del rows[key]
        for client_id, name, topic in own:
            current = rows.get((client_id, name))
            if current is None or current[1] == me or current[1] in self.shared.gone:
                rows[(client_id, name)] = (topic, me)
        return {key: member for key, (_, member) in rows.items() if member != me}


_FORGET: Final = """
DELETE FROM sluiceway_durable AS d
WHERE d.cluster_id = %(cluster)s AND d.broker_id = %(me)s
  AND NOT EXISTS (SELECT 1 FROM unnest(%(clients)s::text[], %(names)s::text[]) AS o(c, n)
                  WHERE o.c = d.client_id AND o.n = d.name)
"""
# A row is this broker's to write when it is new, its own, or its member no longer operates
# (a takeover hands them over in its own commit; this covers one that left them behind).
_CLAIM: Final = """
INSERT INTO sluiceway_durable AS d (cluster_id, client_id, name, topic, broker_id)
SELECT %(cluster)s, o.c, o.n, o.t, %(me)s
FROM unnest(%(clients)s::text[], %(names)s::text[], %(topics)s::text[]) AS o(c, n, t)
ON CONFLICT (cluster_id, client_id, name) DO UPDATE
SET broker_id = EXCLUDED.broker_id, topic = EXCLUDED.topic, updated_at = now()
WHERE (d.broker_id = EXCLUDED.broker_id AND d.topic <> EXCLUDED.topic)
   OR (d.broker_id <> EXCLUDED.broker_id AND NOT EXISTS (
        SELECT 1 FROM sluiceway_broker AS b
        WHERE b.cluster_id = d.cluster_id AND b.broker_id = d.broker_id
          AND b.state = %(operating)s))
"""
_OTHERS: Final = """
SELECT client_id, name, broker_id FROM sluiceway_durable
WHERE cluster_id = %(cluster)s AND broker_id <> %(me)s
"""


class DatabaseDurables:
    """The record in the shared database (`sluiceway_durable`), one transaction a reading."""

    def __init__(self, database: Database, cluster_id: str, broker_id: str) -> None:
        self.cluster_id = cluster_id
        self.broker_id = broker_id
        self._kept = KeptConnection(database)

    def exchange(self, own: list[tuple[str, str, str]]) -> dict[Key, str]:
        what = f"record the durable subscriptions of cluster {self.cluster_id!r}"
        return self._kept.run(lambda connection: self._exchange(connection, own), what)

    def _exchange(
        self, connection: psycopg.Connection[tuple[object, ...]], own: list[tuple[str, str, str]]
    ) -> dict[Key, str]:
        values = {
            "cluster": self.cluster_id,
            "me": self.broker_id,
            "operating": OPERATING,
            "clients": [row[0] for row in own],
            "names": [row[1] for row in own],
            "topics": [row[2] for row in own],
        }
        with connection.transaction():
            connection.execute(_FORGET, values)
            connection.execute(_CLAIM, values)
            rows = connection.execute(_OTHERS, values).fetchall()
        return {(str(client), str(name)): str(member) for client, name, member in rows}

    def close(self) -> None:
        self._kept.close()


@dataclass(frozen=True, slots=True)
class Attachment:
    """A subscriber attached here to a durable subscription that lives elsewhere: what the
    links attach at its home with."""

    client_id: str
    name: str
    topic: DestinationName
    selector: str  # the subscriber's selector text ("" for none)

    @property
    def key(self) -> Key:
        return (self.client_id, self.name)


class DurableDirectory:
    """Where the other members' durable subscriptions live, as last read (`update`), and what
    this broker's subscribers of them attached with. The core asks it (core.connection
    .DurableHomes) on its event loop; the links read and update it on the same loop.

    Bounded by the cluster's durable subscriptions: an attachment or a removal is noted only
    for a subscription the record names.
    """

    def __init__(self, broker_id: str) -> None:
        self.broker_id = broker_id
        self.homes: dict[Key, str] = {}  # another member's subscription -> that member
        self.own: set[Key] = set()  # this broker's, as last recorded
        self.attachments: dict[DestinationName, Attachment] = {}  # by the queue read here
        self.removals: dict[Key, str] = {}  # ended here, to be ended at home -> home

    def update(self, homes: Mapping[Key, str], own: Iterable[Key]) -> None:
        """The record as just read, and this broker's own. A subscription being removed stays
        away until its home forgot it. A subscriber attached here keeps its queue when the
        subscription comes to live here (this broker took its home over): the links then
        attach to it here, until the subscriber leaves."""
        self.homes = {key: home for key, home in homes.items() if key not in self.removals}
        self.own = set(own)
        for queue, attachment in list(self.attachments.items()):
            if attachment.key not in self.homes and attachment.key not in self.own:
                del self.attachments[queue]

    def home(self, key: Key) -> str | None:
        """The member subscription `key` lives on (this broker's id for its own)."""
        home = self.homes.get(key)
        if home is None and key in self.own:
            return self.broker_id
        return home

    def detach(self, queues: Iterable[DestinationName]) -> None:
        """Forget the attachments of `queues`, which no subscriber reads now."""
        for queue in queues:
            self.attachments.pop(queue, None)

    def serve(
        self, client_id: str, name: str, topic: DestinationName, selector: str
    ) -> DestinationName | None:
        if (client_id, name) not in self.homes:
            return None
        queue = durable_queue(client_id, name)
        self.attachments[queue] = Attachment(client_id, name, topic, selector)
        return queue

    def queue_of(self, client_id: str, name: str) -> DestinationName | None:
        return durable_queue(client_id, name) if (client_id, name) in self.homes else None

    def remove(self, client_id: str, name: str) -> None:
        key = (client_id, name)
        home = self.homes.pop(key, None)
        if home is not None:
            self.removals[key] = home
            self.attachments.pop(durable_queue(client_id, name), None)
            log.info(
                "durable subscription %r of client %r ended here: ending it on member %s",
                name,
                client_id,
                home,
            )

    def removed(self, key: Key) -> None:
        """Its home ended it."""
        self.removals.pop(key, None)

    def attached(self, queues: Iterable[DestinationName]) -> dict[DestinationName, Attachment]:
        """The attachments of `queues` (those read here now)."""
        return {queue: self.attachments[queue] for queue in queues if queue in self.attachments}
