"""A client stand-in for core tests: one core connection and what it was given."""

from __future__ import annotations

import dataclasses

from sluiceway.core.broker import Broker
from sluiceway.core.connection import CoreConnection
from sluiceway.core.model.holding import HeldSend
from sluiceway.core.model.subscription import AckMode, Delivery, Subscription
from sluiceway.core.values.flow import ConnectionFlow
from sluiceway.core.values.message import DEFAULT_PRIORITY, Message
from sluiceway.errors import BrokerError
from sluiceway.naming import parse_destination

# CoreConnection.take's byte budget when a test means no budget.
ANY_SIZE = 1 << 40


class Client:
    """One core connection plus the bookkeeping a test needs."""

    def __init__(self, broker: Broker, flow: ConnectionFlow | None = None) -> None:
        self.broker = broker
        self.ready_calls = 0
        self.held: list[HeldSend] = []  # SENDs the broker held, in order
        self.outcomes: list[tuple[str, BrokerError | None]] = []  # (message id, error) settled
        self.connection: CoreConnection = broker.open_connection(
            flow=flow or ConnectionFlow(), on_ready=self._on_ready
        )
        self.received: list[Delivery] = []

    def _on_ready(self) -> None:
        self.ready_calls += 1

    def subscribe(
        self,
        path: str,
        sub_id: str = "s1",
        *,
        ack: AckMode = AckMode.CLIENT_INDIVIDUAL,
        limit: int = 1000,
        threshold: int = 50,
        prefetch: bool = True,
    ) -> Subscription:
        return self.connection.subscribe(
            sub_id,
            parse_destination(path),
            ack,
            requested_limit=limit,
            threshold=threshold,
            prefetch=prefetch,
        )

    def send(
        self,
        path: str,
        body: bytes = b"x",
        *,
        priority: int = DEFAULT_PRIORITY,
        expires: int = 0,
        transaction: str | None = None,
        persistent: bool = False,
        report: bool | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> str:
        """Send as a SEND frame would; a held SEND is recorded in `held`, and its outcome in
        `outcomes` once the broker settles it."""
        sent = self.connection.send(
            parse_destination(path),
            body,
            headers,
            priority=priority,
            expires=expires,
            persistent=persistent,
            transaction=transaction,
            report=report,
        )
        message, held = sent.message, sent.held
        if held is not None:
            self.held.append(held)
            held.on_done = lambda error: self.outcomes.append((message.id, error))
        self.broker.settle()
        return message.id

    def take(self, limit: int = 1_000_000) -> list[Delivery]:
        """Everything the connection would write now (as the I/O layer's pump would)."""
        taken: list[Delivery] = []
        while True:
            batch = self.connection.take(min(limit - len(taken), 100), ANY_SIZE)
            if not batch:
                break
            taken.extend(batch)
            if len(taken) >= limit:
                break
        self.received.extend(taken)
        self.broker.settle()
        return taken

    def ack(self, delivery: Delivery, transaction: str | None = None) -> int:
        count = self.connection.ack(delivery.subscription, delivery.message.id, transaction)
        self.broker.settle()
        return count

    def nack(self, delivery: Delivery, transaction: str | None = None) -> int:
        count = self.connection.nack(delivery.subscription, delivery.message.id, transaction)
        self.broker.settle()
        return count


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]


def message_fields(message: Message) -> tuple[object, ...]:
    """What the message is, not how the broker holds it at the moment (its encoded MESSAGE
    headers, how many lists hold it in memory)."""
    return tuple(
        getattr(message, f.name)
        for f in dataclasses.fields(message)
        if f.name not in ("wire", "resident")
    )
