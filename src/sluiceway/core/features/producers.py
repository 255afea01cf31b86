"""The producer side of the broker: admission of new messages, holding and releasing producers.

Every new message passes `admit` (see core.features.limits for the order of the checks): an
administrator's pause, JMS IQ Manager throttling (core.values.throttle), memory level RED and, for a
message the journal would keep, a disk low or full (core.features.disk) hold the SEND; a failed
journal, the system limits and a REJECT_NEWEST destination refuse it; REMOVE_OLDEST /
REMOVE_LOW_PRIORITY make room by evicting; FLOW_CONTROL holds it until there is room
(core.model.holding).

Held connections are released in the order they were first held (Open MQ resumes paused producers
in pause order), each taking at most its producer batch per round, so the first one released
cannot take all the room: under FLOW_CONTROL the batch is maxNumMsgs / maxNumProducers, between
1 and 1000 (Open MQ's producer credit); otherwise 1000.

Memory levels (core.values.memory) come in through a per-connection producer credit: a connection
may send the current level's count of messages (5000 at GREEN, 500 at YELLOW, 50 at ORANGE, 0 at
RED), and at most a quarter of the bytes left below RED, before the broker measures its memory
again; at RED every SEND is held and a connection that is not yet a producer of a destination is
refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluiceway.config import LimitBehavior
from sluiceway.core.features.disk import DiskGuard, DiskPressure
from sluiceway.core.features.limits import (
    Admission,
    Verdict,
    check_system,
    destination_verdict,
    make_room,
)
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.holding import HeldProducer, HeldQueue, HeldSend, HoldTimes
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.subscription import Outlet
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.memory import MESSAGE_OVERHEAD, MemoryLevel, SystemCounts
from sluiceway.core.values.message import Message
from sluiceway.core.values.throttle import Throttle
from sluiceway.errors import BrokerError, ResourceFull

log = logging.getLogger(__name__)

Publish = Callable[[Message], None]  # where an admitted message goes
PublishAll = Callable[[list[Message]], None]  # where the admitted messages of a pack go

MAX_BATCH = 1000  # Open MQ's imq.producer.maxBatch


class Producer(Outlet):
    """What producer control uses of a connection that sends (core.connection).

    A base class for the connection rather than a Protocol: producer control reads and writes
    these on every SEND, and the compiled build reaches a base class's attributes directly (a
    Protocol's through a lookup by name, about 2,600 instructions a SEND more)."""

    held: HeldQueue  # its SENDs held, in order
    produced_to: set[Destination]  # the destinations it is a producer of
    credit: int  # SENDs before the broker measures its memory level again
    credit_bytes: int
    # Its messages move from another cluster member (a link, naming.CLUSTER_LINK_PREFIX): a
    # queue weighs them against what this member holds only, not the cluster's count, which
    # still has them at the member they leave.
    moves: bool


