"""Adoption: persistent state another broker's store held, made this broker's own (a cluster
member taking over a failed member's store, docs/cluster.md).

An adopted message is a new message of this broker as far as its store goes: it takes the next
sequence number of its destination here and is recorded by this broker's store, with its message
id, headers, body, priority, expiry and timestamp unchanged. Where the failed broker had
delivered it without seeing it acknowledged, it keeps its delivery count, so it goes out flagged
redelivered, and the count is recorded too (a restart here still flags it).

- A queue message joins its queue behind what the queue holds, and is dispatched as any other;
  no destination limit refuses it (it was accepted once, and refusing it now would lose it).
- A durable subscription's messages go to the subscription of the same client id and name here,
  made anew if there is none (or to the one its subscriber made here on reconnecting). A topic
  message enters the topic's log for those subscriptions only: every other durable subscription
  of the topic here counts it as acknowledged, and no non-durable subscriber is offered it (they
  were offered the message when it was published, over the cluster's links).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluiceway.core.model.queue import Queue
from sluiceway.core.model.store import MessageStore
from sluiceway.core.model.topic import DurableState, Topic
from sluiceway.core.values.message import Message


def adopt_queue_message(queue: Queue, message: Message) -> None:
    """`message`, taken over from another broker, into `queue` (recorded by its store)."""
    deliveries = message.delivery_count
    message.location, message.marks, message.wire = 0, None, None
    queue.publish(message)  # records it: a new number here, and a new place in this store
    if message.persistent:
        for _ in range(deliveries):
            queue.store.delivered(message)


class DurableAdoption:
    """Takes one topic's messages for the durable subscriptions adopted on it."""

    def __init__(self, topic: Topic, store: MessageStore) -> None:
        self._topic = topic
        self._store = store

    def adopt(self, message: Message, wanted: Sequence[tuple[DurableState, int]]) -> None:
        """`message` into the topic's log for the subscriptions in `wanted` (each with the
        deliveries the failed broker made of it to that subscription), and for no other."""
        topic = self._topic
        if not wanted:
            return
        message.location, message.marks, message.wire = 0, None, None
        message.seq = topic.next_seq()
        if message.persistent:
            self._store.added(message)
        takers = {id(state) for state, _ in wanted}
        for state in topic.durables.values():
            if id(state) not in takers and state.accepts(message):
                # Not this subscription's message: counted as acknowledged, as after a restart.
                state.acked_ahead.add(message.seq)
                if message.persistent:
                    self._store.durable_acked(state.record.sub_id, message)
        for state, deliveries in wanted:
            if deliveries:
                state.deliveries[message.seq] = deliveries
                if message.persistent:
                    for _ in range(deliveries):
                        self._store.durable_delivered(state.record.sub_id, message)
        topic.recovered(message)  # into the log, offered to no subscriber present
        topic.stats.received(message)

    def wake(self) -> None:
        """Let attached subscribers read what was adopted."""
        for state in self._topic.durables.values():
            if state.active is not None:
                state.active.fill()
