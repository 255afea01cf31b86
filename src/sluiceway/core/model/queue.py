"""Queues: point to point, each message to exactly one consumer, and how one is chosen.

A queue has one pending list shared by its consumers (Open MQ, reference section 1.4). The queue,
its consumers (`QueueSubscription`) and its dispatch call each other for every message, so they
live together here.

Dispatch, which ready consumer is given which pending message, has two policies (destination
property `dispatchPolicy`, see `config.DispatchPolicy`):

- OPENMQ: consumers are served in the order they subscribed; a ready consumer takes up to its
  whole window from the head of the pending list before the next one is considered ("first come,
  first serve", as the Open MQ tuning guide describes it).
- FAIR: each message goes to the ready consumer that will be done soonest with what it holds:
  its outstanding messages times its pace (the time it takes per message, a moving average of
  what the broker measures between its acknowledgements); ties go to the consumer with fewer
  outstanding messages, then to the one after the last served. No consumer is given more work
  than the shortest full window among them takes (a consumer's window times its pace), so a
  slow consumer holds fewer messages than a fast one and all of them run out at about the same
  time: none idles while another holds messages it has not started. A consumer whose pace is
  not measured yet holds at most WARMUP messages while others' are.

A consumer with a selector only takes messages its selector matches, wherever they are in the
pending list; while any consumer of a queue has a selector, dispatch scans the list in delivery
order and gives each message to a matching ready consumer chosen by the same policy. Messages no
consumer matches stay where they are.
"""

from __future__ import annotations

from typing import Final

from sluiceway.config import DeliveryOrder, DestinationSettings, DispatchPolicy
from sluiceway.core.containers.deadlines import DeadlineList
from sluiceway.core.containers.pending import PackedChunk
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.subscription import Subscription
from sluiceway.core.values.flow import AUTO_MARGIN, AUTO_SLACK_S
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.message import Message
from sluiceway.errors import Conflict
from sluiceway.naming import DestinationName

# Read on every message: a Final name is a C static when compiled (setup.py says why).
_FAIR: Final = DispatchPolicy.FAIR
_DEADLINE: Final = DeliveryOrder.DEADLINE