class ProducerControl:
    """Admission, holding and release of the messages producers send."""

    def __init__(
        self,
        config: LiveConfig,
        context: Context,
        registry: DestinationRegistry,
        disk: DiskGuard,
    ) -> None:
        self._config = config
        self._context = context
        self._registry = registry
        self._ledger = context.ledger
        self._disk = disk
        self._clock = context.clock
        # Raised by whatever may let held SENDs go: room freed in a destination, a change here.
        self._room = context.room
        self._room.raised = True
        # Connections with held SENDs, in the order they were first held (insertion order).
        self._order: dict[Producer, None] = {}
        self._throttled: set[Destination] = set()
        self._settling = False
        self.hold_times = HoldTimes()

    @property
    def throttle(self) -> Throttle:
        """The throttling thresholds of the current configuration."""
        config = self._config.current
        return Throttle(
            config.throttling_server_threshold,
            config.throttling_destination_threshold,
            config.throttling_lag,
        )

    # -- producing -----------------------------------------------------------------------------

    def produce(
        self,
        connection: Producer,
        destination: Destination,
        message: Message,
        *,
        report: bool,
        into: Publish | None = None,
    ) -> HeldSend | None:
        """Publish `message` now, hold it (returned), or refuse it.

        With `report` (the SEND asked for a receipt, or the message is persistent) a refusal is
        raised; otherwise the message is dropped and counted, as Open MQ does. With `into`, an
        admitted message goes there instead of into `destination` (a stage,
        core.features.stages), still counted against `destination`'s limits.
        """
        self.register(connection, destination)
        self._spend_credit(connection, message.size)
        if connection.held:  # an earlier SEND waits: this one waits behind it, in order
            return self._hold(
                connection, destination, message, report, connection.held.head().reason, into=into
            )
        admission = self.admit(
            destination, message, journaled=into is not None, local=connection.moves
        )
        if admission.verdict is Verdict.HOLD:
            assert admission.error is not None
            return self._hold(connection, destination, message, report, admission.error, into=into)
        waiting = self._waiting_for(destination) if destination.held_sends else None
        if waiting is not None and admission.verdict is not Verdict.REJECT:
            # Producers already wait for room in this destination: it goes to them first, in
            # the order they were held, not to whoever sends next.
            return self._hold(connection, destination, message, report, waiting, into=into)
        error = self._apply(destination, message, admission, into)
        if error is not None:
            if report:
                raise error
            self._dropped(destination, error)
        return None

    def produce_pack(
        self,
        connection: Producer,
        destination: Destination,
        messages: list[Message],
        *,
        into: PublishAll | None = None,
    ) -> None:
        """Publish all of `messages` now (into `into` when given), or refuse them all and change
        nothing: a pack is taken only when every message of it would be accepted at once. What
        would hold, evict or refuse any of them refuses the pack (ResourceFull, or the
        admission's own error); its sender then sends the messages one by one, each getting
        what a single SEND gets."""
        self.register(connection, destination)
        count, size = len(messages), sum(m.size for m in messages)
        if connection.held or destination.held_sends:
            raise self._pack_refused(destination, count, "earlier sends are held for room")
        journaled = into is not None or any(m.persistent for m in messages)
        admission = self._admit(destination, count, size, journaled=journaled, local=False)
        if admission.verdict is not Verdict.ACCEPT:
            error = admission.error
            reason = "room would be made by evicting" if error is None else str(error)
            raise self._pack_refused(destination, count, reason)
        self._spend_credit(connection, size, count)
        if into is not None:
            into(messages)
            return
        for message in messages:
            destination.publish(message)

    @staticmethod
    def _pack_refused(destination: Destination, count: int, reason: str) -> ResourceFull:
        return ResourceFull(
            "pack not taken whole",
            f"a pack of {count} messages for {destination.name} cannot be taken at once "
            f"({reason}); nothing of it was taken: send its messages one by one",
            destination=destination.name.path,
        )

    def register(self, connection: Producer, destination: Destination) -> None:
        """`connection` becomes a producer of `destination` (maxNumProducers; RED refuses)."""
        if connection.number in destination.producers:
            return
        if self._ledger.check() is MemoryLevel.RED:
            raise self._memory_error("new producers are refused")
        destination.add_producer(connection.number)
        connection.produced_to.add(destination)

    def _spend_credit(self, connection: Producer, size: int, count: int = 1) -> None:
        """Memory levels pace producers (Open MQ's per-connection producer credit): the broker
        measures its memory again once a connection has sent its level's count of messages, or
        a quarter of the bytes left below RED, whichever comes first, and at every SEND from
        ORANGE up. At RED the count is 0: every SEND is measured, and held (see `admit`)."""
        connection.credit -= count
        connection.credit_bytes -= size + count * MESSAGE_OVERHEAD
        ledger = self._ledger
        spent = connection.credit <= 0 or connection.credit_bytes <= 0
        if not spent and ledger.level < MemoryLevel.ORANGE:
            return
        ledger.check()
        connection.credit = ledger.credit
        connection.credit_bytes = ledger.room_below_red // 4

    def admit(
        self,
        destination: Destination,
        message: Message,
        *,
        journaled: bool = False,
        local: bool = False,
    ) -> Admission:
        """What happens to one more message for `destination` now. `journaled`: the message is
        written to the journal even if it is not persistent (a staged one). `local`: weighed
        against what this broker holds only (a message moving from another cluster member)."""
        journaled = journaled or message.persistent
        return self._admit(destination, 1, message.size, journaled=journaled, local=local)

    def _admit(
        self, destination: Destination, count: int, size: int, *, journaled: bool, local: bool
    ) -> Admission:
        """`admit` for `count` messages of `size` bytes in all, taken at once."""
        if destination.paused_producers:
            return Admission(
                Verdict.HOLD,
                ResourceFull(
                    "producers paused",
                    f"the producers of {destination.name} are paused by an administrator; they "
                    "go on when the destination is resumed",
                    destination=destination.name.path,
                ),
            )
        if destination.throttled:
            return Admission(Verdict.HOLD, self._throttle_error(destination))
        if self._ledger.level is MemoryLevel.RED:
            return Admission(Verdict.HOLD, self._memory_error("producers wait"))
        disk = self._disk
        if (disk.holding or disk.refusing) and journaled:
            error = disk.hold_error(destination.name.path)
            return Admission(Verdict.HOLD if disk.holding else Verdict.REJECT, error)
        path, system = destination.name.path, self._context.system
        fullness = destination.local_fullness() if local else destination.fullness()
        if count > 1:  # the limits are checked for one more: the pack's others are there first
            system = SystemCounts(system.count + count - 1, system.bytes)
            fullness = Fullness(fullness.count + count - 1, fullness.bytes)
        try:
            check_system(path, size, self._config.current, system)
        except BrokerError as exc:
            # Kept, not raised here: its traceback would keep this frame (and the message)
            # alive in a reference cycle until the garbage collector runs.
            return Admission(Verdict.REJECT, exc.with_traceback(None))
        settings = destination.settings
        return destination_verdict(
            path,
            size,
            fullness,
            max_count=settings.max_num_msgs,
            max_bytes=settings.max_total_msg_bytes,
            behavior=settings.limit_behavior,
        )

    def _apply(
        self,
        destination: Destination,
        message: Message,
        admission: Admission,
        into: Publish | None = None,
    ) -> BrokerError | None:
        """Publish an admitted message (evicting first if so decided); the error if refused."""
        if admission.verdict is Verdict.REJECT:
            return admission.error
        publish = into if into is not None else destination.publish
        if admission.verdict is Verdict.ACCEPT:
            publish(message)
            return None
        with self._context.store.atomic():  # evictions, their dead copies and the new message
            error = make_room(destination, message)
            if error is None:
                publish(message)
        return error

    def _dropped(self, destination: Destination, error: BrokerError) -> None:
        destination.stats.dropped += 1
        log.debug("dropped a non-persistent message without receipt: %s", error)

    # -- transactions --------------------------------------------------------------------------

    def check_commit(self, sends: list[tuple[Destination, Message]]) -> None:
        """Refuse a COMMIT whose messages the system limits or a REJECT_NEWEST destination
        would refuse, before any is published (all or nothing). What would be held (FLOW_CONTROL,
        throttled, paused) is accepted: a transaction's size is bounded by
        imq.transaction.producer.maxNumMsgs, and holding a COMMIT would hold its ACKs too.
        For that reason a COMMIT that would publish persistent messages while the disk is low,
        full or failed (core.features.disk) is refused too."""
        disk = self._disk
        if disk.holding or disk.refusing:
            persistent = next((d for d, m in sends if m.persistent), None)
            if persistent is not None:
                raise disk.hold_error(persistent.name.path, held=False)
        system = SystemCounts(self._context.system.count, self._context.system.bytes)
        planned: dict[Destination, Fullness] = {}
        for destination, message in sends:
            path = destination.name.path
            check_system(path, message.size, self._config.current, system)
            system.add(message.size)
            settings = destination.settings
            current = planned.get(destination) or destination.fullness()
            if settings.limit_behavior is not LimitBehavior.REJECT_NEWEST:
                current = Fullness(0, 0)  # room is made by eviction, if the message can fit
            admission = destination_verdict(
                path,
                message.size,
                current,
                max_count=settings.max_num_msgs,
                max_bytes=settings.max_total_msg_bytes,
                behavior=LimitBehavior.REJECT_NEWEST,
            )
            if admission.error is not None:
                raise admission.error
            planned[destination] = Fullness(current.count + 1, current.bytes + message.size)

    def publish_committed(self, destination: Destination, message: Message) -> bool:
        """Publish a message of a committed transaction (evicting if its destination does);
        False when no room could be made for it (what fills the destination is being
        delivered), so it was dropped."""
        behavior = destination.settings.limit_behavior
        if behavior in (LimitBehavior.REMOVE_OLDEST, LimitBehavior.REMOVE_LOW_PRIORITY):
            error = self._apply(destination, message, Admission(Verdict.EVICT))
            if error is not None:
                destination.stats.dropped += 1
                log.warning("a message of a committed transaction was dropped: %s", error)
                return False
        else:
            destination.publish(message)
        return True

    # -- holding -------------------------------------------------------------------------------

    def _hold(
        self,
        connection: Producer,
        destination: Destination,
        message: Message,
        report: bool,
        reason: BrokerError,
        *,
        into: Publish | None = None,
    ) -> HeldSend:
        now = self._clock.monotonic()
        send = HeldSend(
            destination,
            message,
            report=report,
            reason=reason,
            since=now,
            deadline=now + self._config.current.hold_timeout_ms / 1000,
            into=into,
        )
        if not connection.held:
            self._order[connection] = None
            log.debug("connection %d held: %s", connection.number, reason)
        connection.held.append(send)
        self._ledger.hold(message)
        destination.held_sends += 1
        return send

    def _unhold(self, send: HeldSend) -> None:
        """`send` leaves the holding area (released, refused, or dropped)."""
        self._ledger.let_go(send.message)
        send.destination.held_sends -= 1
        self.hold_times.observe(self._clock.monotonic() - send.since)

    def _waiting_for(self, destination: Destination) -> BrokerError | None:
        """Why a held SEND waits for `destination` itself (not behind another one, nor for the
        disk), if any."""
        for connection in self._order:
            head = connection.held.head()
            if head.destination is destination and not isinstance(head.reason, DiskPressure):
                return head.reason
        return None

    def hold_full(self, connection: Producer) -> bool:
        """The connection holds as many SENDs as it may: stop reading it."""
        held = connection.held
        config = self._config.current
        return len(held) >= config.hold_max_messages or held.bytes >= config.hold_max_bytes

    def changed(self) -> None:
        """Something an operator changed (a limit, a pause, a setting) may let held SENDs go."""
        self._room.raised = True

    def settle(self) -> None:
        """Release what can go now. Called after every operation that may have made room."""
        room = self._room
        if not room.raised or self._settling:
            return
        self._settling = True
        try:
            while room.raised:
                room.raised = False
                for destination in list(self._throttled):
                    self.review_throttle(destination)
                if not self._order:
                    return
                self._ledger.check()
                for send, error in self._release():
                    send.settle(error)  # may close a connection, or make more room
        finally:
            self._settling = False

    def _release(self) -> list[tuple[HeldSend, BrokerError | None]]:
        """Admit held SENDs, connections in pause order, each at most its batch per round."""
        outcomes: list[tuple[HeldSend, BrokerError | None]] = []
        progress = True
        while progress and self._order:
            progress = False
            for connection in list(self._order):
                held = connection.held
                batch = _batch(held.head().destination)
                released = 0
                while held and released < batch:
                    send = held.head()
                    admission = self.admit(
                        send.destination,
                        send.message,
                        journaled=send.into is not None,
                        local=connection.moves,
                    )
                    if admission.verdict is Verdict.HOLD:
                        assert admission.error is not None
                        send.reason = admission.error
                        break
                    held.popleft()
                    self._unhold(send)
                    error = self._apply(send.destination, send.message, admission, send.into)
                    if error is not None and not send.report:
                        self._dropped(send.destination, error)
                        error = None
                    outcomes.append((send, error))
                    released += 1
                    progress = True
                if not held:
                    del self._order[connection]
        return outcomes

    def expire(self, now: float) -> None:
        """Refuse the held SENDs whose deadline (imq.producer.hold.timeout) passed."""
        outcomes: list[tuple[HeldSend, BrokerError]] = []
        for connection in list(self._order):
            for send in connection.held.expired(now):
                self._unhold(send)
                outcomes.append((send, self._timeout_error(send, now)))
            if not connection.held:
                del self._order[connection]
        for send, error in outcomes:
            log.warning("%s", error)
            send.settle(error)

    def _timeout_error(self, send: HeldSend, now: float) -> ResourceFull:
        reason = send.reason
        return ResourceFull(
            "send held too long",
            f"a SEND to {send.destination.name} was held for {now - send.since:.1f} s, the limit "
            f"set by imq.producer.hold.timeout ({self._config.current.hold_timeout_ms} ms), "
            f"waiting for: "
            f"{reason}",
            destination=send.destination.name.path,
            limit=reason.limit,
            limit_value=reason.limit_value,
        )

    def forget(self, connection: Producer) -> int:
        """The connection closed: drop what it had held (nobody is left to tell); return how
        many; it stops being a producer."""
        self._order.pop(connection, None)
        dropped = connection.held.clear()
        for send in dropped:
            self._unhold(send)
        for destination in connection.produced_to:
            destination.remove_producer(connection.number)
        connection.produced_to.clear()
        return len(dropped)

    def fail_held(self, destination: Destination, error: BrokerError) -> None:
        """Refuse every SEND held for `destination` (it is being destroyed)."""
        outcomes: list[HeldSend] = []
        for connection in list(self._order):
            held = connection.held
            for send in held.clear():
                if send.destination is destination:
                    outcomes.append(send)
                else:
                    held.append(send)
            if not held:
                del self._order[connection]
        for send in outcomes:
            self._unhold(send)
            send.settle(error)

    def held(self) -> list[HeldProducer]:
        """Every connection with held SENDs, in pause order, with the reason of its oldest."""
        producers = []
        for connection in self._order:
            head = connection.held.head()
            producers.append(
                HeldProducer(
                    connection=connection.number,
                    destination=head.destination.name.path,
                    reason=head.reason.summary,
                    detail=str(head.reason),
                    limit=head.reason.limit,
                    since=head.since,
                    held_sends=len(connection.held),
                    held_bytes=connection.held.bytes,
                )
            )
        return producers

    # -- throttling (spec-docs 003) ------------------------------------------------------------

    def review(self) -> None:
        """Periodic (every broker tick): decide which destinations are throttled."""
        if self.throttle.enabled:
            for destination in self._registry:
                if destination.producers or destination.throttled:
                    self.review_throttle(destination)
        self._room.raised = True

    def review_throttle(self, destination: Destination) -> None:
        throttled = self.throttle.decide(
            destination.throttled, self._context.system.count, destination.undelivered()
        )
        if throttled == destination.throttled:
            return
        destination.throttled = throttled
        if throttled:
            self._throttled.add(destination)
            log.info(
                "throttling the producers of %s: %s",
                destination.name,
                self._throttle_error(destination),
            )
        else:
            self._throttled.discard(destination)
            self._room.raised = True
            log.info(
                "producers of %s no longer throttled: %d undelivered, broker holds %d messages",
                destination.name,
                destination.undelivered(),
                self._context.system.count,
            )

    def _throttle_error(self, destination: Destination) -> ResourceFull:
        throttle = self.throttle
        return ResourceFull(
            "producer throttled",
            f"{destination.name} is throttled: the broker holds more than "
            f"imq.throttling.server.threshold ({throttle.server_threshold}) messages and "
            f"{destination.name} has more than imq.throttling.destination.threshold "
            f"({throttle.destination_threshold}) undelivered; it is released below "
            f"{throttle.destination_threshold - throttle.lag} undelivered (imq.throttling.lag "
            f"{throttle.lag}) or when the broker falls below its threshold",
            destination=destination.name.path,
            limit="imq.throttling.destination.threshold",
            limit_value=str(throttle.destination_threshold),
        )

    def _memory_error(self, what: str) -> ResourceFull:
        ledger = self._ledger
        budget = ledger.policy.budget
        return ResourceFull(
            "memory low",
            f"the broker's memory level is RED ({ledger.total} of {budget} bytes of "
            f"imq.memory.budget in use): {what} until consumers free memory",
            limit="imq.memory.budget",
            limit_value=str(budget),
        )


def _batch(destination: Destination) -> int:
    """Messages one held connection may have admitted per release round (Open MQ's Bp)."""
    settings = destination.settings
    if settings.limit_behavior is not LimitBehavior.FLOW_CONTROL or settings.max_num_msgs < 0:
        return MAX_BATCH
    producers = settings.max_num_producers if settings.max_num_producers > 0 else 100
    return max(1, min(settings.max_num_msgs // producers, MAX_BATCH))
