"""A client stand-in for core tests: one core connection and what it was given."""

from __future__ import annotations

from sluiceway.core.broker import Broker
from sluiceway.core.connection import CoreConnection
from sluiceway.core.flow import ConnectionFlow
from sluiceway.core.message import DEFAULT_PRIORITY
from sluiceway.core.subscription import AckMode, Delivery, Subscription
from sluiceway.naming import parse_destination


class Client:
    """One core connection plus the bookkeeping a test needs."""

    def __init__(self, broker: Broker, flow: ConnectionFlow | None = None) -> None:
        self.ready_calls = 0
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
    ) -> str:
        message = self.connection.send(
            parse_destination(path),
            body,
            (),
            priority=priority,
            expires=expires,
            persistent=persistent,
            transaction=transaction,
        )
        return message.id

    def take(self, limit: int = 1_000_000) -> list[Delivery]:
        """Everything the connection would write now (as the I/O layer's pump would)."""
        taken: list[Delivery] = []
        while True:
            batch = self.connection.take(min(limit - len(taken), 100))
            if not batch:
                break
            taken.extend(batch)
            if len(taken) >= limit:
                break
        self.received.extend(taken)
        return taken

    def ack(self, delivery: Delivery, transaction: str | None = None) -> int:
        return self.connection.ack(delivery.subscription, delivery.message.id, transaction)

    def nack(self, delivery: Delivery, transaction: str | None = None) -> int:
        return self.connection.nack(delivery.subscription, delivery.message.id, transaction)


def bodies(deliveries: list[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]
