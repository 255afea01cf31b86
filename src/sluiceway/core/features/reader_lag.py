"""How far behind each pipeline reader is: a topic's cursors and a queue's lease groups.

A pipeline reader (docs/pipelines-protocol.md) drains a destination without a subscription, so
the admin API, /metrics and the history show it beside the consumers, with its lag: how many
messages of the destination it has not yet taken, and the age of the oldest of them.

- A cursor group (core.features.cursors) has not taken the messages its topic retains at or
  after its committed position. That is the topic's next sequence number minus the position,
  less the numbers no message holds any more: those a restart skipped (sequence numbers are
  reserved in blocks) and messages evicted from a full topic's log. Reading by range does not
  move a cursor, so messages read but not committed are still counted, as a reader that fails
  reads them again.
- A lease group (core.features.leases) has not taken the messages waiting in its queue (not
  delivered to a consumer, not in any lease) nor those of its own open leases: they go back to
  the queue unless it acknowledges them. Messages delivered to the queue's consumers, or leased
  by another group, are not its to take.

The age is the time since the broker accepted the oldest of those messages (its `timestamp`):
for a cursor, the first message at its position; for a lease group, the earliest of the first
waiting message of each priority and the first message of each of its open leases. Finding them
reads at most one spilled chunk per priority level or lease from the swap area; the counts read
none, except for the one chunk a cursor's position falls in.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluiceway.core.containers.pending import PRIORITY_LEVELS
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.topic import Topic

if TYPE_CHECKING:
    from sluiceway.core.containers.seqlog import SeqLog
    from sluiceway.core.features.leases import LeaseGroup, Leases
    from sluiceway.core.model.destination import Destination
    from sluiceway.core.values.message import Message


class ReaderKind(enum.Enum):
    CURSOR_GROUP = "cursor-group"  # a topic cursor (`cursor:GROUP`)
    LEASE_GROUP = "lease-group"  # a queue's leases `GROUP/N` (`lease:GROUP/N`)


@dataclass(frozen=True, slots=True)
class ReaderLag:
    """One pipeline reader of a destination and how far behind it is (the module docstring)."""

    kind: ReaderKind
    group: str
    messages: int  # messages of the destination it has not yet taken
    oldest_ms: int | None  # when the broker accepted the oldest of them (None: there are none)
    position: int | None = None  # a cursor's committed position (the next sequence it needs)
    open_leases: int | None = None  # a lease group's open leases
    leased_messages: int | None = None  # the messages they hold

    def seconds(self, now_ms: int) -> float:
        """The age of the oldest message it has not taken, in seconds (0 when none)."""
        if self.oldest_ms is None:
            return 0.0
        return max(0, now_ms - self.oldest_ms) / 1000


def readers_of(destination: Destination, leases: Leases) -> list[ReaderLag]:
    """The pipeline readers of `destination`, by group name: a topic's cursors, a queue's lease
    groups (those this broker serves)."""
    if isinstance(destination, Topic):
        return [
            cursor_lag(destination, group, mark.position)
            for group, mark in sorted(destination.cursors.items())
        ]
    if isinstance(destination, Queue):
        groups = sorted(leases.groups_of(destination.name), key=lambda group: group.name)
        if not groups:
            return []
        waiting = _first_waiting(destination)
        return [lease_group_lag(destination, group, waiting) for group in groups]
    return []


def reader_count(destination: Destination, leases: Leases) -> int:
    """How many pipeline readers `destination` has, without measuring their lag."""
    if isinstance(destination, Topic):
        return len(destination.cursors)
    return leases.group_count(destination.name)


def cursor_lag(topic: Topic, group: str, position: int) -> ReaderLag:
    count, first = retained_from(topic.log, position)
    return ReaderLag(
        ReaderKind.CURSOR_GROUP,
        group,
        count,
        first.timestamp if first is not None else None,
        position=position,
    )


def lease_group_lag(queue: Queue, group: LeaseGroup, waiting: Iterable[Message]) -> ReaderLag:
    """`waiting`: the first waiting message of each priority level of `queue`."""
    leases = list(group.open.values())
    leased = sum(len(lease.messages) for lease in leases)
    firsts = [*waiting]
    for lease in leases:
        firsts.extend(lease.messages.read_at(0, 1))
    return ReaderLag(
        ReaderKind.LEASE_GROUP,
        group.name,
        queue.pending_count + leased,
        min((message.timestamp for message in firsts), default=None),
        open_leases=len(leases),
        leased_messages=leased,
    )


def _first_waiting(queue: Queue) -> list[Message]:
    """The first message of each priority level of the queue's pending list (each level is in
    arrival order, so its first is its oldest)."""
    pending = queue.pending
    firsts: list[Message] = []
    level = PRIORITY_LEVELS - 1
    while pending and level >= 0:
        # The first message of this level, or of the next one below it that holds any.
        found = pending.following((level, -1), 1)
        if not found:
            break
        firsts.append(found[0])
        level = found[0].priority - 1
    return firsts


def retained_from(log: SeqLog, seq: int) -> tuple[int, Message | None]:
    """How many messages `log` holds with a sequence number of `seq` or above, and the first of
    them. The log is in sequence order: its head and its filling part are searched, its spilled
    chunks counted by their first and last numbers; only a chunk holding the first is read."""
    count = 0
    first: Message | None = None
    head = log.head
    start = bisect.bisect_left(head, seq, key=_seq)
    count += len(head) - start
    if start < len(head):
        first = head[start]
    for chunk in log.chunks:
        if chunk.last_seq < seq:
            continue
        if chunk.first_seq >= seq and first is not None:
            count += chunk.count
            continue
        kept = [m for m in log.read_chunk(chunk, free=False) if m.seq >= seq]
        count += len(kept)
        if first is None and kept:
            first = kept[0]
    filling = log.filling
    start = bisect.bisect_left(filling, seq, key=_seq)
    count += len(filling) - start
    if first is None and start < len(filling):
        first = filling[start]
    return count, first


def _seq(message: Message) -> int:
    return message.seq
