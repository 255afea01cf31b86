"""Adaptive consumer windows (consumerFlowLimit=auto): the sizing rule, and the core sizing real
subscriptions on a fake clock while a simulated consumer works and the network delays it."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from sluiceway.admin.model import consumer_snapshot
from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.model.subscription import AckMode, Delivery, Subscription
from sluiceway.core.values.flow import (
    AUTO,
    AUTO_INITIAL,
    AUTO_MARGIN,
    AUTO_MAX,
    AUTO_SLACK_S,
    AutoWindow,
    ConnectionFlow,
    ConsumerFlow,
    ConsumerWindow,
)
from sluiceway.core.values.message import Message
from sluiceway.core.values.selector import compile_selector
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import Client


def flow(limit: int = 1000, threshold: int = 50, pool: int = 0) -> ConsumerFlow:
    return ConsumerFlow.negotiate(
        requested_limit=AUTO, threshold=threshold, prefetch=True, destination_limit=limit, pool=pool
    )


def expected_size(pace: float, round_trip: float, threshold: int = 50) -> int:
    """The module's formula, written out again."""
    reserve = math.ceil((round_trip * (1 + AUTO_MARGIN) + AUTO_SLACK_S) / pace) + 1
    return math.ceil(reserve * 100 / threshold) if threshold else reserve


# -- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "destination", "limit", "auto"),
    [
        (AUTO, 1000, 1000, True),  # the destination's number caps the consumer's auto
        (500, AUTO, 500, True),  # and the consumer's number caps the destination's auto
        (AUTO, AUTO, AUTO_MAX, True),
        (-1, AUTO, AUTO_MAX, True),
        (AUTO, 0, AUTO_MAX, True),
        (500, 200, 200, False),
    ],
)
def test_either_side_may_ask_for_auto(
    client: int, destination: int, limit: int, auto: bool
) -> None:
    negotiated = ConsumerFlow.negotiate(
        requested_limit=client, threshold=50, prefetch=True, destination_limit=destination
    )
    assert (negotiated.limit, negotiated.auto) == (limit, auto)


def test_prefetch_off_wins_over_auto() -> None:
    negotiated = ConsumerFlow.negotiate(
        requested_limit=AUTO, threshold=50, prefetch=False, destination_limit=AUTO
    )
    assert (negotiated.limit, negotiated.auto) == (1, False)


@pytest.mark.parametrize(
    ("pace", "round_trip", "threshold"),
    [
        (0.001, 0.001, 50),
        (0.005, 0.001, 50),
        (0.0001, 0.002, 50),
        (0.001, 0.01, 10),
        (0.002, 0.0, 0),
    ],
)
def test_size_covers_a_round_trip_and_the_slack(
    pace: float, round_trip: float, threshold: int
) -> None:
    auto = AutoWindow(flow(threshold=threshold), memory_budget=0)
    auto.round_trip = round_trip
    assert auto.size(pace) == min(expected_size(pace, round_trip, threshold), 1000)


def test_size_before_any_measure_is_the_initial_window() -> None:
    assert AutoWindow(flow(), memory_budget=0).size(None) == AUTO_INITIAL
    assert ConsumerWindow(flow()).limit == AUTO_INITIAL
    assert ConsumerWindow(flow(limit=5)).limit == 5  # never past the cap
    assert ConsumerWindow(flow(pool=40)).limit == 40  # nor below the pool


def test_cap_pool_and_memory_bound_the_size() -> None:
    fast = 1e-6  # a consumer this fast would be given everything
    auto = AutoWindow(flow(limit=300), memory_budget=0)
    assert auto.size(fast) == 300
    assert auto.size(0.0) == 300  # no measurable time per message: the cap
    slow = AutoWindow(flow(pool=25), memory_budget=0)
    assert slow.size(1.0) == 25  # a pool of 25 handlers is never starved
    assert AutoWindow(flow(limit=10, pool=25), memory_budget=0).size(1.0) == 10  # the cap first
    budget = 64 * 1024 * 1024  # a share of 1 MiB
    big = AutoWindow(flow(), memory_budget=budget)
    big.staged(100 * 1024)
    assert big.size(fast) == 10  # ten 100 KiB messages fill the share
    big.staged(100 * 1024)
    pooled = AutoWindow(flow(pool=25), memory_budget=budget)
    pooled.staged(100 * 1024)
    assert pooled.size(fast) == 25  # the pool before the memory share


