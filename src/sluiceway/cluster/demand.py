"""What this broker's own consumers want, read from the core: the demand the links serve.

For each queue: how many local consumers it has, how many more messages they may be given now
(the free credit of their consumer flow windows, `imqConsumerFlowLimit` / `consumerFlowLimit`,
core.values.flow) and how many messages wait in the queue already (its backlog). For each topic:
whether a local subscriber exists, or a durable subscription, attached or not: a durable
subscription keeps what is published while its subscriber is away, so the topic's messages
must keep reaching this broker for it.

The links' own connections are never demand: a member's link is a consumer here only to carry
messages to that member, and counting it would make this broker ask for what it is about to
forward away (messages would bounce between brokers). Links connect with a client id that
starts with LINK_CLIENT_PREFIX, and their connections are left out by it. A client that
chose such a client id itself is left out too: its demand alone does not pull messages here
(it still gets what reaches this broker).

Reading walks every subscription of every connection; the links do it a few times a second, on
the broker's event loop (the core is not thread-safe).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from sluiceway.core.connection import CoreConnection
from sluiceway.core.model.browsing import BrowserSubscription, TopicBrowserSubscription
from sluiceway.core.model.queue import QueueSubscription
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.subscription import Subscription
from sluiceway.core.model.topic import DurableSubscription, Topic, TopicSubscription
from sluiceway.core.values.flow import UNLIMITED_STAGING
from sluiceway.naming import CLUSTER_LINK_PREFIX, DestinationName

LINK_CLIENT_PREFIX: Final = CLUSTER_LINK_PREFIX


def link_client_id(broker_id: str) -> str:
    """The client id of the links of broker `broker_id`, at every member."""
    return f"{LINK_CLIENT_PREFIX}{broker_id}"


def is_link(connection: CoreConnection) -> bool:
    client_id = connection.client_id
    return client_id is not None and client_id.startswith(LINK_CLIENT_PREFIX)


class LocalConsumers(Protocol):
    """The part of the core the demand is read from (core.broker): the open connections, the
    durable subscriptions by client id and name, with the topic of each, and the destinations."""

    @property
    def connections(self) -> Mapping[int, CoreConnection]: ...

    @property
    def durables(self) -> Mapping[tuple[str, str], Topic]: ...

    @property
    def registry(self) -> DestinationRegistry: ...


@dataclass(frozen=True, slots=True)
class QueueDemand:
    """One queue as its local consumers see it; counts are messages."""

    consumers: int
    free: int  # more messages the consumers may be given now (window credit)
    backlog: int  # messages in the queue waiting for a consumer

    @property
    def room(self) -> int:
        """Messages the consumers could take beyond what already waits for them here."""
        return self.free - self.backlog if self.consumers else 0


@dataclass(frozen=True, slots=True)
class Demand:
    """The local demand at one moment."""

    queues: Mapping[DestinationName, QueueDemand] = field(default_factory=dict)
    topics: frozenset[DestinationName] = frozenset()


def free_credit(subscription: Subscription) -> int:
    """Messages `subscription` may be given now, as its window and its connection allow."""
    if subscription.destination.paused_consumers or not subscription.connection.can_stage():
        return 0
    window = subscription.window
    if window.unlimited:
        return max(0, UNLIMITED_STAGING - window.outstanding)
    return window.credit


def read_demand(local: LocalConsumers) -> Demand:
    """The demand of every local consumer that is not a link's."""
    consumers: dict[DestinationName, int] = {}
    free: dict[DestinationName, int] = {}
    backlog: dict[DestinationName, int] = {}
    topics: set[DestinationName] = set()
    for connection in local.connections.values():
        if is_link(connection) or connection.closed:
            continue
        for subscription in connection.subscriptions.values():
            if isinstance(subscription, BrowserSubscription | TopicBrowserSubscription):
                continue  # a browse reads what is here; it asks for nothing to come
            destination = subscription.destination
            name = destination.name
            if name.is_system:
                continue
            if isinstance(subscription, TopicSubscription | DurableSubscription):
                topics.add(name)
            elif isinstance(subscription, QueueSubscription) and not subscription.backup:
                consumers[name] = consumers.get(name, 0) + 1
                free[name] = free.get(name, 0) + free_credit(subscription)
                backlog[name] = destination.pending_count
    for (client_id, _), topic in local.durables.items():
        if not client_id.startswith(LINK_CLIENT_PREFIX):
            topics.add(topic.name)
    queues = {
        name: QueueDemand(count, free[name], backlog[name]) for name, count in consumers.items()
    }
    return Demand(queues, frozenset(topics))
