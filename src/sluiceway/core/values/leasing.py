"""The state of topic cursors and queue leases that a store keeps across restarts.

The protocol is in docs/pipelines-protocol.md. These are the values core.features.cursors and
core.features.leases hand to their recorders and take back at recovery; how a store encodes them
is its own affair (the journal's layout is in persist.format).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sluiceway.core.values.message import Message


class LeaseState(enum.Enum):
    """What a lease read or acknowledgement reports (the `lease-state` header)."""

    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    EXPIRED = "expired"  # expired or released before being acknowledged
    UNREAD = "unread"  # never read: answered only to a read that may not create it


@dataclass(frozen=True, slots=True)
class CursorRecord:
    topic: str
    group: str
    position: int


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    lease_id: int
    queue: str
    group: str
    number: int
    expires: int  # ms since the epoch


@dataclass
class GroupRecord:
    """A lease group as a snapshot restates it: its highest number and its finished leases."""

    queue: str
    group: str
    high: int
    # Lease number -> (lease id, how it ended), oldest first.
    finished: dict[int, tuple[int, LeaseState]] = field(default_factory=dict)


@dataclass
class LeaseSnapshot:
    next_id: int
    cursors: list[CursorRecord]
    groups: list[GroupRecord]
    leases: list[LeaseRecord]


class LeaseRecorder(Protocol):
    """What core.features.cursors and core.features.leases tell whoever keeps their state
    across restarts (persist.lease_extension, in the journal)."""

    def cursor_saved(self, record: CursorRecord) -> None:
        """A topic cursor was created or moved."""
        ...

    def cursor_deleted(self, topic: str, group: str) -> None: ...

    def lease_opened(self, record: LeaseRecord) -> None:
        """A queue lease was created; its messages' lease_marked follow."""
        ...

    def lease_marked(self, lease_id: int, message: Message) -> None:
        """A persistent message was taken by lease `lease_id`."""
        ...

    def lease_ended(self, lease_id: int, state: LeaseState) -> None:
        """The lease was acknowledged (its messages' removals follow) or expired."""
        ...


class Unrecorded:
    """The recorder of a broker whose cursors and leases do not outlive it."""

    def cursor_saved(self, record: CursorRecord) -> None:
        pass

    def cursor_deleted(self, topic: str, group: str) -> None:
        pass

    def lease_opened(self, record: LeaseRecord) -> None:
        pass

    def lease_marked(self, lease_id: int, message: Message) -> None:
        pass

    def lease_ended(self, lease_id: int, state: LeaseState) -> None:
        pass


# -- recovery -------------------------------------------------------------------------------


@dataclass
class RecoveredLeases:
    """Cursors and leases as a store's recovery finds them, for core.features.leases to take
    back."""

    next_id: int = 0
    cursors: dict[tuple[str, str], int] = field(default_factory=dict)  # (topic, group) -> position
    groups: dict[tuple[str, str], GroupRecord] = field(default_factory=dict)  # by (queue, group)
    open: dict[int, LeaseRecord] = field(default_factory=dict)  # by lease id
    # The lease that last took each live message (by the message's location in the store).
    holders: dict[int, int] = field(default_factory=dict)

    def marked(self, add: int, lease_id: int) -> None:
        """The lease `lease_id` took the message kept at `add` (its location in the store), the
        latest lease to take it so far."""
        self.holders[add] = lease_id

    def keep_live(self, is_live: Callable[[int], bool]) -> None:
        """Once the store has read everything back: forget the holders of messages consumed
        since."""
        self.holders = {add: lease for add, lease in self.holders.items() if is_live(add)}

    def group(self, queue: str, group: str) -> GroupRecord:
        record = self.groups.get((queue, group))
        if record is None:
            record = self.groups[queue, group] = GroupRecord(queue, group, 0)
        return record

    def opened(self, lease: LeaseRecord) -> None:
        self.open[lease.lease_id] = lease
        group = self.group(lease.queue, lease.group)
        group.high = max(group.high, lease.number)
        self.next_id = max(self.next_id, lease.lease_id + 1)

    def ended(self, lease_id: int, state: LeaseState) -> None:
        lease = self.open.pop(lease_id, None)
        if lease is not None:
            self.group(lease.queue, lease.group).finished[lease.number] = (lease_id, state)

    def restate(self, snapshot: LeaseSnapshot) -> None:
        self.next_id = max(self.next_id, snapshot.next_id)
        self.cursors = {(c.topic, c.group): c.position for c in snapshot.cursors}
        self.groups = {(g.queue, g.group): g for g in snapshot.groups}
        self.open = {lease.lease_id: lease for lease in snapshot.leases}
