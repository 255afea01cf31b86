"""Queue leases: numbered batches taken out of a queue for one reader, consumed or given back later.

A lease (docs/pipelines-protocol.md, "Queue leases") is what a consumer's delivered and
unacknowledged messages are, owned by a name `GROUP/N` instead of a connection: reading it takes
messages from the head of the queue, in queue order (up to `lease-max-messages` and
`lease-max-bytes`, capped by imq.lease.max_messages and imq.lease.max_bytes); reading it again
returns the same messages. Acknowledging it consumes them; releasing it (NACK) or letting it
expire (`lease-ttl`, default imq.lease.ttl) gives them back to the queue with `redelivered` and
their delivery count, as a NACK does, so maxDeliveryCount and the dead message queue apply. Until
then they stay counted in the queue's limits (maxNumMsgs, maxTotalMsgBytes), so producer flow
control sees them.

Every buffer is bounded: a queue has at most imq.lease.max_groups lease groups (a lease in a new
group beyond it is refused with 414 before anything is written; groups recovered from the journal
are kept even beyond it), a group has at most imq.lease.max_open open leases (414 beyond), each
holds at most imq.lease.max_messages messages (spilled to the swap area like a pending list), and
the group remembers its highest number and as many finished leases as it may have open ones. A
number the group does not remember and that is not above its highest reads as `expired`, never
as a new lease with other messages. A group is never forgotten, so a lease number is never given
out twice.

Expiry is checked by the broker's tick, and also whenever a lease is read or acknowledged, so an
acknowledgement after the deadline is refused (410) even before the tick runs.

A lease's messages left the queue's pending list but not the queue: `LeasedMessages` keeps the
first ones in memory and, once the broker's memory ledger is over `imq.swap.threshold`, writes
the rest to the swap area in chunks; reading a lease again reads the chunks back without removing
them. `LeaseReader` is the subscription a lease read (SUBSCRIBE with `lease:GROUP/N`) creates: it
sends the lease's messages in order, each with a `lease` header, without consuming them, then the
end marker with the lease's state.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from dataclasses import dataclass
from typing import Final

from sluiceway.core.containers.spilling import SpillingRun
from sluiceway.core.model.browsing import BrowserSubscription
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.values.clock import Clock
from sluiceway.core.values.counts import CountLimit, CountRefusals
from sluiceway.core.values.flow import destination_window
from sluiceway.core.values.leasing import (
    CursorRecord,
    GroupRecord,
    LeaseRecord,
    LeaseRecorder,
    LeaseSnapshot,
    LeaseState,
    RecoveredLeases,
    Unrecorded,
)
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.message import Message
from sluiceway.core.values.positions import PositionHomes
from sluiceway.errors import BadRequest, Gone, NotFound, ResourceFull, Unavailable
from sluiceway.naming import DestinationKind, DestinationName

log = logging.getLogger(__name__)

MAX_NUMBER: Final = 2**63 - 1  # lease numbers, sequence numbers and deadlines fit an i64


@dataclass(frozen=True, slots=True)
class LeaseRead:
    """The lease headers of a SUBSCRIBE; the sizes and ttl are used only when creating."""

    group: str
    number: int
    max_messages: int | None = None  # None: the queue's effective consumer flow limit
    max_bytes: int | None = None  # None: imq.lease.max_bytes
    ttl_ms: int | None = None  # None: imq.lease.ttl
    create: bool = True  # False (`lease-create:false`): answer what is there, make nothing
    send: bool = True  # False (`lease-messages:false`): the end marker alone
    strict_bytes: bool = False  # True (`lease-bytes-strict`): may take none over max_bytes


class LeasedMessages(SpillingRun):
    """A lease's messages, in the order they left the queue (queue order)."""

    __slots__ = ()


class Lease:
    """An open lease (or one that just ended, for a read still sending it)."""

    __slots__ = (
        "adopting",
        "expires",
        "group",
        "lease_id",
        "messages",
        "number",
        "queue",
        "state",
    )

    def __init__(
        self,
        queue: Queue,
        group: LeaseGroup,
        *,
        number: int,
        lease_id: int,
        expires: int,
        messages: LeasedMessages,
    ) -> None:
        self.queue = queue
        self.group = group
        self.number = number
        self.lease_id = lease_id
        self.expires = expires  # ms since the epoch
        self.messages = messages
        self.state = LeaseState.OPEN
        self.adopting = False  # being taken over from a failed member: not to be read yet

    @property
    def name(self) -> str:
        return f"{self.group.name}/{self.number}"

    @property
    def record(self) -> LeaseRecord:
        return LeaseRecord(
            self.lease_id, self.queue.name.name, self.group.name, self.number, self.expires
        )


