"""The listeners a running broker serves STOMP on, as admin's metrics read them (admin.view)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sluiceway.server.snapshots import ConnectionInfo, Traffic


class ListenerView(Protocol):
    """A service that carries STOMP connections, as its metrics read it."""

    @property
    def name(self) -> str: ...

    def connections(self) -> list[ConnectionInfo]: ...

    def traffic(self) -> Traffic: ...


class ListenersView(Protocol):
    """What the metrics sampler reads: the listeners, as many as have started so far."""

    @property
    def listeners(self) -> Sequence[ListenerView]: ...
