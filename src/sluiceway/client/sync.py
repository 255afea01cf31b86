"""The synchronous client: the asyncio client's names and semantics, without `await`.

    from sluiceway.client.sync import AckMode, ConnectionFactory

    with ConnectionFactory("stomp://127.0.0.1:61613").connect() as connection:
        session = connection.session(AckMode.AUTO)
        session.producer("/queue/orders").send(b"...")
        message = session.consumer("/queue/orders").receive(timeout=5.0)

Each connection runs the asyncio client on an event loop in one thread of its own, started by
`connect()` and joined by `close()`; a listener's handlers run in the consumer's own pool of
threads, shut down when the consumer closes. There is one codec and one protocol implementation:
this module only carries calls across to the loop and waits for their results. Calling the
blocking API from inside the loop's own thread (for example from an `async def` handler) would
deadlock and raises RuntimeError instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from sluiceway.client import connection as aconnection
from sluiceway.client.browser import QueueBrowser as AsyncQueueBrowser
from sluiceway.client.consumer import Consumer as AsyncConsumer
from sluiceway.client.message import Message as AsyncMessage
from sluiceway.client.message import MessageView
from sluiceway.client.producer import Producer as AsyncProducer
from sluiceway.client.producer import RetryPolicy
from sluiceway.client.session import AckMode
from sluiceway.client.session import Session as AsyncSession
from sluiceway.client.settings import ClientSettings

T = TypeVar("T")

__all__ = [
    "AckMode",
    "Connection",
    "ConnectionFactory",
    "Consumer",
    "Message",
    "Producer",
    "QueueBrowser",
    "RetryPolicy",
    "Session",
]


class _Loop:
    """An event loop in a thread of its own, and the way to run work on it from other threads."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="sluiceway-client-loop", daemon=True
        )
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and wait for its result."""
        self._check_thread(coroutine)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call(self, fn: Callable[[], T]) -> T:
        """Run a plain function on the loop (where the asyncio objects live)."""

        async def invoke() -> T:
            return fn()

        return self.run(invoke())

    def _check_thread(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "the synchronous client was called from its own event loop thread, which would "
                "deadlock; use the asyncio API (sluiceway.client) there"
            )

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass(eq=False)
class Message(MessageView):
    """A received message (synchronous API)."""

    body: bytes
    headers: Mapping[str, str]
    _message: AsyncMessage
    _loop: _Loop

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message the session has delivered so far."""
        self._loop.run(_awaited(self._message.acknowledge()))


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _wrap(message: AsyncMessage | None, loop: _Loop) -> Message | None:
    if message is None:
        return None
    return Message(message.body, message.headers, message, loop)


class ConnectionFactory:
    """Makes synchronous connections; takes the same arguments as the asyncio factory."""

    def __init__(
        self,
        address: str | None = None,
        *,
        properties: Mapping[str, str] | str | Path | None = None,
        **keywords: Any,
    ) -> None:
        self._factory = aconnection.ConnectionFactory(address, properties=properties, **keywords)

    @property
    def settings(self) -> ClientSettings:
        return self._factory.settings

    def connect(self) -> Connection:
        loop = _Loop()
        try:
            connection = loop.run(self._factory.connect())
        except BaseException:
            loop.stop()
            raise
        return Connection(connection, loop)


