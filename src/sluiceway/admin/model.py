"""What operators see: snapshots of the broker's state, as plain values for the API and the CLI.

Each snapshot is a frozen dataclass of JSON-able fields, named after the imqcmd columns where
Open MQ has one (`list dst`: Name, Type, State, Producers, Consumers, Msgs Count, UnAck, Avg
Size...). Snapshots are read on the broker's event loop and never hold references into it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluiceway import __version__
from sluiceway.admin.readers import ReaderSnapshot, destination_readers, pipeline_readers
from sluiceway.admin.statistics import subscriptions_of, totals_of
from sluiceway.config import BROKER_PROPERTIES, DESTINATION_PROPERTIES
from sluiceway.config.properties import format_default
from sluiceway.core.broker import Broker
from sluiceway.core.features.dead_letters import DMQ_NAME
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.queue import QueueSubscription
from sluiceway.core.model.subscription import Subscription
from sluiceway.core.model.topic import DurableSubscription, Topic
from sluiceway.core.values.memory import MemoryLevel
from sluiceway.naming import DestinationKind

if TYPE_CHECKING:
    from sluiceway.admin.metrics import CountTrend, DestinationTrend
    from sluiceway.admin.view import BrokerView


def to_json(value: Any) -> Any:
    """A snapshot (or a list of them) as JSON-able data."""
    if isinstance(value, list):
        return [to_json(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def destination_state(destination: Destination) -> str:
    """Open MQ's destination states: RUNNING, PAUSED, PRODUCERS_PAUSED, CONSUMERS_PAUSED."""
    if destination.paused_producers and destination.paused_consumers:
        return "PAUSED"
    if destination.paused_producers:
        return "PRODUCERS_PAUSED"
    if destination.paused_consumers:
        return "CONSUMERS_PAUSED"
    return "RUNNING"


@dataclass(frozen=True, slots=True)
class Totals:
    """Counters since the destination was created (one field per DESTINATION_STATISTICS)."""

    msgs_in: int
    msgs_out: int
    bytes_in: int
    bytes_out: int
    consumed: int
    redelivered: int
    expired: int
    late: int
    deadline_misses: int
    dead: int
    dropped: int
    discarded: int


@dataclass(frozen=True, slots=True)
class DestinationSummary:
    """One row of `list dst`."""

    name: str
    type: str  # queue | topic
    path: str
    state: str
    throttled: bool
    producers: int
    consumers: int  # STOMP consumers: active and backup
    active_consumers: int
    backup_consumers: int
    pipeline_readers: int  # a topic's cursor groups, a queue's lease groups (admin.readers)
    msgs: int  # held: waiting, being delivered, unacknowledged (a topic: copies)
    pending: int  # waiting for a consumer
    unacked: int
    msg_bytes: int
    avg_size: float
    held_sends: int  # SENDs held for producers of it


@dataclass(frozen=True, slots=True)
class DestinationDetail:
    """`query dst`: the summary, every property, counters, flow-control state."""

    summary: DestinationSummary
    properties: dict[str, str]  # Open MQ property name -> value
    totals: Totals
    durables: int
    paused_consumers: list[ConsumerSnapshot]  # by flow control: window used up
    consumers: list[ConsumerSnapshot]  # every one, with its window as it is now
    held_producers: list[dict[str, Any]]
    trend: DestinationTrend | None  # peaks, averages, rates (from the metrics sampler)
    readers: list[ReaderSnapshot]  # its pipeline readers, with their lag


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    connection: int
    id: str
    destination: str
    ack: str
    selector: str
    durable: str  # the durable subscription's name, or ""
    backup: bool
    window_limit: int  # -1: unlimited; adaptive: its size now
    window_threshold: int  # percent: the window refills once unconsumed falls to limit x this
    window_auto: bool  # the broker sizes the window (consumerFlowLimit=auto)
    window_max: int  # adaptive: the most it grows to; else window_limit
    pace_ms: float | None  # measured time per message (adaptive windows, fair dispatch)
    round_trip_ms: float | None  # adaptive: measured delivery-to-acknowledgement round trip
    pool_size: int  # handlers it declared (consumer-pool-size); 0: none
    outstanding: int  # given to it and not consumed
    staged: int  # given and not yet written
    unacked: int
    delivered: int
    flow_paused_for: float | None  # seconds its window has been used up, or None


