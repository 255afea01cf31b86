"""The Sluiceway client runtime: asyncio first (this package), synchronous in `.sync`.

from sluiceway.client import AckMode, ConnectionFactory

factory = ConnectionFactory("stomp://127.0.0.1:61613", consumer_flow_limit=100)
async with await factory.connect() as connection:
    session = connection.session(AckMode.AUTO)
    producer = session.producer("/queue/orders")
    await producer.send(b"...", persistent=True, priority=4, time_to_live=60.0)
    consumer = await session.consumer("/queue/orders", selector="region = 'EU'")
    message = await consumer.receive(timeout=5.0)
"""

from sluiceway.client.browser import QueueBrowser
from sluiceway.client.connection import Connection, ConnectionFactory
from sluiceway.client.consumer import Consumer
from sluiceway.client.message import Message
from sluiceway.client.producer import Producer, RetryPolicy
from sluiceway.client.session import AckMode, Session
from sluiceway.errors import (
    BrokerError,
    ConnectFailedError,
    ConnectionClosedError,
    EntityTooLarge,
    Forbidden,
    OperationTimeoutError,
    ResourceFull,
    TransactionRolledBackError,
    Unauthorized,
)

__all__ = [
    "AckMode",
    "BrokerError",
    "ConnectFailedError",
    "Connection",
    "ConnectionClosedError",
    "ConnectionFactory",
    "Consumer",
    "EntityTooLarge",
    "Forbidden",
    "Message",
    "OperationTimeoutError",
    "Producer",
    "QueueBrowser",
    "ResourceFull",
    "RetryPolicy",
    "Session",
    "TransactionRolledBackError",
    "Unauthorized",
]
