"""A STOMP transaction: SENDs and ACK/NACKs held back until COMMIT, dropped or undone by ABORT.

"Consumed" means acknowledged or committed, so messages acknowledged inside a transaction still
count against their subscription's window until the COMMIT. ABORT (and a disconnect with the
transaction open) redelivers the messages it acknowledged, as a JMS session rollback does.

A COMMIT is all or nothing, in two steps. `prepare` does everything that can fail: it numbers
the messages as publishing will, and writes the records of what the COMMIT publishes and
consumes to the journal as one transaction (an unstorable message or a journal that refuses the
write fails it there, before anything is published, and the caller rolls the transaction back).
`commit` then takes effect in memory: publishing adopts the records already written (a message
whose location is set counts as stored) instead of writing them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sluiceway.core.model.destination import Destination
from sluiceway.core.model.store import MessageStore
from sluiceway.core.values.counts import CountLimit, CountRefusals
from sluiceway.core.values.message import Message
from sluiceway.errors import BadRequest, ResourceFull

if TYPE_CHECKING:
    from sluiceway.config import BrokerConfig
    from sluiceway.core.model.subscription import Subscription

# Publishes one message of a committed transaction; False when its destination could not keep it.
Publish = Callable[[Destination, Message], bool]


class Transaction:
    """Work of one open transaction, bounded by the per-transaction limits."""

    __slots__ = ("acked", "acks", "bytes", "id", "nacks", "sends")

    def __init__(self, tx_id: str) -> None:
        self.id = tx_id
        self.sends: list[tuple[Destination, Message]] = []
        self.acks: list[tuple[Subscription, list[Message]]] = []
        self.nacks: list[tuple[Subscription, list[Message]]] = []
        self.acked = 0  # messages covered by ACKs and NACKs
        self.bytes = 0  # of the bodies of `sends`

    def add_send(self, destination: Destination, message: Message) -> None:
        """Hold `message` until COMMIT (OpenTransactions.check_send checked the limits)."""
        self.sends.append((destination, message))
        self.bytes += message.size

    def check_ack_room(self, count: int, limit: int) -> None:
        if self.acked + count > limit:
            raise ResourceFull(
                "transaction acknowledgement limit reached",
                f"transaction {self.id!r} would acknowledge {self.acked + count} messages, more "
                f"than imq.transaction.consumer.maxNumMsgs ({limit}); commit it first, or raise "
                "the limit",
                limit="imq.transaction.consumer.maxNumMsgs",
                limit_value=str(limit),
            )

    def add_ack(self, subscription: Subscription, messages: list[Message]) -> None:
        self.acks.append((subscription, messages))
        self.acked += len(messages)
        subscription.destination.held_by_transaction(messages, True)

    def add_nack(self, subscription: Subscription, messages: list[Message]) -> None:
        self.nacks.append((subscription, messages))
        self.acked += len(messages)
        subscription.destination.held_by_transaction(messages, True)

    def _let_go(self) -> None:
        """The transaction holds its acknowledged and refused messages no more."""
        for subscription, messages in [*self.acks, *self.nacks]:
            subscription.destination.held_by_transaction(messages, False)

    def prepare(self, store: MessageStore) -> None:
        """The part of a COMMIT that may fail, done before any of it takes effect: number the
        messages as publishing will, reserve those numbers, and write the records of what the
        COMMIT publishes and consumes (raises, changing nothing the broker shows, when the
        store refuses them: the caller rolls the transaction back)."""
        # Dead copies that publishing may make go to the dead message queue and would take the
        # numbers planned there: messages sent to it are published first, before anything else.
        self.sends.sort(key=lambda send: not send[0].is_dmq)  # (stable: sending order kept)
        following: dict[Destination, int] = {}
        for destination, message in self.sends:
            message.seq = following.get(destination, destination.last_seq + 1)
            following[destination] = message.seq + 1
        for destination, after in following.items():
            destination.reserve(after - 1)
        store.write_transaction(
            [message for destination, message in self.sends if destination.stores(message)],
            [
                message
                for subscription, messages in self.acks
                if subscription.consuming_removes()
                for message in messages
                if message.location
            ],
        )

    def commit(self, store: MessageStore, publish: Publish) -> None:
        """Take effect, once `prepare` succeeded: publish the messages, consume what was
        acknowledged, give back what was refused. Nothing here writes the records `prepare`
        wrote; what publishing causes besides (evictions and dead copies, a durable
        subscription's acknowledgements) is recorded as it happens, all together."""
        with store.atomic():
            dead_letters = 0
            while dead_letters < len(self.sends) and self.sends[dead_letters][0].is_dmq:
                dead_letters += 1
            self._publish(store, publish, self.sends[:dead_letters])
            self._let_go()
            # Each subscription sees all its acknowledged messages leave at once, so a refill is
            # sized by what remains after the whole transaction.
            for subscription, messages in _by_subscription(self.acks).items():
                subscription.consumed(messages)
            for subscription, messages in _by_subscription(self.nacks).items():
                subscription.give_back(messages, delivered=True)
            self._publish(store, publish, self.sends[dead_letters:])
        self._clear()

    @staticmethod
    def _publish(
        store: MessageStore, publish: Publish, sends: list[tuple[Destination, Message]]
    ) -> None:
        for destination, message in sends:
            planned = message.seq
            if not publish(destination, message):
                # Not kept after all (no room could be made): its number is skipped, so those
                # planned after it hold, and its ADD dies.
                destination.next_seq()
                if message.location:
                    store.removed(message)
            assert message.seq == planned, (destination.name, message.seq, planned)

    def abort(self) -> None:
        self._let_go()
        for subscription, messages in _by_subscription([*self.acks, *self.nacks]).items():
            subscription.give_back(messages, delivered=True)
        self._clear()

    def _clear(self) -> None:
        self.sends.clear()
        self.acks.clear()
        self.nacks.clear()
        self.acked = 0
        self.bytes = 0


class OpenTransactions:
    """The open transactions of one connection, and the messages they hold together.

    Per connection: at most imq.stomp.max_transactions open, holding at most
    imq.stomp.transactions.max_messages messages and imq.stomp.transactions.max_bytes bytes of
    bodies sent in them (one message is always accepted when they hold none, so a message of
    imq.message.max_size can be sent in a transaction); per transaction, at most
    imq.transaction.producer.maxNumMsgs sends (core.values.counts). A refused BEGIN or SEND changes
    nothing: the transactions stay open, holding what they held.
    """

    __slots__ = ("_open", "_refusals", "bytes", "messages")

    def __init__(self, refusals: CountRefusals) -> None:
        self._open: dict[str, Transaction] = {}
        self._refusals = refusals
        self.messages = 0  # sent in the open transactions, not yet committed or aborted
        self.bytes = 0  # of their bodies

    def __len__(self) -> int:
        return len(self._open)

    def values(self) -> list[Transaction]:
        return list(self._open.values())

    def begin(self, tx_id: str, limit: int) -> None:
        if tx_id in self._open:
            raise BadRequest(
                "transaction already begun",
                f"transaction {tx_id!r} is already open on this connection; COMMIT or ABORT it "
                "before beginning it again",
            )
        if len(self._open) >= limit:
            raise self._refusals.refuse(
                CountLimit.TRANSACTIONS,
                limit,
                "too many open transactions",
                f"this connection already has {len(self._open)} open transactions, the limit "
                f"set by imq.stomp.max_transactions ({limit}); commit or abort some first, or "
                "raise imq.stomp.max_transactions",
            )
        self._open[tx_id] = Transaction(tx_id)

    def get(self, tx_id: str) -> Transaction:
        tx = self._open.get(tx_id)
        if tx is None:
            raise BadRequest(
                "no such transaction",
                f"transaction {tx_id!r} is not open on this connection; BEGIN it first",
            )
        return tx

    def check_send(self, tx: Transaction, size: int, config: BrokerConfig) -> None:
        """Refuse a message of `size` bytes that `tx` may not take (status 414)."""
        refuse = self._refusals.refuse
        sends = config.tx_producer_max_msgs
        if len(tx.sends) >= sends:
            raise refuse(
                CountLimit.TRANSACTION_SENDS,
                sends,
                "transaction send limit reached",
                f"transaction {tx.id!r} already holds {len(tx.sends)} sent messages, the limit "
                f"set by imq.transaction.producer.maxNumMsgs ({sends}); commit it before "
                "sending more, or raise imq.transaction.producer.maxNumMsgs",
            )
        held = config.tx_max_messages
        if self.messages >= held:
            raise refuse(
                CountLimit.TRANSACTION_MESSAGES,
                held,
                "too many messages in transactions",
                f"this connection's open transactions already hold {self.messages} messages, "
                f"the limit set by imq.stomp.transactions.max_messages ({held}); this SEND was "
                f"refused and transaction {tx.id!r} stays open: commit or abort some "
                "transactions first, or raise imq.stomp.transactions.max_messages",
            )
        room = config.tx_max_bytes
        if self.messages and self.bytes + size > room:
            raise refuse(
                CountLimit.TRANSACTION_BYTES,
                room,
                "too many bytes in transactions",
                f"this connection's open transactions hold {self.bytes} bytes of message "
                f"bodies, and this {size}-byte message would take them past "
                f"imq.stomp.transactions.max_bytes ({room}); this SEND was refused and "
                f"transaction {tx.id!r} stays open: commit or abort some transactions first, "
                "or raise imq.stomp.transactions.max_bytes",
            )

    def add_send(self, tx: Transaction, destination: Destination, message: Message) -> None:
        tx.add_send(destination, message)
        self.messages += 1
        self.bytes += message.size

    def pop(self, tx_id: str) -> Transaction:
        """Close `tx_id` (for its COMMIT or ABORT): what it holds no longer counts."""
        tx = self._open.pop(tx_id)
        self.messages -= len(tx.sends)
        self.bytes -= tx.bytes
        return tx

    def abort_all(self) -> None:
        for tx_id in list(self._open):
            self.pop(tx_id).abort()


def _by_subscription(
    entries: list[tuple[Subscription, list[Message]]],
) -> dict[Subscription, list[Message]]:
    grouped: dict[Subscription, list[Message]] = {}
    for subscription, messages in entries:
        grouped.setdefault(subscription, []).extend(messages)
    return grouped
