"""JMS IQ Manager throttling and memory levels over real sockets, with stomp.py and raw frames.

Both are decided by the broker's periodic tick (every second in the server), so the tests wait
for the broker's state (a destination's `throttled` flag, a tick counted, a held SEND) with bounded
polls, never with a sleep. Releases come from consumption: once a destination is throttled, the
tests that check a release stop the tick, so only the consumer can let the held SEND go.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from functools import partial
from typing import Any

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.holding import HeldProducer
from sluiceway.core.values.memory import MemoryLevel
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder, connect, subscribe, sync, wait_until, with_receipt

# Small thresholds so a test reaches them with a few dozen messages: throttled above 30 messages
# in the broker and 10 undelivered in the destination, released below 10 - 3 = 7 undelivered.
THROTTLING = {
    "imq.throttling.server.threshold": "30",
    "imq.throttling.destination.threshold": "10",
    "imq.throttling.lag": "3",
}
RELEASE_BELOW = 10 - 3

# A 200 KiB budget reached with ~2 KB messages; never swap, so queued messages stay in memory.
MEMORY = {"imq.memory.budget": "200k", "imq.swap.threshold": "0"}
BUDGET = 200 * 1024
BODY = b"m" * 2000


def core(broker: BrokerThread) -> Broker:
    assert broker.broker is not None
    return broker.broker


def destination(broker: BrokerThread, path: str) -> Destination:
    name = parse_destination(path)
    return broker.call(lambda: core(broker).destination(name))


def throttled(broker: BrokerThread, path: str) -> bool:
    target = destination(broker, path)
    return broker.call(lambda: target.throttled)


def held(broker: BrokerThread) -> list[HeldProducer]:
    return broker.call(core(broker).producers.held)


def memory_level(broker: BrokerThread) -> MemoryLevel:
    return broker.call(lambda: core(broker).ledger.level)


class TickCounter:
    """Counts the broker's periodic ticks, so a test can wait for one that ran entirely after
    something it did (the tick is what reviews throttling)."""

    def __init__(self, broker: BrokerThread) -> None:
        self._broker = broker
        self.count = 0
        services = broker.services
        assert services is not None
        broker.call(lambda: services.every_tick(self._ticked))  # runs after the broker's tick

    def _ticked(self) -> None:
        self.count += 1

    def wait_for_next(self) -> None:
        """Wait for a tick that started after this call (read on the broker's loop, so no tick
        is half done when the count is taken)."""
        seen = self._broker.call(lambda: self.count)
        wait_until(lambda: self.count > seen)


def stop_ticks(broker: BrokerThread) -> None:
    """From now on there is no periodic review: only consumption can release a SEND."""
    services = broker.services
    assert services is not None

    def stop() -> None:  # on the broker's loop: no tick is half done, none is due after it
        if services._tick is not None:
            services._tick.cancel()

    broker.call(stop)


def fill(client: RawClient, path: str, count: int, body: bytes = b"x") -> None:
    for _ in range(count):
        client.send("SEND", {"destination": path}, body)
    client.sync()


def throttle_slow_queue(broker: BrokerThread, clients: ClientFactory) -> tuple[Any, Recorder]:
    """/queue/slow throttled: 15 undelivered (> 10) while the broker holds 55 (> 30). Returns
    its producer (stomp.py), which stays connected so the destination has a producer."""
    loader = clients(broker.port)
    fill(loader, "/queue/bulk", 40)  # keeps the broker's total over 30 even once slow is drained
    producer, recorder = connect(broker.port)
    for i in range(15):
        producer.send("/queue/slow", f"{i}")
    sync(producer, recorder)
    wait_until(lambda: throttled(broker, "/queue/slow"))  # a tick reviewed it (one second)
    return producer, recorder


# -- throttling ----------------------------------------------------------------------------------


def test_throttled_send_waits_for_a_consumer_to_drain_below_threshold_minus_lag(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker(THROTTLING)
    producer, recorder = throttle_slow_queue(broker, clients)
    stop_ticks(broker)
    producer.send("/queue/slow", "held", headers={"receipt": "held-send"})
    wait_until(lambda: bool(held(broker)))
    (info,) = held(broker)
    assert info.reason == "producer throttled"
    assert info.destination == "/queue/slow"
    assert info.limit == "imq.throttling.destination.threshold"
    assert info.held_sends == 1

    # The held SEND does not hold up the connection's other frames.
    subscribe(producer, recorder, "/queue/bulk", "bulk", consumer_flow_limit="1")
    (bulk,) = recorder.wait_messages(1)
    with_receipt(recorder, lambda r: producer.ack(bulk.headers["ack"], receipt=r))
    assert "held-send" not in recorder.receipts

    # A consumer takes 5 and acknowledges 2: 8 are still undelivered, not below 7.
    consumer = clients(broker.port)
    consumer.subscribe("/queue/slow", consumer_flow_limit="5")
    received = consumer.receive(5)
    for message in received[:2]:
        consumer.ack(message)
    consumer.sync()
    slow = destination(broker, "/queue/slow")
    undelivered, still = broker.call(lambda: (slow.undelivered(), slow.throttled))
    assert undelivered >= RELEASE_BELOW
    assert still
    assert [p.reason for p in held(broker)] == ["producer throttled"]
    assert "held-send" not in recorder.receipts

    # Acknowledging one at a time releases it (no tick runs now) once the backlog is below 7:
    # never while the backlog before the ACK was 8 or more, always once it was 6 or fewer.
    unacked = deque(received[2:])
    while held(broker):
        assert unacked, "the queue was drained and the SEND is still held"
        before = broker.call(slow.undelivered)
        consumer.ack(unacked.popleft())
        consumer.sync()
        arrived = consumer.drain()
        received += arrived
        unacked += arrived
        released = not held(broker)
        assert released or before >= RELEASE_BELOW, f"held with {before} undelivered"
        assert not released or before <= RELEASE_BELOW, f"released with {before} undelivered"
    recorder.wait_for(lambda: "held-send" in recorder.receipts)
    for message in unacked:
        consumer.ack(message)
    while len(received) < 16:
        (message,) = consumer.receive(1)
        received.append(message)
        consumer.ack(message)
    assert "status" not in recorder.receipts["held-send"]
    assert [m.body for m in received] == [b"%d" % i for i in range(15)] + [b"held"]
    assert held(broker) == []
    assert not throttled(broker, "/queue/slow")
    producer.disconnect()


def test_a_backlog_is_not_throttled_while_the_broker_is_under_its_threshold(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(THROTTLING)
    ticks = TickCounter(broker)
    producer, recorder = connect(broker.port)
    for i in range(25):  # 25 undelivered, far over 10; but the broker holds only 25 <= 30
        producer.send("/queue/backlog", f"{i}")
    sync(producer, recorder)
    ticks.wait_for_next()
    assert not throttled(broker, "/queue/backlog")
    receipt = with_receipt(
        recorder, lambda r: producer.send("/queue/backlog", "more", headers={"receipt": r})
    )
    assert "status" not in receipt
    assert held(broker) == []
    producer.disconnect()


def test_throttled_send_is_refused_after_the_hold_timeout(
    make_broker: BrokerFactory, clients: ClientFactory
) -> None:
    broker = make_broker({**THROTTLING, "imq.producer.hold.timeout": "500"})
    producer, _ = throttle_slow_queue(broker, clients)
    client = clients(broker.port, failed_receipts="true")
    started = time.monotonic()
    # Expiry is checked at the tick: 0.5 s of hold, then up to a second more.
    refusal = client.request("SEND", {"destination": "/queue/slow", "persistent": "true"}, b"late")
    waited = time.monotonic() - started
    assert refusal.headers["status"] == "414"
    assert "held for" in refusal.headers["detail"]
    assert "throttl" in refusal.headers["detail"]
    assert "imq.producer.hold.timeout" in refusal.headers["detail"]
    assert refusal.headers["destination"] == "/queue/slow"
    assert refusal.headers["limit"] == "imq.throttling.destination.threshold"
    assert refusal.headers["limit-value"] == "10"
    assert 0.5 <= waited < 3.0
    assert held(broker) == []
    client.sync()  # the connection is still open
    producer.disconnect()


# -- memory levels -------------------------------------------------------------------------------


def answered_or_held(broker: BrokerThread, recorder: Recorder, receipt: str) -> bool:
    return receipt in recorder.receipts or bool(held(broker))


def produce_until_held(broker: BrokerThread, producer: Any, recorder: Recorder) -> int:
    """Send persistent messages with receipts one at a time until one is held; return how many
    were sent (the last one is the held one)."""
    for sent in range(1, 200):
        receipt = f"mem-{sent}"
        producer.send("/queue/mem", BODY, headers={"persistent": "true", "receipt": receipt})
        wait_until(partial(answered_or_held, broker, recorder, receipt))
        if receipt not in recorder.receipts:
            return sent
    raise AssertionError("200 messages of 2 KB never took a 200 KiB budget to RED")


def test_memory_levels_rise_refuse_new_producers_hold_old_ones_and_fall(
    make_broker: BrokerFactory, clients: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.core.values.memory")
    broker = make_broker(MEMORY)
    assert broker.call(lambda: core(broker).ledger.policy.budget) == BUDGET
    producer, recorder = connect(broker.port)
    sent = produce_until_held(broker, producer, recorder)
    assert memory_level(broker) is MemoryLevel.RED
    (info,) = held(broker)
    assert info.reason == "memory low"
    assert info.limit == "imq.memory.budget"
    assert info.destination == "/queue/mem"

    rising = [r for r in caplog.records if r.name == "sluiceway.core.values.memory"]
    messages = [r.getMessage() for r in rising]
    assert any(m.startswith("memory level GREEN -> YELLOW") for m in messages), messages
    assert any("-> RED" in m for m in messages), messages
    for record in rising:
        assert record.levelno == logging.WARNING
        assert f"of {BUDGET} bytes (imq.memory.budget) in use" in record.getMessage()

    # A connection that is not yet a producer of /queue/mem is refused at its first SEND.
    newcomer = clients(broker.port, failed_receipts="true")
    refusal = newcomer.request("SEND", {"destination": "/queue/mem", "persistent": "true"}, b"new")
    assert refusal.headers["status"] == "414"
    assert refusal.headers["message"] == "memory low"
    assert refusal.headers["limit"] == "imq.memory.budget"
    assert refusal.headers["limit-value"] == str(BUDGET)
    plain = clients(broker.port)
    plain.send("SEND", {"destination": "/queue/mem", "persistent": "true", "receipt": "p"})
    error = plain.expect("ERROR")
    assert error.headers["status"] == "414"
    assert error.headers["limit"] == "imq.memory.budget"
    plain.expect_closed()

    # The existing producer's SEND is still held: its connection answers, its RECEIPT waits.
    sync(producer, recorder)
    assert f"mem-{sent}" not in recorder.receipts
    assert [p.reason for p in held(broker)] == ["memory low"]

    # A consumer frees memory: the held SEND goes, its RECEIPT arrives, the level falls.
    consumer, inbox = connect(broker.port)
    subscribe(consumer, inbox, "/queue/mem", "drain", ack="auto")
    recorder.wait_for(lambda: f"mem-{sent}" in recorder.receipts)
    assert "status" not in recorder.receipts[f"mem-{sent}"]
    assert len(inbox.wait_messages(sent)) == sent
    assert held(broker) == []
    wait_until(lambda: memory_level(broker) is MemoryLevel.GREEN)
    falling = [
        r
        for r in caplog.records
        if r.name == "sluiceway.core.values.memory"
        and r.getMessage().startswith("memory level RED ->")
    ]
    assert falling
    assert all(r.levelno == logging.INFO for r in falling)
    producer.disconnect()
    consumer.disconnect()
