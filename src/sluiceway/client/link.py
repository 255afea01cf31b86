"""The machinery of an asyncio client connection: opening, routing, requests, reconnecting.

`Link` opens one STOMP session to the first broker address that answers (over TLS when the
settings say so: `tls`), sends Open MQ's connection-level flow settings on CONNECT, and routes
incoming MESSAGE frames to its consumers;
`connection.Connection` adds the making of sessions on top. Consumers and sessions are known
here only by what the link asks of them (`Subscriber`, `LinkedSession`), so this module depends
on nothing above it. When the connection is lost:

- without reconnect (`imqReconnectEnabled=false`, the default) every pending operation and every
  later one fails at once with ConnectionClosedError;
- with reconnect, the connection is reopened (`imqReconnectAttempts` per address,
  `imqReconnectInterval` apart), its consumers subscribe again and get the messages the broker
  redelivers; sends waiting for a receipt when the connection went fail with
  ConnectionClosedError (the broker may or may not have them), an open transaction is rolled back
  (its commit raises TransactionRolledBackError), and operations started while reconnecting wait
  for the outcome. If every attempt fails, everything fails with ConnectFailedError.

A TLS certificate the client does not accept, or an address that does not speak TLS, raises
TlsError at once, on opening as on reconnecting: no other address or attempt is tried, since
only the settings (or the broker's certificate) can fix it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from sluiceway.client.protocol import ConnectRequest, heartbeat_intervals
from sluiceway.client.settings import ClientSettings
from sluiceway.client.tls import TlsError, client_context, handshake_failed
from sluiceway.client.wire import Wire
from sluiceway.errors import (
    BrokerError,
    ClientError,
    ConnectFailedError,
    ConnectionClosedError,
    OperationTimeoutError,
    ProtocolError,
)
from sluiceway.protocol.frames import Frame

log = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 10.0  # seconds for TCP connect, TLS and CONNECTED, when imqAckTimeout is 0
CLOSE_TIMEOUT: Final = 5.0  # seconds to wait for the RECEIPT of DISCONNECT


class Subscriber(Protocol):
    """What the link asks of a consumer: to take its MESSAGE frames and to hear of the
    connection's loss (then reopening) or end."""

    subscription_id: str

    def deliver(self, frame: Frame, generation: int) -> None: ...

    def connection_lost(self) -> None: ...

    def connection_closed(self, exc: BaseException) -> None: ...

    async def resubscribe(self) -> None: ...


class LinkedSession(Protocol):
    """What the link asks of a session: to hear of the connection's loss, and to close."""

    def connection_lost(self) -> None: ...

    async def close(self) -> None: ...


