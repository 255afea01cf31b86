"""The client runtime's flow control: bounded buffers, prefetch off, and MDB-style pools."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import pytest

from sluiceway.client import ConnectionFactory, Message
from sluiceway.testing import BrokerThread
from tests.client.conftest import ConnectTo
from tests.client.support import caught_up, queue_state
from tests.e2e.support import eventually


async def fill(connect: ConnectTo, destination: str, count: int) -> None:
    connection = await connect()
    producer = connection.session().producer(destination, persistent=False)
    for i in range(count):
        await producer.send(f"{i}")
    await connection.close()


async def test_buffer_never_exceeds_the_effective_limit_with_a_slow_application(
    connect: ConnectTo,
) -> None:
    await fill(connect, "/queue/slow", 200)
    connection = await connect(consumer_flow_limit=20)
    consumer = await connection.session().consumer("/queue/slow")
    assert consumer.flow_limit == 20
    await eventually(lambda: consumer.buffered == 20)  # the broker fills the window at once
    for _ in range(200):
        message = await consumer.receive(timeout=5)
        assert message is not None
        assert consumer.buffered <= 20
        await asyncio.sleep(0.001)  # the application's work on each message: it is slower
    assert consumer.max_buffered == 20  # it filled up to the limit, and never beyond


async def test_destination_cap_is_the_client_buffer_bound(
    make_broker: Callable[[Mapping[str, str]], BrokerThread],
) -> None:
    broker = make_broker({"imq.autocreate.queue.consumerFlowLimit": "5"})
    address = f"stomp://127.0.0.1:{broker.port}"
    async with await ConnectionFactory(address, consumer_flow_limit=50).connect() as connection:
        session = connection.session()
        producer = session.producer("/queue/capped")
        for i in range(60):
            await producer.send(f"{i}")
        consumer = await session.consumer("/queue/capped")
        assert consumer.flow_limit == 5  # the broker's answer, adopted
        await eventually(lambda: consumer.buffered == 5)
        for _ in range(60):
            assert await consumer.receive(timeout=5) is not None
            await asyncio.sleep(0.001)  # the application's work on each message
        assert consumer.max_buffered == 5


async def test_connection_buffer_bound_when_enabled(connect: ConnectTo) -> None:
    await fill(connect, "/queue/ca", 60)
    await fill(connect, "/queue/cb", 60)
    connection = await connect(connection_flow_limit=8, connection_flow_limit_enabled=True)
    session = connection.session()
    first = await session.consumer("/queue/ca")
    second = await session.consumer("/queue/cb")
    await eventually(lambda: connection.buffered == 8)  # the limit is reached at once
    for _ in range(60):
        for consumer in (first, second):
            assert await consumer.receive(timeout=5) is not None
            await asyncio.sleep(0.001)  # the application's work on each message
    assert connection.max_buffered == 8


async def test_prefetch_off_holds_nothing_while_the_application_works(
    connect: ConnectTo, broker: BrokerThread
) -> None:
    await fill(connect, "/queue/one", 5)
    connection = await connect(consumer_flow_limit_prefetch=False)
    consumer = await connection.session().consumer("/queue/one")
    assert consumer.flow_limit == 1
    for i in range(5):
        message = await consumer.receive(timeout=5)
        assert message is not None
        assert message.text == f"{i}"
        # While the application works on it, the broker has had every frame the client sent
        # and still counts this message unconsumed (only those before it are acknowledged): with
        # a window of one, it sends nothing more.
        await caught_up(connection)
        state = queue_state(broker, "/queue/one")
        assert (state.consumed, state.outstanding, state.waiting) == (i, 1, 4 - i)
        assert consumer.buffered == 0


async def run_pool(
    connect: ConnectTo, broker: BrokerThread, destination: str, limit: int, concurrency: int
) -> int:
    """Serve a queue of 40 messages with a pool; return the most handlers seen working at once.

    The handlers hold their messages until as many work at once as can: the whole pool, or one
    per message of the window. Then, the broker having had every frame the client sent, the
    window is used up and nothing is consumed yet: no other handler can get a message.
    """
    await fill(connect, destination, 40)
    connection = await connect(consumer_flow_limit=limit)
    consumer = await connection.session().consumer(destination)
    busy = peak = handled = 0
    go_on = asyncio.Event()
    done = asyncio.Event()

    async def handler(message: Message) -> None:
        nonlocal busy, peak, handled
        busy += 1
        peak = max(peak, busy)
        await go_on.wait()
        busy -= 1
        handled += 1
        if handled == 40:
            done.set()

    consumer.set_listener(handler, concurrency=concurrency)
    try:
        await eventually(lambda: busy == min(concurrency, limit))
        await caught_up(connection)
        state = queue_state(broker, destination)
        assert (state.consumed, state.outstanding) == (0, limit)
        assert busy + consumer.buffered == limit
    finally:
        go_on.set()  # closing the connection waits for the handlers
    await asyncio.wait_for(done.wait(), 10)
    await connection.close()
    return peak


async def test_pool_warning_names_both_numbers_and_the_limit_caps_concurrency(
    connect: ConnectTo, broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="sluiceway.client.consumer"):
        capped = await run_pool(connect, broker, "/queue/mdb-small", limit=2, concurrency=4)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("flow limit is 2 messages but 4 handlers" in w for w in warnings), warnings
    assert capped == 2  # the trap: four handlers, two at work
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sluiceway.client.consumer"):
        full = await run_pool(connect, broker, "/queue/mdb-large", limit=8, concurrency=4)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert full == 4