@dataclass(frozen=True, slots=True)
class HeldProducerSnapshot:
    """One connection whose SENDs the broker holds, with the reason of its oldest held SEND."""

    connection: int
    destination: str
    reason: str  # short, e.g. "destination full", "producer throttled", "producers paused"
    limit: str  # the property that holds it (e.g. maxNumMsgs), or ""
    detail: str  # the full explanation, with the limit's value
    held_for: float  # seconds its oldest held SEND has waited
    held_sends: int
    held_bytes: int


@dataclass(frozen=True, slots=True)
class ConnectionSnapshot:
    """One row of `list cxn`."""

    id: int
    service: str
    peer: str
    user: str
    client_id: str
    state: str
    version: str
    subscriptions: int
    producers: int  # destinations it produces to
    outstanding: int
    held_sends: int
    held_reason: str
    write_buffer: int
    reading_paused: bool
    writing_paused: bool
    connected_for: float  # seconds
    msgs_in: int  # SENDs received
    msgs_out: int  # MESSAGEs sent
    bytes_in: int  # on the wire
    bytes_out: int


@dataclass(frozen=True, slots=True)
class ConnectionDestroyed:
    """The answer of `destroy cxn`."""

    id: int
    peer: str
    user: str  # "" when authentication was off when it connected
    reason: str  # as sent to the client; "" when none was given


@dataclass(frozen=True, slots=True)
class DurableSnapshot:
    """One row of `list dur`."""

    name: str
    client_id: str
    topic: str
    selector: str
    state: str  # ACTIVE | INACTIVE
    backlog: int  # messages not yet delivered to it
    unacked: int


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    level: str
    used: int  # messages in memory, as the ledger counts them
    external: int  # bytes waiting in write buffers
    peak: int
    budget: int
    thresholds: dict[str, int]  # level -> percent
    swap_point: int  # bytes; 0: never swap


@dataclass(frozen=True, slots=True)
class DiskSnapshot:
    """The disk holding the journal (core.features.disk)."""

    state: str  # ok | low (below the free-space floor) | full (writes fail) | failed
    reason: str  # why it is not ok, and what to do; "" when ok
    since: int  # ms since the epoch: when it entered this state
    path: str  # the journal's directory ("" with the memory store)
    free: int  # bytes free on its file system (-1: not measured)
    total: int  # bytes of that file system (-1: not measured)
    free_limit: int  # imq.persist.file.disk.free.limit (0: no floor)
    backlog: int  # bytes of journal records waiting in memory for the disk
    backlog_limit: int  # imq.persist.file.disk.backlog.max_size
    reading_paused: bool  # the backlog is at its limit: no client is read


@dataclass(frozen=True, slots=True)
class BrokerSnapshot:
    """`query bkr`."""

    version: str
    instance: str
    started: int  # ms since the epoch
    uptime: float  # seconds
    services: dict[str, str]  # name -> host:port
    connections: int
    destinations: int
    msgs: int  # held in all destinations (imq.system.max_count counts these)
    msg_bytes: int
    dmq_msgs: int
    dmq_bytes: int
    held_producers: int
    throttled: list[str]
    memory: MemorySnapshot
    store: str  # file | memory
    disk_bytes: int  # the journal's size
    disk: DiskSnapshot
    counts: list[CountTrend]  # the counts clients make grow, their limits and refusals
    properties: dict[str, str] = field(default_factory=dict)


