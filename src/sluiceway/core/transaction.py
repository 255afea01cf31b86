"""A STOMP transaction: SENDs and ACK/NACKs held back until COMMIT, dropped or undone by ABORT.

"Consumed" means acknowledged or committed, so messages acknowledged inside a transaction still
count against their subscription's window until the COMMIT. ABORT (and a disconnect with the
transaction open) redelivers the messages it acknowledged, as a JMS session rollback does.
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

    def commit(self, store: MessageStore, publish: Callable[[Destination, Message], None]) -> None:
        # A COMMIT consumes atomically: each subscription sees all its acknowledged messages
        # leave at once, so a refill is sized by what remains after the whole transaction; and
        # the store records the whole transaction or, after a crash, none of it.
        with store.atomic():
            for subscription, messages in _by_subscription(self.acks).items():
                subscription.consumed(messages)
            for subscription, messages in _by_subscription(self.nacks).items():
                subscription.give_back(messages, delivered=True)
            for destination, message in self.sends:
                publish(destination, message)
        self._clear()

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
