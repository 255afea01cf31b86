"""Queue dispatch: which ready consumer is given which pending message.

Two policies (destination property `dispatchPolicy`, see `config.DispatchPolicy`):

- OPENMQ: consumers are served in the order they subscribed; a ready consumer takes up to its
  whole window from the head of the pending list before the next one is considered ("first come,
  first serve", as the Open MQ tuning guide describes it).
- FAIR: each message goes to the ready consumer that will be done soonest with what it holds:
  its outstanding messages times its pace (the time it takes per message, a moving average of
  what the broker measures between its acknowledgements); ties go to the consumer with fewer
  outstanding messages, then to the one after the last served. No consumer is given more work
  than the shortest full window among them takes (a consumer's window times its pace), so a
  slow consumer holds fewer messages than a fast one and all of them run out at about the same
  time: none idles while another holds messages it has not started. A consumer whose pace is
  not measured yet holds at most WARMUP messages while others' are.

A consumer with a selector only takes messages its selector matches, wherever they are in the
pending list; while any consumer of a queue has a selector, dispatch scans the list in delivery
order and gives each message to a matching ready consumer chosen by the same policy. Messages no
consumer matches stay where they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from sluiceway.config import DispatchPolicy
from sluiceway.core.values.message import Message

if TYPE_CHECKING:
    from sluiceway.core.model.destination import Queue
    from sluiceway.core.model.subscription import QueueSubscription

# Read on every message: a Final name is a C static when compiled (setup.py says why).
_OPENMQ: Final = DispatchPolicy.OPENMQ


def dispatch(queue: Queue) -> None:
    """Stage pending messages to ready consumers according to the queue's policy."""
    if not queue.pending or not queue.consumers:
        return
    if queue.selective:
        _dispatch_scan(queue)
    elif queue.settings.dispatch_policy is _OPENMQ:
        for consumer in queue.consumers:
            fill(queue, consumer)
            if not queue.pending:
                return
    else:
        _dispatch_fair(queue)


def stage_at_once(queue: Queue, message: Message) -> bool:
    """Under OPENMQ, with no selector and nothing pending, give a new message to the first
    ready consumer now, as `fill` would (it skips the pending list); False: it must wait there.
    A message with an expiry time always waits, for `fill` to check it."""
    if (
        queue.pending
        or queue.selective
        or message.expires
        or queue.settings.dispatch_policy is not _OPENMQ
    ):
        return False
    consumer = _first_ready(queue, message)
    if consumer is None:
        return False
    consumer.stage(message)
    return True


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
    if queue.selective or queue.settings.dispatch_policy is not _OPENMQ:
        dispatch(queue)
    else:
        fill(queue, consumer)


WARMUP = 16  # messages a consumer of unknown pace may hold while other consumers' are known


def _dispatch_fair(queue: Queue) -> None:
    now = queue.clock.time_ms()
    horizon = _horizon(queue)
    while queue.pending:
        consumer = _least_loaded(queue, None, horizon)
        if consumer is None:
            return
        message = _pop_live(queue, now)
        if message is None:
            return
        consumer.stage(message)


def _horizon(queue: Queue) -> float | None:
    """The most work (in seconds) a consumer may hold: the shortest full window among the
    consumers whose pace is known; None while no pace is known, or none takes measurable time
    (then only the number of outstanding messages counts)."""
    horizon = None
    for consumer in queue.consumers:
        if consumer.pace is not None and consumer.window.limit > 0:
            full = consumer.window.limit * consumer.pace
            if horizon is None or full < horizon:
                horizon = full
    return horizon or None


def _least_loaded(
    queue: Queue, message: Message | None, horizon: float | None
) -> QueueSubscription | None:
    """The ready consumer (matching `message`, if given) that would be done with its
    outstanding messages soonest, within the `horizon` (see the module's FAIR).

    Starts looking after the last consumer served, so equal consumers take turns.
    """
    consumers = queue.consumers
    count = len(consumers)
    best: QueueSubscription | None = None
    best_index = 0
    best_load = (0.0, 0)
    for offset in range(count):
        index = (queue.rotation + offset) % count
        consumer = consumers[index]
        if not _has_room(consumer, horizon) or (
            message is not None and not consumer.accepts(message)
        ):
            continue
        outstanding = consumer.window.outstanding
        load = ((outstanding + 1) * (consumer.pace or 0.0), outstanding)
        if best is None or load < best_load:
            best, best_index, best_load = consumer, index, load
    if best is not None:
        queue.rotation = (best_index + 1) % count
    return best


def _has_room(consumer: QueueSubscription, horizon: float | None) -> bool:
    """Ready, and holding less work than the `horizon` allows (FAIR)."""
    if not consumer.ready():
        return False
    if horizon is None:
        return True
    outstanding, pace = consumer.window.outstanding, consumer.pace
    if pace is None:
        return outstanding < WARMUP
    # One more while what it holds is within the horizon; one at least, however slow it is.
    return not outstanding or outstanding * pace < horizon


def _first_ready(queue: Queue, message: Message) -> QueueSubscription | None:
    for consumer in queue.consumers:
        if consumer.ready() and consumer.accepts(message):
            return consumer
    return None


def _dispatch_scan(queue: Queue) -> None:
    now = queue.clock.time_ms()
    pick = _first_ready if queue.settings.dispatch_policy is _OPENMQ else None
    horizon = _horizon(queue) if pick is None else None

    def choose(message: Message) -> bool:
        if message.expires and message.expired(now):
            queue.expired(message)
            return True
        if pick is not None:
            consumer = pick(queue, message)
        else:
            consumer = _least_loaded(queue, message, horizon)
        if consumer is None:
            return False
        consumer.stage(message)
        return True

    def nobody_ready() -> bool:
        return not any(_has_room(consumer, horizon) for consumer in queue.consumers)

    queue.pending.extract(choose, nobody_ready)