def destination_summary(broker: Broker, destination: Destination) -> DestinationSummary:
    subscriptions = subscriptions_of(destination)
    backups = sum(1 for s in subscriptions if isinstance(s, QueueSubscription) and s.backup)
    unacked = sum(len(s.unacked) for s in subscriptions)
    msgs = destination.held_count
    return DestinationSummary(
        name=destination.name.name,
        type=destination.name.kind.value,
        path=destination.name.path,
        state=destination_state(destination),
        throttled=destination.throttled,
        producers=len(destination.producers),
        consumers=len(subscriptions),
        active_consumers=len(subscriptions) - backups,
        backup_consumers=backups,
        pipeline_readers=pipeline_readers(broker, destination),
        msgs=msgs,
        pending=destination.pending_count,
        unacked=unacked,
        msg_bytes=destination.held_bytes,
        avg_size=round(destination.held_bytes / msgs, 1) if msgs else 0.0,
        held_sends=destination.held_sends,
    )


def destination_properties(destination: Destination) -> dict[str, str]:
    kind = destination.name.kind
    settings = destination.settings
    return {
        name: info.text(getattr(settings, field_name))
        for name, (field_name, info) in DESTINATION_PROPERTIES.items()
        if kind in info.kinds
    }


def consumer_snapshot(subscription: Subscription, now: float) -> ConsumerSnapshot:
    since = subscription.paused_since
    window = subscription.window
    auto = subscription.auto
    return ConsumerSnapshot(
        connection=subscription.connection.number,
        id=subscription.id,
        destination=subscription.destination.name.path,
        ack=subscription.ack_mode.value,
        selector=subscription.selector.text if subscription.selector is not None else "",
        durable=subscription.state.record.name
        if isinstance(subscription, DurableSubscription)
        else "",
        backup=isinstance(subscription, QueueSubscription) and subscription.backup,
        window_limit=window.limit if window.limit > 0 else -1,
        window_threshold=subscription.flow.threshold,
        window_auto=auto is not None,
        window_max=subscription.flow.limit if subscription.flow.limit > 0 else -1,
        pace_ms=None if subscription.pace is None else round(subscription.pace * 1000, 3),
        round_trip_ms=None
        if auto is None or auto.round_trip is None
        else round(auto.round_trip * 1000, 3),
        pool_size=subscription.flow.pool,
        outstanding=window.outstanding,
        staged=len(subscription.staged),
        unacked=len(subscription.unacked),
        delivered=subscription.delivered,
        flow_paused_for=None if since is None else round(now - since, 3),
    )


def destination_detail(
    broker: Broker, destination: Destination, trend: DestinationTrend | None = None
) -> DestinationDetail:
    now = broker.clock.monotonic()
    subscriptions = subscriptions_of(destination)
    held = [
        dataclasses.asdict(h)
        for h in broker.producers.held()
        if h.destination == destination.name.path
    ]
    durables = len(destination.durables) if isinstance(destination, Topic) else 0
    return DestinationDetail(
        summary=destination_summary(broker, destination),
        properties=destination_properties(destination),
        totals=Totals(**totals_of(destination.stats)),
        durables=durables,
        paused_consumers=[
            consumer_snapshot(s, now) for s in subscriptions if s.paused_since is not None
        ],
        consumers=[consumer_snapshot(s, now) for s in subscriptions],
        held_producers=held,
        trend=trend,
        readers=destination_readers(broker, destination),
    )


def list_destinations(broker: Broker, kind: DestinationKind | None = None) -> list[Destination]:
    """Destinations sorted by type then name; the dead message queue is always listed."""
    found = [d for d in broker.registry if kind is None or d.name.kind is kind]
    return sorted(found, key=lambda d: (d.name.kind.value, d.name.name))


def consumers(broker: Broker) -> list[ConsumerSnapshot]:
    now = broker.clock.monotonic()
    return [
        consumer_snapshot(s, now) for d in list_destinations(broker) for s in subscriptions_of(d)
    ]


def held_producers(broker: Broker) -> list[HeldProducerSnapshot]:
    """Every connection with held SENDs, in the order they were held."""
    now = broker.clock.monotonic()
    return [
        HeldProducerSnapshot(
            connection=held.connection,
            destination=held.destination,
            reason=held.reason,
            limit=held.limit or "",
            detail=held.detail,
            held_for=round(now - held.since, 3),
            held_sends=held.held_sends,
            held_bytes=held.held_bytes,
        )
        for held in broker.producers.held()
    ]