def test_round_trip_leaves_out_the_work() -> None:
    auto = AutoWindow(flow(), memory_budget=0)
    message = Message(
        id="m",
        destination=parse_destination("/queue/q"),
        body=b"",
        headers=(),
        priority=4,
        expires=0,
        persistent=False,
        timestamp=0,
    )
    auto.start_probe(message, now=10.0, ahead=3)
    auto.end_probe(now=10.025, pace=0.005)  # 25 ms, of which 4 x 5 ms were work
    assert auto.round_trip == pytest.approx(0.005)
    auto.start_probe(message, now=11.0, ahead=2)
    auto.end_probe(now=11.040, pace=0.005)  # behind others: no sample once there is one
    assert auto.round_trip == pytest.approx(0.005)
    auto.start_probe(message, now=12.0, ahead=0)
    auto.end_probe(now=12.014, pace=0.005)  # held nothing: 9 ms of round trip
    assert auto.round_trip == pytest.approx(0.005 + 0.25 * (0.009 - 0.005))
    auto.start_probe(message, now=13.0, ahead=0)
    auto.drop_probe([message])  # given back: no sample
    assert auto.probe is None


def test_resize_grows_at_once_and_shrinks_at_the_next_top_up() -> None:
    window = ConsumerWindow(ConsumerFlow(limit=10, threshold=50, prefetch=True))
    for _ in range(10):
        window.take()
    assert window.paused
    assert window.resize(40, 50)  # 10 unconsumed <= 20: a used-up window refills
    assert window.credit == 30
    for _ in range(30):
        window.take()
    assert not window.resize(8, 50)  # 40 unconsumed: nothing more until 4 or fewer remain
    assert window.credit == 0
    assert not window.release(35)
    assert window.release(1)  # 4 remain: topped up to the new size
    assert window.credit == 4


# -- the core, simulated ---------------------------------------------------------------------


@dataclass
class Consumer:
    """A consumer on the far side of a network: what arrives after half a round trip is worked
    off one at a time, each ACK reaching the broker half a round trip after its work ends."""

    pace: Callable[[float], float]  # seconds per message, given the time its work starts
    round_trip: float
    free_at: float = 0.0  # when the consumer is done with what it has
    busy: float = 0.0  # seconds it worked
    held_most: int = 0  # messages it held unconsumed at once (sent and not acknowledged)
    acked: int = 0
    window_sizes: list[tuple[float, int]] = field(default_factory=list)
    idle_while_others_hold: float = 0.0  # seconds it had nothing while another held unstarted


class Simulation:
    """Events in time order: deliveries reaching the consumers, ACKs reaching the broker.
    Several consumers may share a client (one connection)."""

    def __init__(
        self, broker: Broker, clock: FakeClock, consumers: dict[Subscription, Consumer]
    ) -> None:
        self.broker, self.clock, self.consumers = broker, clock, consumers
        self.clients: dict[Subscription, Client] = {}
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()
        self.most_together = 0  # messages all consumers held unconsumed at once

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.order), action))

    def run(self, clients: list[Client], until: float) -> None:
        tick = self.clock.monotonic()
        while tick + 1.0 <= until:  # the broker's tick, once a second
            tick += 1.0
            self.at(tick, self.broker.tick)
        self.deliver(clients)
        while self.events and self.events[0][0] <= until:
            when, _, action = heapq.heappop(self.events)
            self.clock.advance(when - self.clock.monotonic())
            action()
            self.deliver(clients)

    def deliver(self, clients: list[Client]) -> None:
        """What the broker writes now reaches its consumer half a round trip later."""
        now = self.clock.monotonic()
        for client in clients:
            for delivery in client.take():
                consumer = self.consumers[delivery.subscription]
                self.clients[delivery.subscription] = client
                arrive = functools.partial(self.arrive, consumer, delivery)
                self.at(now + consumer.round_trip / 2, arrive)
        for sub, consumer in self.consumers.items():
            consumer.held_most = max(consumer.held_most, sub.window.outstanding)
            consumer.window_sizes.append((now, sub.window.limit))
        together = sum(sub.window.outstanding for sub in self.consumers)
        self.most_together = max(self.most_together, together)

    def arrive(self, consumer: Consumer, delivery: Delivery) -> None:
        now = self.clock.monotonic()
        if now > consumer.free_at and any(
            other.free_at > now + other.round_trip for other in self.consumers.values()
        ):
            consumer.idle_while_others_hold += now - consumer.free_at
        start = max(now, consumer.free_at)
        work = consumer.pace(start)
        consumer.free_at = start + work
        consumer.busy += work
        ack_at = consumer.free_at + consumer.round_trip / 2
        self.at(ack_at, functools.partial(self.ack, consumer, delivery))

    def ack(self, consumer: Consumer, delivery: Delivery) -> None:
        self.clients[delivery.subscription].ack(delivery)
        consumer.acked += 1


