"""Consumers: a bounded buffer fed by the broker, read by receive, iteration or a listener pool.

The buffer never holds more than the consumer's effective flow limit (the value the broker
returned on the SUBSCRIBE's RECEIPT): the broker sends at most that many unconsumed messages, and
this session acknowledges a message only once it has left the buffer. The client always asks for
a finite window (UNLIMITED_CONSUMER_WINDOW when imqConsumerFlowLimit sets none), and a broker that
sends a message beyond the window it granted breaks the protocol: the connection ends with a
RemoteProtocolError naming the window and the count, rather than the buffer growing. Browsers are
the exception: a browse consumes nothing, so the broker releases their window as it writes.
`max_buffered` records the most the buffer ever held.

With imqConsumerFlowLimit=auto the consumer asks for an adaptive window
(`consumer-flow-limit:auto`): the broker sizes it from the consumer's measured pace and round
trip, and the RECEIPT names its cap (the most the broker will ever have given the consumer
unconsumed, the buffer's bound as above) and says `consumer-flow-auto:true` (`flow_auto`). A
destination whose consumerFlowLimit is auto makes the window adaptive too, within the number the
consumer asked for.

A listener may be served by a pool of N concurrent handlers sharing the one consumer, like the
message-driven bean pools of an application server. The consumer's flow limit caps how many of
them can work at once; when it is below N the client logs a warning naming both numbers. An
adaptive window may shrink to what the consumer's pace needs, fewer messages than handlers,
unless the consumer declares its pool (`pool_size`, sent as `consumer-pool-size`): the broker
keeps the window at least that large, within the cap. A listener of more handlers than the
declared pool logs a warning saying so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator

from sluiceway.client.message import Message, MessageHandler
from sluiceway.client.session_state import AckMode, SessionState
from sluiceway.client.settings import UNLIMITED_CONSUMER_WINDOW, FlowLimit
from sluiceway.errors import (
    BrokerError,
    ClientError,
    ConnectionClosedError,
    OperationTimeoutError,
    RemoteProtocolError,
)
from sluiceway.protocol.frames import Frame

log = logging.getLogger(__name__)

# The most handlers a consumer may declare (consumer-pool-size): the broker reads it as a Java int.
MAX_POOL_SIZE = 2**31 - 1


def checked_pool_size(pool_size: object) -> int:
    """`pool_size` if it is an int from 0 to MAX_POOL_SIZE, else TypeError or ValueError."""
    accepted = (
        f"pool_size must be an integer from 0 to {MAX_POOL_SIZE}: the number of handlers that "
        "serve the consumer (the concurrency of its listener), 0 for none declared"
    )
    if isinstance(pool_size, bool) or not isinstance(pool_size, int):
        raise TypeError(f"{accepted}; got {pool_size!r}")
    if not 0 <= pool_size <= MAX_POOL_SIZE:
        raise ValueError(f"{accepted}; got {pool_size}")
    return pool_size


class Consumer:
    """Receives the messages of one subscription."""

    def __init__(
        self,
        session: SessionState,
        destination: str,
        selector: str | None = None,
        *,
        durable_name: str | None = None,
        browse: bool = False,
        pool_size: int = 0,
    ) -> None:
        self.session = session
        self.connection = session.connection
        self.destination = destination
        self.selector = selector
        self.durable_name = durable_name
        self.browse = browse
        # Handlers that serve this consumer, declared to the broker so that an adaptive window
        # never falls below them; 0: none declared.
        self.pool_size = checked_pool_size(pool_size)
        self.subscription_id = self.connection.next_id("sub")
        settings = self.connection.settings
        asked = self._window_asked()
        # Replaced by the window the broker grants (the cap, when the window adapts).
        self.flow_limit = asked if isinstance(asked, int) else UNLIMITED_CONSUMER_WINDOW
        self.flow_auto = False  # the broker sizes the window (consumer-flow-auto on the RECEIPT)
        self.flow_threshold = settings.consumer_flow_threshold
        self.prefetch = settings.consumer_flow_limit_prefetch
        # (connection generation, message); at most `flow_limit` of them, a finite number (the
        # client never asks for an unlimited window). The broker enforces it: it sends no more
        # than the window it granted until messages are consumed, and a message leaves the buffer
        # before it is acknowledged. `deliver` checks it: a broker that sends more ends the
        # connection. Browsers excepted (see the module's docstring).
        self._buffer: deque[tuple[int, Message]] = deque()
        self._arrived = asyncio.Event()
        self.max_buffered = 0
        self.closed = False
        self._failure: BaseException | None = None
        self._deferred: tuple[int, Message] | None = None  # handed over, acknowledged next time
        self._workers: list[asyncio.Task[None]] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    # -- subscribing -----------------------------------------------------------------------------

    def _window_asked(self) -> FlowLimit:
        """The consumer flow limit this consumer asks for: a finite number, or `auto` (the broker
        names the cap on the RECEIPT); never unlimited. Browsers ask for a number."""
        settings = self.connection.settings
        if self.browse:
            return settings.queue_browser_max_messages_per_retrieve
        return settings.consumer_window

    def _subscribe_frame(self) -> Frame:
        settings = self.connection.settings
        headers = {
            "destination": self.destination,
            "id": self.subscription_id,
            "ack": "auto" if self.browse else "client-individual",
            "consumer-flow-limit": str(self._window_asked()),
            "consumer-flow-threshold": str(settings.consumer_flow_threshold),
            "consumer-flow-prefetch": str(settings.consumer_flow_limit_prefetch).lower(),
        }
        if self.browse:
            headers["browser"] = "true"
        elif self.pool_size > 0:
            headers["consumer-pool-size"] = str(self.pool_size)
        if self.selector:
            headers["selector"] = self.selector
        if self.durable_name is not None:
            headers["durable-subscription-name"] = self.durable_name
        return Frame("SUBSCRIBE", headers)

    async def subscribe(self) -> None:
        """SUBSCRIBE and adopt the effective flow settings the broker returns."""
        self.connection.register(self)  # before sending: messages may follow the RECEIPT at once
        try:
            await self.connection.request(self._subscribe_frame(), on_receipt=self._adopt)
        except BaseException:
            self.connection.unregister(self)
            raise

    async def resubscribe(self) -> None:
        """Subscribe again on a reopened connection (the broker redelivers what was unacked)."""
        if self.closed:
            return
        try:
            await self.connection.request(self._subscribe_frame(), on_receipt=self._adopt)
        except (BrokerError, ClientError, OperationTimeoutError) as exc:
            log.error(  # noqa: TRY400  (the cause says it all)
                "could not subscribe again to %s: %s", self.destination, exc
            )
            self.connection_closed(exc)

    def _adopt(self, receipt: Frame) -> None:
        """Take the effective flow settings from the SUBSCRIBE's RECEIPT, as soon as it is read
        (before the MESSAGE frames behind it)."""
        headers = receipt.headers
        asked = self._window_asked()
        text = headers.get("consumer-flow-limit")
        granted = 0 if text is None else int(text)
        if isinstance(asked, int):
            # The broker grants at most what was asked (a destination's cap only lowers it); an
            # answer of more, or of no limit, gives the buffer no more room than was asked for.
            self.flow_limit = granted if 0 < granted <= asked else asked
        else:
            # Auto: the broker names the cap of the adaptive window (the destination's
            # consumerFlowLimit), which the consumer accepted by asking for auto; an answer of
            # no limit gives the buffer no more room than an unlimited request would have.
            self.flow_limit = granted if granted > 0 else UNLIMITED_CONSUMER_WINDOW
        self.flow_auto = headers.get("consumer-flow-auto") == "true"
        self.flow_threshold = int(headers.get("consumer-flow-threshold", self.flow_threshold))
        self.prefetch = headers.get("consumer-flow-prefetch", "true") == "true"

    # -- the buffer ------------------------------------------------------------------------------

    def deliver(self, frame: Frame, generation: int) -> None:
        """A MESSAGE arrived for this subscription (called by the connection's reader).

        Raises RemoteProtocolError, and buffers nothing, if the broker sent it beyond the window
        it granted: the reader then ends the connection with that error.
        """
        if not self.browse and len(self._buffer) >= self.flow_limit:
            raise RemoteProtocolError(
                f"the broker sent the consumer of {self.destination} (subscription "
                f"{self.subscription_id}) more messages than the window it granted: "
                f"{len(self._buffer) + 1} unconsumed messages for a consumer flow limit of "
                f"{self.flow_limit} (consumer-flow-limit on the RECEIPT of its SUBSCRIBE); the "
                "connection is closed rather than buffer beyond the window, and the broker will "
                "deliver the unacknowledged messages again"
            )
        message = Message(
            frame.body,
            frame.headers,
            self.subscription_id,
            frame.headers.get("ack", ""),
            self.session,
        )
        self._buffer.append((generation, message))
        self.max_buffered = max(self.max_buffered, len(self._buffer))
        self.connection.buffer_changed(1)
        self._arrived.set()

    @property
    def buffered(self) -> int:
        """Messages received and not yet handed to the application."""
        return len(self._buffer)

    async def _next(self, timeout: float | None) -> tuple[int, Message] | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self.closed:
                return None  # what is still buffered goes back to the broker
            if self._buffer:
                return self._take()
            if self._failure is not None:
                raise ConnectionClosedError(f"the connection is closed: {self._failure}")
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            self._arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                return None

    # -- receiving -------------------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout` seconds (None: until one comes).

        Returns None on timeout or once the consumer is closed; raises ConnectionClosedError if
        the connection is closed for good.
        """
        self._settle_deferred()
        item = await self._next(timeout)
        return None if item is None else self._hand_over(item)

    def receive_no_wait(self) -> Message | None:
        """The next message if one is already buffered, else None."""
        self._settle_deferred()
        if not self._buffer:
            if self._failure is not None:
                raise ConnectionClosedError(f"the connection is closed: {self._failure}")
            return None
        return self._hand_over(self._take())

    def _take(self) -> tuple[int, Message]:
        self.connection.buffer_changed(-1)
        return self._buffer.popleft()

    def _drop_buffer(self) -> None:
        self.connection.buffer_changed(-len(self._buffer))
        self._buffer.clear()

    def _hand_over(self, item: tuple[int, Message]) -> Message:
        generation, message = item
        if self.browse:
            return message
        deferred = (
            not self.prefetch
            and self.session.ack_mode is AckMode.AUTO
            and not self.session.transacted
        )
        if deferred:
            # Prefetch off: the next message must not come while the application works on
            # this one, so it is acknowledged at the next receive (Open MQ does the same).
            self._deferred = item
        else:
            self.session.handed_over(self, message, generation)
        return message

    def _settle_deferred(self) -> None:
        if self._deferred is not None:
            generation, message = self._deferred
            self._deferred = None
            self.session.handed_over(self, message, generation)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        message = await self.receive()
        if message is None:
            raise StopAsyncIteration
        return message

    # -- listener pool ---------------------------------------------------------------------------

    def set_listener(self, handler: MessageHandler, *, concurrency: int = 1) -> None:
        """Call `handler` for every message, from `concurrency` concurrent workers.

        An `async def` handler runs on the event loop; a plain function runs in a thread of a
        pool of `concurrency` threads owned by this consumer. In AUTO and DUPS_OK sessions a
        message is acknowledged when the handler returns; if the handler raises, the message is
        delivered again.
        """
        if self._workers:
            raise RuntimeError("this consumer already has a listener")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._warn_if_capped(concurrency)
        if not inspect.iscoroutinefunction(handler):
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=concurrency, thread_name_prefix=f"sluiceway-{self.subscription_id}"
            )
        for index in range(concurrency):
            self._workers.append(
                asyncio.create_task(self._work(handler), name=f"{self.subscription_id}-{index}")
            )

    def _warn_if_capped(self, concurrency: int) -> None:
        """The trap Open MQ's flow-control article describes for MDB pools: a window smaller
        than the pool leaves handlers idle. An adaptive window is at least the declared pool
        (within its cap), so a pool larger than declared may be starved too."""
        settings = self.connection.settings
        if 0 < self.flow_limit < concurrency:
            raise_what = (
                "the destination's consumerFlowLimit (the cap of the adaptive window)"
                if settings.consumer_flow_auto
                else "imqConsumerFlowLimit (and the destination's consumerFlowLimit)"
            )
            log.warning(
                "consumer of %s: its effective flow limit is %d messages but %d handlers serve it, "
                "so at most %d can work at once; raise %s to at least %d",
                self.destination,
                self.flow_limit,
                concurrency,
                self.flow_limit,
                raise_what,
                concurrency,
            )
        # The most handlers the window can keep busy; the declared pool must reach it.
        busy = min(concurrency, self.flow_limit) if self.flow_limit > 0 else concurrency
        if self.flow_auto and self.pool_size < busy:
            log.warning(
                "consumer of %s: its window adapts to its pace (consumer-flow-auto) and is kept "
                "no smaller than its declared pool_size (%d), but %d handlers serve it: the "
                "window may fall below %d messages and leave handlers idle; declare "
                "pool_size=%d when creating the consumer",
                self.destination,
                self.pool_size,
                concurrency,
                busy,
                concurrency,
            )
        if settings.connection_flow_limit_enabled and settings.connection_flow_limit < concurrency:
            log.warning(
                "consumer of %s: the connection flow limit is %d messages but %d handlers serve "
                "this consumer, so at most %d can work at once; raise imqConnectionFlowLimit",
                self.destination,
                settings.connection_flow_limit,
                concurrency,
                settings.connection_flow_limit,
            )

    async def _work(self, handler: MessageHandler) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                item = await self._next(None)
            except ConnectionClosedError:
                return
            if item is None:
                return
            generation, message = item
            # In a CLIENT session the handler owns the message as soon as it gets it, so that
            # message.acknowledge() inside the handler covers it; otherwise the message counts as
            # handed over when the handler returns (AUTO acknowledges it then).
            client_ack = self.session.ack_mode is AckMode.CLIENT and not self.session.transacted
            if client_ack:
                self.session.handed_over(self, message, generation)
            try:
                if self._executor is None:
                    result = handler(message)
                else:
                    result = await loop.run_in_executor(self._executor, handler, message)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception(
                    "listener of %s failed on message %s", self.destination, message.message_id
                )
                self._redeliver(message, generation)
                continue
            if not client_ack:
                self.session.handed_over(self, message, generation)

    def _redeliver(self, message: Message, generation: int) -> None:
        if self.session.transacted or self.session.ack_mode is AckMode.CLIENT:
            return  # the application decides (rollback, recover)
        if generation == self.connection.generation:
            self.connection.send_nowait(Frame("NACK", {"id": message.ack_id}))

    # -- connection events -----------------------------------------------------------------------

    def connection_lost(self) -> None:
        """Buffered messages will be delivered again after the reconnection: drop them."""
        self._drop_buffer()
        self._deferred = None

    def connection_closed(self, exc: BaseException) -> None:
        """Closed for good: waiting receivers raise ConnectionClosedError."""
        self._failure = exc
        self._arrived.set()

    # -- closing ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the listener (letting running handlers finish), then UNSUBSCRIBE.

        Messages still buffered, and in a CLIENT session those not yet acknowledged, go back to
        the broker and are delivered again.
        """
        if self.closed:
            return
        self.closed = True
        self._arrived.set()
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
            self._workers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._settle_deferred()
        self.session.forget_consumer_acks(self)
        if not self.connection.closed and self._failure is None:
            with contextlib.suppress(BrokerError, ClientError, OperationTimeoutError):
                await self.connection.request(Frame("UNSUBSCRIBE", {"id": self.subscription_id}))
        self.connection.unregister(self)
        self.session.forget(self)
        self._drop_buffer()
