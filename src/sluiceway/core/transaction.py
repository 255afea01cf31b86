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

from sluiceway.core.destination import Destination
from sluiceway.core.message import Message
from sluiceway.core.store import MessageStore
from sluiceway.errors import ResourceFull

if TYPE_CHECKING:
    from sluiceway.core.subscription import Subscription

# Publishes one message of a committed transaction; False when its destination could not keep it.
Publish = Callable[[Destination, Message], bool]


class Transaction:
    """Work of one open transaction, bounded by the per-transaction limits."""

    __slots__ = ("acked", "acks", "id", "nacks", "sends")

    def __init__(self, tx_id: str) -> None:
        self.id = tx_id
        self.sends: list[tuple[Destination, Message]] = []
        self.acks: list[tuple[Subscription, list[Message]]] = []
        self.nacks: list[tuple[Subscription, list[Message]]] = []
        self.acked = 0  # messages covered by ACKs and NACKs

    def add_send(self, destination: Destination, message: Message, limit: int) -> None:
        if len(self.sends) >= limit:
            raise ResourceFull(
                "transaction send limit reached",
                f"transaction {self.id!r} already holds {len(self.sends)} sent messages, the "
                f"limit set by imq.transaction.producer.maxNumMsgs ({limit}); commit it before "
                "sending more, or raise the limit",
            )
        self.sends.append((destination, message))

    def check_ack_room(self, count: int, limit: int) -> None:
        if self.acked + count > limit:
            raise ResourceFull(
                "transaction acknowledgement limit reached",
                f"transaction {self.id!r} would acknowledge {self.acked + count} messages, more "
                f"than imq.transaction.consumer.maxNumMsgs ({limit}); commit it first, or raise "
                "the limit",
            )

    def add_ack(self, subscription: Subscription, messages: list[Message]) -> None:
        self.acks.append((subscription, messages))
        self.acked += len(messages)

    def add_nack(self, subscription: Subscription, messages: list[Message]) -> None:
        self.nacks.append((subscription, messages))
        self.acked += len(messages)

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
        for subscription, messages in _by_subscription([*self.acks, *self.nacks]).items():
            subscription.give_back(messages, delivered=True)
        self._clear()

    def _clear(self) -> None:
        self.sends.clear()
        self.acks.clear()
        self.nacks.clear()
        self.acked = 0


def _by_subscription(
    entries: list[tuple[Subscription, list[Message]]],
) -> dict[Subscription, list[Message]]:
    grouped: dict[Subscription, list[Message]] = {}
    for subscription, messages in entries:
        grouped.setdefault(subscription, []).extend(messages)
    return grouped