class Queue(Destination):
    """Point to point: each message to exactly one consumer.

    Consumers beyond maxNumActiveConsumers are backups: they receive nothing until an active
    consumer leaves (the oldest backup is promoted); beyond maxNumBackupConsumers a SUBSCRIBE is
    refused with status 409.
    """

    __slots__ = ("_selective", "backups", "consumers", "pending", "rotation")

    def __init__(
        self, name: DestinationName, settings: DestinationSettings, context: Context
    ) -> None:
        super().__init__(name, settings, context)
        self.pending = context.pending_list(deadlines=settings.delivery_order is _DEADLINE)
        self.consumers: list[QueueSubscription] = []  # the active ones
        self.backups: list[QueueSubscription] = []
        self.rotation = 0  # where the fair policy starts looking, so ties rotate
        self._selective = 0  # consumers with a selector

    @property
    def subscription_count(self) -> int:
        return len(self.consumers) + len(self.backups)

    @property
    def pending_count(self) -> int:
        return len(self.pending)

    def fullness(self) -> Fullness:
        return Fullness(
            self.held_count + self.staged_count + self.remote_count,
            self.held_bytes + self.staged_bytes + self.remote_bytes,
        )

    def local_fullness(self) -> Fullness:
        """As `fullness`, without what other cluster members hold."""
        return Fullness(self.held_count + self.staged_count, self.held_bytes + self.staged_bytes)

    def undelivered(self) -> int:
        return len(self.pending) + sum(len(c.staged) for c in self.consumers)

    def publish(self, message: Message) -> None:
        message.seq = self.next_seq()
        if message.persistent:
            self.store.added(message)  # first: a message the store refuses changes nothing
        self.stats.received(message)
        self._took(message)
        if stage_at_once(self, message):
            return
        self.pending.append(message)
        if self.consumers and not self.context.batch.defer(self.dispatch):
            self.dispatch()

    def order_changed(self) -> None:
        """`deliveryOrder` changed: the pending messages move to a list kept in the new order."""
        deadlines = self.settings.delivery_order is _DEADLINE
        if isinstance(self.pending, DeadlineList) == deadlines:
            return
        old = self.pending
        self.pending = self.context.pending_list(deadlines=deadlines)
        while (message := old.pop()) is not None:
            self.pending.append(message)
        self.dispatch()

    def adopt_taken(self, message: Message) -> None:
        """A message of a failed cluster member's store that a lease there had taken: numbered,
        recorded and counted here as a published one is, and delivered once (its lease here
        holds it, not the pending list; core.features.leases.adopt_message)."""
        message.seq = self.next_seq()
        if message.persistent:
            self.store.added(message)
        self.stats.received(message)
        self._took(message)
        self.stats.delivered(message)

    def stores(self, message: Message) -> bool:
        return message.persistent

    def finished(self, message: Message) -> None:
        """The message leaves the queue for good (consumed, dead, purged)."""
        if message.persistent:
            self.store.removed(message)
        self._let_go(message)

    @property
    def selective(self) -> bool:
        """True while some consumer has a selector (dispatch must then scan)."""
        return self._selective > 0

    def attach(self, consumer: QueueSubscription) -> None:
        settings = self.settings
        if not 0 <= settings.max_num_active_consumers <= len(self.consumers):
            self.consumers.append(consumer)
            if consumer.selector is not None:
                self._selective += 1
        elif not 0 <= settings.max_num_backup_consumers <= len(self.backups):
            consumer.backup = True
            self.backups.append(consumer)
        else:
            raise Conflict(
                "too many consumers",
                f"{self.name} has {len(self.consumers)} active consumers (maxNumActiveConsumers "
                f"{settings.max_num_active_consumers}) and {len(self.backups)} backups "
                f"(maxNumBackupConsumers {settings.max_num_backup_consumers})",
                destination=self.name.path,
                limit="maxNumBackupConsumers",
                limit_value=str(settings.max_num_backup_consumers),
            )

    def detach(self, consumer: QueueSubscription) -> None:
        if consumer.backup:
            self.backups.remove(consumer)
            return
        self.consumers.remove(consumer)
        if consumer.selector is not None:
            self._selective -= 1
        self.promote_backups()

    def promote_backups(self) -> None:
        """While there is room among the active consumers, the oldest backup becomes active."""
        limit = self.settings.max_num_active_consumers
        while self.backups and not 0 <= limit <= len(self.consumers):
            promoted = self.backups.pop(0)
            promoted.backup = False
            self.consumers.append(promoted)
            if promoted.selector is not None:
                self._selective += 1
            promoted.refill()

    def resume_consumers(self) -> None:
        self.dispatch()

    def refill(self, consumer: QueueSubscription) -> None:
        """`consumer` can take more messages: give it what the policy allows."""
        refill_consumer(self, consumer)

    def give_back(self, messages: list[Message], *, delivered: bool) -> None:
        """Take back messages for delivery again, each at its place in the pending list; one
        delivered maxDeliveryCount times is dead instead."""
        limit = self.settings.max_delivery_count
        for message in messages:
            if delivered and 0 < limit <= message.delivery_count:
                self._dead_and_gone(
                    message,
                    "UNDELIVERABLE",
                    f"delivered {message.delivery_count} times (maxDeliveryCount {limit}) "
                    "without being acknowledged",
                )
            else:
                self.pending.restore(message)
        if delivered:
            self.stats.redelivered += len(messages)
        self.dispatch()

    def recovered(self, message: Message) -> None:
        """A persistent message read back from the journal at start-up."""
        self.pending.append(message)
        self._took(message)

    def recovered_packed(self, priority: int, packed: PackedChunk) -> None:
        """Persistent messages read back at start-up, packed for the swap area as they were
        (persist.restoring), behind every message of `priority`."""
        self.pending.append_packed(priority, packed)
        self.held_count += packed.count
        self.held_bytes += packed.body_bytes
        self.context.system.add_all(packed.count, packed.body_bytes)

    def consumed(self, message: Message) -> None:
        super().consumed(message)
        self.finished(message)

    def expired(self, message: Message) -> None:
        super().expired(message)
        self._dead_and_gone(
            message, "EXPIRED", "its expiration time passed before it was delivered"
        )

    def too_late(self, message: Message, finish_ms: int) -> None:
        """Under deadline order: `message` could no longer be consumed before its expiration
        time (by the consumer's pace, it would be done at `finish_ms`): it expires now, leaving
        the consumer's time to messages that can still meet theirs."""
        super().expired(message)
        late = finish_ms - message.expires
        self._dead_and_gone(
            message,
            "EXPIRED",
            f"it could no longer be consumed before its expiration time (about {late} ms "
            "after it, at its consumer's pace; deliveryOrder=deadline)",
        )

    def _dead_and_gone(self, message: Message, reason: str, comment: str) -> None:
        # One journal transaction: the dead copy is kept if and only if the original is gone.
        with self.store.atomic():
            self.dead(message, reason, comment)
            self.finished(message)

    def evict_one(self, *, lowest_priority: bool) -> bool:
        victim = self.pending.evict(lowest_priority=lowest_priority)
        if victim is None:
            return False
        reason = "LOW_PRIORITY" if lowest_priority else "OLDEST"
        self._dead_and_gone(
            victim, reason, f"evicted to make room ({self.settings.limit_behavior.value})"
        )
        return True

    def purge(self) -> int:
        count = 0
        while (message := self.pending.pop()) is not None:
            self.finished(message)
            count += 1
        return count

    def reap_expired(self, now_ms: int) -> int:
        removed = self.pending.remove_expired(now_ms)
        for message in removed:
            self.expired(message)
        return len(removed)

    def dispatch(self) -> None:
        """Stage pending messages to ready consumers (see `dispatch_pending` below)."""
        if not self.paused_consumers:
            dispatch_pending(self)