class LeaseGroup:
    """The leases of one group on one queue."""

    __slots__ = ("finished", "high", "name", "open", "queue")

    def __init__(self, queue: DestinationName, name: str) -> None:
        self.queue = queue
        self.name = name
        self.high = -1  # the highest number used; -1: none yet
        self.open: dict[int, Lease] = {}
        # Recently finished leases: number -> (lease id, how it ended), oldest first.
        self.finished: dict[int, tuple[int, LeaseState]] = {}

    def remember(self, number: int, lease_id: int, state: LeaseState, keep: int) -> None:
        self.finished[number] = (lease_id, state)
        while len(self.finished) > keep:
            del self.finished[next(iter(self.finished))]

    def known_state(self, number: int) -> LeaseState:
        """How a finished or forgotten lease (not above `high`) ended, as far as remembered."""
        finished = self.finished.get(number)
        return finished[1] if finished is not None else LeaseState.EXPIRED


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What a lease read answers: the lease's name and state, and the lease when it is open."""

    name: str
    state: LeaseState
    lease: Lease | None = None
    high: int = -1  # the highest number the group used (-1: none)
    send: bool = True  # whether the read returns the lease's messages


class Leases:
    """Every lease group of the broker, by queue and group name."""

    def __init__(
        self,
        config: LiveConfig,
        registry: DestinationRegistry,
        clock: Clock,
        refusals: CountRefusals,
    ) -> None:
        self._config = config
        self._registry = registry
        self._clock = clock
        self._refusals = refusals
        self._groups: dict[tuple[DestinationName, str], LeaseGroup] = {}
        self._group_counts: dict[DestinationName, int] = {}  # groups by queue
        self._next_id = 1  # lease ids are never reused: journal marks name them
        # (expires, lease id, lease) of leases that may be open; ended ones are dropped lazily.
        self._deadlines: list[tuple[int, int, Lease]] = []
        self._open = 0
        # Told of every lease, to keep them across restarts (persist.lease_extension).
        self.recorder: LeaseRecorder = Unrecorded()
        # In a cluster, where the groups this broker does not have live.
        self.homes: PositionHomes | None = None

    @property
    def open_count(self) -> int:
        return self._open

    def group_count(self, queue: DestinationName) -> int:
        """How many lease groups `queue` has (what imq.lease.max_groups bounds)."""
        return self._group_counts.get(queue, 0)

    def most_groups(self) -> int:
        """The most lease groups one queue has."""
        return max(self._group_counts.values(), default=0)

    def _now(self) -> int:
        return self._clock.time_ms()

    # -- reading --------------------------------------------------------------------------------

    def read(self, destination: Destination, request: LeaseRead) -> LeaseView:
        """Lease `request.group/number` of the queue: created now when its number is above
        every number the group used, else the one the broker has (or remembers)."""
        if not isinstance(destination, Queue):
            raise BadRequest(
                "lease on a topic",
                f"the lease header is for queues and {destination.name} is a topic; a topic is "
                "read by sequence number with the cursor header instead",
            )
        name = f"{request.group}/{request.number}"
        key = (destination.name, request.group)
        group = self._groups.get(key)
        send = request.send
        if group is None:
            self._check_elsewhere(destination.name, request.group)
            if not request.create:
                return LeaseView(name, LeaseState.UNREAD, send=send)
            self._check_new_group(destination, name)
            group = LeaseGroup(destination.name, request.group)
        elif request.number <= group.high:
            lease = group.open.get(request.number)
            if lease is not None and lease.adopting:
                raise _adopting(lease)
            if lease is not None and not self._expired(lease):
                return LeaseView(name, LeaseState.OPEN, lease, group.high, send)
            return LeaseView(name, group.known_state(request.number), None, group.high, send)
        elif not request.create:
            return LeaseView(name, LeaseState.UNREAD, None, group.high, send)
        lease = self._create(destination, group, request)
        self._add_group(group)
        return LeaseView(name, LeaseState.OPEN, lease, group.high, send)

    def _check_elsewhere(self, queue: DestinationName, group: str) -> None:
        """Refuse a group this broker does not have when it lives on another cluster member."""
        refusal = None if self.homes is None else self.homes.lease_group(queue, group)
        if refusal is not None:
            raise refusal

    def group_keys(self) -> list[tuple[DestinationName, str]]:
        """Every lease group of the broker, as (queue, group name)."""
        return list(self._groups)

    def _check_new_group(self, queue: Queue, lease: str) -> None:
        """Refuse a new group on `queue` beyond imq.lease.max_groups (before anything is made)."""
        limit = self._config.current.lease_max_groups
        count = self.group_count(queue.name)
        if count >= limit:
            raise self._refusals.refuse(
                CountLimit.LEASE_GROUPS,
                limit,
                "too many lease groups",
                f"{queue.name} already has {count} lease groups, the limit set by "
                f"imq.lease.max_groups ({limit}); lease {lease} would start a new one and was "
                "not read. A group is remembered once it read a lease: read the next lease of a "
                "group in use instead, or raise imq.lease.max_groups",
                destination=queue.name.path,
            )

    def _add_group(self, group: LeaseGroup) -> None:
        key = (group.queue, group.name)
        if key not in self._groups:
            self._groups[key] = group
            self._group_counts[group.queue] = self.group_count(group.queue) + 1

    def _create(self, queue: Queue, group: LeaseGroup, request: LeaseRead) -> Lease:
        config = self._config.current
        if len(group.open) >= config.lease_max_open:
            raise ResourceFull(
                "too many open leases",
                f"lease group {group.name!r} of {queue.name} already has {len(group.open)} open "
                f"leases, the limit set by imq.lease.max_open; acknowledge or release some "
                f"(ACK or NACK with lease:{group.name}/N) before reading lease "
                f"{group.name}/{request.number}",
                destination=queue.name.path,
                limit="imq.lease.max_open",
                limit_value=str(config.lease_max_open),
            )
        max_messages = request.max_messages or destination_window(
            queue.settings.consumer_flow_limit
        )
        max_messages = min(max_messages, config.lease_max_messages)
        max_bytes = config.lease_max_bytes  # -1: no limit
        if request.max_bytes is not None:
            max_bytes = request.max_bytes if max_bytes < 0 else min(request.max_bytes, max_bytes)
        ttl = request.ttl_ms if request.ttl_ms is not None else config.lease_ttl_ms
        now = self._now()
        context = queue.context
        lease = Lease(
            queue,
            group,
            number=request.number,
            lease_id=self._next_id,
            expires=min(now + ttl, MAX_NUMBER),
            messages=LeasedMessages(context.ledger, context.spill),
        )
        self._next_id += 1
        # The lease's record comes before its messages' marks, which name it.
        self.recorder.lease_opened(lease.record)
        self._take(lease, max_messages, max_bytes, now, strict=request.strict_bytes)
        group.high = request.number
        group.open[request.number] = lease
        self._open += 1
        heapq.heappush(self._deadlines, (lease.expires, lease.lease_id, lease))
        log.debug(
            "lease %s of %s opened: %d messages, %d bytes",
            lease.name,
            queue.name,
            len(lease.messages),
            lease.messages.bytes,
        )
        return lease

    def _take(
        self, lease: Lease, max_messages: int, max_bytes: int, now: int, *, strict: bool
    ) -> None:
        """Move messages from the head of the queue into the lease: each is delivered once.
        Without `strict`, the first message is taken even when it alone exceeds `max_bytes`."""
        queue = lease.queue
        if queue.paused_consumers:
            return  # pause dst -pst CONSUMERS: nothing leaves the queue
        pending, messages = queue.pending, lease.messages
        while len(messages) < max_messages and (message := pending.pop()) is not None:
            if message.expires and message.expired(now):
                queue.expired(message)
                continue
            if 0 <= max_bytes < messages.bytes + message.size and (len(messages) or strict):
                pending.restore(message)  # the lease is full (one message is always taken,
                return  # unless strict)
            message.delivery_count += 1
            queue.stats.delivered(message)
            if message.persistent:
                self.recorder.lease_marked(lease.lease_id, message)
            messages.append(message)

    # -- ending ---------------------------------------------------------------------------------

    def acknowledge(self, name: DestinationName, group_name: str, number: int) -> LeaseState:
        """Consume the lease's messages (idempotent); 410 when it expired or was released."""
        group = self._group(name, group_name, number)
        lease = group.open.get(number)
        if lease is not None and lease.adopting:
            raise _adopting(lease)
        if lease is not None and not self._expired(lease):
            self._end(lease, LeaseState.ACKNOWLEDGED)
            return LeaseState.ACKNOWLEDGED
        state = group.known_state(number)
        if state is LeaseState.ACKNOWLEDGED:
            return state
        raise Gone(
            "lease expired",
            f"lease {group_name}/{number} of {name} expired or was released before it was "
            "acknowledged: its messages went back to the queue for redelivery; read a new lease",
            destination=name.path,
        )

    def release(self, name: DestinationName, group_name: str, number: int) -> LeaseState:
        """Give the lease's messages back to the queue now (NACK); idempotent."""
        group = self._group(name, group_name, number)
        lease = group.open.get(number)
        if lease is not None and lease.adopting:
            raise _adopting(lease)
        if lease is not None:
            self._end(lease, LeaseState.EXPIRED)
            return LeaseState.EXPIRED
        return group.known_state(number)

    def _group(self, name: DestinationName, group_name: str, number: int) -> LeaseGroup:
        group = self._groups.get((name, group_name))
        if group is None:
            self._check_elsewhere(name, group_name)
        if group is None or number > group.high:
            raise NotFound(
                "no such lease",
                f"{name} has no lease {group_name}/{number}: it was never read; a lease is "
                f"created by a SUBSCRIBE with lease:{group_name}/{number}",
                destination=name.path,
            )
        return group

    def _expired(self, lease: Lease) -> bool:
        """Expire `lease` now if its deadline passed; True if it did."""
        if self._now() < lease.expires:
            return False
        self._expire(lease)
        return True

    def _expire(self, lease: Lease) -> None:
        log.info(
            "lease %s of %s expired (lease-ttl passed before it was acknowledged): %d messages "
            "back to the queue",
            lease.name,
            lease.queue.name,
            len(lease.messages),
        )
        self._end(lease, LeaseState.EXPIRED)

    def _end(self, lease: Lease, state: LeaseState) -> None:
        """The lease is acknowledged (its messages consumed) or expired (given back)."""
        group, queue = lease.group, lease.queue
        del group.open[lease.number]
        self._open -= 1
        group.remember(lease.number, lease.lease_id, state, self._config.current.lease_max_open)
        lease.state = state
        # The end first: a crash before every REMOVE is written completes them at recovery.
        self.recorder.lease_ended(lease.lease_id, state)
        for batch in lease.messages.drain():
            if state is LeaseState.ACKNOWLEDGED:
                for message in batch:
                    queue.consumed(message)
            else:
                queue.give_back(batch, delivered=True)

    def expire_due(self) -> int:
        """Expire every open lease whose deadline passed (the broker's tick); return how many."""
        now = self._now()
        deadlines = self._deadlines
        count = 0
        while deadlines and deadlines[0][0] <= now:
            lease = heapq.heappop(deadlines)[2]
            if lease.state is LeaseState.OPEN:
                self._expire(lease)
                count += 1
        # Entries of leases that ended early wait for their deadline; rebuild before they
        # outnumber the open leases, so the heap stays proportional to what is open.
        if len(deadlines) > 2 * self._open + 64:
            self._deadlines = [entry for entry in deadlines if entry[2].state is LeaseState.OPEN]
            heapq.heapify(self._deadlines)
        return count

    def destination_destroyed(self, queue: Queue) -> None:
        """An administrator destroyed `queue`: its open leases end, their messages with it."""
        for (name, _), group in self._groups.items():
            if name != queue.name:
                continue
            for lease in list(group.open.values()):
                del group.open[lease.number]
                self._open -= 1
                group.remember(
                    lease.number,
                    lease.lease_id,
                    LeaseState.EXPIRED,
                    self._config.current.lease_max_open,
                )
                lease.state = LeaseState.EXPIRED
                self.recorder.lease_ended(lease.lease_id, LeaseState.EXPIRED)
                for batch in lease.messages.drain():
                    for message in batch:
                        queue.finished(message)

    # -- persistence ----------------------------------------------------------------------------

    # -- adoption (core.features.adoption) -------------------------------------------------------

    def adopt_lease(self, queue: Queue, group_name: str, number: int, expires: int) -> Lease | None:
        """An open lease of a failed member's store, made here under its number (its messages
        follow with `adopt_message`, then `adopted`); None when the number is used here already
        (its messages then go back to the queue). Reads of it are refused until it is whole."""
        group = self._groups.get((queue.name, group_name))
        if group is None:
            group = LeaseGroup(queue.name, group_name)
            self._add_group(group)
        elif number in group.open or number in group.finished:
            return None
        lease = Lease(
            queue,
            group,
            number=number,
            lease_id=self._next_id,
            expires=expires,
            messages=LeasedMessages(queue.context.ledger, queue.context.spill),
        )
        self._next_id += 1
        lease.adopting = True
        self.recorder.lease_opened(lease.record)  # before its messages' marks, which name it
        group.high = max(group.high, number)
        group.open[number] = lease
        self._open += 1
        return lease

    def adopt_message(self, lease: Lease, message: Message) -> None:
        """One message of an adopted lease, in lease order, recorded here (its delivery count
        kept: the lease's mark counts one)."""
        queue = lease.queue
        deliveries = message.delivery_count
        message.location, message.marks, message.wire = 0, None, None
        queue.adopt_taken(message)
        if message.persistent:
            for _ in range(deliveries - 1):
                queue.store.delivered(message)
            self.recorder.lease_marked(lease.lease_id, message)
        lease.messages.append(message)

    def adopted(self, lease: Lease) -> None:
        """The adopted lease is whole: it may be read, acknowledged, and expire."""
        lease.adopting = False
        heapq.heappush(self._deadlines, (lease.expires, lease.lease_id, lease))

    def adopt_group(
        self, queue: Queue, group_name: str, high: int, finished: dict[int, LeaseState]
    ) -> None:
        """A failed member's lease group: its numbers stay used here, and its finished leases
        answer here as they did there. Each is recorded as a lease opened and ended at once, so
        a restart here knows them too; numbers used here already keep what they are here."""
        group = self._groups.get((queue.name, group_name))
        if group is None:
            group = LeaseGroup(queue.name, group_name)
            self._add_group(group)
        if high > group.high and high not in finished:
            finished = {**finished, high: LeaseState.EXPIRED}  # its highest number, forgotten
        keep = self._config.current.lease_max_open
        for number, state in sorted(finished.items()):
            if number in group.open or number in group.finished:
                continue
            lease_id = self._next_id
            self._next_id += 1
            self.recorder.lease_opened(
                LeaseRecord(lease_id, queue.name.name, group_name, number, 0)
            )
            self.recorder.lease_ended(lease_id, state)
            group.remember(number, lease_id, state, keep)
            group.high = max(group.high, number)

    def groups_of(self, queue: DestinationName) -> list[LeaseGroup]:
        """The lease groups of `queue`."""
        return [group for (name, _), group in self._groups.items() if name == queue]

    def open_leases(self, queue: DestinationName) -> list[Lease]:
        """The open leases of `queue`, in the order they were made (which is the order their
        messages left the queue): what a takeover adopts from a failed member's store."""
        leases = [
            lease
            for (name, _), group in self._groups.items()
            if name == queue
            for lease in group.open.values()
        ]
        return sorted(leases, key=lambda lease: lease.lease_id)

    def snapshot(self, cursors: list[CursorRecord]) -> LeaseSnapshot:
        """Everything a new journal segment must restate (with the cursors given)."""
        groups = [
            GroupRecord(name.name, group.name, group.high, dict(group.finished))
            for (name, _), group in self._groups.items()
            if group.high >= 0
        ]
        leases = [lease.record for group in self._groups.values() for lease in group.open.values()]
        return LeaseSnapshot(self._next_id, cursors, groups, leases)

    def restore(self, recovered: RecoveredLeases) -> None:
        """After a restart (the queues' messages are recovered already): the lease groups, the
        open leases with their messages, and the consumption of any message whose lease was
        acknowledged just before a crash."""
        keep = self._config.current.lease_max_open
        self._next_id = max(self._next_id, recovered.next_id)
        # Lease id -> the queue and the lease its recovered messages go to (None: consumed).
        holders: dict[int, tuple[Queue, Lease | None]] = {}
        for (queue_name, group_name), record in recovered.groups.items():
            name = DestinationName(DestinationKind.QUEUE, queue_name)
            group = LeaseGroup(name, group_name)
            group.high = record.high
            queue = self._registry.get(name)
            for number, (lease_id, state) in record.finished.items():
                group.remember(number, lease_id, state, keep)
                if state is LeaseState.ACKNOWLEDGED and isinstance(queue, Queue):
                    holders[lease_id] = (queue, None)
            self._add_group(group)
        for lease_record in recovered.open.values():
            lease = self._reopen(lease_record)
            holders[lease.lease_id] = (lease.queue, lease)
        self._warn_over_limit()
        by_queue: dict[Queue, dict[int, Lease | None]] = {}
        for add, lease_id in recovered.holders.items():
            if lease_id in holders:
                queue, target = holders[lease_id]
                by_queue.setdefault(queue, {})[add] = target
        for queue, wanted in by_queue.items():
            self._settle(queue, wanted)

    def _reopen(self, record: LeaseRecord) -> Lease:
        name = DestinationName(DestinationKind.QUEUE, record.queue)
        queue = self._registry.recovered(name)
        assert isinstance(queue, Queue)
        group = self._groups.get((name, record.group))
        if group is None:
            group = LeaseGroup(name, record.group)
            self._add_group(group)
        group.high = max(group.high, record.number)
        context = queue.context
        messages = LeasedMessages(context.ledger, context.spill)
        lease = Lease(
            queue,
            group,
            number=record.number,
            lease_id=record.lease_id,
            expires=record.expires,
            messages=messages,
        )
        group.open[record.number] = lease
        self._open += 1
        heapq.heappush(self._deadlines, (lease.expires, lease.lease_id, lease))
        return lease

    def _warn_over_limit(self) -> None:
        limit = self._config.current.lease_max_groups
        for queue, count in self._group_counts.items():
            if count > limit:
                log.warning(
                    "%s has %d lease groups in the journal, more than imq.lease.max_groups "
                    "(%d): all are kept, and leases in new groups are refused",
                    queue,
                    count,
                    limit,
                )

    @staticmethod
    def _settle(queue: Queue, wanted: dict[int, Lease | None]) -> None:
        """Take the recovered messages of `queue`'s open leases out of its pending list (in
        queue order, the order they were leased in), and consume those of acknowledged ones,
        in one scan. `wanted`: the ADD location of each such message -> its lease or None."""
        consumed: list[Message] = []

        def choose(message: Message) -> bool:
            if message.location not in wanted:
                return False
            lease = wanted.pop(message.location)
            if lease is None:
                consumed.append(message)
            else:
                lease.messages.append(message)
            return True

        queue.pending.extract(choose, lambda: not wanted)
        for message in consumed:
            queue.consumed(message)
        if consumed:
            log.info(
                "%s: %d messages of a lease acknowledged just before the broker stopped are "
                "consumed now",
                queue.name,
                len(consumed),
            )


