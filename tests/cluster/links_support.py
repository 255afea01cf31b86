"""Brokers in threads linked as cluster members, for the links' tests: each member's links are
built by the test with a static list of the others (no database, no membership)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pytest

from sluiceway.cluster.durables import SharedDurables
from sluiceway.cluster.links import Links
from sluiceway.cluster.peer_link import LinkSettings
from sluiceway.cluster.peers import Peer, Peers, StaticPeers
from sluiceway.cluster.positions import PositionExchange, SharedPositions, own_positions
from sluiceway.core.model.destination import Destination
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.e2e.support import WAIT, wait_until

T = TypeVar("T")

# Seconds for a member's links to finish what is on its way and close: more than the links'
# own timeout (LinkSettings.timeout), after which a link held by a full destination is cut.
STOP_WAIT = 15.0
DEMAND_INTERVAL = 0.05  # the tests read demand more often than a broker does: fewer idle turns


@dataclass
class Member:
    """One broker of a test cluster and its links."""

    broker_id: str
    broker: BrokerThread
    links: Links | None = None
    started: list[Any] = field(default_factory=list)

    @property
    def peer(self) -> Peer:
        return Peer(self.broker_id, "127.0.0.1", self.broker.port)

    def call(self, fn: Callable[[], T]) -> T:
        return self.broker.call(fn)

    def destination(self, path: str) -> Destination | None:
        broker = self.broker.broker
        assert broker is not None
        return self.call(lambda: broker.registry.get(parse_destination(path)))

    def link_to(
        self,
        peers: Peers,
        *,
        flow_limit: int = 1000,
        durables: SharedDurables | None = None,
        positions: SharedPositions | None = None,
        **settings: Any,
    ) -> Links:
        """Start this member's links to `peers`, on its broker's event loop; with `durables`
        and `positions`, the records of durable subscriptions and pipeline positions they
        share."""
        broker = self.broker.broker
        assert broker is not None
        link_settings = LinkSettings(
            broker_id=self.broker_id,
            local_host="127.0.0.1",
            local_port=self.broker.port,
            flow_limit=flow_limit,
            **settings,
        )
        record = None if durables is None else durables.member(self.broker_id)
        exchange = None
        if positions is not None:
            own = partial(own_positions, broker.leases, broker.stages)
            exchange = PositionExchange(positions.member(self.broker_id), own, self.broker_id)
        links = Links(
            broker, peers, link_settings, peers_interval=0.2, durables=record, positions=exchange
        )
        links.demand_interval = DEMAND_INTERVAL
        return self.run(links)

    def run(self, links: Links) -> Links:
        """Start `links` on this member's event loop; stop_links stops them."""
        broker = self.broker.broker
        assert broker is not None
        self.links = links

        def start() -> None:
            broker.durable_homes = links.directory
            if links.positions is not None:
                broker.leases.homes = broker.stages.homes = links.positions.directory
            links.start()

        self.call(start)
        return links

    def stop_links(self, grace: float | None = None) -> None:
        """Stop the links (finishing what is on its way within `grace` seconds; 0: cut short,
        as a crash would) and wait until they are closed."""
        links, self.links = self.links, None
        if links is None:
            return
        task = self.call(lambda: asyncio.ensure_future(links.stop(grace)))
        wait_until(lambda: self.call(task.done), STOP_WAIT)
        self.call(task.result)

    def routes(self, peer_id: str) -> set[str]:
        """The destinations this member's link to `peer_id` subscribes to now."""
        links = self.links
        assert links is not None

        def read() -> set[str]:
            link = links.links.get(peer_id)
            return set() if link is None else {name.path for name in link.routes}

        return self.call(read)

    def wait_routes(self, peer_id: str, expected: set[str], timeout: float = WAIT) -> None:
        wait_until(lambda: self.routes(peer_id) == expected, timeout)


def undelivered(member: Member, path: str) -> int:
    """Messages `member` holds for `path` that no consumer has taken yet."""
    destination = member.destination(path)
    return 0 if destination is None else member.call(lambda: destination.pending_count)


def received(member: Member, path: str) -> int:
    """Messages published to `path` at `member` (its statistics)."""
    destination = member.destination(path)
    return 0 if destination is None else member.call(lambda: destination.stats.msgs_in)


@pytest.fixture
def cluster(make_broker: Callable[..., BrokerThread]) -> Iterator[Callable[..., list[Member]]]:
    """`cluster(n)`: n brokers, each linked to all the others; every link stopped after the
    test, before the brokers are."""
    members: list[Member] = []

    def make(
        count: int, *, flow_limit: int = 1000, properties: dict[str, dict[str, str]] | None = None
    ) -> list[Member]:
        """`properties`: broker properties by member id ("a", "b"...)."""
        ids = [chr(ord("a") + len(members) + i) for i in range(count)]
        made = [Member(i, make_broker((properties or {}).get(i))) for i in ids]
        members.extend(made)
        durables, positions = SharedDurables(), SharedPositions()
        for member in made:
            others = [other.peer for other in made if other is not member]
            member.link_to(
                StaticPeers(others), flow_limit=flow_limit, durables=durables, positions=positions
            )
        return made

    yield make
    for member in members:
        member.stop_links()
