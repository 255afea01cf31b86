"""Sessions: where producers, consumers and queue browsers come from.

The acknowledgement modes and transactions a session applies to them are in `session_state`;
`AckMode` is also importable from here.
"""

from __future__ import annotations

from sluiceway.client.browser import QueueBrowser
from sluiceway.client.consumer import Consumer
from sluiceway.client.producer import Producer, RetryPolicy
from sluiceway.client.session_state import AckMode, SessionState
from sluiceway.protocol.frames import Frame

__all__ = ["AckMode", "Session"]


class Session(SessionState):
    """A single-threaded context for producing and consuming."""

    def producer(
        self,
        destination: str | None = None,
        *,
        persistent: bool = True,
        priority: int = 4,
        time_to_live: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Producer:
        """A producer, for one destination or (destination None) any given at send time."""
        return Producer(
            self,
            destination,
            persistent=persistent,
            priority=priority,
            time_to_live=time_to_live,
            retry=retry,
        )

    async def consumer(
        self,
        destination: str,
        selector: str | None = None,
        *,
        durable_name: str | None = None,
    ) -> Consumer:
        """Subscribe to `destination`; the broker's RECEIPT gives the effective flow limit."""
        consumer = Consumer(self, destination, selector, durable_name=durable_name)
        await consumer.subscribe()
        self._consumers.append(consumer)
        return consumer

    async def durable_subscriber(
        self, topic: str, name: str, selector: str | None = None
    ) -> Consumer:
        """A durable subscription called `name` to `topic` (needs the connection's client id)."""
        return await self.consumer(topic, selector, durable_name=name)

    async def unsubscribe(self, name: str) -> None:
        """Remove durable subscription `name` from the broker."""
        await self.connection.request(
            Frame("UNSUBSCRIBE", {"id": name, "durable-subscription-name": name})
        )

    async def browser(self, queue: str, selector: str | None = None) -> QueueBrowser:
        """Look at the messages waiting in `queue` without consuming them."""
        return QueueBrowser(self, queue, selector)
