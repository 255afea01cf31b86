"""Pipeline positions across the members of a cluster: where each queue lease group and each
sink lives, and the refusal another member answers for them.

A pipeline reader's lease group (docs/pipelines-protocol.md, "Queue leases") and a sink's
stages and last committed batch ("Stages") live on the member that first served them. Another
member that served them anew would hand out lease numbers the reader used already, with other
messages, or take a replayed batch for a new one: exactly once would be lost. So every member
records its own in the shared database (`sluiceway_position`: cluster, kind, destination, name,
member) and reads the others' every monitor interval (`PositionRecords.exchange`, off the event
loop), as it does its durable subscriptions (cluster.durables). A lease read or settled, a stage
sent, committed or aborted, for one that lives on another member, is refused with 503 naming
that member and its STOMP address (`member`, `member-address`): the client goes there. When
that member has failed, the refusal says so, and the client tries again: the takeover moves the
member's positions with its store (cluster.store_takeover hands its rows to the taker in its
final commit), and the taker serves them from then on.

A row belongs to the member that wrote it first; another takes it only once that member no
longer operates. A group or sink started on two members (the second started it within a monitor
interval of the first) is logged as a warning naming both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Final, Protocol

from sluiceway.cluster.peers import OPERATING, KeptConnection, Peer, Reading
from sluiceway.core.features.leases import Leases
from sluiceway.core.features.stages import StageArea
from sluiceway.errors import BrokerError, Unavailable
from sluiceway.naming import DestinationName
from sluiceway.persist.database import Database

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

LEASE_GROUP: Final = "lease"  # destination: the queue's path, name: the group
SINK: Final = "sink"  # destination: "", name: the sink

Position = tuple[str, str, str]  # (kind, destination, name)


def own_positions(leases: Leases, stages: StageArea) -> list[Position]:
    """This broker's lease groups and sinks. Call on the broker's event loop."""
    groups = [(LEASE_GROUP, queue.path, group) for queue, group in leases.group_keys()]
    return sorted([*groups, *((SINK, "", sink) for sink in stages.sinks())])


def described(position: Position) -> str:
    kind, destination, name = position
    return f"lease group {name!r} of {destination}" if kind == LEASE_GROUP else f"sink {name!r}"


class PositionRecords(Protocol):
    """The cluster's record of its pipeline positions. `exchange` may block (a database
    transaction): the links call it off the event loop."""

    def exchange(self, own: list[Position]) -> dict[Position, str]:
        """Record `own` as living on this broker and forget this broker's others; returns
        where every other member's positions live."""
        ...


class SharedPositions:
    """The record kept in memory and shared by brokers of one process (tests)."""

    def __init__(self) -> None:
        self.rows: dict[Position, str] = {}  # position -> member
        self.gone: set[str] = set()  # members whose positions another may claim

    def member(self, broker_id: str) -> PositionRecords:
        return _SharedView(self, broker_id)


class _SharedView:
    def __init__(self, shared: SharedPositions, broker_id: str) -> None:
        self.shared = shared
        self.broker_id = broker_id

    def exchange(self, own: list[Position]) -> dict[Position, str]:
        rows, me, mine = self.shared.rows, self.broker_id, set(own)
        for position, member in list(rows.items()):
            if member == me and position not in mine:
                del rows[position]
        for position in own:
            if rows.get(position, me) == me or rows[position] in self.shared.gone:
                rows[position] = me
        return {position: member for position, member in rows.items() if member != me}


_FORGET: Final = """
DELETE FROM sluiceway_position AS p
WHERE p.cluster_id = %(cluster)s AND p.broker_id = %(me)s
  AND NOT EXISTS (SELECT 1 FROM unnest(%(kinds)s::text[], %(dests)s::text[], %(names)s::text[])
                  AS o(k, d, n) WHERE o.k = p.kind AND o.d = p.destination AND o.n = p.name)
"""
# A row is this broker's to write when it is new, or its member no longer operates (a takeover
# hands them over in its own commit; this covers one that left them behind).
_CLAIM: Final = """
INSERT INTO sluiceway_position AS p (cluster_id, kind, destination, name, broker_id)
SELECT %(cluster)s, o.k, o.d, o.n, %(me)s
FROM unnest(%(kinds)s::text[], %(dests)s::text[], %(names)s::text[]) AS o(k, d, n)
ON CONFLICT (cluster_id, kind, destination, name) DO UPDATE
SET broker_id = EXCLUDED.broker_id, updated_at = now()
WHERE p.broker_id <> EXCLUDED.broker_id AND NOT EXISTS (
    SELECT 1 FROM sluiceway_broker AS b
    WHERE b.cluster_id = p.cluster_id AND b.broker_id = p.broker_id AND b.state = %(operating)s)
"""
_OTHERS: Final = """
SELECT kind, destination, name, broker_id FROM sluiceway_position
WHERE cluster_id = %(cluster)s AND broker_id <> %(me)s
"""