def subscribe(client: Client, sub_id: str, *, pool: int = 0, selector: str = "") -> Subscription:
    return client.connection.subscribe(
        sub_id,
        parse_destination("/queue/work"),
        AckMode.CLIENT_INDIVIDUAL,
        requested_limit=AUTO,
        threshold=50,
        prefetch=True,
        pool=pool,
        selector=compile_selector(selector) if selector else None,
    )


def simulate(
    pace: Callable[[float], float],
    round_trip: float,
    seconds: float,
    *,
    messages: int = 20_000,
    pool: int = 0,
    properties: dict[str, str] | None = None,
) -> tuple[Consumer, Subscription]:
    clock = FakeClock()
    broker = Broker(build_config(properties or {}), clock=clock)
    producer, client = Client(broker), Client(broker)
    for _ in range(messages):
        producer.send("/queue/work", b"x" * 100)
    start = clock.monotonic()
    sub = subscribe(client, "c", pool=pool)
    consumer = Consumer(lambda at: pace(at - start), round_trip, free_at=start)
    Simulation(broker, clock, {sub: consumer}).run([client], start + seconds)
    return consumer, sub


def steady(pace: float, _: float) -> float:
    """A consumer's pace that never changes."""
    return pace


def simulate_many(
    paces: list[float],
    seconds: float,
    *,
    messages: int,
    properties: dict[str, str] | None = None,
    connection: ConnectionFlow | None = None,
    shared_connection: bool = False,
    selector: str = "",
) -> tuple[list[Consumer], list[Subscription], float, int]:
    """Consumers of the given paces on one queue holding `messages`; returns them, their
    subscriptions, when the last message was acknowledged (seconds from the start), and the
    most messages they held unconsumed at once, together."""
    clock = FakeClock()
    broker = Broker(build_config(properties or {}), clock=clock)
    producer = Client(broker)
    for i in range(messages):
        producer.send("/queue/work", b"x" * 100, headers=(("n", str(i)),))
    start = clock.monotonic()
    shared = Client(broker, connection) if shared_connection else None
    clients: list[Client] = []
    consumers: dict[Subscription, Consumer] = {}
    for index, pace in enumerate(paces):
        client = shared if shared is not None else Client(broker, connection)
        if client not in clients:
            clients.append(client)
        sub = subscribe(client, f"c{index}", selector=selector)
        consumers[sub] = Consumer(functools.partial(steady, pace), round_trip=0.001, free_at=start)
    simulation = Simulation(broker, clock, consumers)
    simulation.run(clients, start + seconds)
    finished = max(c.free_at for c in consumers.values()) - start
    return list(consumers.values()), list(consumers), finished, simulation.most_together


def test_a_fast_consumer_is_kept_busy() -> None:
    consumer, sub = simulate(lambda _: 0.0001, round_trip=0.002, seconds=1.0)
    assert consumer.busy / 1.0 > 0.95  # never waiting for the broker, after the first messages
    assert sub.window.limit == pytest.approx(expected_size(0.0001, 0.002), rel=0.2)
    assert sub.window.limit < AUTO_MAX  # and holding far fewer than prefetch 1000 would


def test_a_slow_consumer_holds_a_few_messages_and_stays_busy() -> None:
    consumer, sub = simulate(lambda _: 0.005, round_trip=0.001, seconds=5.0)
    assert consumer.busy / 5.0 > 0.97
    # 6 to 8 messages: the first round trip measured may include one message's work
    assert expected_size(0.005, 0.001) <= sub.window.limit <= expected_size(0.005, 0.006)
    assert consumer.held_most <= AUTO_INITIAL  # the first window was the most it held


