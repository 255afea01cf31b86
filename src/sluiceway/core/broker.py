"""The broker core: destinations and connections, driven by method calls and a clock.

No I/O and no awaiting happen here: the server layer feeds client commands in and writes what
`CoreConnection.take` hands out. `tick()` does the periodic work (expiry sweeps, reclaiming what
stalled connections hold) and is called by the server on a timer, or by a test at will.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

from sluiceway.config import BrokerConfig
from sluiceway.core.clock import Clock, SystemClock
from sluiceway.core.connection import CoreConnection
from sluiceway.core.flow import ConnectionFlow
from sluiceway.core.registry import DestinationRegistry
from sluiceway.core.store import MemoryStore, MessageStore

log = logging.getLogger(__name__)


class Broker:
    """Owns the destination registry and the open connections."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        clock: Clock | None = None,
        store: MessageStore | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.store: MessageStore = store if store is not None else MemoryStore()
        self.registry = DestinationRegistry(config, self.clock, self.store)
        self.connections: dict[int, CoreConnection] = {}
        self._next_connection = 0
        # Message ids are unique across restarts: a random prefix per broker run, then a counter.
        self.instance_id = secrets.token_hex(4)
        self._id_prefix = f"sw-{self.instance_id}-"
        self._next_message = 0
        self._last_sweep = self.clock.monotonic()

    def new_message_id(self) -> str:
        self._next_message += 1
        return f"{self._id_prefix}{self._next_message}"

    def open_connection(
        self, *, flow: ConnectionFlow, on_ready: Callable[[], None]
    ) -> CoreConnection:
        """A new client connection; `on_ready` is called when it has messages to write."""
        self._next_connection += 1
        connection = CoreConnection(self, self._next_connection, flow, on_ready)
        self.connections[connection.number] = connection
        return connection

    def connection_closed(self, connection: CoreConnection) -> None:
        self.connections.pop(connection.number, None)

    def tick(self) -> None:
        """Periodic work: reclaim messages held by stalled connections, sweep expired messages."""
        now = self.clock.monotonic()
        reclaim_after = self.config.stalled_reclaim_ms / 1000
        if reclaim_after > 0:
            for connection in list(self.connections.values()):
                since = connection.unwritable_since
                if since is not None and now - since >= reclaim_after:
                    count = connection.reclaim_staged()
                    if count:
                        log.info(
                            "connection %d has not drained its writes for %.1f s: %d staged "
                            "messages given back to their queues",
                            connection.number,
                            now - since,
                            count,
                        )
        if now - self._last_sweep >= self.config.expiration_interval_s:
            self._last_sweep = now
            self.sweep_expired()

    def sweep_expired(self) -> int:
        """Remove every expired message waiting in a destination; return how many."""
        now_ms = self.clock.time_ms()
        return sum(destination.reap_expired(now_ms) for destination in self.registry)

    def close(self) -> None:
        for connection in list(self.connections.values()):
            connection.close()
        self.store.close()
