"""Time and count limits on the connections of the broker's HTTP servers (aiohttp).

aiohttp closes a connection that stays idle `keepalive_timeout` after its last response, and
bounds the size of a request's head (`max_line_size`, `max_field_size`, `max_headers`); it has no
time limit on receiving a request's head, and no limit on how many connections it holds. A
client sending half a request then holds its connection, and what it sent, until the keep-alive
timeout (an hour by default), and many such clients hold as many. So every connection of the
admin endpoint and of the WebSocket endpoint's handshake goes through a `GuardedConnection`, a
protocol between the transport and aiohttp's that:

- closes the connection when a request's line and headers have not all come within the header
  timeout, counted from the connection's start (after the TLS handshake, which the server
  bounds by the same time) and, between requests, from the next request's first byte;
- with a cap, answers a connection beyond it with a fixed refusal (503) and closes it.

It learns that a request's head is complete when the application gets the request
(`request_started`, from a middleware or the handler) and that the connection is between
requests when the application is done with it (`request_done`). Bytes that come while a request
is handled (its body, or a pipelined next request) start no timer: aiohttp's own keep-alive
timeout then bounds a connection that goes quiet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

log = logging.getLogger(__name__)

# aiohttp's limits on a request's head, for both endpoints. A head is held in memory while it
# arrives, so these bound what one slow connection costs: at most MAX_HEADERS x MAX_FIELD_SIZE
# (512 KiB). A browser sends about 15 headers; 8 KiB per line leaves room for large cookies
# that a browser on localhost may carry for other local sites.
MAX_LINE_SIZE: Final = 8190
MAX_FIELD_SIZE: Final = 8190
MAX_HEADERS: Final = 64
LOG_EVERY_S: Final = 60.0  # a repeated refusal or timeout is logged at most this often


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """The limits of one server, each with the property that sets it (named in the log)."""

    header_timeout_s: float
    header_timeout_property: str
    max_connections: int | None = None
    max_connections_property: str = ""
    refusal: bytes = b""  # written to a connection beyond the cap, before closing it


def http_kwargs(keepalive_timeout_s: float) -> dict[str, Any]:
    """aiohttp server arguments shared by the broker's HTTP servers."""
    return {
        "keepalive_timeout": keepalive_timeout_s,
        "max_line_size": MAX_LINE_SIZE,
        "max_field_size": MAX_FIELD_SIZE,
        "max_headers": MAX_HEADERS,
    }


class _Throttled:
    """A WARNING for a repeated event, at most once per LOG_EVERY_S, with the count since."""

    def __init__(self) -> None:
        self._last = float("-inf")
        self._since = 0

    def note(self, now: float, message: str, *args: object) -> None:
        self._since += 1
        if now - self._last < LOG_EVERY_S:
            return
        count, self._since, self._last = self._since, 0, now
        more = f" ({count} times since the last such line)" if count > 1 else ""
        log.warning(message + more, *args)


class ConnectionGuard:
    """The limits of one HTTP server, and the connections it holds."""

    def __init__(self, name: str, limits: GuardLimits) -> None:
        self.name = name  # in the log: "admin endpoint", "WebSocket endpoint"
        self.limits = limits
        self.open: set[GuardedConnection] = set()  # admitted and not yet lost
        self.refused = 0  # connections refused at the cap, since the start
        self.timed_out = 0  # connections closed for an incomplete request head, since the start
        self._timeout_log = _Throttled()
        self._refusal_log = _Throttled()

    def factory(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], GuardedConnection]:
        """A protocol factory for `loop.create_server`: aiohttp's protocols (made by `make`
        for the connections admitted), guarded."""
        return lambda: GuardedConnection(self, make)

    def admit(self, connection: GuardedConnection) -> bool:
        cap = self.limits.max_connections
        if cap is not None and len(self.open) >= cap:
            self.refused += 1
            self._refusal_log.note(
                asyncio.get_running_loop().time(),
                "%s: a connection from %s was refused: %d are open, the most allowed (%s)",
                self.name,
                connection.peer,
                cap,
                self.limits.max_connections_property,
            )
            return False
        self.open.add(connection)
        return True

    def release(self, connection: GuardedConnection) -> None:
        self.open.discard(connection)

    def timed_out_head(self, connection: GuardedConnection) -> None:
        self.timed_out += 1
        self._timeout_log.note(
            asyncio.get_running_loop().time(),
            "%s: closed the connection from %s: no complete request line and headers within "
            "%.1f s (%s)",
            self.name,
            connection.peer,
            self.limits.header_timeout_s,
            self.limits.header_timeout_property,
        )


class GuardedConnection(asyncio.Protocol):
    """One connection under its server's limits, and aiohttp's protocol for it once admitted."""

    def __init__(self, guard: ConnectionGuard, make: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._make = make
        self._inner: asyncio.Protocol | None = None  # aiohttp's, once admitted
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._between_requests = False  # the next byte starts a request's head
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self._guard.admit(self):
            transport.write(self._guard.limits.refusal)
            transport.close()
            return
        self._inner = self._make()
        self._start_timer()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return  # refused: what it sends is not read
        if self._between_requests:
            self._between_requests = False
            self._start_timer()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._inner is not None:
            self._guard.release(self)
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    # -- what the application tells ------------------------------------------------------------

    def request_started(self) -> None:
        """A request's head is complete: its time limit no longer applies."""
        self._between_requests = False
        self._cancel_timer()

    def request_done(self) -> None:
        """The application is done with the request: the next byte starts another."""
        self._between_requests = True

    # -- the timer -----------------------------------------------------------------------------

    def _start_timer(self) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.limits.header_timeout_s, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._guard.timed_out_head(self)
            self._transport.abort()


def guarded(request: web.BaseRequest) -> GuardedConnection | None:
    """The guard of the connection `request` came on (None outside a guarded server)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, GuardedConnection) else None


@contextmanager
def handling(request: web.BaseRequest) -> Iterator[None]:
    """Around the handling of `request`: its head is complete; afterwards, the connection is
    between requests."""
    connection = guarded(request)
    if connection is not None:
        connection.request_started()
    try:
        yield
    finally:
        if connection is not None:
            connection.request_done()


@web.middleware
async def guard_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """`handling` as an application's outermost middleware."""
    with handling(request):
        return await handler(request)
