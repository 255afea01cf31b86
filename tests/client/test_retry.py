"""Refused and held sends with the asyncio client against a real broker.

A refusal (414, REJECT_NEWEST or a system limit) comes back at once: a RetryPolicy pauses and
retries it until its deadline. A FLOW_CONTROL destination holds the SEND instead: the send simply
waits for its RECEIPT, bounded by the call's `timeout`.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from sluiceway.client import (
    Connection,
    ConnectionFactory,
    OperationTimeoutError,
    ResourceFull,
    RetryPolicy,
)
from sluiceway.core.model.holding import HeldProducer
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.support import WAIT, eventually


def retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "sluiceway.client.producer" and "retrying" in r.getMessage()
    )


def held(broker: BrokerThread) -> list[HeldProducer]:
    core = broker.broker
    assert core is not None
    return broker.call(core.producers.held)


async def open_connection(broker: BrokerThread) -> Connection:
    return await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect()


async def receive_texts(connection: Connection, destination: str, count: int) -> list[str]:
    consumer = await connection.session().consumer(destination)
    texts = []
    for _ in range(count):
        message = await consumer.receive(timeout=WAIT)
        assert message is not None
        texts.append(message.text)
    return texts


async def test_retry_policy_succeeds_once_a_consumer_makes_room(
    make_broker: BrokerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.client.producer")
    broker = make_broker({"imq.destination.queue.retry.maxNumMsgs": "1"})  # REJECT_NEWEST
    policy = RetryPolicy(pause=0.05, deadline=5, retry_on=(ResourceFull,))
    async with await open_connection(broker) as producing, await open_connection(broker) as other:
        producer = producing.session().producer("/queue/retry", retry=policy)
        await producer.send("first")

        async def consume_after_a_refusal() -> list[str]:
            await eventually(lambda: retries(caplog) >= 1)
            return await receive_texts(other, "/queue/retry", 2)

        consumer = asyncio.create_task(consume_after_a_refusal())
        async with asyncio.timeout(WAIT):
            await producer.send("second")  # refused (full), retried, accepted: no exception
        assert retries(caplog) >= 1
        assert await asyncio.wait_for(consumer, WAIT) == ["first", "second"]


async def test_retry_policy_gives_up_at_its_deadline_with_the_system_limit(
    make_broker: BrokerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.client.producer")
    broker = make_broker({"imq.system.max_count": "1"})
    policy = RetryPolicy(pause=0.05, backoff=1.0, deadline=0.3, retry_on=(ResourceFull,))
    async with await open_connection(broker) as connection:
        producer = connection.session().producer("/queue/sys", retry=policy)
        await producer.send("the one the broker may hold")
        started = time.monotonic()
        with pytest.raises(ResourceFull) as raised:
            await producer.send("one too many", destination="/queue/other")
        elapsed = time.monotonic() - started
        error = raised.value
        assert error.status == 414
        assert error.limit == "imq.system.max_count"
        assert error.limit_value == "1"
        assert error.destination == "/queue/other"
        assert retries(caplog) >= 2
        assert 0.2 <= elapsed < 2.0  # gave up around the deadline, not at once
        assert await receive_texts(connection, "/queue/sys", 1) == ["the one the broker may hold"]


FLOW_CONTROL = {
    "imq.destination.queue.fc.maxNumMsgs": "2",
    "imq.destination.queue.fc.limitBehavior": "FLOW_CONTROL",
}


async def test_send_to_a_full_flow_control_queue_waits_for_room(make_broker: BrokerFactory) -> None:
    broker = make_broker(FLOW_CONTROL)
    async with await open_connection(broker) as producing, await open_connection(broker) as other:
        producer = producing.session().producer("/queue/fc")
        await producer.send("0")
        await producer.send("1")
        third = asyncio.create_task(producer.send("2"))
        await eventually(lambda: bool(held(broker)))
        (info,) = held(broker)
        assert info.reason == "destination full"
        assert info.limit == "maxNumMsgs"
        assert info.destination == "/queue/fc"
        assert not third.done()  # waiting, not refused
        assert await receive_texts(other, "/queue/fc", 3) == ["0", "1", "2"]
        await asyncio.wait_for(third, WAIT)  # completed without an exception
        assert held(broker) == []


async def test_send_held_longer_than_its_timeout_raises_operation_timeout(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(FLOW_CONTROL)
    async with await open_connection(broker) as producing, await open_connection(broker) as other:
        producer = producing.session().producer("/queue/fc")
        await producer.send("0")
        await producer.send("1")
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            await producer.send("2", timeout=0.3)
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 2.0
        # The client stopped waiting; the broker still holds the SEND (until
        # imq.producer.hold.timeout), and a DISCONNECT would wait for it: make room first.
        assert [p.reason for p in held(broker)] == ["destination full"]
        assert await receive_texts(other, "/queue/fc", 3) == ["0", "1", "2"]
