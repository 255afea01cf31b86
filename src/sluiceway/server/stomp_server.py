"""The STOMP listener: accepts connections, runs the core's periodic tick, shuts down cleanly."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.server.connection import ConnectionInfo, StompProtocol

log = logging.getLogger(__name__)

TICK_INTERVAL_S: Final = 1.0  # expiry sweeps and stalled-connection checks run at most this often
SHUTDOWN_GRACE_S: Final = 5.0  # how long stop() waits for connections to finish closing


class StompServer:
    """Serves one Broker over STOMP on TCP."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config: BrokerConfig = broker.config
        self._server: asyncio.Server | None = None
        self._connections: set[StompProtocol] = set()
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._tick: asyncio.TimerHandle | None = None
        self._waiting_sync: set[StompProtocol] = set()  # connections holding frames for a sync

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

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: StompProtocol(self),
            host=self.config.host,
            port=self.config.stomp_port,
            reuse_address=True,
            backlog=1024,
        )
        for sock in self._server.sockets:
            # Accepted sockets inherit these buffer sizes from the listening socket.
            if self.config.tcp_inbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.tcp_inbufsz)
            if self.config.tcp_outbufsz:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.tcp_outbufsz)
        self._tick = loop.call_later(TICK_INTERVAL_S, self._on_tick)

    def _on_tick(self) -> None:
        try:
            # The bytes waiting in write buffers count against the memory budget too.
            self.broker.ledger.external = sum(p.write_buffer_size for p in self._connections)
            self.broker.tick()
            self.flush_store()
        except Exception:  # the tick must survive a bug in one sweep
            log.exception("periodic broker work failed")
        self._tick = asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._on_tick)

    def flush_store(self) -> None:
        """Hand journal records appended so far to the operating system."""
        store = self.broker.store
        if store.buffered:
            store.flush()

    def wait_for_sync(self, protocol: StompProtocol) -> None:
        self._waiting_sync.add(protocol)

    def synced(self) -> None:
        """The journal synced further (called on the loop): release the frames waiting for it."""
        waiting, self._waiting_sync = self._waiting_sync, set()
        for protocol in waiting:
            protocol.flush_control()

    def connection_opened(self, protocol: StompProtocol) -> None:
        self._connections.add(protocol)
        self._all_closed.clear()

    def connection_closed(self, protocol: StompProtocol) -> None:
        self._connections.discard(protocol)
        self._waiting_sync.discard(protocol)
        if not self._connections:
            self._all_closed.set()

    async def stop(self) -> None:
        """Stop accepting, tell every client the broker is going, and close them."""
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self._server is not None:
            self._server.close()
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
        self.broker.close()
