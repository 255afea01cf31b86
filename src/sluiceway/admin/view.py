"""What the admin endpoint reads of a running broker, declared where it is read.

The object that wires a broker (app.services) sits above admin and hands itself to the admin
endpoint, the metrics sampler and the history; they type it against these protocols, so admin
never imports the wiring it is part of. Each protocol names only what admin reads: the
attributes are read-only properties, which a plain attribute satisfies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sluiceway.admin.listeners import ListenersView
from sluiceway.server.connection import Serving

if TYPE_CHECKING:
    from sluiceway.admin.metrics import MetricsSampler
    from sluiceway.cluster.member import ClusterMember
    from sluiceway.server.snapshots import ConnectionInfo


class BrokerView(ListenersView, Serving, Protocol):
    """A running broker and its services, as the admin API, /metrics and the history read it."""

    @property
    def started(self) -> float: ...

    @property
    def metrics(self) -> MetricsSampler: ...

    @property
    def cluster(self) -> ClusterMember | None:
        """This broker's place in its cluster; None outside one (imq.cluster.ha false)."""
        ...

    def connections(self) -> list[ConnectionInfo]:
        """A snapshot of every open STOMP connection, whatever carries it."""
        ...

    def addresses(self) -> dict[str, tuple[str, int]]:
        """Service name -> the host and port it is bound to."""
        ...