class QueueSubscription(Subscription):
    """A consumer of a queue: the queue's shared pending list feeds it."""

    __slots__ = ("backup", "queue")

    def _setup(self) -> None:
        assert isinstance(self.destination, Queue)
        self.queue = self.destination
        self.backup = False  # beyond maxNumActiveConsumers: receives nothing until promoted

    def measures_pace(self) -> bool:
        # The `fair` policy (the module docstring) weighs consumers by their pace; deadline
        # order judges by it whether a message can still be consumed in time.
        settings = self.queue.settings
        return (
            self.auto is not None
            or settings.dispatch_policy is _FAIR
            or settings.delivery_order is _DEADLINE
        )

    def release(self, count: int) -> None:
        super().release(count)
        if (
            count
            and self.active
            and self.queue.pending
            and self.queue.settings.dispatch_policy is _FAIR
        ):
            # The policy may have held messages back from this consumer before its window was
            # used up (dispatch, below): each consumption makes room for more.
            self.refill()

    def finish_ms(self, now_ms: int) -> int:
        """When this consumer would have consumed one more message given now, judged on the
        safe side: after the ones it holds, at its pace, and a round trip (an adaptive
        window's measure; else none), half as much again for the pace's and the machine's
        variations, plus AUTO_SLACK_S. `now_ms` when its pace is not measured yet."""
        pace = self.pace
        if pace is None:
            return now_ms
        auto = self.auto
        round_trip = 0.0 if auto is None or auto.round_trip is None else auto.round_trip
        work = (self.window.outstanding + 1) * pace + round_trip
        return now_ms + int((work * (1 + AUTO_MARGIN) + AUTO_SLACK_S) * 1000)

    def stage(self, message: Message) -> None:
        # (An adaptive window's consumer is timed by Subscription.stage.)
        if self.busy_since is None and self.auto is None and self.measures_pace():
            self.busy_since = self.connection.clock.monotonic()
        super().stage(message)

    def ready(self) -> bool:
        return not self.backup and super().ready()

    def refill(self) -> None:
        self.queue.refill(self)

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        self.queue.give_back(messages, delivered=delivered)

    def detach(self) -> None:
        self.queue.detach(self)

    def count_delivery(self, message: Message) -> int:
        # A queue message belongs to one consumer at a time, so the count lives on the message
        # and follows it to the next consumer after a NACK.
        message.delivery_count += 1
        return message.delivery_count

    def note_delivery(self, message: Message) -> None:
        if message.persistent:
            # So that after a crash it comes back marked redelivered.
            self.queue.store.delivered(message)

    def consuming_removes(self) -> bool:
        return True


# Read on every message: a Final name is a C static when compiled (setup.py says why).
_OPENMQ: Final = DispatchPolicy.OPENMQ


def dispatch_pending(queue: Queue) -> None:
    """Stage pending messages to ready consumers according to the queue's policy."""
    if not queue.pending or not queue.consumers:
        return
    if queue.selective:
        _dispatch_scan(queue)
    elif queue.settings.dispatch_policy is _OPENMQ:
        for consumer in queue.consumers:
            fill_consumer(queue, consumer)
            if not queue.pending:
                return
    else:
        _dispatch_fair(queue)


def stage_at_once(queue: Queue, message: Message) -> bool:
    """Under OPENMQ, with no selector and nothing pending, give a new message to the first
    ready consumer now, as `fill` would (it skips the pending list); False: it must wait there.
    A message with an expiry time always waits, for `fill` to check it."""
    if (
        queue.pending
        or queue.selective
        or message.expires
        or queue.settings.dispatch_policy is not _OPENMQ
    ):
        return False
    consumer = _first_ready(queue, message)
    if consumer is None:
        return False
    consumer.stage(message)
    return True


def fill_consumer(queue: Queue, consumer: QueueSubscription) -> None:
    """Give `consumer` messages from the head of the list while it is ready (no selectors)."""
    now = queue.clock.time_ms()
    while consumer.ready() and (message := _pop_live(queue, now)) is not None:
        if not _too_late(queue, consumer, message, now):
            consumer.stage(message)


