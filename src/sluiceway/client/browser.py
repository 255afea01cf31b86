"""Queue browsers: the messages waiting in a queue, in delivery order, without consuming them.

The broker sends them `imqQueueBrowserMaxMessagesPerRetrieve` at a time and ends the browse with a
marker; messages that arrive while browsing may or may not be seen (JMS allows either).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sluiceway.client.consumer import Consumer
from sluiceway.client.message import Message
from sluiceway.client.protocol import is_end_marker
from sluiceway.client.session_state import SessionState


class QueueBrowser:
    """`async for message in browser:` yields the queue's messages; each iteration browses anew."""

    def __init__(self, session: SessionState, queue: str, selector: str | None) -> None:
        self.session = session
        self.queue = queue
        self.selector = selector

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._browse()

    async def _browse(self) -> AsyncIterator[Message]:
        consumer = Consumer(self.session, self.queue, self.selector, browse=True)
        await consumer.subscribe()
        try:
            while True:
                message = await consumer.receive()
                if message is None or is_end_marker(message.headers):
                    return
                yield message
        finally:
            await consumer.close()

    async def messages(self) -> list[Message]:
        """Every message the browse sees (for small queues; iterate for large ones)."""
        return [message async for message in self]