def test_a_consumer_that_slows_down_sees_its_window_shrink_within_a_second() -> None:
    change = 2.0
    consumer, sub = simulate(
        lambda t: 0.0002 if t < change else 0.02, round_trip=0.002, seconds=4.0
    )
    before = [size for when, size in consumer.window_sizes if change - 0.5 < when - 1000 < change]
    assert min(before) > 50
    slow = expected_size(0.02, 0.002)
    shrunk_at = next(
        when - 1000
        for when, size in consumer.window_sizes
        if when - 1000 > change and size <= slow * 2
    )
    assert shrunk_at - change < 1.0
    assert sub.window.limit == pytest.approx(slow, abs=2)


def test_a_consumer_that_stops_acknowledging_shrinks_on_the_tick() -> None:
    consumer, sub = simulate(lambda t: 0.0002 if t < 1.0 else 30.0, round_trip=0.002, seconds=3.5)
    # One message held for seconds: it is taken to be that slow now.
    assert sub.window.limit == expected_size(1.0, 0.002)
    assert consumer.acked > 1000


def test_a_pool_of_handlers_is_never_starved() -> None:
    _, sub = simulate(lambda _: 0.005, round_trip=0.001, seconds=2.0, pool=12)
    assert sub.window.limit == 12


def test_the_window_is_shown_as_sized() -> None:
    consumer, sub = simulate(lambda _: 0.005, round_trip=0.001, seconds=2.0)
    snapshot = consumer_snapshot(sub, 0.0)
    assert snapshot.window_auto
    assert (snapshot.window_limit, snapshot.window_max) == (sub.window.limit, 1000)
    assert snapshot.pace_ms == pytest.approx(5.0, rel=0.05)
    assert snapshot.round_trip_ms is not None
    assert 1.0 <= snapshot.round_trip_ms <= 6.0  # perhaps with the first message's work
    assert consumer.acked > 300


def test_auto_as_a_destination_property() -> None:
    """imq.autocreate.queue.consumerFlowLimit=auto: a consumer asking for 200 adapts within 200."""
    clock = FakeClock()
    broker = Broker(build_config({"imq.autocreate.queue.consumerFlowLimit": "auto"}), clock=clock)
    client = Client(broker)
    sub = client.subscribe("/queue/adaptive", limit=200)
    assert (sub.flow.auto, sub.flow.limit, sub.window.limit) == (True, 200, AUTO_INITIAL)
    auto_ack = Client(broker).subscribe("/queue/adaptive", "s2", ack=AckMode.AUTO, limit=200)
    assert (auto_ack.flow.auto, auto_ack.window.limit) == (False, 200)  # nothing to measure


# -- with the rest of flow control ----------------------------------------------------------


@pytest.mark.parametrize("policy", ["openmq", "fair"])
def test_uneven_consumers_all_stay_busy_under_either_policy(policy: str) -> None:
    """5, 1, 1, 1 ms consumers with 4,000 messages: none idles while another holds messages it
    has not started, and they finish together, the slow one having held a handful."""
    properties = {"imq.autocreate.queue.dispatchPolicy": policy}
    consumers, subs, finished, _ = simulate_many(
        [0.005, 0.001, 0.001, 0.001], 10.0, messages=4_000, properties=properties
    )
    assert sum(c.acked for c in consumers) == 4_000
    ideal = 4_000 / (1 / 0.005 + 3 / 0.001)  # all four busy throughout: 1.25 s
    assert finished < ideal * 1.1
    assert max(c.idle_while_others_hold for c in consumers) < 0.05
    slow = consumers[0]
    assert slow.held_most <= AUTO_INITIAL
    assert subs[0].window.limit < subs[1].window.limit


def test_selectors_and_auto_windows() -> None:
    """Consumers with selectors take only what they match, their windows sized as any other."""
    consumers, subs, _, _ = simulate_many(
        [0.002, 0.0005], 5.0, messages=2_000, selector="n IS NOT NULL"
    )
    assert sum(c.acked for c in consumers) == 2_000
    assert subs[0].window.limit == pytest.approx(expected_size(0.002, 0.001), abs=2)


def test_the_connection_limit_still_caps_the_windows_together() -> None:
    """Two fast adaptive consumers on one connection limited to 50 messages: never more than 50
    outstanding together, whatever their windows say."""
    connection = ConnectionFlow(limit=50, limit_enabled=True)
    consumers, subs, _, together = simulate_many(
        [0.0001, 0.0001], 1.0, messages=5_000, connection=connection, shared_connection=True
    )
    assert sum(c.acked for c in consumers) > 1_000
    assert together == 50
    assert subs[0].window.limit + subs[1].window.limit > 50
