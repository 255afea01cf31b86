"""The ports a connection uses for durable subscriptions: the broker's book of them
(DurableBook) and, in a cluster, where each lives (DurableHomes)."""

from __future__ import annotations

from typing import Protocol

from sluiceway.core.model.subscription import MessageFilter
from sluiceway.core.model.topic import DurableState, Topic
from sluiceway.naming import DestinationName


class DurableBook(Protocol):
    """The broker's durable subscriptions, by client id and name (core.broker keeps them, with
    the journal records that name them)."""

    def durable_state(
        self, topic: Topic, client_id: str, name: str, selector: MessageFilter | None
    ) -> DurableState: ...

    def remove_durable(self, client_id: str, name: str) -> None: ...

    def serve_elsewhere(
        self, client_id: str, name: str, topic: DestinationName, selector: str
    ) -> DestinationName | None:
        """For a subscriber of durable subscription `name` of `client_id` attaching here: the
        queue it reads when the subscription lives on another broker of a cluster (that
        broker's messages for it are brought to this queue), None when it lives here or is
        new. Raises Conflict when a subscriber reads that queue already."""
        ...

    def elsewhere(self, client_id: str, name: str) -> DestinationName | None:
        """The queue subscribers of durable subscription `name` of `client_id` read here when
        it lives on another broker (serve_elsewhere); None when it does not."""
        ...


class DurableHomes(Protocol):
    """Where a cluster's durable subscriptions live, as this broker knows it (cluster.durables):
    a subscriber that attaches here to one that lives on another member reads a queue here
    that brings it that member's messages for it."""

    def serve(
        self, client_id: str, name: str, topic: DestinationName, selector: str
    ) -> DestinationName | None:
        """The queue a subscriber attaching here reads, when the subscription lives elsewhere
        (noted, with its topic and selector, for what brings its messages here)."""
        ...

    def queue_of(self, client_id: str, name: str) -> DestinationName | None:
        """That queue, when the subscription lives elsewhere; nothing is noted."""
        ...

    def remove(self, client_id: str, name: str) -> None:
        """End the subscription where it lives (done later, off this thread)."""
        ...
