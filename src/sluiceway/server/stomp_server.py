"""A STOMP listener (plain TCP or TLS): accepts connections, holds them, shuts them down cleanly.

Every listener counts the connections it accepts in the broker's one `ConnectionCounts`, so
imq.stomp.max_connections and imq.stomp.max_connections_per_address hold over all of them; it
counts the connections it refused, or closed, by each connection and input limit (the metrics).
The broker's periodic tick and the other services live in app.services.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Iterable
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.values.connection_counts import MAX_CONNECTIONS, MAX_PER_ADDRESS
from sluiceway.errors import BrokerError
from sluiceway.security.access import Gate
from sluiceway.server.connection import Fence, StompProtocol
from sluiceway.server.snapshots import ConnectionInfo, Traffic
from sluiceway.session.input_budget import CONNECT_FRAME_SIZE, INPUT_MAX, INPUT_TOTAL_MAX
from sluiceway.session.session import StompSession

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S: Final = 5.0  # how long stop() waits for connections to finish closing
# The limits whose refusals are counted: connections refused when they open, or ended for what
# they sent.
REFUSAL_LIMITS: Final = (
    MAX_CONNECTIONS,
    MAX_PER_ADDRESS,
    CONNECT_FRAME_SIZE,
    INPUT_MAX,
    INPUT_TOTAL_MAX,
)
# A refused connection is logged at most once per limit in this many seconds (with how many
# were refused since), so a flood of connections does not flood the log too.
REFUSAL_LOG_INTERVAL_S: Final = 10.0


class StompServer:
    """Serves one Broker over STOMP on one TCP port, with TLS when given an SSL context."""

    def __init__(
        self,
        broker: Broker,
        name: str = "stomp",
        gate: Gate | None = None,
        fence: Fence | None = None,
    ) -> None:
        """`fence`: a cluster member's lease, checked on every read and write (None: none)."""
        self.broker = broker
        self.fence = fence
        self.name = name  # the service's name in metrics: stomp, stomp-tls
        # With authentication, the users file and access rules every session of the broker
        # shares (one reading of each, re-read when its file changes); None makes one per session.
        self.gate = gate
        self.config: BrokerConfig = broker.config
        self._server: asyncio.Server | None = None
        self._connections: set[StompProtocol] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._waiting_sync: set[StompProtocol] = set()  # connections holding frames for a sync
        self._closed_traffic = Traffic()  # what connections that have closed carried
        self.connections_closed = 0
        # Connections refused when they opened, until their ERROR is delivered and they close.
        self._refused: set[StompProtocol] = set()
        self.refusals: dict[str, int] = dict.fromkeys(REFUSAL_LIMITS, 0)
        self._refusal_log: dict[str, tuple[float, int]] = {}  # last logged, refused since

    @property
    def address(self) -> tuple[str, int]:
        """The host and port actually bound (the port is chosen by the OS when configured 0)."""
        assert self._server is not None
        assert self._server.sockets
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def connections(self) -> list[ConnectionInfo]:
        """A snapshot of every open connection."""
        return [protocol.info() for protocol in self._connections]

    def sessions(self) -> list[StompSession]:
        """The sessions of the open connections that have connected (sent CONNECT)."""
        found = [protocol.session for protocol in self._connections]
        return [session for session in found if session is not None and session.core is not None]

    def traffic(self) -> Traffic:
        """Everything this listener carried since it started, open connections included."""
        total = Traffic()
        total.add(self._closed_traffic)
        for protocol in self._connections:
            total.add(protocol.traffic_now())
        return total

    async def start(
        self, host: str | None = None, port: int | None = None, tls: ssl.SSLContext | None = None
    ) -> None:
        """Listen on `host`:`port` (default: imq.hostname and imq.stomp.tcp.port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: StompProtocol(self),
            host=self.config.host if host is None else host,
            port=self.config.stomp_port if port is None else port,
            reuse_address=True,
            backlog=1024,
            ssl=tls,
            # A client that never finishes the handshake gets as long as one that never sends
            # CONNECT (imq.stomp.connect.timeout), not asyncio's minute.
            ssl_handshake_timeout=self.config.connect_timeout_ms / 1000
            if tls is not None
            else None,
        )
        for sock in self._server.sockets:
            # Accepted sockets inherit these buffer sizes from the listening socket.
            if self.config.tcp_inbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.tcp_inbufsz)
            if self.config.tcp_outbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.tcp_outbufsz)

    @property
    def write_buffered(self) -> int:
        """Bytes waiting in this listener's connections' write buffers."""
        return sum(protocol.write_buffer_size for protocol in self._connections)

    def flush_store(self) -> None:
        """Hand journal records appended so far to the operating system."""
        store = self.broker.store
        if store.buffered:
            store.flush()

    def wait_for_sync(self, protocol: StompProtocol) -> None:
        """`protocol` holds frames until the journal syncs: it is called back (`synced`)."""
        self._waiting_sync.add(protocol)
        session = protocol.session
        if session is not None:
            self.broker.store.request_sync(session.waiting_lsn)

    def synced(self) -> None:
        """The journal synced further (called on the loop): release the frames waiting for it."""
        waiting, self._waiting_sync = self._waiting_sync, set()
        for protocol in waiting:
            protocol.flush_control()

    def resume_input(self) -> None:
        """Something that stopped reading every connection cleared: look at each again."""
        for protocol in self._connections:
            protocol.input_may_go_on()

    @property
    def input_buffered(self) -> int:
        """Bytes of frames being received that this listener's connections hold."""
        return sum(protocol.input_held for protocol in self._connections)

    def admit(self, protocol: StompProtocol, address: str) -> BrokerError | None:
        """Count a new connection from `address`; past a connection limit, the ERROR that
        refuses it (it then never gets a session)."""
        error = self.broker.connection_counts.admit(address)
        if error is None:
            protocol.address = address
            return None
        self._refused.add(protocol)
        self.refused(error.limit)
        self._log_refusal(address, error)
        return error

    def refused(self, limit: str | None) -> None:
        """A connection was refused, or ended, by `limit` (counted if it is one of ours)."""
        if limit in self.refusals:
            self.refusals[limit] += 1

    def _log_refusal(self, address: str, error: BrokerError) -> None:
        limit = error.limit or ""
        now = asyncio.get_running_loop().time()
        last, since = self._refusal_log.get(limit, (-REFUSAL_LOG_INTERVAL_S, 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            self._refusal_log[limit] = (last, since + 1)
            return
        self._refusal_log[limit] = (now, 0)
        more = f"; {since} more refused by it since the last such line" if since else ""
        log.warning("%s: connection refused: %s (status %d)%s", address, error, error.status, more)

    def connection_opened(self, protocol: StompProtocol) -> None:
        self._connections.add(protocol)
        self._all_closed.clear()

    def connection_closed(self, protocol: StompProtocol) -> None:
        if protocol in self._connections:
            self._closed_traffic.add(protocol.traffic_now())
            self.connections_closed += 1
        self._connections.discard(protocol)
        self._waiting_sync.discard(protocol)
        self._refused.discard(protocol)
        if protocol.address is not None:
            self.broker.connection_counts.release(protocol.address)
            protocol.address = None
        if not self._connections:
            self._all_closed.set()

    async def stop(self) -> None:
        """Stop accepting, tell every client the broker is going, and close them."""
        if self._server is not None:
            self._server.close()
        for protocol in list(self._refused):
            protocol.abort()  # its ERROR is written; the broker does not wait for it to be read
        for protocol in list(self._connections):
            protocol.shutdown()
        try:
            await asyncio.wait_for(self._all_closed.wait(), SHUTDOWN_GRACE_S)
        except TimeoutError:
            log.warning(
                "%d connections did not close within %.0f s; dropping them",
                len(self._connections),
                SHUTDOWN_GRACE_S,
            )
            for protocol in list(self._connections):
                protocol.abort()
        if self._server is not None:
            await self._server.wait_closed()


def open_sessions(listeners: Iterable[object]) -> list[StompSession]:
    """The connected sessions of every STOMP listener among `listeners` (TCP, TLS, WebSocket)."""
    return [
        s
        for listener in listeners
        if isinstance(listener, StompServer)
        for s in listener.sessions()
    ]


def find_session(listeners: Iterable[object], number: int) -> StompSession | None:
    """The connected session whose connection ID (its core connection's number) is `number`."""
    for session in open_sessions(listeners):
        if session.core is not None and session.core.number == number:
            return session
    return None
