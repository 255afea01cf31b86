"""Where a cluster's pipeline positions live: the port through which the core asks whether a
lease group or a sink it does not have lives on another member (filled by cluster.positions).

A queue lease group and a sink keep their state (leases and their messages, stages, the last
committed batch) on the member that first served them. Another member that started them anew
would hand out the same lease numbers with other messages, or take a replayed batch for a new
one: so it refuses them (status 503), naming the member they live on and its address, until a
takeover brings them over.
"""

from __future__ import annotations

from typing import Protocol

from sluiceway.errors import BrokerError
from sluiceway.naming import DestinationName


class PositionHomes(Protocol):
    """Asked on the broker's event loop, only for what this broker does not have."""

    def lease_group(self, queue: DestinationName, group: str) -> BrokerError | None:
        """The refusal of lease group `group` of `queue` when it lives on another member."""
        ...

    def sink(self, sink: str) -> BrokerError | None:
        """The refusal of sink `sink` when it lives on another member."""
        ...
