"""The broker-side state of one client connection: its subscriptions, transactions and flow.

Commands come in as method calls (subscribe, send, ack...); refusals are raised as BrokerError with
the status code for the wire. Messages go out by pull: when a subscription has staged messages the
connection calls `on_ready`, and the I/O layer then calls `take(n)` whenever the socket can accept
more, writing at most `imqConnectionFlowCount` payload frames before its control frames.
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sluiceway.core.features.cursors import Cursor, CursorRead, Cursors
from sluiceway.core.features.durable_ports import DurableBook
from sluiceway.core.features.leases import LeaseRead, LeaseReader, Leases
from sluiceway.core.features.limits import check_size
from sluiceway.core.features.producers import Producer, ProducerControl
from sluiceway.core.features.stages import StageArea, StagedSend
from sluiceway.core.features.transaction import OpenTransactions
from sluiceway.core.model.browsing import BrowserSubscription, TopicBrowserSubscription
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.holding import HeldQueue, Sent
from sluiceway.core.model.queue import Queue, QueueSubscription
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.store import MessageStore, StoreError
from sluiceway.core.model.subscription import AckMode, Delivery, MessageFilter, Subscription
from sluiceway.core.model.topic import DurableState, DurableSubscription, Topic, TopicSubscription
from sluiceway.core.values.clock import Clock
from sluiceway.core.values.counts import CountRefusals
from sluiceway.core.values.flow import ConnectionFlow, ConsumerFlow
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.message import Message, PackedSend
from sluiceway.core.values.message_ids import MessageIds
from sluiceway.errors import BadRequest, BrokerError, Conflict, InternalError, ResourceFull
from sluiceway.naming import DestinationKind, DestinationName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionParts:
    """What every connection of one broker works with; the broker makes one and gives it to
    each connection it opens."""

    config: LiveConfig
    clock: Clock
    store: MessageStore
    registry: DestinationRegistry
    ids: MessageIds
    refusals: CountRefusals
    producers: ProducerControl
    stages: StageArea
    cursors: Cursors
    leases: Leases
    durables: DurableBook
    closed: Callable[[CoreConnection], None]  # told once when a connection closes


class CoreConnection(Producer):
    """One client connection as the broker core sees it."""

    def __init__(
        self,
        parts: ConnectionParts,
        number: int,
        flow: ConnectionFlow,
        on_ready: Callable[[], None],
    ) -> None:
        self._parts = parts
        self._config = parts.config
        self._registry = parts.registry
        self._producers = parts.producers
        self.clock = parts.clock
        self.number = number
        self.flow = flow
        self.subscriptions: dict[str, Subscription] = {}
        self._by_number: dict[int, Subscription] = {}
        self._next_subscription = 0
        # Subscriptions with staged messages, in turn: each at most once (added when its first
        # message is staged, dropped when its last is taken), so never more than it has.
        self._busy: deque[Subscription] = deque()
        self.transactions = OpenTransactions(parts.refusals)
        self._on_ready = on_ready
        self.outstanding = 0  # messages given to this connection's subscriptions, not consumed
        self.client_id: str | None = None  # from CONNECT; names durable subscriptions
        self.moves = False  # a cluster link's connection (Producer.moves)
        self.user: str | None = None  # the authenticated login, if authentication is on
        self.opened = self.clock.time_ms()
        self.writable = True
        self.unwritable_since: float | None = None
        self.closed = False
        # Producing: SENDs held until their destination can take them (core.model.holding), the
        # destinations this connection is a producer of, and its memory-level credit.
        self.held = HeldQueue()
        self.produced_to: set[Destination] = set()
        self.credit = 0  # SENDs before the broker measures its memory level again
        self.credit_bytes = 0

    # -- flow ----------------------------------------------------------------------------------

    def can_stage(self) -> bool:
        """Whether any subscription of this connection may be given a message now."""
        if not self.writable or self.closed:
            return False
        flow = self.flow
        return not flow.limit_enabled or self.outstanding < flow.limit

    @property
    def connection_limited(self) -> bool:
        """True while the connection flow limit is what stops delivery."""
        return self.flow.limit_enabled and self.outstanding >= self.flow.limit

    def staged_one(self, subscription: Subscription) -> None:
        self.outstanding += 1

    def released(self, count: int) -> None:
        """`count` messages left this connection's subscriptions (consumed or given back)."""
        was_limited = self.connection_limited
        self.outstanding -= count
        if was_limited and not self.connection_limited:
            self._refill_all()

    def mark_busy(self, subscription: Subscription) -> None:
        """`subscription` has staged messages now (it had none)."""
        self._busy.append(subscription)
        if len(self._busy) == 1 and self.writable:
            self._on_ready()

    def set_writable(self, writable: bool) -> None:
        """The transport's write buffer went above its high-water mark (False) or drained (True)."""
        if writable == self.writable:
            return
        self.writable = writable
        if not writable:
            self.unwritable_since = self.clock.monotonic()
            return
        self.unwritable_since = None
        self._refill_all()
        if self._busy:
            self._on_ready()

    @property
    def has_pending_output(self) -> bool:
        return bool(self._busy)

    def take(self, limit: int, max_bytes: int) -> list[Delivery]:
        """Up to `limit` (> 0) messages to write now, one per busy subscription in turn, and no
        more once their bodies add up to `max_bytes` (at least one is taken), so that large
        bodies do not pile up in the write buffer far past its high-water mark.

        Within a connection the busy subscriptions are served round-robin, one message per turn,
        as Open MQ serves the consumers of a session. A staged message that expired meanwhile is
        dropped here and its window credit returned, so it can never leave a consumer stalled.
        """
        deliveries: list[Delivery] = []
        if not self.writable:
            return deliveries
        busy = self._busy
        now = self.clock.time_ms()
        # ack:auto messages taken, by subscription
        auto: defaultdict[Subscription, list[Message]] = defaultdict(list)
        size = 0
        while busy and len(deliveries) < limit and size < max_bytes:
            subscription = busy.popleft()
            staged = subscription.staged
            message = staged.popleft()
            if staged:
                busy.append(subscription)
            if message.expires and message.expired(now):
                subscription.drop_expired(message)
                continue
            deliveries.append(subscription.write(message))
            size += len(message.body)
            if subscription.ack_mode is AckMode.AUTO:
                auto[subscription].append(message)
        for subscription, messages in auto.items():
            subscription.written(messages)  # consumed a take at a time
        return deliveries

    def _refill_all(self) -> None:
        # Least loaded first: when the connection flow limit frees one slot, it goes to the
        # subscription holding the fewest messages, so no subscription of the connection starves.
        by_load = sorted(self.subscriptions.values(), key=lambda s: s.window.outstanding)
        for subscription in by_load:
            if not self.can_stage():
                return
            if subscription.window.has_credit():
                subscription.refill()

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe(
        self,
        sub_id: str,
        name: DestinationName,
        ack_mode: AckMode,
        *,
        requested_limit: int,
        threshold: int,
        prefetch: bool,
        pool: int = 0,
        selector: MessageFilter | None = None,
        browser: bool = False,
        browse_range: tuple[int, int | None] = (0, None),
        durable_name: str | None = None,
        cursor: CursorRead | None = None,
        lease: LeaseRead | None = None,
        pack: int = 0,
    ) -> Subscription:
        """Create a subscription; it is given messages at once if any are waiting.

        With `browser`, the subscription browses instead: a queue's pending messages, or a
        topic's log, within `browse_range` (first sequence number, first one past the end).
        With `durable_name`, it attaches to that durable subscription of this connection's
        client id, creating it if new. With `cursor` (a topic browser), it opens that cursor
        and reads from its position unless told where; with `lease`, it reads that queue lease,
        creating it if new (core.features.cursors, core.features.leases). A browse with `pack`
        sends that many messages per MESSAGE frame (protocol.pack).
        """
        if sub_id in self.subscriptions:
            raise Conflict(
                "subscription id in use",
                f"this connection already has a subscription with id {sub_id!r}; "
                "UNSUBSCRIBE it first or use another id",
            )
        config = self._config.current
        limit = config.max_subscriptions
        if len(self.subscriptions) >= limit:
            raise ResourceFull(
                "too many subscriptions",
                f"this connection already holds {limit} subscriptions, the limit set by "
                "imq.stomp.max_subscriptions; unsubscribe some or use another connection",
                limit="imq.stomp.max_subscriptions",
                limit_value=str(limit),
            )
        if durable_name is not None and not browser:
            name, durable_name = self._served_where(name, durable_name, selector)
        destination = self._registry.resolve(name)
        state = None
        if durable_name is not None and not browser:
            state = self._durable_state(destination, durable_name, selector)
        # Opened (or created) before anything is registered, since either may be refused.
        parts = self._parts
        limit = config.cursor_max_groups
        opened = None if cursor is None else parts.cursors.open(destination, cursor, limit)
        view = None if lease is None else parts.leases.read(destination, lease)
        flow = ConsumerFlow.negotiate(
            requested_limit=requested_limit,
            threshold=threshold,
            prefetch=prefetch,
            destination_limit=destination.settings.consumer_flow_limit,
            pool=pool,
        )
        if flow.auto and (browser or view is not None):
            flow = flow.fixed()  # a browse or a lease read acknowledges nothing to measure
        self._next_subscription += 1
        cls = _subscription_class(destination, browser, durable=state is not None)
        if view is not None:
            cls = LeaseReader
        subscription = cls(
            sub_id=sub_id,
            number=self._next_subscription,
            connection=self,
            destination=destination,
            ack_mode=AckMode.AUTO if browser or view is not None else ack_mode,
            flow=flow,
            selector=selector,
        )
        if isinstance(subscription, QueueSubscription):
            subscription.queue.attach(subscription)  # may refuse (409): nothing registered yet
        self.subscriptions[sub_id] = subscription
        self._by_number[subscription.number] = subscription
        if isinstance(subscription, BrowserSubscription | TopicBrowserSubscription):
            subscription.pack = pack
        if isinstance(subscription, TopicSubscription):
            subscription.topic.attach(subscription)
        elif isinstance(subscription, DurableSubscription):
            assert state is not None
            subscription.attach(state)
        elif isinstance(subscription, LeaseReader):
            assert view is not None
            subscription.show(view)
        elif isinstance(subscription, BrowserSubscription | TopicBrowserSubscription):
            _set_range(subscription, browse_range, cursor, opened)
        subscription.refill()
        return subscription

    def _served_where(
        self, name: DestinationName, durable_name: str, selector: MessageFilter | None
    ) -> tuple[DestinationName, str | None]:
        """Where a subscriber of durable subscription `durable_name` on topic `name` reads: the
        subscription here, or, when it lives on another member of a cluster, the queue here
        that brings its messages (then no durable name)."""
        if not self.client_id or name.kind is not DestinationKind.TOPIC:
            return name, durable_name
        text = selector.text if selector is not None else ""
        served = self._parts.durables.serve_elsewhere(self.client_id, durable_name, name, text)
        return (name, durable_name) if served is None else (served, None)

    def _durable_state(
        self, destination: Destination, name: str, selector: MessageFilter | None
    ) -> DurableState:
        if not isinstance(destination, Topic):
            raise BadRequest(
                "durable subscriptions are for topics",
                f"{destination.name} is a queue; a queue keeps its messages for any consumer "
                "anyway, durable subscriptions are for topics",
            )
        if not self.client_id:
            raise BadRequest(
                "durable subscription without a client id",
                "a durable subscription belongs to a client id: send client-id on CONNECT",
            )
        state = self._parts.durables.durable_state(destination, self.client_id, name, selector)
        if state.active is not None:
            raise Conflict(
                "durable subscription in use",
                f"durable subscription {name!r} of client {self.client_id!r} already has a "
                "subscriber attached",
            )
        return state

    def remove_durable(self, name: str) -> None:
        """Delete durable subscription `name` of this client id (detaching it here first)."""
        served = self._parts.durables.elsewhere(self.client_id or "", name)
        for subscription in list(self.subscriptions.values()):
            if (
                isinstance(subscription, DurableSubscription)
                and subscription.state.key
                == (
                    self.client_id,
                    name,
                )
            ) or (served is not None and subscription.destination.name == served):
                self.unsubscribe(subscription.id)
        self._parts.durables.remove_durable(self.client_id or "", name)

    def unsubscribe(self, sub_id: str) -> None:
        subscription = self.subscriptions.pop(sub_id, None)
        if subscription is None:
            raise BadRequest(
                "no such subscription",
                f"UNSUBSCRIBE names subscription {sub_id!r}, which this connection does not have",
            )
        self._drop(subscription)

    def _drop(self, subscription: Subscription) -> None:
        del self._by_number[subscription.number]
        if subscription.staged:
            self._busy.remove(subscription)
        subscription.close()

    def subscription(self, sub_id: str) -> Subscription | None:
        return self.subscriptions.get(sub_id)

    def subscription_by_number(self, number: int) -> Subscription | None:
        return self._by_number.get(number)

    def find_unacked(self, message_id: str) -> Subscription | None:
        """The subscription holding unacknowledged message `message_id` (STOMP 1.0 ACKs)."""
        for subscription in self.subscriptions.values():
            if message_id in subscription.unacked:
                return subscription
        return None

    # -- producing -----------------------------------------------------------------------------

    def send(
        self,
        name: DestinationName,
        body: bytes,
        headers: tuple[tuple[str, str], ...],
        *,
        priority: int,
        expires: int,
        persistent: bool,
        transaction: str | None = None,
        report: bool | None = None,
        stage: StagedSend | None = None,
    ) -> Sent:
        """Accept a message for `name`: published now, held until its destination can take it
        (the HeldSend is returned), or published at COMMIT of `transaction`. With `stage`, it
        goes through the same admission into that stage instead (core.features.stages).

        `report` (default: `persistent`) says whether the producer hears of a refusal: the
        SEND asked for a receipt, or is persistent. Without it a refused message is dropped and
        counted (`dropped` in the destination's statistics), as Open MQ does.
        """
        if report is None:
            report = persistent
        destination = self._registry.resolve(name)
        message = Message(
            id=self._parts.ids.new(),
            destination=destination.name,
            body=body,
            headers=headers,
            priority=priority,
            expires=expires,
            persistent=persistent,
            timestamp=self.clock.time_ms(),
        )
        config = self._config.current
        try:
            check_size(name.path, len(body), config, destination.settings.max_bytes_per_msg)
        except BrokerError:
            if report or transaction is not None:
                raise
            destination.stats.dropped += 1
            return Sent(message, None)
        if transaction is not None:
            transactions = self.transactions
            tx = transactions.get(transaction)
            transactions.check_send(tx, message.size, config)  # before any change
            self._producers.register(self, destination)
            transactions.add_send(tx, destination, message)
            return Sent(message, None)
        into = None
        if stage is not None:
            into = self._parts.stages.target(stage.name, destination, stage.ttl_ms)
            if into is None:  # its batch was committed before: accepted, and dropped
                return Sent(message, None)
        held = self._producers.produce(self, destination, message, report=report, into=into)
        return Sent(message, held)

    def send_pack(
        self, name: DestinationName, pack: Sequence[PackedSend], stage: StagedSend | None
    ) -> None:
        """Accept every message of `pack` for `name` at once, or refuse them all and change
        nothing (ProducerControl.produce_pack). With `stage`, they go into that stage."""
        destination = self._registry.resolve(name)
        config, new_id, now = self._config.current, self._parts.ids.new, self.clock.time_ms()
        max_per_msg = destination.settings.max_bytes_per_msg
        messages = []
        for body, headers, priority, expires, persistent in pack:
            check_size(name.path, len(body), config, max_per_msg)
            messages.append(
                Message(
                    id=new_id(),
                    destination=destination.name,
                    body=body,
                    headers=headers,
                    priority=priority,
                    expires=expires,
                    persistent=persistent,
                    timestamp=now,
                )
            )
        into = None
        if stage is not None:
            into = self._parts.stages.target_pack(stage.name, destination, stage.ttl_ms)
            if into is None:  # its batch was committed before: accepted, and dropped
                return
        self._producers.produce_pack(self, destination, messages, into=into)

    # -- acknowledging -------------------------------------------------------------------------

    def ack(self, subscription: Subscription, message_id: str, transaction: str | None) -> int:
        """Acknowledge `message_id` (and, with ack:client, every earlier one); return the count."""
        messages = self._select(subscription, message_id, transaction, "ACK")
        if transaction is None:
            subscription.consumed(messages)
        else:
            self.transactions.get(transaction).add_ack(subscription, messages)
        return len(messages)

    def ack_each(self, acks: Sequence[tuple[int, str] | None], start: int = 0) -> int:
        """Acknowledge, from `acks[start]` on, messages named by (subscription number, message
        id), outside any transaction, each as `ack` would. Stop at the first that is anything
        else (None, unknown, ack:auto, not awaiting acknowledgement) and return its index
        (`len(acks)` when there is none): `ack` refuses it. Each subscription consumes its part
        at once, at the end."""
        acked: defaultdict[Subscription, list[Message]] = defaultdict(list)
        by_number = self._by_number
        index = start
        while index < len(acks):
            named = acks[index]
            if named is None:
                break
            subscription = by_number.get(named[0])
            if subscription is None or subscription.ack_mode is AckMode.AUTO:
                break
            selected = subscription.select(named[1])
            if selected is None:
                break
            acked[subscription] += selected
            index += 1
        for subscription, messages in acked.items():
            subscription.consumed(messages)
        return index

    def nack(self, subscription: Subscription, message_id: str, transaction: str | None) -> int:
        """Refuse `message_id` (cumulatively with ack:client): it is delivered again."""
        messages = self._select(subscription, message_id, transaction, "NACK")
        if transaction is None:
            subscription.give_back(messages, delivered=True)
        else:
            self.transactions.get(transaction).add_nack(subscription, messages)
        return len(messages)

    def _select(
        self, subscription: Subscription, message_id: str, transaction: str | None, verb: str
    ) -> list[Message]:
        if subscription.ack_mode is AckMode.AUTO:
            raise BadRequest(
                f"{verb} on an auto-acknowledged subscription",
                f"subscription {subscription.id!r} uses ack:auto, whose messages are consumed when "
                f"written; subscribe with ack:client or ack:client-individual to {verb}",
            )
        if message_id not in subscription.unacked:
            raise BadRequest(
                f"{verb} for an unknown message",
                f"{verb} names message {message_id!r}, which subscription {subscription.id!r} has "
                "not delivered or which was already acknowledged",
            )
        if transaction is not None:
            tx = self.transactions.get(transaction)
            covered = self._covered(subscription, message_id)
            tx.check_ack_room(covered, self._config.current.tx_consumer_max_msgs)
        selected = subscription.select(message_id)
        assert selected is not None
        return selected

    @staticmethod
    def _covered(subscription: Subscription, message_id: str) -> int:
        if subscription.ack_mode is not AckMode.CLIENT:
            return 1
        for index, key in enumerate(subscription.unacked, start=1):
            if key == message_id:
                return index
        return 0

    # -- transactions --------------------------------------------------------------------------

    def begin(self, tx_id: str) -> None:
        self.transactions.begin(tx_id, self._config.current.max_transactions)

    def commit(self, tx_id: str) -> None:
        """Publish the transaction's messages and consume what it acknowledged, all at once.

        What may refuse the COMMIT comes before any of it takes effect: a system limit or a
        REJECT_NEWEST destination refusing one of its messages, a message the journal cannot
        store, the journal failing to write its records. Then none is published: the
        transaction is rolled back (its messages dropped, its acknowledgements undone, so
        those messages are delivered again) and the refusal raised.
        """
        tx = self.transactions.get(tx_id)
        producers = self._producers
        store = self._parts.store
        try:
            producers.check_commit(tx.sends)
            tx.prepare(store)
        except BrokerError as exc:
            self.transactions.pop(tx_id).abort()
            raise type(exc)(
                "transaction rolled back",
                f"COMMIT of transaction {tx_id!r} was refused and the transaction rolled back "
                f"(its messages were not sent, its acknowledgements undone): {exc}",
                destination=exc.destination,
                limit=exc.limit,
                limit_value=exc.limit_value,
            ) from None
        except Exception as exc:
            log.exception("COMMIT of transaction %r failed on connection %d", tx_id, self.number)
            self.transactions.pop(tx_id).abort()
            cause = (
                "the journal could not write its records"
                if isinstance(exc, StoreError)
                else "the broker failed internally"
            )
            raise InternalError(
                "transaction rolled back",
                f"COMMIT of transaction {tx_id!r} failed and the transaction was rolled back "
                f"(its messages were not sent, its acknowledgements undone): {cause}; the "
                "broker's log says why. Send the transaction again once that is fixed",
            ) from None
        self.transactions.pop(tx_id).commit(store, producers.publish_committed)

    def abort(self, tx_id: str) -> None:
        self.transactions.get(tx_id)
        self.transactions.pop(tx_id).abort()

    # -- lifecycle -----------------------------------------------------------------------------

    def review_windows(self, now: float) -> None:
        """The broker's tick: size the adaptive windows of this connection's subscriptions
        again (a consumer that stopped acknowledging says nothing otherwise)."""
        for subscription in list(self.subscriptions.values()):
            if subscription.auto is not None:
                subscription.review_window(now)

    def reclaim_staged(self) -> int:
        """Give the queues the messages staged here and not written (the client stalled)."""
        count = 0
        for subscription in list(self.subscriptions.values()):
            if isinstance(subscription, QueueSubscription) and subscription.staged:
                self._busy.remove(subscription)
                count += subscription.reclaim_staged()
        return count

    def stop_consuming(self) -> None:
        """Abort open transactions and end every subscription (unconsumed messages go back);
        held SENDs stay (a DISCONNECT waits for them)."""
        self.transactions.abort_all()
        for subscription in list(self.subscriptions.values()):
            del self.subscriptions[subscription.id]
            self._drop(subscription)

    def close(self) -> None:
        """The client left: open transactions are aborted, unconsumed messages returned."""
        if self.closed:
            return
        self.closed = True
        self.stop_consuming()
        dropped = self._producers.forget(self)
        if dropped:
            log.info(
                "connection %d closed with %d SENDs held; they were not accepted",
                self.number,
                dropped,
            )
        self._parts.closed(self)


def _subscription_class(
    destination: Destination, browser: bool, *, durable: bool
) -> type[Subscription]:
    if browser:
        return BrowserSubscription if isinstance(destination, Queue) else TopicBrowserSubscription
    if durable:
        return DurableSubscription
    return QueueSubscription if isinstance(destination, Queue) else TopicSubscription


def _set_range(
    subscription: BrowserSubscription | TopicBrowserSubscription,
    browse_range: tuple[int, int | None],
    cursor: CursorRead | None,
    opened: Cursor | None,
) -> None:
    """The range a browse reads: the one asked for, or from a cursor's position."""
    start, end = browse_range
    if cursor is not None and opened is not None:
        start = cursor.from_seq if cursor.from_seq is not None else opened.position
        end = cursor.to_seq
        subscription.end_extra = opened.end_headers
    if not start and isinstance(subscription, TopicBrowserSubscription):
        destination = subscription.topic
        start = destination.log.first_seq or destination.last_seq + 1
    subscription.set_range(start, end)