class Connection:
    def __init__(self, connection: aconnection.Connection, loop: _Loop) -> None:
        self._connection = connection
        self._loop = loop

    @property
    def closed(self) -> bool:
        return self._connection.closed

    @property
    def reconnects(self) -> int:
        return self._connection.reconnects

    def session(self, ack_mode: AckMode | None = None, *, transacted: bool = False) -> Session:
        return Session(
            self._loop.call(lambda: self._connection.session(ack_mode, transacted=transacted)),
            self._loop,
        )

    def close(self) -> None:
        """Close the connection and stop its thread."""
        try:
            if self._loop.thread.is_alive():
                self._loop.run(self._connection.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Session:
    def __init__(self, session: AsyncSession, loop: _Loop) -> None:
        self._session = session
        self._loop = loop

    @property
    def ack_mode(self) -> AckMode:
        return self._session.ack_mode

    @property
    def transacted(self) -> bool:
        return self._session.transacted

    def producer(
        self,
        destination: str | None = None,
        *,
        persistent: bool = True,
        priority: int = 4,
        time_to_live: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Producer:
        producer = self._loop.call(
            lambda: self._session.producer(
                destination,
                persistent=persistent,
                priority=priority,
                time_to_live=time_to_live,
                retry=retry,
            )
        )
        return Producer(producer, self._loop)

    def consumer(
        self,
        destination: str,
        selector: str | None = None,
        *,
        durable_name: str | None = None,
        pool_size: int = 0,
    ) -> Consumer:
        consumer = self._loop.run(
            self._session.consumer(
                destination, selector, durable_name=durable_name, pool_size=pool_size
            )
        )
        return Consumer(consumer, self._loop)

    def durable_subscriber(
        self, topic: str, name: str, selector: str | None = None, *, pool_size: int = 0
    ) -> Consumer:
        consumer = self._loop.run(
            self._session.durable_subscriber(topic, name, selector, pool_size=pool_size)
        )
        return Consumer(consumer, self._loop)

    def unsubscribe(self, name: str) -> None:
        self._loop.run(self._session.unsubscribe(name))

    def browser(self, queue: str, selector: str | None = None) -> QueueBrowser:
        return QueueBrowser(self._loop.run(self._session.browser(queue, selector)), self._loop)

    def commit(self, timeout: float | None = None) -> None:
        self._loop.run(self._session.commit(timeout))

    def rollback(self, timeout: float | None = None) -> None:
        self._loop.run(self._session.rollback(timeout))

    def acknowledge(self) -> None:
        self._loop.run(self._session.acknowledge())

    def recover(self) -> None:
        self._loop.run(self._session.recover())

    def close(self) -> None:
        self._loop.run(self._session.close())


class Producer:
    def __init__(self, producer: AsyncProducer, loop: _Loop) -> None:
        self._producer = producer
        self._loop = loop

    def send(
        self,
        body: bytes | str,
        destination: str | None = None,
        *,
        persistent: bool | None = None,
        priority: int | None = None,
        time_to_live: float | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._loop.run(
            self._producer.send(
                body,
                destination,
                persistent=persistent,
                priority=priority,
                time_to_live=time_to_live,
                headers=headers,
                content_type=content_type,
                timeout=timeout,
                retry=retry,
            )
        )


class Consumer:
    def __init__(self, consumer: AsyncConsumer, loop: _Loop) -> None:
        self._consumer = consumer
        self._loop = loop

    @property
    def flow_limit(self) -> int:
        """The effective consumer flow limit the broker returned (an adaptive window's cap)."""
        return self._consumer.flow_limit

    @property
    def flow_auto(self) -> bool:
        """True when the broker sizes the window (consumer-flow-auto on the RECEIPT)."""
        return self._consumer.flow_auto

    @property
    def pool_size(self) -> int:
        """The handlers declared to serve the consumer (0: none)."""
        return self._consumer.pool_size

    @property
    def max_buffered(self) -> int:
        return self._consumer.max_buffered

    @property
    def buffered(self) -> int:
        return self._consumer.buffered

    def receive(self, timeout: float | None = None) -> Message | None:
        return _wrap(self._loop.run(self._consumer.receive(timeout)), self._loop)

    def receive_no_wait(self) -> Message | None:
        return _wrap(self._loop.call(self._consumer.receive_no_wait), self._loop)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.receive()) is not None:
            yield message

    def set_listener(self, handler: Callable[[Message], object], *, concurrency: int = 1) -> None:
        """Call `handler` for every message from `concurrency` threads of this consumer's own."""
        loop = self._loop

        def call(message: AsyncMessage) -> object:
            wrapped = _wrap(message, loop)
            assert wrapped is not None
            return handler(wrapped)

        self._loop.call(lambda: self._consumer.set_listener(call, concurrency=concurrency))

    def close(self) -> None:
        self._loop.run(self._consumer.close())


class QueueBrowser:
    def __init__(self, browser: AsyncQueueBrowser, loop: _Loop) -> None:
        self._browser = browser
        self._loop = loop

    def __iter__(self) -> Iterator[Message]:
        browse = self._loop.call(self._browser.__aiter__)
        try:
            while True:
                try:
                    message = self._loop.run(_awaited(browse.__anext__()))
                except StopAsyncIteration:
                    return
                wrapped = _wrap(message, self._loop)
                assert wrapped is not None
                yield wrapped
        finally:
            aclose = getattr(browse, "aclose", None)
            if aclose is not None:
                self._loop.run(_awaited(aclose()))

    def messages(self) -> list[Message]:
        return list(self)