class Link:
    """One client connection, its sessions and consumers aside: opening, reconnecting, sending,
    requests, and MESSAGE frames routed to the consumer they are for."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        # Made before any socket, so that a CA file that cannot be read is a ConfigError at once.
        self._tls_context = None if settings.tls is None else client_context(settings.tls)
        self._wire: Wire | None = None
        self._available = asyncio.Event()  # set while connected, and once closed for good
        self._failure: BaseException | None = None
        self._closed = False
        self._consumers: dict[str, Subscriber] = {}
        self._sessions: list[LinkedSession] = []
        self._ids = itertools.count(1)
        self._reconnecting: asyncio.Task[None] | None = None
        self.generation = 0  # increases with every (re)connection
        self.reconnects = 0
        self._failed_reconnect_attempts = 0
        self._heartbeats_of_lost_wires = 0  # heart-beats received on connections since lost
        self.buffered = 0  # messages in all consumers' buffers
        self.max_buffered = 0
        self.connected_headers: Mapping[str, str] = {}

    # -- opening ---------------------------------------------------------------------------------

    async def open(self) -> None:
        self._attach(await self._connect_any(attempts_per_address=1))

    async def _connect_any(self, attempts_per_address: int | None) -> Wire:
        """Try every address, `imqAddressListIterations` times, each `attempts_per_address`
        times in a row; raise ConnectFailedError. With no limit (None, imqReconnectAttempts
        -1), the list is tried over and over, one attempt an address, until one answers: the
        members of a cluster are listed so that a client finds the one that took over."""
        settings = self.settings
        failures: list[str] = []
        iterations = settings.address_list_iterations if attempts_per_address is not None else 1
        in_a_row = attempts_per_address if attempts_per_address is not None else 1
        iteration = 0
        while attempts_per_address is None or iteration < iterations:
            iteration += 1
            for host, port in settings.addresses:
                for attempt in range(1, in_a_row + 1):
                    try:
                        return await self._connect_once(host, port)
                    except (BrokerError, TlsError):
                        raise  # refused by the broker, or its certificate: retrying cannot help
                    except (OSError, ClientError, ProtocolError, TimeoutError) as exc:
                        failures.append(f"{host}:{port}: {exc}")
                        del failures[:-5]
                        if self.generation:  # connected before: this was a reconnection attempt
                            self._failed_reconnect_attempts += 1
                        if self._closed:
                            raise ConnectionClosedError("the connection was closed") from None
                        if attempts_per_address is None or attempt < in_a_row:
                            await asyncio.sleep(settings.reconnect_interval)
        raise ConnectFailedError("could not connect: " + "; ".join(failures))

    async def _connect_once(self, host: str, port: int) -> Wire:
        timeout = self.settings.ack_timeout or CONNECT_TIMEOUT
        async with asyncio.timeout(timeout):
            reader, writer = await self._open_stream(host, port)
        wire = Wire(reader, writer, self._on_frame, self._on_lost)
        request = self._connect_request(host)
        try:
            connected = await wire.handshake(request.headers(), timeout)
        except BrokerError as exc:  # 401 wrong credentials, 403 not allowed to connect...
            writer.close()
            raise request.refused(exc, port) from None
        except BaseException:
            writer.close()
            raise
        wire.start(*heartbeat_intervals(request.heartbeat_ms, connected))
        return wire

    async def _open_stream(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `host`:`port`, TLS on top when the settings say so: the broker's
        certificate checked against the CA file, and (unless turned off) against `host`."""
        context = self._tls_context
        if context is None:
            return await asyncio.open_connection(host, port)
        try:
            return await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
        except ssl.SSLError as exc:  # (an OSError too: one that may pass is left as such)
            refused = handshake_failed(exc, f"{host}:{port}")
            if refused is not None:
                raise refused from None
            raise

    def _connect_request(self, host: str) -> ConnectRequest:
        settings = self.settings
        return ConnectRequest(
            host,
            settings.username,
            settings.password,
            settings.client_id,
            heartbeat_ms=round(settings.ping_interval * 1000),
            extensions={
                "connection-flow-count": str(settings.connection_flow_count),
                "connection-flow-limit": str(settings.connection_flow_limit),
                "connection-flow-limit-enabled": str(
                    settings.connection_flow_limit_enabled
                ).lower(),
            },
        )

    def _attach(self, wire: Wire) -> None:
        self._wire = wire
        self.generation += 1
        self.connected_headers = dict(wire.connected.headers if wire.connected else {})
        self._available.set()

    # -- using -----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Closed for good (by close(), or lost with reconnection off or exhausted)."""
        return self._closed

    @property
    def connected(self) -> bool:
        """A live connection to the broker exists right now (False while reconnecting)."""
        wire = self._wire
        return not self._closed and wire is not None and not wire.closed

    @property
    def failed_reconnect_attempts(self) -> int:
        """Attempts to reopen a lost connection that failed (an address that refused the TCP
        connection, or did not answer CONNECT in time), over this connection's life."""
        return self._failed_reconnect_attempts

    @property
    def heartbeats_received(self) -> int:
        """Heart-beats the broker sent (each an EOL between frames), over this connection's life."""
        wire = self._wire
        return self._heartbeats_of_lost_wires + (wire.heartbeats_received if wire else 0)

    @property
    def awaiting_receipt(self) -> int:
        """Frames sent with a receipt request (waiting sends, commits, subscriptions...) whose
        RECEIPT has not come yet; 0 while there is no live connection."""
        wire = self._wire
        return 0 if wire is None or wire.closed else wire.awaiting_receipt

    async def wire(self) -> Wire:
        """The live connection, waiting while a reconnection is in progress."""
        while True:
            if self._closed:
                raise ConnectionClosedError("the connection is closed") from self._failure
            wire = self._wire
            if wire is not None and not wire.closed:
                return wire
            self._available.clear()
            await self._available.wait()

    async def send(self, frame: Frame) -> None:
        await (await self.wire()).send(frame)

    def send_nowait(self, frame: Frame) -> bool:
        """Write a small frame now if connected; False if there is no live connection."""
        wire = self._wire
        if wire is None or wire.closed:
            return False
        wire.write(frame)
        return True

    async def request(
        self,
        frame: Frame,
        timeout: float | None = None,
        *,
        on_receipt: Callable[[Frame], None] | None = None,
    ) -> Frame:
        """Send `frame` and wait for its RECEIPT (`timeout`, else imqAckTimeout, bounds it);
        `on_receipt` sees the RECEIPT before any frame behind it is dispatched."""
        wire = await self.wire()
        return await wire.request(
            frame, timeout if timeout is not None else self.settings.ack_timeout, on_receipt
        )

    def buffer_changed(self, delta: int) -> None:
        """Consumers report every change to their buffers, for the connection-wide count."""
        self.buffered += delta
        self.max_buffered = max(self.max_buffered, self.buffered)

    def next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def register(self, consumer: Subscriber) -> None:
        self._consumers[consumer.subscription_id] = consumer

    def unregister(self, consumer: Subscriber) -> None:
        self._consumers.pop(consumer.subscription_id, None)

    def adopt(self, session: LinkedSession) -> None:
        """A new session of this connection: told of losses, closed with it."""
        self._sessions.append(session)

    def forget(self, session: LinkedSession) -> None:
        if session in self._sessions:
            self._sessions.remove(session)

    def _on_frame(self, frame: Frame) -> None:
        if frame.command != "MESSAGE":
            log.warning("unexpected %s frame from the broker", frame.command)
            return
        consumer = self._consumers.get(frame.headers.get("subscription", ""))
        if consumer is None:
            return  # a consumer closed meanwhile: the broker takes the message back
        # A MESSAGE beyond the consumer's window raises RemoteProtocolError here: the wire's
        # reader then ends the connection with it.
        consumer.deliver(frame, self.generation)

    # -- losing and reconnecting -----------------------------------------------------------------

    def _on_lost(self, exc: BaseException) -> None:
        if self._closed:
            return
        log.warning("connection to the broker lost: %s", exc)
        if self._wire is not None:
            self._heartbeats_of_lost_wires += self._wire.heartbeats_received
        self._wire = None
        for consumer in list(self._consumers.values()):
            consumer.connection_lost()
        for session in list(self._sessions):
            session.connection_lost()
        if self.settings.reconnect_enabled:
            self._reconnecting = asyncio.create_task(self._reconnect(), name="sluiceway-reconnect")
        else:
            self._fail(exc)

    async def _reconnect(self) -> None:
        try:
            wire = await self._connect_any(self.settings.attempts_per_address)
            self._attach(wire)
            for consumer in list(self._consumers.values()):
                await consumer.resubscribe()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # every attempt failed, or the broker refused
            log.error("reconnection failed: %s", exc)  # noqa: TRY400  (the cause says it all)
            self._fail(exc)
            return
        self.reconnects += 1
        log.info("reconnected to the broker (reconnection %d)", self.reconnects)

    def _fail(self, exc: BaseException) -> None:
        """Closed for good: wake everything that waits, with the cause."""
        self._closed = True
        self._failure = exc
        self._available.set()
        for consumer in list(self._consumers.values()):
            consumer.connection_closed(exc)

    # -- closing ---------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close every session, DISCONNECT, and release everything."""
        if self._closed:
            return
        for session in list(self._sessions):
            with contextlib.suppress(ClientError, BrokerError, OperationTimeoutError):
                await session.close()  # closing anyway: a failure here only means less to undo
        self._closed = True
        self._available.set()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self._wire is not None:
            await self._wire.close(CLOSE_TIMEOUT)
        for consumer in list(self._consumers.values()):
            consumer.connection_closed(ConnectionClosedError("the connection was closed"))