def _too_late(queue: Queue, consumer: QueueSubscription, message: Message, now: int) -> bool:
    """Under deadline order, whether `message` (taken from the pending list) would be
    consumed after its expiration time if `consumer` took it: then it expires now
    (Queue.too_late). Earliest deadline first gives the consumer the message nearest its
    deadline; under overload that is one it cannot finish in time, and each such message
    makes the next late too. Expiring those keeps the consumer on messages it can finish."""
    if not message.expires or queue.settings.delivery_order is not _DEADLINE:
        return False
    finish = consumer.finish_ms(now)
    if finish <= message.expires:
        return False
    queue.too_late(message, finish)
    return True


def _pop_live(queue: Queue, now: int) -> Message | None:
    """The head of the pending list, dropping (and counting) expired messages on the way."""
    while (message := queue.pending.pop()) is not None:
        if not (message.expires and message.expired(now)):
            return message
        queue.expired(message)
    return None


def refill_consumer(queue: Queue, consumer: QueueSubscription) -> None:
    """`consumer` can take more: under OPENMQ it takes them itself, otherwise the policy runs."""
    if queue.selective or queue.settings.dispatch_policy is not _OPENMQ:
        dispatch_pending(queue)
    else:
        fill_consumer(queue, consumer)


WARMUP = 16  # messages a consumer of unknown pace may hold while other consumers' are known


def _dispatch_fair(queue: Queue) -> None:
    now = queue.clock.time_ms()
    horizon = _horizon(queue)
    while queue.pending:
        consumer = _least_loaded(queue, None, horizon)
        if consumer is None:
            return
        message = _pop_live(queue, now)
        if message is None:
            return
        if not _too_late(queue, consumer, message, now):
            consumer.stage(message)


def _horizon(queue: Queue) -> float | None:
    """The most work (in seconds) a consumer may hold: the shortest full window among the
    consumers whose pace is known; None while no pace is known, or none takes measurable time
    (then only the number of outstanding messages counts)."""
    horizon = None
    for consumer in queue.consumers:
        if consumer.pace is not None and consumer.window.limit > 0:
            full = consumer.window.limit * consumer.pace
            if horizon is None or full < horizon:
                horizon = full
    return horizon or None


def _least_loaded(
    queue: Queue, message: Message | None, horizon: float | None
) -> QueueSubscription | None:
    """The ready consumer (matching `message`, if given) that would be done with its
    outstanding messages soonest, within the `horizon` (see the module's FAIR).

    Starts looking after the last consumer served, so equal consumers take turns.
    """
    consumers = queue.consumers
    count = len(consumers)
    best: QueueSubscription | None = None
    best_index = 0
    best_load = (0.0, 0)
    for offset in range(count):
        index = (queue.rotation + offset) % count
        consumer = consumers[index]
        if not _has_room(consumer, horizon) or (
            message is not None and not consumer.accepts(message)
        ):
            continue
        outstanding = consumer.window.outstanding
        load = ((outstanding + 1) * (consumer.pace or 0.0), outstanding)
        if best is None or load < best_load:
            best, best_index, best_load = consumer, index, load
    if best is not None:
        queue.rotation = (best_index + 1) % count
    return best


def _has_room(consumer: QueueSubscription, horizon: float | None) -> bool:
    """Ready, and holding less work than the `horizon` allows (FAIR)."""
    if not consumer.ready():
        return False
    if horizon is None:
        return True
    outstanding, pace = consumer.window.outstanding, consumer.pace
    if pace is None:
        return outstanding < WARMUP
    # One more while what it holds is within the horizon; one at least, however slow it is.
    return not outstanding or outstanding * pace < horizon


def _first_ready(queue: Queue, message: Message) -> QueueSubscription | None:
    for consumer in queue.consumers:
        if consumer.ready() and consumer.accepts(message):
            return consumer
    return None


def _dispatch_scan(queue: Queue) -> None:
    now = queue.clock.time_ms()
    pick = _first_ready if queue.settings.dispatch_policy is _OPENMQ else None
    horizon = _horizon(queue) if pick is None else None

    def choose(message: Message) -> bool:
        if message.expires and message.expired(now):
            queue.expired(message)
            return True
        if pick is not None:
            consumer = pick(queue, message)
        else:
            consumer = _least_loaded(queue, message, horizon)
        if consumer is None:
            return False
        if not _too_late(queue, consumer, message, now):
            consumer.stage(message)
        return True

    def nobody_ready() -> bool:
        return not any(_has_room(consumer, horizon) for consumer in queue.consumers)

    queue.pending.extract(choose, nobody_ready)
