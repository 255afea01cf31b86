"""STOMP over WebSocket (`imq.stomp.ws.port`), for browser clients such as stomp.js.

The endpoint is `ws://imq.hostname:imq.stomp.ws.port/stomp` (`/ws`, where RabbitMQ's examples
look, and `/` are accepted too), `wss://` when `imq.stomp.ws.tls` is true. The subprotocols
offered are v12.stomp, v11.stomp and v10.stomp, as stomp.js asks for them; a client that names
none is served too. The STOMP version itself is agreed by CONNECT's accept-version, as over TCP.

The handshake is refused (403) when it carries an `Origin` header naming a page of another site
than the endpoint's own or one of `imq.stomp.ws.allowed_origins` (server.browsers), and its
connection is closed when the handshake's request line and headers have not come within
`imq.stomp.connect.timeout` (server.httpguard).

Each connection is the same `StompProtocol` and `StompSession` as over TCP; only the transport
differs. `WebSocketTransport` adapts aiohttp's `WebSocketResponse` to the `asyncio.Transport` the
protocol expects:

- incoming: each WebSocket message goes to `data_received` (stomp.js sends a heart-beat as a
  message holding "\\n"), cut in pieces of at most `READ_CHUNK` bytes and never while reading is
  paused, so the protocol sees what it would see from a socket;
- outgoing: what the protocol writes is cut into whole STOMP frames, one WebSocket message each
  (text when it is valid UTF-8, binary otherwise), and heart-beat EOLs. The messages wait in an
  outgoing buffer drained by one writer task per connection; the protocol's `pause_writing` and
  `resume_writing` follow the bytes in that buffer against `imq.stomp.write.high_water` and
  `low_water`, exactly as a socket transport's buffer would, so a client that stops reading
  costs bounded memory, as over TCP: in the outgoing buffer, the high-water mark plus one write
  chunk of messages (plus the control frames the protocol allows before it stops reading, four
  times the high-water mark); in aiohttp's socket transport under the WebSocket, at most its
  64 KiB high-water mark plus `SOCKET_CHECK_BYTES` and one message. Both count in
  `get_write_buffer_size`, hence in the broker's memory budget.

Messages larger than `imq.stomp.max_frame_size` (plus `MESSAGE_SLACK`) are refused by aiohttp
with close code 1009; a frame slightly over the limit still gets the STOMP ERROR naming it.

The input budget (session.input_budget) covers what aiohttp holds too: aiohttp assembles a whole
message before handing it over, so a client stalled inside one would hold up to the message
limit unseen. `InputCounter` stands between the socket's transport and aiohttp's protocol and
counts the bytes aiohttp is given; those that arrived since the last message was taken, plus what
is left of the message being handed to the protocol, count as this connection's input
(`StompProtocol.input_held_below`), so that the pre-CONNECT frame limit, the per-connection and
the broker-wide budget see a message while it arrives, as over TCP.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from aiohttp import WSMsgType, hdrs, web

from sluiceway.server.browsers import OriginPolicy, machine_name, served_names, shown
from sluiceway.server.connection import CLOSE_LINGER_S, WRITE_CAP_FACTOR, Fence, StompProtocol
from sluiceway.server.httpguard import ConnectionGuard, GuardLimits, handling, http_kwargs
from sluiceway.server.stomp_server import StompServer

if TYPE_CHECKING:
    from sluiceway.core.broker import Broker
    from sluiceway.security.access import Gate

log = logging.getLogger(__name__)

PATHS: Final = frozenset({"/stomp", "/ws", "/"})
# stomp.js offers these, best first; the client's order of preference decides.
SUBPROTOCOLS: Final = ("v12.stomp", "v11.stomp", "v10.stomp")
# What one data_received gets at most: asyncio's socket transports read 256 KiB at a time, so a
# large message reaches the session as it would over TCP, and a pause takes effect within it.
READ_CHUNK: Final = 256 * 1024
# EOLs a client may send after a frame's NUL, and room for a frame a little over
# imq.stomp.max_frame_size to reach the decoder, which answers it with an ERROR naming the limit.
MESSAGE_SLACK: Final = 64 * 1024
# aiohttp checks whether the socket under a WebSocket is above its high-water mark (64 KiB) once
# per this many bytes sent. Its default, 256 KiB, would let a client that stops reading hold
# that much more in the socket transport, on top of the outgoing buffer the watermarks bound.
SOCKET_CHECK_BYTES: Final = 16 * 1024

_LF: Final = 0x0A
_CR: Final = 0x0D
_NUL: Final = 0x00
_CONTENT_LENGTH: Final = b"\ncontent-length:"


class FrameSplitter:
    """Cuts the byte stream the session writes into whole STOMP frames and heart-beat EOLs.

    The session writes frames as `encode_frame` makes them: LF line ends, a `content-length`
    header whenever the body is not empty (the first one counts), then the body and a NUL. A
    write that ends inside a frame (which the session never does) keeps its tail until the rest
    comes.
    """

    def __init__(self) -> None:
        self._partial = bytearray()

    def split(self, data: bytes) -> list[bytes]:
        if self._partial:
            self._partial += data
            data = bytes(self._partial)
            self._partial.clear()
        pieces: list[bytes] = []
        start, size = 0, len(data)
        while start < size:
            if data[start] in (_LF, _CR):  # EOLs between frames: heart-beats
                end = start + 1
                while end < size and data[end] in (_LF, _CR):
                    end += 1
            else:
                end = _frame_end(data, start)
                if end < 0:
                    self._partial += data[start:]
                    break
            pieces.append(data[start:end])  # the whole of `data` when it is one frame: no copy
            start = end
        return pieces


def _frame_end(data: bytes, start: int) -> int:
    """Where the frame starting at `start` ends (after its NUL), or -1 if it is incomplete."""
    head_end = data.find(b"\n\n", start)
    if head_end < 0:
        return -1
    body = head_end + 2
    header = data.find(_CONTENT_LENGTH, start, head_end + 1)
    if header >= 0:
        value_start = header + len(_CONTENT_LENGTH)
        value = data[value_start : data.find(b"\n", value_start)]
        if value.isdigit():
            nul = body + int(value)
            if nul >= len(data):
                return -1
            if data[nul] == _NUL:
                return nul + 1
    nul = data.find(b"\0", body)  # no (usable) content-length: the body runs to the first NUL
    return nul + 1 if nul >= 0 else -1


def message_type(frame: bytes) -> WSMsgType:
    """TEXT for a frame that is valid UTF-8 (every frame without a binary body), else BINARY."""
    if frame.isascii():
        return WSMsgType.TEXT
    try:
        frame.decode()
    except UnicodeDecodeError:
        return WSMsgType.BINARY
    return WSMsgType.TEXT


class InputCounter(asyncio.Protocol):
    """Passes everything between a socket's transport and aiohttp's protocol on, and tells
    `on_data` how many bytes each read gave aiohttp."""

    def __init__(self, inner: asyncio.Protocol, on_data: Callable[[int], None]) -> None:
        self._inner = inner
        self._on_data = on_data

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)
        self._on_data(len(data))

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class WebSocketTransport(asyncio.Transport):
    """One WebSocket connection as the `asyncio.Transport` a `StompProtocol` writes to."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        protocol: StompProtocol,
        below: asyncio.Transport | None,
    ) -> None:
        super().__init__()
        self._ws = ws
        self._below = below  # the socket's transport, under the WebSocket
        self._protocol = protocol
        self._splitter = FrameSplitter()
        # The outgoing buffer. The protocol writes MESSAGEs only below `_high` and control
        # frames only below WRITE_CAP_FACTOR x `_high` (but a closing session's last frames);
        # `write` checks it, so the buffer never takes a write past that.
        self._outgoing: collections.deque[bytes] = collections.deque()
        self._buffered = 0  # bytes in `_outgoing`, the message being sent included
        self._high = 64 * 1024  # asyncio's defaults, until the protocol sets its own
        self._low = 16 * 1024
        self._protocol_paused = False
        self._readable = asyncio.Event()  # set while the protocol wants data
        self._readable.set()
        self._wake_writer = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False  # close() was called: send what is buffered, then close
        self._aborted = False
        self._lost = False  # the connection is over; the protocol was (or is being) told
        # Input aiohttp holds: bytes given to it since the last message was taken, and what is
        # left to hand over of the message taken last.
        self._untaken = 0
        self._undelivered = 0
        if below is not None:
            inner = below.get_protocol()
            if isinstance(inner, asyncio.Protocol):
                below.set_protocol(InputCounter(inner, self._raw_received))

    # -- the asyncio.Transport side, as StompProtocol uses it ---------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or self._aborted or self._lost:
            return
        protocol = self._protocol
        if self._buffered > WRITE_CAP_FACTOR * self._high and not protocol.closing:
            log.error(
                "%s: a write came while %d bytes waited to be sent, more than a connection may "
                "buffer (%d); dropping the connection",
                protocol.session.peer if protocol.session is not None else "?",
                self._buffered,
                WRITE_CAP_FACTOR * self._high,
            )
            self.abort()
            return
        for piece in self._splitter.split(bytes(data)):
            self._outgoing.append(piece)
            self._buffered += len(piece)
        self._wake_writer.set()
        if not self._protocol_paused and self._buffered > self._high:
            self._protocol_paused = True
            self._protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        """The bytes waiting: in the outgoing buffer, and in the socket transport under it."""
        below = self._below
        return self._buffered + (below.get_write_buffer_size() if below is not None else 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = 64 * 1024 if low is None else 4 * low
        if low is None:
            low = high // 4
        self._high, self._low = high, low

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def pause_reading(self) -> None:
        self._readable.clear()

    def resume_reading(self) -> None:
        self._readable.set()

    def is_reading(self) -> bool:
        return self._readable.is_set()

    def close(self) -> None:
        """Send what is buffered, then close the WebSocket (code 1000)."""
        if self._closing or self._lost:
            return
        self._closing = True
        self._wake_writer.set()
        self._readable.set()  # keep reading, to see the client's close

    def abort(self) -> None:
        """Drop what is buffered and the connection under the WebSocket at once."""
        if self._aborted:
            return
        self._aborted = True
        self._outgoing.clear()
        self._buffered = 0
        if self._writer is not None:
            self._writer.cancel()
        if self._below is not None:
            self._below.abort()  # the read loop then sees the connection gone
        self._readable.set()

    def is_closing(self) -> bool:
        return self._closing or self._aborted or self._lost or self._ws.closed

    def can_write_eof(self) -> bool:
        # No half-close: a close frame makes aiohttp close the socket at once when a receive
        # is pending (the read loop's always is), so the protocol reads on and closes later.
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._ws.get_extra_info(name, default)

    # -- the connection's life -----------------------------------------------------------------

    async def serve(self) -> None:
        """Run the connection until it ends: read here, write from the one writer task."""
        protocol = self._protocol
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        protocol.connection_made(self)
        error: Exception | None = None
        try:
            error = await self._read_loop()
        finally:
            self._lost = True
            writer = self._writer
            if not writer.done() and not (self._closing and not self._aborted):
                writer.cancel()
            # A close the broker started finishes (bounded by the close timeout and the
            # protocol's linger, which aborts); anything else ends now.
            await asyncio.gather(writer, return_exceptions=True)
            protocol.connection_lost(error)

    async def _read_loop(self) -> Exception | None:
        ws = self._ws
        while not self._aborted:
            if not self._readable.is_set():
                await self._readable.wait()
                continue
            message = await ws.receive()
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                data = message.data
                data = data if isinstance(data, bytes) else str(data).encode()
                self._untaken = 0  # (what aiohttp read meanwhile of the next message: one read)
                self._undelivered = len(data)
                await self._deliver(data)
                self._undelivered = 0  # (all of it, or dropped: the connection is closing)
            elif message.type is WSMsgType.ERROR:
                error = message.data
                return error if isinstance(error, Exception) else ConnectionError(str(error))
            else:  # CLOSE, CLOSING (our own close started), CLOSED
                return None
        return None

    async def _deliver(self, data: bytes) -> None:
        """Give `data` to the protocol, never more than READ_CHUNK at a time, nor while paused
        (reading may have been paused while this message was awaited)."""
        view = memoryview(data)
        for offset in range(0, len(data), READ_CHUNK):
            if not self._readable.is_set():
                await self._readable.wait()
            if self._closing or self._aborted:
                return  # asyncio transports stop reading on close(); so does this one
            chunk = data if len(data) <= READ_CHUNK else bytes(view[offset : offset + READ_CHUNK])
            self._undelivered -= len(chunk)  # from now on the session holds it
            self._report_held()
            self._protocol.data_received(chunk)

    def _raw_received(self, size: int) -> None:
        """aiohttp was given `size` more bytes: until it hands them over, they are held."""
        if self._aborted:
            return
        self._untaken += size
        self._report_held()

    def _report_held(self) -> None:
        self._protocol.input_held_below(self._untaken + self._undelivered)

    async def _write_loop(self) -> None:
        """Send the buffered messages in order; close the WebSocket when told to."""
        ws, outgoing = self._ws, self._outgoing
        try:
            while True:
                while outgoing:
                    piece = outgoing[0]
                    await ws.send_frame(piece, message_type(piece))
                    outgoing.popleft()
                    self._buffered -= len(piece)
                    if self._protocol_paused and self._buffered <= self._low:
                        self._protocol_paused = False
                        self._protocol.resume_writing()
                if self._closing or self._lost:
                    break
                self._wake_writer.clear()
                await self._wake_writer.wait()
            if self._closing:
                await ws.close()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away under a send: drop the connection
            log.debug("WebSocket connection dropped while writing: %r", exc)
            self.abort()


class WebSocketServer(StompServer):
    """STOMP over WebSocket on imq.hostname:imq.stomp.ws.port (the listener named "ws").

    The connections are `StompProtocol`s like those of a TCP `StompServer`, whose bookkeeping
    (connections, traffic, journal sync, shutdown) this listener shares; only accepting differs:
    aiohttp's low-level HTTP server takes the WebSocket handshake.
    """

    def __init__(
        self,
        broker: Broker,
        name: str = "ws",
        gate: Gate | None = None,
        fence: Fence | None = None,
    ) -> None:
        super().__init__(broker, name, gate, fence)
        self._http: web.Server | None = None
        self._listening: asyncio.Server | None = None
        self._stopping = False
        self.origins = OriginPolicy(self.config.ws_allowed_origins)
        self._machine = machine_name()
        # A handshake has as long as CONNECT after it (imq.stomp.connect.timeout).
        self.guard = ConnectionGuard(
            "WebSocket endpoint",
            GuardLimits(
                header_timeout_s=self.config.connect_timeout_ms / 1000,
                header_timeout_property="imq.stomp.connect.timeout",
            ),
        )

    @property
    def address(self) -> tuple[str, int]:
        assert self._listening is not None
        assert self._listening.sockets
        host, port = self._listening.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(
        self, host: str | None = None, port: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        """Listen on `host`:`port` (default: imq.hostname and imq.stomp.ws.port)."""
        config = self.config
        timeout_s = config.connect_timeout_ms / 1000
        # After a refused handshake (404, 403, 426) a connection stays no longer than that.
        self._http = web.Server(self._accept, access_log=None, **http_kwargs(timeout_s))
        self._listening = await asyncio.get_running_loop().create_server(
            self.guard.factory(self._http),
            host=config.host if host is None else host,
            port=config.ws_port if port is None else port,
            reuse_address=True,
            backlog=1024,
            ssl=tls,
            # A TLS client has as long to finish its handshake as to send CONNECT afterwards.
            ssl_handshake_timeout=timeout_s if tls is not None else None,
        )
        for sock in self._listening.sockets:
            # Accepted sockets inherit these buffer sizes from the listening socket.
            if config.tcp_inbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, config.tcp_inbufsz)
            if config.tcp_outbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.tcp_outbufsz)

    async def _accept(self, request: web.BaseRequest) -> web.StreamResponse:
        with handling(request):
            return await self._handshake(request)

    def _origin_allowed(self, request: web.BaseRequest) -> bool:
        transport = request.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        served = served_names(
            (self.config.host, local[0] if isinstance(local, tuple) else None), self._machine
        )
        return self.origins.allows(request.headers.get(hdrs.ORIGIN), served)

    async def _handshake(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path not in PATHS:
            return web.Response(
                status=404, text="STOMP over WebSocket is served at /stomp (and /ws, /)\n"
            )
        if not self._origin_allowed(request):
            origin = shown(request.headers[hdrs.ORIGIN])
            log.warning(
                "WebSocket handshake from %s refused: Origin %s is not allowed "
                "(imq.stomp.ws.allowed_origins)",
                request.remote,
                origin,
            )
            return web.Response(
                status=403,
                text=f"Origin {origin} may not open STOMP over WebSocket here: a page of "
                "another site would connect with its visitor's browser. To allow it, add it to "
                "the broker's imq.stomp.ws.allowed_origins (comma-separated "
                "scheme://host[:port], or * for any)\n",
            )
        ws = web.WebSocketResponse(
            protocols=SUBPROTOCOLS,
            timeout=CLOSE_LINGER_S,  # how long our close waits for the client's
            autoping=True,
            heartbeat=None,  # STOMP heart-beats watch the connection
            # No permessage-deflate: compressing secrets (passcodes, message bodies) together
            # with text a peer chooses leaks them (CRIME), and it costs CPU per message.
            compress=False,
            max_msg_size=self.config.max_frame_size + MESSAGE_SLACK,
            decode_text=False,  # TEXT data as bytes: the decoder wants bytes anyway
            writer_limit=SOCKET_CHECK_BYTES,
        )
        if self._stopping:
            return web.Response(status=503, text="the broker is shutting down\n")
        if not ws.can_prepare(request).ok:
            return web.Response(
                status=426,
                headers={"Upgrade": "websocket", "Connection": "Upgrade"},
                text="this is a STOMP over WebSocket endpoint: connect with a WebSocket client "
                f"(subprotocols {', '.join(SUBPROTOCOLS)})\n",
            )
        await ws.prepare(request)
        below = request.transport
        transport = WebSocketTransport(
            ws, StompProtocol(self), below if isinstance(below, asyncio.Transport) else None
        )
        await transport.serve()
        return ws

    async def stop(self) -> None:
        """Stop accepting, tell every client the broker is going, close them, stop aiohttp."""
        self._stopping = True
        if self._listening is not None:
            self._listening.close()
        await super().stop()  # ERROR to every connection, then close (abort after a grace)
        if self._http is not None:
            await self._http.shutdown(CLOSE_LINGER_S)
        if self._listening is not None:
            await self._listening.wait_closed()
