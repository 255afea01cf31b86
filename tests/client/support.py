"""What the client tests look at on the broker's side, to wait on events rather than on time."""

from __future__ import annotations

from dataclasses import dataclass

from sluiceway.client import Connection
from sluiceway.core.model.queue import Queue
from sluiceway.naming import parse_destination
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerThread


async def caught_up(connection: Connection) -> None:
    """Return once the broker has processed every frame `connection` wrote before this call
    (frames are processed in order: the RECEIPT of a BEGIN written now comes after them)."""
    transaction = connection.next_id("caught-up")
    await connection.request(Frame("BEGIN", {"transaction": transaction}))
    await connection.send(Frame("ABORT", {"transaction": transaction}))


@dataclass(frozen=True)
class QueueState:
    """A queue's messages as the broker counts them."""

    consumed: int  # acknowledged, over the queue's life
    outstanding: int  # given to its consumers and not consumed yet: what their windows hold
    waiting: int  # given to no consumer yet


def queue_state(broker: BrokerThread, path: str) -> QueueState:
    """A snapshot of queue `path`, taken on the broker's own event loop."""
    core = broker.broker
    assert core is not None

    def look() -> QueueState:
        queue = core.destination(parse_destination(path))
        assert isinstance(queue, Queue)
        outstanding = sum(consumer.window.outstanding for consumer in queue.consumers)
        return QueueState(queue.stats.consumed, outstanding, len(queue.pending))

    return broker.call(look)
