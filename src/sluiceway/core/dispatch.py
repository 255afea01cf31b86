"""Queue dispatch: which ready consumer is given which pending message.

Two policies (destination property `dispatchPolicy`, see `config.DispatchPolicy`):

- OPENMQ: consumers are served in the order they subscribed; a ready consumer takes up to its
  whole window from the head of the pending list before the next one is considered ("first come,
  first serve", as the Open MQ tuning guide describes it).
- FAIR: each message goes to the ready consumer with the fewest outstanding messages; ties go to
  the consumer after the last one served.

A consumer with a selector only takes messages its selector matches, wherever they are in the
pending list; while any consumer of a queue has a selector, dispatch scans the list in delivery
order and gives each message to a matching ready consumer chosen by the same policy. Messages no
consumer matches stay where they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluiceway.config import DispatchPolicy
from sluiceway.core.message import Message

if TYPE_CHECKING:
    from sluiceway.core.destination import Queue
    from sluiceway.core.subscription import QueueSubscription


def dispatch(queue: Queue) -> None:
    """Stage pending messages to ready consumers according to the queue's policy."""
    if not queue.pending or not queue.consumers:
        return
    if queue.selective:
        _dispatch_scan(queue)
    elif queue.settings.dispatch_policy is DispatchPolicy.OPENMQ:
        for consumer in queue.consumers:
            fill(queue, consumer)
            if not queue.pending:
                return
    else:
        _dispatch_fair(queue)


def fill(queue: Queue, consumer: QueueSubscription) -> None:
    """Give `consumer` messages from the head of the list while it is ready (no selectors)."""
    now = queue.clock.time_ms()
    while consumer.ready() and (message := _pop_live(queue, now)) is not None:
        consumer.stage(message)


def _pop_live(queue: Queue, now: int) -> Message | None:
    """The head of the pending list, dropping (and counting) expired messages on the way."""
    while (message := queue.pending.pop()) is not None:
        if not (message.expires and message.expired(now)):
            return message
        queue.expired(message)
    return None


def refill(queue: Queue, consumer: QueueSubscription) -> None:
    """`consumer` can take more: under OPENMQ it takes them itself, otherwise the policy runs."""
    if queue.selective or queue.settings.dispatch_policy is not DispatchPolicy.OPENMQ:
        dispatch(queue)
    else:
        fill(queue, consumer)


def _dispatch_fair(queue: Queue) -> None:
    now = queue.clock.time_ms()
    while queue.pending:
        consumer = _least_loaded(queue, None)
        if consumer is None:
            return
        message = _pop_live(queue, now)
        if message is None:
            return
        consumer.stage(message)


def _least_loaded(queue: Queue, message: Message | None) -> QueueSubscription | None:
    """The ready consumer (matching `message`, if given) with the fewest outstanding messages.

    Starts looking after the last consumer served, so equal consumers take turns.
    """
    consumers = queue.consumers
    count = len(consumers)
    best: QueueSubscription | None = None
    best_index = best_load = 0
    for offset in range(count):
        index = (queue.rotation + offset) % count
        consumer = consumers[index]
        if consumer.ready() and (message is None or consumer.accepts(message)):
            load = consumer.window.outstanding
            if best is None or load < best_load:
                best, best_index, best_load = consumer, index, load
    if best is not None:
        queue.rotation = (best_index + 1) % count
    return best


def _first_ready(queue: Queue, message: Message) -> QueueSubscription | None:
    for consumer in queue.consumers:
        if consumer.ready() and consumer.accepts(message):
            return consumer
    return None


def _dispatch_scan(queue: Queue) -> None:
    now = queue.clock.time_ms()
    pick = _first_ready if queue.settings.dispatch_policy is DispatchPolicy.OPENMQ else None

    def choose(message: Message) -> bool:
        if message.expires and message.expired(now):
            queue.expired(message)
            return True
        consumer = pick(queue, message) if pick is not None else _least_loaded(queue, message)
        if consumer is None:
            return False
        consumer.stage(message)
        return True

    def nobody_ready() -> bool:
        return not any(consumer.ready() for consumer in queue.consumers)

    queue.pending.extract(choose, nobody_ready)