class LeaseReader(BrowserSubscription):
    """A lease read: the lease's messages, each labelled `lease:GROUP/N`, then the end marker
    (`lease`, `lease-state`, `lease-count`, `lease-bytes`, `lease-expires`, `lease-high` and
    the range read's headers)."""

    __slots__ = ("_high", "_index", "_lease", "_name", "_send", "_state")

    def _setup(self) -> None:
        super()._setup()
        self._index = 0  # position in the lease of the next message to send
        self._lease: Lease | None = None
        self._name = ""
        self._state = LeaseState.EXPIRED
        self._high = -1
        self._send = True

    def show(self, view: LeaseView) -> None:
        """What this read answers: the lease, its state and its group's highest number; its
        messages unless the view says not to send them."""
        lease = view.lease
        self._name, self._state, self._lease, self._high = view.name, view.state, lease, view.high
        self._send = view.send
        self.pack_extra = (("lease", view.name),)
        if lease is None or not len(lease.messages) or not view.send:
            # Nothing is returned: a following read by sequence would start after the head.
            self._from = self.destination.last_seq + 1

    def fill(self) -> None:
        while not self._done and self.ready():
            lease = self._lease
            batch = []
            if lease is not None and lease.state is LeaseState.OPEN and self._send:
                batch = lease.messages.read_at(self._index, self._room())
            if not batch:
                self._finish()
                return
            for message in batch:
                self._index += 1
                self.stage_seen(message if self.pack else _labelled(message, self._name))
            self.flush_pack()

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
            ("lease-bytes", str(lease.messages.bytes if lease is not None and open_now else 0)),
            ("lease-expires", str(lease.expires if lease is not None else 0)),
            ("lease-high", str(self._high)),
        ]


def _labelled(message: Message, name: str) -> Message:
    """A copy of `message` to write, carrying its lease's name; the journal bookkeeping stays
    with the original, which the lease keeps."""
    return dataclasses.replace(
        message, headers=(("lease", name), *message.headers), location=0, marks=None
    )


def _adopting(lease: Lease) -> Unavailable:
    return Unavailable(
        "lease being taken over",
        f"lease {lease.name} of {lease.queue.name} is being taken over from a cluster member "
        "that failed; read or settle it again in a moment",
        destination=lease.queue.name.path,
    )
