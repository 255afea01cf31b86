"""Open STOMP connections, counted in all and per client address, against their limits.

`imq.stomp.max_connections` bounds the connections of every STOMP service together (TCP, TLS,
WebSocket) and `imq.stomp.max_connections_per_address` those from one client IP address, as Open
MQ bounds a service with `imq.<service>.max_threads`: here a connection is what costs (a socket,
its buffers, a session), so connections are what is counted. A connection counts from the moment
it is accepted until its socket is gone, closing included; a refused one never counts. The I/O
layer asks `admit` for each connection it accepts, and calls `release` when it is gone.
"""

from __future__ import annotations

from typing import Final

from sluiceway.errors import ResourceFull

MAX_CONNECTIONS: Final = "imq.stomp.max_connections"
MAX_PER_ADDRESS: Final = "imq.stomp.max_connections_per_address"


class ConnectionCounts:
    """The broker's open STOMP connections: how many in all, and how many per address."""

    __slots__ = ("_by_address", "max_per_address", "max_total", "total")

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.total = 0
        # Only addresses with a connection open: at most max_total entries.
        self._by_address: dict[str, int] = {}

    def admit(self, address: str) -> ResourceFull | None:
        """Count one more connection from `address`; past a limit, do not count it and return
        the error that refuses it."""
        if self.total >= self.max_total:
            return ResourceFull(
                f"too many connections ({MAX_CONNECTIONS})",
                f"the broker has {self.total} STOMP connections open, the most "
                f"{MAX_CONNECTIONS} allows ({self.max_total}); connect again once others "
                f"have closed, or raise {MAX_CONNECTIONS}",
                limit=MAX_CONNECTIONS,
                limit_value=str(self.max_total),
            )
        held = self._by_address.get(address, 0)
        if held >= self.max_per_address:
            return ResourceFull(
                f"too many connections from {address} ({MAX_PER_ADDRESS})",
                f"{address} has {held} STOMP connections open, the most one address may have "
                f"({MAX_PER_ADDRESS} = {self.max_per_address}); close some of them, or raise "
                f"{MAX_PER_ADDRESS}",
                limit=MAX_PER_ADDRESS,
                limit_value=str(self.max_per_address),
            )
        self.total += 1
        self._by_address[address] = held + 1
        return None

    def release(self, address: str) -> None:
        """A connection `admit` counted is gone."""
        held = self._by_address.get(address, 0)
        if held <= 0:
            return  # (never admitted: nothing to give back)
        self.total -= 1
        if held == 1:
            del self._by_address[address]
        else:
            self._by_address[address] = held - 1

    def from_address(self, address: str) -> int:
        """Connections open from `address`."""
        return self._by_address.get(address, 0)

    @property
    def most_per_address(self) -> int:
        """The most connections any one address has open (0: none open)."""
        return max(self._by_address.values(), default=0)
