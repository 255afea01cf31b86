"""What a queue lease holds, and how a reader sees it: its messages, and the lease read.

A lease's messages left the queue's pending list but not the queue: they stay counted in its
limits until the lease is acknowledged (consumed) or released (given back). Like a pending list,
`LeasedMessages` keeps the first ones in memory and, once the broker's memory ledger is over
`imq.swap.threshold`, writes the rest to the swap area in chunks; reading a lease again reads
the chunks back without removing them.

`LeaseReader` is the subscription a lease read (SUBSCRIBE with `lease:GROUP/N`) creates: it sends
the lease's messages in order, each with a `lease` header, without consuming them, then the end
marker with the lease's state.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from sluiceway.core.containers.spilling import SpillingRun
from sluiceway.core.model.subscription import BrowserSubscription
from sluiceway.core.values.leasing import LeaseState
from sluiceway.core.values.message import Message

if TYPE_CHECKING:
    from sluiceway.core.features.leases import Lease


class LeasedMessages(SpillingRun):
    """A lease's messages, in the order they left the queue (queue order)."""

    __slots__ = ()


class LeaseReader(BrowserSubscription):
    """A lease read: the lease's messages, each labelled `lease:GROUP/N`, then the end marker
    (`lease`, `lease-state`, `lease-count`, `lease-expires` and the range read's headers)."""

    __slots__ = ("_index", "_lease", "_name", "_state")

    def _setup(self) -> None:
        super()._setup()
        self._index = 0  # position in the lease of the next message to send
        self._lease: Lease | None = None
        self._name = ""
        self._state = LeaseState.EXPIRED

    def show(self, name: str, state: LeaseState, lease: Lease | None) -> None:
        """What this read answers: lease `name`, in `state`, with `lease` when it is open."""
        self._name, self._state, self._lease = name, state, lease
        if lease is None or not len(lease.messages):
            # Nothing is returned: a following read by sequence would start after the head.
            self._from = self.destination.last_seq + 1

    def fill(self) -> None:
        while not self._done and self.ready():
            lease = self._lease
            batch = []
            if lease is not None and lease.state is LeaseState.OPEN:
                batch = lease.messages.read_at(self._index, self._room())
            if not batch:
                self._finish()
                return
            for message in batch:
                self._index += 1
                self.stage_seen(_labelled(message, self._name))

    def end_headers(self) -> list[tuple[str, str]]:
        lease = self._lease
        # A lease acknowledged or expired while it was being read reports what it is now.
        state = lease.state if lease is not None else self._state
        open_now = lease is not None and state is LeaseState.OPEN
        return [
            *super().end_headers(),
            ("lease", self._name),
            ("lease-state", state.value),
            ("lease-count", str(len(lease.messages) if lease is not None and open_now else 0)),
            ("lease-expires", str(lease.expires if lease is not None else 0)),
        ]


def _labelled(message: Message, name: str) -> Message:
    """A copy of `message` to write, carrying its lease's name; the journal bookkeeping stays
    with the original, which the lease keeps."""
    return dataclasses.replace(
        message, headers=(("lease", name), *message.headers), location=0, marks=None
    )
