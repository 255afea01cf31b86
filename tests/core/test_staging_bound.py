"""A subscription's staged messages never outgrow its window (or UNLIMITED_STAGING without one),
and a connection's turn order lists each subscription with staged messages once.

`Subscription.staged` is a deque without `maxlen` on purpose: a maxlen would drop a message
silently if the bound were ever broken, and a check that raised inside dispatch would lose the
message being staged. The bound is kept by the dispatch paths instead (`ready()` before every
`stage`), and this test drives them through random sends, subscriptions, takes, ACKs, NACKs,
batches and disconnections, checking the bound and that no message is lost after every step.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.model.subscription import AckMode, Delivery, Subscription
from sluiceway.core.values.flow import UNLIMITED_STAGING
from sluiceway.errors import BrokerError
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import Client

QUEUE, TOPIC = "/queue/work", "/topic/news"
LIMITS = st.sampled_from([-1, 0, 1, 2, 5, 40])  # -1 and 0: no window from the client
ACKS = st.sampled_from([AckMode.AUTO, AckMode.CLIENT, AckMode.CLIENT_INDIVIDUAL])
CLIENTS = 3


def bound(subscription: Subscription) -> int:
    limit = subscription.window.limit
    return limit if limit > 0 else UNLIMITED_STAGING


class Staging(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # No destination limit refuses a send (every message sent is there to be accounted for),
        # and no destination caps the window, so -1 and 0 give a subscription none at all.
        config = build_config(
            {
                "imq.autocreate.destination.maxNumMsgs": "-1",
                "imq.autocreate.destination.maxTotalMsgBytes": "-1",
                "imq.autocreate.queue.consumerFlowLimit": "-1",
                "imq.autocreate.topic.consumerFlowLimit": "-1",
            }
        )
        self.broker = Broker(config, clock=FakeClock())
        self.producer = Client(self.broker)
        self.clients = [Client(self.broker) for _ in range(CLIENTS)]
        self.serial = 0
        self.queue_sent = 0
        self.queue_consumed: set[bytes] = set()

    def _unsettled(self, client: Client) -> list[Delivery]:
        return [
            d
            for d in client.received
            if d.subscription.ack_mode is not AckMode.AUTO
            and d.message.id in d.subscription.unacked
        ]

    @rule(client=st.integers(0, CLIENTS - 1), queue=st.booleans(), limit=LIMITS, ack=ACKS)
    def subscribe(self, client: int, queue: bool, limit: int, ack: AckMode) -> None:
        self.serial += 1
        path = QUEUE if queue else TOPIC
        self.clients[client].subscribe(path, f"s{self.serial}", ack=ack, limit=limit)

    @rule(queue=st.booleans(), count=st.integers(1, 1500), batch=st.booleans())
    def send(self, queue: bool, count: int, batch: bool) -> None:
        path = QUEUE if queue else TOPIC
        try:
            if batch:
                with self.broker.context.batch:
                    self._send(path, count)
            else:
                self._send(path, count)
        except BrokerError:  # a full destination or system: refused, nothing staged
            pass

    def _send(self, path: str, count: int) -> None:
        for _ in range(count):
            self.serial += 1
            self.producer.send(path, b"%d" % self.serial)
            if path == QUEUE:
                self.queue_sent += 1

    @rule(client=st.integers(0, CLIENTS - 1), count=st.integers(0, 700))
    def take(self, client: int, count: int) -> None:
        for delivery in self.clients[client].take(count):
            if delivery.subscription.ack_mode is AckMode.AUTO:
                self._consumed(delivery)

    def _consumed(self, delivery: Delivery) -> None:
        if delivery.message.destination.name == "work":
            self.queue_consumed.add(delivery.message.body)

    @rule(client=st.integers(0, CLIENTS - 1), count=st.integers(1, 50), nack=st.booleans())
    def settle(self, client: int, count: int, nack: bool) -> None:
        owner = self.clients[client]
        for delivery in self._unsettled(owner)[:count]:
            if delivery.message.id not in delivery.subscription.unacked:
                continue  # a cumulative ACK took it already
            if nack:
                owner.nack(delivery)
            else:
                taken = list(delivery.subscription.unacked.values())
                owner.ack(delivery)
                for message in taken:
                    if message.id not in delivery.subscription.unacked:
                        self._consumed(Delivery(delivery.subscription, message, 1))

    @rule(client=st.integers(0, CLIENTS - 1))
    def reconnect(self, client: int) -> None:
        self.clients[client].connection.close()
        self.broker.settle()
        self.clients[client] = Client(self.broker)

    @invariant()
    def staged_within_bound(self) -> None:
        for client in self.clients:
            for subscription in client.connection.subscriptions.values():
                assert len(subscription.staged) <= bound(subscription), (
                    f"{subscription.id}: {len(subscription.staged)} staged, window "
                    f"{subscription.window.limit}"
                )
                if subscription.window.limit > 0:
                    assert subscription.window.outstanding <= subscription.window.limit

    @invariant()
    def busy_lists_each_subscription_with_staged_messages_once(self) -> None:
        # A connection's turn order: bounded by its subscriptions, none twice.
        for client in self.clients:
            busy = list(client.connection._busy)
            staged = [s for s in client.connection.subscriptions.values() if s.staged]
            assert len(busy) == len(set(busy))
            assert set(busy) == set(staged)

    @invariant()
    def no_queue_message_lost(self) -> None:
        # Each queue message is consumed, waiting, staged or unacknowledged: counted once (no
        # expiry and no delivery limit here, so none is dead).
        queue = self.broker.registry.get(parse_destination(QUEUE))
        waiting = 0 if queue is None else queue.pending_count
        held = sum(
            len(subscription.staged) + len(subscription.unacked)
            for client in self.clients
            for subscription in client.connection.subscriptions.values()
            if subscription.destination.name.name == "work"
        )
        assert len(self.queue_consumed) + waiting + held == self.queue_sent


def test_staged_messages_stay_within_the_window() -> None:
    run_state_machine_as_test(
        Staging,
        settings=settings(
            max_examples=40,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