class DatabasePositions:
    """The record in the shared database (`sluiceway_position`), one transaction a reading."""

    def __init__(self, database: Database, cluster_id: str, broker_id: str) -> None:
        self.cluster_id = cluster_id
        self.broker_id = broker_id
        self._kept = KeptConnection(database)

    def exchange(self, own: list[Position]) -> dict[Position, str]:
        what = f"record the pipeline positions of cluster {self.cluster_id!r}"
        return self._kept.run(lambda connection: self._exchange(connection, own), what)

    def _exchange(
        self, connection: psycopg.Connection[tuple[object, ...]], own: list[Position]
    ) -> dict[Position, str]:
        values = {
            "cluster": self.cluster_id,
            "me": self.broker_id,
            "operating": OPERATING,
            "kinds": [row[0] for row in own],
            "dests": [row[1] for row in own],
            "names": [row[2] for row in own],
        }
        with connection.transaction():
            connection.execute(_FORGET, values)
            connection.execute(_CLAIM, values)
            rows = connection.execute(_OTHERS, values).fetchall()
        return {(str(k), str(d), str(n)): str(member) for k, d, n, member in rows}

    def close(self) -> None:
        self._kept.close()


class PositionDirectory:
    """Where the other members' lease groups and sinks live, as last read, and the members that
    operate now with their STOMP addresses: the core asks it (core.values.positions
    .PositionHomes) on its event loop, for what it does not have; the links update it on the
    same loop."""

    def __init__(self, broker_id: str) -> None:
        self.broker_id = broker_id
        self.homes: dict[Position, str] = {}  # another member's position -> that member
        self.members: dict[str, Peer] = {}  # operating members, by broker id
        self.own: set[Position] = set()  # this broker's, as last recorded
        self._split: set[Position] = set()  # here and recorded elsewhere: warned of

    def update(self, homes: Mapping[Position, str], own: Iterable[Position]) -> None:
        """The record as just read, and this broker's own positions."""
        self.homes = dict(homes)
        self.own = mine = set(own)
        for position in mine & set(homes) - self._split:
            log.warning(
                "%s exists here and on member %s, where the cluster's record keeps it: it was "
                "started here within a monitor interval of the other. Each serves its own "
                "(exactly once does not hold across the two); its reader or writer should use "
                "one member",
                described(position),
                homes[position],
            )
        self._split = {position for position in mine if position in homes}

    def everywhere(self) -> dict[Position, str]:
        """Every position of the cluster and its member, this broker's included."""
        return {**self.homes, **dict.fromkeys(self.own, self.broker_id)}

    def follow(self, members: Iterable[Peer]) -> None:
        self.members = {peer.broker_id: peer for peer in members}

    def lease_group(self, queue: DestinationName, group: str) -> BrokerError | None:
        return self._refusal((LEASE_GROUP, queue.path, group), queue.path)

    def sink(self, sink: str) -> BrokerError | None:
        return self._refusal((SINK, "", sink), None)

    def _refusal(self, position: Position, destination: str | None) -> BrokerError | None:
        home = self.homes.get(position)
        if home is None or home == self.broker_id:
            return None
        what = described(position)
        peer = self.members.get(home)
        if peer is None:
            return Unavailable(
                "lives on a failed member",
                f"{what} lives on cluster member {home}, which does not operate now; the member "
                "that takes its store over serves it from then on: try again in a few seconds",
                destination=destination,
                member=home,
            )
        address = f"{peer.host}:{peer.port}"
        return Unavailable(
            "lives on another member",
            f"{what} lives on cluster member {home} ({address}), which keeps its state: use it "
            "there",
            destination=destination,
            member=home,
            member_address=address,
        )


class PositionExchange:
    """What the links do with the record each monitor interval: write this broker's positions,
    read the others' into the directory."""

    def __init__(
        self, records: PositionRecords, own: Callable[[], list[Position]], broker_id: str
    ) -> None:
        self.records = records
        self.own = own
        self.directory = PositionDirectory(broker_id)
        self._reading = Reading("exchange the cluster's pipeline positions")

    async def exchange(self) -> None:
        own = self.own()
        homes = await self._reading.run(partial(self.records.exchange, own))
        if homes is not None:  # else what was read last is kept until it can be read again
            self.directory.update(homes, own)

    def close(self) -> None:
        close = getattr(self.records, "close", None)
        if close is not None:
            close()
