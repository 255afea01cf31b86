"""The links from this broker to every other member of its cluster: which members, and which
destinations each link carries.

A producer on any member reaches consumers on any member. A message stays on the broker it was
published to (its home) until a consumer there takes it, or a link from a member that has
consumers for it takes it away: that member's link subscribes at the home broker and publishes
what it receives to its own broker (cluster.peer_link). So a broker pulls: it learns of new
messages at a member through its link's subscription there, which the member feeds as it feeds
any consumer.

Every DEMAND_INTERVAL_S this broker reads its own consumers' demand (cluster.demand) and tells
every link what to carry:

- a queue whose local consumers have room (free window credit beyond the queue's own backlog),
  with a window of min(imq.cluster.consumerFlowLimit, that room) messages; a queue whose
  consumers have no room is let go. The room is also the budget all links share until the next
  reading (peer_link.Budget): what crosses for a slow consumer stays within about its window;
- every topic with a local subscriber or durable subscription, with a window of
  imq.cluster.consumerFlowLimit.

Every imq.cluster.monitor.interval it asks `Peers` who the members are (a database query, on a
thread of the default executor) and starts or stops links to match, and exchanges the record of
durable subscriptions (cluster.durables): a subscriber here of one that lives on another member
gets a DurableLink (cluster.durable_link) to that member while it has room, and one it ended
here is ended there.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from functools import partial
from typing import Final

from sluiceway.client.credentials import read_password_file
from sluiceway.cluster.demand import Demand, LocalConsumers, read_demand
from sluiceway.cluster.durable_link import DurableLink, end_at_home
from sluiceway.cluster.durables import (
    DatabaseDurables,
    DurableDirectory,
    DurableRecords,
    own_durables,
)
from sluiceway.cluster.forwarding import Seen
from sluiceway.cluster.peer_link import Budget, LinkSettings, PeerLink, end_task
from sluiceway.cluster.peers import DatabasePeers, Peer, Peers, Reading
from sluiceway.cluster.positions import DatabasePositions, Position, PositionExchange
from sluiceway.config.cluster import ClusterConfig
from sluiceway.core.broker import read_by_client
from sluiceway.core.model.queue import Queue
from sluiceway.errors import BrokerError, ClientError, ConfigError, ProtocolError, SluicewayError
from sluiceway.naming import DestinationName
from sluiceway.persist.database import member_database

log = logging.getLogger(__name__)

DEMAND_INTERVAL_S: Final = 0.25  # how often the local demand is read and handed to the links


def wanted_routes(demand: Demand, flow_limit: int) -> dict[DestinationName, int]:
    """The destinations every link should carry for `demand`, each with its window. Among the
    queues, those of subscribers of durable subscriptions living elsewhere: what another member
    holds in its own such queue (its subscriber left it there) comes here with the queue."""
    wanted = {
        name: min(flow_limit, queue.room) for name, queue in demand.queues.items() if queue.room > 0
    }
    for name in demand.topics:
        wanted[name] = flow_limit
    return wanted


class Links:
    """This broker's links, kept to the members `peers` names and to the local demand."""

    def __init__(
        self,
        local: LocalConsumers,
        peers: Peers,
        settings: LinkSettings,
        *,
        peers_interval: float,
        demand_interval: float = DEMAND_INTERVAL_S,
        durables: DurableRecords | None = None,
        positions: PositionExchange | None = None,
    ) -> None:
        self.local = local
        self.peers = peers
        self.settings = settings
        self.peers_interval = peers_interval
        self.demand_interval = demand_interval
        self.links: dict[str, PeerLink] = {}  # by the member's broker id
        self._members: dict[str, Peer] = {}  # the members linked to, by broker id
        # Durable subscriptions across members (cluster.durables): the record, what it says,
        # and the links that bring those living elsewhere to their subscribers here.
        self.durables = durables
        self.directory = DurableDirectory(settings.broker_id)
        self.durable_links: dict[DestinationName, DurableLink] = {}  # by the queue read here
        self._durable_seen: dict[DestinationName, Seen] = {}
        self._durables_reading = Reading("exchange the cluster's durable subscriptions")
        self._removal_failing: set[tuple[str, str]] = set()
        self._split: set[tuple[str, str]] = set()  # here and recorded elsewhere: warned of
        # Where the pipelines' lease groups and sinks live (cluster.positions).
        self.positions = positions
        # What each member's link published here, kept while the member's link is made again.
        self.seen: dict[str, Seen] = {}
        self.budget = Budget()  # what the links may publish here until the next reading
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._peers_failing = False  # told once per outage of the members' source

    def forwarded_from(self, broker_id: str, message_id: str) -> bool:
        """Whether a link published here, lately, the message `message_id` of member
        `broker_id` (forwarding.Seen: the latest ids, in memory). Call on the loop."""
        seen = self.seen.get(broker_id)
        return seen is not None and message_id in seen

    def start(self) -> None:
        """Start following the members and the demand (on the broker's event loop)."""
        self._stopping = False
        self._task = asyncio.create_task(self._watch(), name="sluiceway-links")

    async def stop(self, grace: float | None = None) -> None:
        """Stop every link: each finishes the batch on its way within `grace` seconds (default:
        the links' timeout), then closes; the members get back what the links still held."""
        task, self._task = self._task, None
        self._stopping = True  # the watcher ends at its next turn, even had it missed the cancel
        if task is not None:
            await end_task(task)
        for link in [*self.links.values(), *self.durable_links.values()]:
            await link.stop(grace)
        self.links.clear()
        self.durable_links.clear()
        for source in (self.peers, self.durables, self.positions):
            close = getattr(source, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        next_peers = loop.time()
        while not self._stopping:
            try:
                members_round = loop.time() >= next_peers
                if members_round:
                    await self._follow_peers()
                    await self._exchange_durables()
                    if self.positions is not None:
                        await self.positions.exchange()
                    next_peers = loop.time() + self.peers_interval
                demand = self._follow_demand()
                await self._follow_durables(demand)
                # A removal is tried at once, then once a round while it fails.
                if members_round or set(self.directory.removals) - self._removal_failing:
                    await self._end_removed()
            except Exception:  # the links must survive a bug in one reading
                log.exception("following the cluster's members and demand failed")
            await asyncio.sleep(self.demand_interval)

    def _follow_demand(self) -> Demand:
        demand = read_demand(self.local)
        self.budget.refresh({name: queue.room for name, queue in demand.queues.items()})
        wanted = wanted_routes(demand, self.settings.flow_limit)
        for link in self.links.values():
            link.want(wanted)
            link.wake()  # messages waiting for budget may go now
        return demand

    async def _exchange_durables(self) -> None:
        """Record this broker's durable subscriptions and read where the others' live."""
        if self.durables is None:
            return
        own = own_durables(self.local)
        homes = await self._durables_reading.run(partial(self.durables.exchange, own))
        if homes is None:
            return  # what was read last is kept until it can be read again
        keys = [(client_id, name) for client_id, name, _ in own]
        for key in keys:
            home = homes.get(key)
            if home is not None and key not in self._split:
                self._split.add(key)  # told once
                log.warning(
                    "durable subscription %r of client %r exists here and on member %s, where "
                    "the cluster's record keeps it: its subscriber attached here before this "
                    "member learnt of the other (within a monitor interval). Each keeps its own "
                    "messages; end one of them (UNSUBSCRIBE with its durable name)",
                    key[1],
                    key[0],
                    home,
                )
        self._split.intersection_update(key for key in keys if key in homes)
        self.directory.update(homes, keys)

    async def _follow_durables(self, demand: Demand) -> None:
        """A DurableLink for every queue here whose subscriber reads a durable subscription
        living on an operating member, to that member; the others stopped."""
        queues = [name for name, queue in demand.queues.items() if queue.consumers]
        directory = self.directory
        directory.detach(set(directory.attachments) - set(queues))
        wanted: dict[DestinationName, DurableLink] = {}
        for queue, attachment in directory.attached(queues).items():
            peer = self._member(directory.home(attachment.key))
            if peer is None:
                continue  # its home does not operate now: its subscriber waits
            link = self.durable_links.get(queue)
            if link is None or link.peer != peer or link.attachment != attachment:
                seen = self._durable_seen.setdefault(queue, Seen())
                link = DurableLink(
                    peer,
                    self.settings,
                    attachment,
                    queue,
                    seen=seen,
                    budget=self.budget,
                    read=partial(self._read_here, queue),
                )
            wanted[queue] = link
        for queue, link in list(self.durable_links.items()):
            if wanted.get(queue) is not link:
                del self.durable_links[queue]
                await link.stop()
        for queue in list(self._durable_seen):
            if queue not in self.directory.attachments:
                del self._durable_seen[queue]
        for queue, link in wanted.items():
            if queue not in self.durable_links:
                self.durable_links[queue] = link
                link.start()
            room = demand.queues[queue].room
            link.want({queue: min(self.settings.flow_limit, room)} if room > 0 else {})
            link.wake()

    def _read_here(self, queue: DestinationName) -> bool:
        """Whether a subscriber reads `queue` here now (another member's link does not count)."""
        destination = self.local.registry.get(queue)
        return isinstance(destination, Queue) and read_by_client(destination)

    def _member(self, broker_id: str | None) -> Peer | None:
        """The member `broker_id` as linked to; this broker itself over its own listener."""
        if broker_id == self.settings.broker_id:
            return Peer(broker_id, self.settings.local_host, self.settings.local_port)
        return None if broker_id is None else self._members.get(broker_id)

    async def _end_removed(self) -> None:
        """End at their homes the durable subscriptions their subscribers ended here."""
        for key, home in list(self.directory.removals.items()):
            peer = self._members.get(home)
            if peer is None:
                continue  # its home does not operate now: tried again when it does
            try:
                await end_at_home(peer, self.settings, key)
            except (OSError, TimeoutError, ClientError, BrokerError, ProtocolError) as exc:
                if key not in self._removal_failing:
                    self._removal_failing.add(key)
                    log.warning(
                        "cannot end durable subscription %r of client %r on member %s yet, "
                        "trying again: %s",
                        key[1],
                        key[0],
                        home,
                        exc,
                    )
                continue
            self._removal_failing.discard(key)
            self.directory.removed(key)

    async def _follow_peers(self) -> None:
        try:
            peers = await asyncio.to_thread(self.peers.current)
        except SluicewayError as exc:  # keep the links there are until the members can be read
            if not self._peers_failing:
                log.warning("cannot read the cluster's members, links kept as they are: %s", exc)
            self._peers_failing = True
            return
        self._peers_failing = False
        await self.follow(peers)

    async def follow(self, peers: list[Peer]) -> None:
        """Link to exactly `peers`: new members get a link, gone ones lose theirs, a member
        that moved gets a new one."""
        current = {peer.broker_id: peer for peer in peers}
        self._members = current
        if self.positions is not None:
            self.positions.directory.follow(peers)
        for broker_id, link in list(self.links.items()):
            if current.get(broker_id) != link.peer:
                del self.links[broker_id]
                log.info("unlinking from member %s", link.peer)
                await link.stop()
        for broker_id, peer in current.items():
            if broker_id not in self.links and broker_id != self.settings.broker_id:
                seen = self.seen.setdefault(broker_id, Seen())
                link = PeerLink(peer, self.settings, seen, self.budget)
                self.links[broker_id] = link
                link.start()


def cluster_links(
    local: LocalConsumers,
    config: ClusterConfig,
    stomp: tuple[str, int] | None,
    own_positions: Callable[[], list[Position]] | None = None,
) -> Links:
    """The links of a broker of an enhanced cluster (`imq.cluster.ha`): members read from the
    shared database, the broker's own plain STOMP listener at `stomp` to publish to (None: it
    has none, which a member cannot do without), and with `own_positions` (this broker's
    pipeline positions, read on its loop) the record of where each lives."""
    if stomp is None:
        raise ConfigError(
            "imq.stomp.tcp.port",
            "imq.cluster.ha=true needs the plain STOMP listener (imq.stomp.tcp.port is -1): the "
            "links that bring other members' messages to this broker's consumers publish "
            "through it",
        )
    host, port = stomp
    password = None
    if config.link_password_file:
        password = read_link_password(config.link_password_file)
    settings = LinkSettings(
        broker_id=config.broker_id,
        local_host=loopback_if_any(host),
        local_port=port,
        flow_limit=config.cluster_flow_limit,
        username=config.link_username or None,
        password=password,
        timeout=max(config.jdbc_connect_timeout, config.lease_seconds),
        heartbeat_s=config.heartbeat_interval,
    )
    database = member_database(config)
    peers = DatabasePeers(database, config.cluster_id, config.broker_id)
    durables = DatabaseDurables(database, config.cluster_id, config.broker_id)
    positions = None
    if own_positions is not None:
        records = DatabasePositions(database, config.cluster_id, config.broker_id)
        positions = PositionExchange(records, own_positions, config.broker_id)
    return Links(
        local,
        peers,
        settings,
        peers_interval=config.monitor_interval,
        durables=durables,
        positions=positions,
    )


def read_link_password(path: str) -> str:
    """The first line of the link password file; refused when others may read it."""
    return read_password_file(path, "imq.cluster.link.password.file", "link password file")


def loopback_if_any(host: str) -> str:
    """`host` to connect to: a listener on every address (0.0.0.0, ::) is reached over loopback."""
    try:
        unspecified = not host or ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name
        return host
    return "127.0.0.1" if unspecified else host
