"""The cluster as operators see it: its members, their states and leases, and its recent
events (GET /api/v1/cluster, `sluiceway cmd list bkr`, the console's Cluster panel, /metrics).

The members are read by the cluster monitor's thread each round (cluster.monitor), never on the
event loop; this broker's own count of messages is read live. A broker outside a cluster shows
as the one member of its own: itself, OPERATING.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sluiceway.admin import model
from sluiceway.cluster.durables import DurableDirectory
from sluiceway.cluster.lease import MemberState
from sluiceway.cluster.positions import PositionDirectory
from sluiceway.cluster.table import Event, Member

if TYPE_CHECKING:
    from sluiceway.admin.view import BrokerView

API: Final = "/api/v1"


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    """One member, with imqcmd's `list bkr` columns (Broker ID, Address, State, Msgs, Takeover
    Broker ID, Time since last status timestamp)."""

    broker_id: str
    address: str  # its STOMP listener, host:port
    admin_address: str
    state: str  # OPERATING, FAILED, TAKEOVER_STARTED, TAKEOVER_COMPLETE, SHUTDOWN_COMPLETE
    epoch: int
    msgs: int  # messages in its store (its own count, written with each heartbeat)
    taken_over_by: str | None
    heartbeat_age: float | None  # seconds since its last heartbeat, by the database's clock
    started: str | None  # ISO 8601
    takeover_started: str | None
    takeover_ended: str | None
    this_broker: bool


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    at: str  # ISO 8601
    broker_id: str
    kind: str  # joined, rejoined, declared-failed, takeover-started, takeover-complete, ...
    detail: str


@dataclass(frozen=True, slots=True)
class DurableHome:
    """A durable subscription of the cluster and the member it lives on (cluster.durables):
    a subscriber attaching on any member is served from there."""

    client_id: str
    name: str
    broker_id: str


@dataclass(frozen=True, slots=True)
class PositionHome:
    """A pipeline position of the cluster (a queue's lease group, a sink) and the member it
    lives on (cluster.positions): the other members refuse it, naming that member."""

    kind: str  # lease | sink
    destination: str  # the queue of a lease group ("" for a sink)
    name: str  # the group or the sink
    broker_id: str


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster this broker is a member of (ha False: a broker of its own)."""

    ha: bool
    cluster_id: str
    broker_id: str
    members: list[MemberSnapshot]
    events: list[ClusterEvent]
    takeovers: int  # takeovers this broker completed since it started
    durables: list[DurableHome]  # as this broker last read the cluster's record
    positions: list[PositionHome]  # the same


def cluster_view(services: BrokerView) -> ClusterView:
    """Read on the event loop: no database access (the monitor's last reading)."""
    config = services.config
    messages = services.broker.context.system.count
    cluster = services.cluster
    snapshot = cluster.snapshot if cluster is not None else None
    if cluster is None or snapshot is None:
        return ClusterView(
            ha=cluster is not None,
            cluster_id=config.cluster_id,
            broker_id=config.broker_id,
            members=[_this_broker(services, messages)],
            events=[],
            takeovers=0,
            durables=_durables(services),
            positions=_positions(services),
        )
    return ClusterView(
        ha=True,
        cluster_id=config.cluster_id,
        broker_id=config.broker_id,
        members=[_member(m, config.broker_id, messages) for m in snapshot.members],
        events=[_event(event) for event in snapshot.events],
        takeovers=cluster.monitor.takeovers,
        durables=_durables(services),
        positions=_positions(services),
    )


def _durables(services: BrokerView) -> list[DurableHome]:
    directory = services.broker.durable_homes
    if not isinstance(directory, DurableDirectory):
        return []
    homes = dict(directory.homes)
    homes.update(dict.fromkeys(directory.own, directory.broker_id))
    return [DurableHome(key[0], key[1], home) for key, home in sorted(homes.items())]


def _positions(services: BrokerView) -> list[PositionHome]:
    directory = services.broker.leases.homes
    if not isinstance(directory, PositionDirectory):
        return []
    return [PositionHome(*key, home) for key, home in sorted(directory.everywhere().items())]


def _this_broker(services: BrokerView, messages: int) -> MemberSnapshot:
    host, port = services.addresses().get("stomp", (services.config.host, 0))
    return MemberSnapshot(
        broker_id=services.config.broker_id,
        address=f"{host}:{port}",
        admin_address=_address(services.addresses().get("admin")),
        state=MemberState.OPERATING.value,
        epoch=0,
        msgs=messages,
        taken_over_by=None,
        heartbeat_age=None,
        started=None,
        takeover_started=None,
        takeover_ended=None,
        this_broker=True,
    )


def _address(bound: tuple[str, int] | None) -> str:
    return f"{bound[0]}:{bound[1]}" if bound is not None else ""


def _member(member: Member, me: str, messages: int) -> MemberSnapshot:
    this = member.broker_id == me
    return MemberSnapshot(
        broker_id=member.broker_id,
        address=member.stomp_address,
        admin_address=member.admin_address,
        state=member.state,
        epoch=member.epoch,
        msgs=messages if this else member.messages,
        taken_over_by=member.taken_over_by,
        heartbeat_age=round(member.heartbeat_age, 3) if member.heartbeat_age is not None else None,
        started=_iso(member.started_at),
        takeover_started=_iso(member.takeover_started_at),
        takeover_ended=_iso(member.takeover_ended_at),
        this_broker=this,
    )


def _event(event: Event) -> ClusterEvent:
    return ClusterEvent(str(_iso(event.at)), event.broker_id, event.kind, event.detail)


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def metrics(services: BrokerView) -> Iterator[Metric]:
    """/metrics of a cluster member: per member, whether it is up, its heartbeat's age and its
    messages; this broker's lease and the takeovers it completed. Nothing outside a cluster."""
    cluster = services.cluster
    if cluster is None:
        return
    view = cluster_view(services)
    up = GaugeMetricFamily(
        "sluiceway_cluster_member_up",
        "1 while the member is OPERATING in the shared database, else 0",
        labels=["broker_id", "state"],
    )
    age = GaugeMetricFamily(
        "sluiceway_cluster_heartbeat_age_seconds",
        "Seconds since the member's last heartbeat, by the database's clock",
        labels=["broker_id"],
    )
    messages = GaugeMetricFamily(
        "sluiceway_cluster_member_messages",
        "Messages in the member's store (as it wrote with its last heartbeat)",
        labels=["broker_id"],
    )
    for member in view.members:
        up.add_metric([member.broker_id, member.state], int(member.state == "OPERATING"))
        if member.heartbeat_age is not None:
            age.add_metric([member.broker_id], member.heartbeat_age)
        messages.add_metric([member.broker_id], member.msgs)
    yield up
    yield age
    yield messages
    yield GaugeMetricFamily(
        "sluiceway_cluster_lease_remaining_seconds",
        "Seconds this broker's lease holds without another renewal (its own view; at 0 it "
        "stops serving)",
        value=max(cluster.lease.remaining, 0.0),
    )
    yield CounterMetricFamily(
        "sluiceway_cluster_takeovers",
        "Failed members' stores this broker took over",
        value=view.takeovers,
    )


def register(app: web.Application, services: BrokerView) -> None:
    async def get_cluster(request: web.Request) -> web.Response:
        return web.json_response(model.to_json(cluster_view(services)))

    app.router.add_get(f"{API}/cluster", get_cluster)