def connections(broker: Broker, services: BrokerView) -> list[ConnectionSnapshot]:
    now_ms = broker.clock.time_ms()
    rows = []
    for info in services.connections():
        core = broker.connections.get(info.number)
        rows.append(
            ConnectionSnapshot(
                id=info.number,
                service=info.service,
                peer=info.peer,
                user=(core.user or "") if core is not None else "",
                client_id=(core.client_id or "") if core is not None else "",
                state=info.state,
                version=info.version or "",
                subscriptions=info.subscriptions,
                producers=len(core.produced_to) if core is not None else 0,
                outstanding=info.outstanding,
                held_sends=info.held_sends,
                held_reason=info.held_reason or "",
                write_buffer=info.write_buffer,
                reading_paused=info.reading_paused,
                writing_paused=info.writing_paused,
                connected_for=round((now_ms - core.opened) / 1000, 3) if core is not None else 0.0,
                msgs_in=info.traffic.msgs_in,
                msgs_out=info.traffic.msgs_out,
                bytes_in=info.traffic.bytes_in,
                bytes_out=info.traffic.bytes_out,
            )
        )
    return sorted(rows, key=lambda c: c.id)


def durables(broker: Broker) -> list[DurableSnapshot]:
    rows = []
    for (client_id, name), topic in sorted(broker.durables.items()):
        state = topic.durables[(client_id, name)]
        active = state.active
        backlog = topic.last_seq - state.cursor + 1 + len(state.redeliver)
        rows.append(
            DurableSnapshot(
                name=name,
                client_id=client_id,
                topic=topic.name.path,
                selector=state.record.selector,
                state="ACTIVE" if active is not None else "INACTIVE",
                backlog=max(0, backlog) + (len(active.staged) if active is not None else 0),
                unacked=len(active.unacked) if active is not None else 0,
            )
        )
    return rows


def broker_snapshot(broker: Broker, services: BrokerView, started: float) -> BrokerSnapshot:
    ledger = broker.ledger
    policy = ledger.policy
    dmq = broker.registry.get(DMQ_NAME)
    config = broker.config
    return BrokerSnapshot(
        version=__version__,
        instance=broker.instance_id,
        started=int(started * 1000),
        uptime=round(time.time() - started, 3),
        services={name: f"{host}:{port}" for name, (host, port) in services.addresses().items()},
        connections=len(broker.connections),
        destinations=len(broker.registry),
        msgs=broker.context.system.count,
        msg_bytes=broker.context.system.bytes,
        dmq_msgs=dmq.held_count if dmq is not None else 0,
        dmq_bytes=dmq.held_bytes if dmq is not None else 0,
        held_producers=len(broker.producers.held()),
        throttled=sorted(d.name.path for d in broker.registry if d.throttled),
        memory=MemorySnapshot(
            level=MemoryLevel(ledger.level).name,
            used=ledger.used,
            external=ledger.external,
            peak=ledger.peak,
            budget=policy.budget,
            thresholds={level.name: policy.thresholds[level] for level in MemoryLevel},
            swap_point=ledger.threshold,
        ),
        store=config.persist_store,
        disk_bytes=broker.store.disk_bytes(),
        disk=disk_snapshot(broker),
        counts=services.metrics.counts(),
        properties=broker_properties(broker),
    )


def disk_snapshot(broker: Broker) -> DiskSnapshot:
    status = broker.disk.status()
    return DiskSnapshot(
        state=status.level.name.lower(),
        reason=status.reason,
        since=status.since_ms,
        path=status.path,
        free=status.free,
        total=status.total,
        free_limit=status.floor,
        backlog=status.backlog,
        backlog_limit=status.backlog_limit,
        reading_paused=status.reading_stopped,
    )


def broker_properties(broker: Broker) -> dict[str, str]:
    """Every broker property with its value in force, by its Open MQ name."""
    config = broker.config
    return {
        name: format_default(getattr(config, field_name))
        for name, (field_name, _) in BROKER_PROPERTIES.items()
    }
