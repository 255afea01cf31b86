"""The broker core: destinations and connections, driven by method calls and a clock.

No I/O and no awaiting happen here: the server layer feeds client commands in and writes what
`CoreConnection.take` hands out. `tick()` does the periodic work (expiry sweeps, reclaiming what
stalled connections hold) and is called by the server on a timer, or by a test at will.

`Broker` is the front: it builds the core's components in order, each given the collaborators it
uses, and keeps the methods the server and the administration tools call. The layers below it
(core.values, core.containers, core.model, core.features, core.connection) import only
downwards; where a lower part must reach a higher one it declares what it needs (a Protocol, a
signal, a callback) and the broker passes the higher object in.

Configuration reaches every component one way: the broker holds its configuration in one
`LiveConfig` that every component is given and reads (`current`) when it needs a setting; no
component copies a setting. `update_properties` (`update bkr`) replaces `current` there, and so
reaches all of them at once. The memory ledger and the disk guard are measurements rather than
components: they are given thresholds computed from the configuration, and the broker gives them
new ones in `update_properties`. The connection counts are given their limits once, as those
cannot change while the broker runs.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping

from sluiceway.config import (
    BrokerConfig,
    DestinationSettings,
    LimitBehavior,
    change_settings,
    update_config,
)
from sluiceway.core.connection import ConnectionParts, CoreConnection
from sluiceway.core.containers.pending import Spill
from sluiceway.core.features.cursors import Cursors
from sluiceway.core.features.dead_letters import DeadLetters
from sluiceway.core.features.disk import DiskGuard
from sluiceway.core.features.durable_ports import DurableHomes
from sluiceway.core.features.leases import Leases
from sluiceway.core.features.producers import ProducerControl
from sluiceway.core.features.stages import StageArea
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.store import (
    BrokerSnapshot,
    MemoryStore,
    MessageStore,
    StoreWriteError,
)
from sluiceway.core.model.subscription import MessageFilter
from sluiceway.core.model.topic import DurableState, Topic
from sluiceway.core.values.clock import Clock, SystemClock
from sluiceway.core.values.connection_counts import ConnectionCounts
from sluiceway.core.values.counts import CountRefusals
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.flow import ConnectionFlow
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.memory import MemoryLedger, MemoryLevel, level_policy, swap_point
from sluiceway.core.values.message_ids import MessageIds
from sluiceway.core.values.selector import compile_selector
from sluiceway.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    NotFound,
    ResourceFull,
)
from sluiceway.naming import CLUSTER_LINK_PREFIX, DestinationKind, DestinationName

log = logging.getLogger(__name__)


class PauseTarget(enum.Enum):
    """What `pause dst -pst` pauses."""

    PRODUCERS = "PRODUCERS"
    CONSUMERS = "CONSUMERS"
    ALL = "ALL"


class Broker:
    """Owns the destination registry and the open connections."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        store: MessageStore | None = None,
        spill: Spill | None = None,
    ) -> None:
        self._live = LiveConfig(config)
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.store: MessageStore = store if store is not None else MemoryStore()
        policy = level_policy(config)
        # Without a swap area there is nowhere to spill to, so no threshold applies.
        threshold = swap_point(config, policy) if spill is not None else 0
        self.ledger = MemoryLedger(threshold, policy)
        # The journal's disk (core.features.disk): always OK for a store without one.
        self.disk = DiskGuard(
            self.clock, floor=config.disk_free_limit, backlog_limit=config.disk_backlog_max
        )
        # Message ids are unique across restarts: a random prefix per broker run, then a counter.
        self.ids = MessageIds()
        self.instance_id = self.ids.instance_id
        # The dead message queue is made with the context that has no dead end (its messages are
        # never copied); every other destination's dead messages go to it.
        own = Context(self.clock, self.store, self.ledger, spill)
        self.dead_letters = DeadLetters(own, self.ids, self._live)
        self.context = own.with_dead_end(self.dead_letters)
        self.registry = DestinationRegistry(self._live, self.context)
        self.registry.add(self.dead_letters.queue)
        self.producers = ProducerControl(self._live, self.context, self.registry, self.disk)
        # Durable subscriptions by (client id, name), and the topic that keeps each.
        self.durables: dict[tuple[str, str], Topic] = {}
        # In a cluster, where the durable subscriptions that live on other members are.
        self.durable_homes: DurableHomes | None = None
        self._next_durable_id = 0
        # Refusals by the limits on counts clients make grow (core.values.counts).
        self.refusals = CountRefusals()
        # Topic cursors and queue leases (docs/pipelines-protocol.md).
        self.cursors = Cursors(self.registry, self.refusals)
        self.leases = Leases(self._live, self.registry, self.clock, self.refusals)
        # Stages: batches published exactly once (same document).
        self.stages = StageArea(self._live, self.context, self.registry)
        self.connections: dict[int, CoreConnection] = {}
        self._next_connection = 0
        # The STOMP connections every listener accepted, counted against their limits.
        self.connection_counts = ConnectionCounts(
            config.max_connections, config.max_connections_per_address
        )
        # What every connection works with (core.connection).
        self._parts = ConnectionParts(
            config=self._live,
            clock=self.clock,
            store=self.store,
            registry=self.registry,
            ids=self.ids,
            refusals=self.refusals,
            producers=self.producers,
            stages=self.stages,
            cursors=self.cursors,
            leases=self.leases,
            durables=self,
            closed=self.connection_closed,
        )
        self._last_sweep = self.clock.monotonic()

    @property
    def config(self) -> BrokerConfig:
        """The broker's configuration as it stands (`update_properties` replaces it)."""
        return self._live.current

    def restore_durable(
        self, record: DurableRecord, acked: set[int], delivered: dict[int, int]
    ) -> None:
        """A durable subscription the store held, back on its topic (at start-up, while the
        store recovers: core.model.store.Restore)."""
        topic = self.registry.recovered(DestinationName(DestinationKind.TOPIC, record.topic))
        assert isinstance(topic, Topic)
        state = DurableState(record, _selector(record.selector))
        state.acked_ahead = acked
        state.deliveries = delivered
        topic.add_durable(state)
        self.durables[state.key] = topic
        self._next_durable_id = max(self._next_durable_id, record.sub_id)

    def snapshot(self) -> BrokerSnapshot:
        """The state a store restates when it starts afresh (a journal's new segment): the
        sequence numbers spoken for, and the durable subscriptions."""
        seqs = [(d.name, d.reserved_seq) for d in self.registry if d.reserved_seq]
        durables = [topic.durables[key].record for key, topic in self.durables.items()]
        return seqs, durables

    # -- durable subscriptions ------------------------------------------------------------------

    def durable_state(
        self, topic: Topic, client_id: str, name: str, selector: MessageFilter | None
    ) -> DurableState:
        """The durable subscription `name` of `client_id` on `topic`, created if new.

        As in JMS, subscribing again with another topic or selector replaces the subscription
        (its retained messages are dropped), unless a subscriber is attached to it.
        """
        key = (client_id, name)
        text = selector.text if selector is not None else ""
        current = self.durables.get(key)
        if current is not None:
            state = current.durables[key]
            if current is topic and state.record.selector == text:
                return state
            self.remove_durable(client_id, name)
        self._next_durable_id += 1
        record = DurableRecord(
            self._next_durable_id, topic.name.name, client_id, name, text, topic.last_seq + 1
        )
        state = DurableState(record, selector)
        topic.add_durable(state)
        self.durables[key] = topic
        self.store.durable_created(record)
        return state

    def adopt_durable(self, record: DurableRecord) -> DurableState | None:
        """The durable subscription here that takes over `record`'s (a failed cluster member's):
        the one of the same client id and name, made anew if there is none. None when the one
        here is on another topic or has another selector: its subscriber replaced it, and, as
        in JMS, what the old one retained is dropped."""
        topic = self.registry.recovered(DestinationName(DestinationKind.TOPIC, record.topic))
        assert isinstance(topic, Topic)
        current = self.durables.get((record.client_id, record.name))
        if current is not None:
            state = current.durables[(record.client_id, record.name)]
            if current is not topic or state.record.selector != record.selector:
                return None
            return state
        return self.durable_state(topic, record.client_id, record.name, _selector(record.selector))

    def serve_elsewhere(
        self, client_id: str, name: str, topic: DestinationName, selector: str
    ) -> DestinationName | None:
        """The queue a subscriber of a durable subscription that lives on another member of
        the cluster reads here (core.connection.DurableBook); made if new."""
        homes = self.durable_homes
        if homes is None or (client_id, name) in self.durables:
            return None  # one that lives here is served here
        served = homes.serve(client_id, name, topic, selector)
        if served is None:
            return None
        queue = self.registry.recovered(served)  # made whatever imq.autocreate.queue says
        if isinstance(queue, Queue) and read_by_client(queue):
            raise Conflict(
                "durable subscription in use",
                f"durable subscription {name!r} of client {client_id!r} already has a "
                "subscriber attached",
            )
        return served

    def elsewhere(self, client_id: str, name: str) -> DestinationName | None:
        homes = self.durable_homes
        if homes is None or (client_id, name) in self.durables:
            return None
        return homes.queue_of(client_id, name)

    def remove_durable(self, client_id: str, name: str) -> None:
        """Delete a durable subscription and what its topic kept for it; one that lives on
        another member of the cluster is ended there, and what was brought here for it with
        it."""
        key = (client_id, name)
        topic = self.durables.get(key)
        served = self.elsewhere(client_id, name)
        if topic is None and served is not None and self.durable_homes is not None:
            self.durable_homes.remove(client_id, name)
            if self.registry.get(served) is not None:
                self.destroy_destination(served)
            return
        if topic is None:
            raise NotFound(
                "no such durable subscription",
                f"client {client_id!r} has no durable subscription called {name!r}",
            )
        state = topic.durables[key]
        if state.active is not None:
            raise Conflict(
                "durable subscription in use",
                f"durable subscription {name!r} of client {client_id!r} has a subscriber "
                "attached; unsubscribe it first",
            )
        del self.durables[key]
        topic.remove_durable(key)
        self.store.durable_ended(state.record.sub_id)

    def new_message_id(self) -> str:
        return self.ids.new()

    def open_connection(
        self, *, flow: ConnectionFlow, on_ready: Callable[[], None]
    ) -> CoreConnection:
        """A new client connection; `on_ready` is called when it has messages to write."""
        self._next_connection += 1
        connection = CoreConnection(self._parts, self._next_connection, flow, on_ready)
        self.connections[connection.number] = connection
        return connection

    def connection_closed(self, connection: CoreConnection) -> None:
        self.connections.pop(connection.number, None)

    def tick(self) -> None:
        """Periodic work: reclaim messages held by stalled connections, sweep expired messages,
        keep the journal up (retry the writes that wait for a full disk, measure its free space:
        core.features.disk), measure memory, expire leases past their lease-ttl, review throttling,
        refuse SENDs held past their deadline, and let go those that may go; size adaptive consumer
        windows again."""
        now = self.clock.monotonic()
        reclaim_after = self.config.stalled_reclaim_ms / 1000
        if reclaim_after > 0:
            for connection in list(self.connections.values()):
                since = connection.unwritable_since
                if since is not None and now - since >= reclaim_after:
                    count = connection.reclaim_staged()
                    if count:
                        log.info(
                            "connection %d has not drained its writes for %.1f s: %d staged "
                            "messages given back to their queues",
                            connection.number,
                            now - since,
                            count,
                        )
        for connection in list(self.connections.values()):
            connection.review_windows(now)
        if now - self._last_sweep >= self.config.expiration_interval_s:
            self._last_sweep = now
            self.sweep_expired()
        for topic in set(self.durables.values()):
            topic.trim()
        self.store.maintain()
        self.ledger.check()
        self.leases.expire_due()
        self.stages.expire()
        self.producers.expire(now)
        self.producers.review()
        self.producers.settle()

    def settle(self) -> None:
        """Let held SENDs go where there is room now. The I/O layer calls this after handling
        input and after writing, outside any one connection's frame handling."""
        self.producers.settle()

    # -- administration (the core API the admin tools use) --------------------------------------

    def update_properties(self, properties: Mapping[str, str]) -> BrokerConfig:
        """Change broker properties at run time (`update bkr -o name=value`): the system limits,
        throttling, memory levels, hold settings, auto-create defaults and the log level."""
        try:
            config = update_config(self.config, properties)
        except ConfigError as exc:
            raise BadRequest("bad broker property", str(exc)) from None
        self._live.current = config
        self.producers.changed()  # new limits, throttling or hold settings may let SENDs go
        self.disk.configure(config.disk_free_limit, config.disk_backlog_max)
        policy = level_policy(config)
        self.ledger.policy = policy
        if self.ledger.threshold:  # swapping is on: the swap point may follow the budget
            self.ledger.threshold = swap_point(config, policy)
        logging.getLogger("sluiceway").setLevel(config.log_level)
        log.info("broker properties updated: %s", dict(properties))
        self.producers.settle()
        return config

    def destination(self, name: DestinationName) -> Destination:
        destination = self.registry.get(name)
        if destination is None:
            raise NotFound("no such destination", f"destination {name} does not exist")
        return destination

    def create_destination(
        self, name: DestinationName, properties: Mapping[str, str] | None = None
    ) -> Destination:
        """Create destination `name` with Open MQ's admin defaults and `properties`."""
        if self.registry.get(name) is not None:
            raise Conflict("destination exists", f"destination {name} already exists")
        if name.is_system:
            raise Forbidden(
                "reserved destination name",
                f"destination {name} cannot be created: names beginning with 'mq.' are reserved "
                "for the broker",
            )
        if self.ledger.check() is MemoryLevel.RED:
            raise ResourceFull(
                "memory low",
                f"destination {name} cannot be created while the broker's memory level is RED",
                limit="imq.memory.budget",
                limit_value=str(self.ledger.policy.budget),
            )
        settings = _changed(name, DestinationSettings(), properties or {})
        log.info("destination %s created", name)
        return self.registry.create(name, settings)

    def update_destination(
        self, name: DestinationName, properties: Mapping[str, str]
    ) -> DestinationSettings:
        """Change destination properties (Open MQ names, e.g. {"maxNumMsgs": "5000"}) at run
        time; new limits apply to the next message, a new consumerFlowLimit to new consumers, a new
        deliveryOrder to the pending messages at once."""
        destination = self.destination(name)
        settings = _changed(name, destination.settings, properties)
        if destination.is_dmq and settings.limit_behavior is LimitBehavior.FLOW_CONTROL:
            raise Forbidden(
                "FLOW_CONTROL refused for the dead message queue",
                f"{name} cannot use limitBehavior FLOW_CONTROL: making a message dead must "
                "never wait; use REMOVE_OLDEST, REMOVE_LOW_PRIORITY or REJECT_NEWEST",
            )
        destination.settings = settings
        if isinstance(destination, Queue):
            destination.promote_backups()
            destination.order_changed()
        log.info("destination %s updated: %s", name, dict(properties))
        self.producers.changed()
        self.producers.settle()
        return settings

    def destroy_destination(self, name: DestinationName) -> None:
        """Destroy a destination and the messages it holds (not one with consumers attached)."""
        destination = self.destination(name)
        if destination.is_dmq:
            raise Forbidden("cannot destroy the dead message queue", f"{name} cannot be destroyed")
        durables = [key for key, topic in self.durables.items() if topic is destination]
        if destination.subscription_count or durables:
            raise Conflict(
                "destination in use",
                f"{name} has {destination.subscription_count} consumers and {len(durables)} "
                "durable subscriptions; close and remove them first",
            )
        if destination.staged_count:
            # A COMMIT must be able to publish every message it lists (all or nothing).
            raise Conflict(
                "destination in use",
                f"{name} has {destination.staged_count} staged messages waiting for a COMMIT; "
                "commit or abort their stages first (or let their stage-ttl pass)",
            )
        self.producers.fail_held(
            destination,
            NotFound(
                "destination destroyed",
                f"{name} was destroyed by an administrator while this SEND waited",
                destination=name.path,
            ),
        )
        if isinstance(destination, Queue):
            self.leases.destination_destroyed(destination)
        elif isinstance(destination, Topic):
            self.cursors.topic_destroyed(destination)
        destination.purge()
        for connection in self.connections.values():
            connection.produced_to.discard(destination)
        self.registry.remove(name)
        log.info("destination %s destroyed", name)

    def pause(self, name: DestinationName, target: PauseTarget = PauseTarget.ALL) -> None:
        """Pause a destination's producers (their SENDs are held), consumers (nothing is
        delivered), or both, until `resume`."""
        destination = self._pausable(name)
        if target is not PauseTarget.CONSUMERS:
            destination.paused_producers = True
        if target is not PauseTarget.PRODUCERS:
            destination.paused_consumers = True
        log.info("destination %s paused (%s)", name, target.value)

    def resume(self, name: DestinationName, target: PauseTarget = PauseTarget.ALL) -> None:
        destination = self._pausable(name)
        if target is not PauseTarget.CONSUMERS:
            destination.paused_producers = False
        if target is not PauseTarget.PRODUCERS and destination.paused_consumers:
            destination.paused_consumers = False
            destination.resume_consumers()
        log.info("destination %s resumed (%s)", name, target.value)
        self.producers.changed()
        self.producers.settle()

    def _pausable(self, name: DestinationName) -> Destination:
        destination = self.destination(name)
        if destination.is_dmq:
            raise Forbidden(
                "cannot pause the dead message queue",
                f"{name} cannot be paused: dead messages must always have somewhere to go",
            )
        return destination

    def purge(self, name: DestinationName) -> int:
        """Remove every message of `name` waiting for a consumer; return how many."""
        count = self.destination(name).purge()
        log.info("destination %s purged: %d messages removed", name, count)
        self.producers.settle()
        return count

    def compact(self) -> tuple[int, int]:
        """Reclaim now the disk held by dead journal records (`compact dst`): topics drop what
        no durable subscription needs, then dead segments are deleted and the rest rewritten.
        Returns (segments deleted, segments compacted)."""
        for topic in set(self.durables.values()):
            topic.trim()
        try:
            return self.store.compact()
        except StoreWriteError as exc:
            raise ResourceFull(f"disk {self.disk.level.name.lower()}", str(exc)) from None

    def sweep_expired(self) -> int:
        """Remove every expired message waiting in a destination; return how many."""
        now_ms = self.clock.time_ms()
        return sum(destination.reap_expired(now_ms) for destination in self.registry)

    def close(self) -> None:
        """Close every connection (the store is closed by whoever opened it)."""
        for connection in list(self.connections.values()):
            connection.close()


def _changed(
    name: DestinationName, settings: DestinationSettings, properties: Mapping[str, str]
) -> DestinationSettings:
    try:
        return change_settings(name.kind, settings, properties)
    except ConfigError as exc:
        raise BadRequest("bad destination property", str(exc)) from None


def _selector(text: str) -> MessageFilter | None:
    return compile_selector(text) if text.strip() else None


def read_by_client(queue: Queue) -> bool:
    """Whether a client reads `queue`: a subscriber, not a cluster link taking what is there to
    another member."""
    for subscription in (*queue.consumers, *queue.backups):
        connection = subscription.connection
        client_id = connection.client_id if isinstance(connection, CoreConnection) else None
        if client_id is None or not client_id.startswith(CLUSTER_LINK_PREFIX):
            return True
    return False
