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
        pool_size: int = 0,
    ) -> Consumer:
        """Subscribe to `destination`; the broker's RECEIPT gives the effective flow limit.

        `pool_size` declares how many handlers will serve the consumer (the concurrency of its
        listener): an adaptive window (imqConsumerFlowLimit=auto) is never sized below it, within
        its cap. 0 declares none. Raises TypeError or ValueError unless it is an int from 0.
        """
        consumer = Consumer(
            self, destination, selector, durable_name=durable_name, pool_size=pool_size
        )
        await consumer.subscribe()
        self._consumers.append(consumer)
        return consumer

    async def durable_subscriber(
        self, topic: str, name: str, selector: str | None = None, *, pool_size: int = 0
    ) -> Consumer:
        """A durable subscription called `name` to `topic` (needs the connection's client id);
        `pool_size` as for `consumer`."""
        return await self.consumer(topic, selector, durable_name=name, pool_size=pool_size)

    async def unsubscribe(self, name: str) -> None:
        """Remove durable subscription `name` from the broker."""
        await self.connection.request(
            Frame("UNSUBSCRIBE", {"id": name, "durable-subscription-name": name})
        )

    async def browser(self, queue: str, selector: str | None = None) -> QueueBrowser:
        """Look at the messages waiting in `queue` without consuming them."""
        return QueueBrowser(self, queue, selector)
