"""The asyncio client against a real broker: producing, consuming, acknowledging, transactions."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import pytest

from sluiceway.client import (
    AckMode,
    Connection,
    ConnectionClosedError,
    ConnectionFactory,
    EntityTooLarge,
    Message,
    RetryPolicy,
)
from sluiceway.testing import BrokerThread
from tests.client.conftest import ConnectTo
from tests.e2e.support import eventually


async def drain(connection: Connection, destination: str, timeout: float = 0.3) -> list[str]:
    """Everything a fresh consumer gets from `destination` (then it is closed)."""
    session = connection.session()
    consumer = await session.consumer(destination)
    texts = []
    while (message := await consumer.receive(timeout=timeout)) is not None:
        texts.append(message.text)
    await session.close()
    return texts


async def test_send_and_receive(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session(AckMode.AUTO)
    producer = session.producer("/queue/basic")
    await producer.send("text body", headers={"region": "EU"})
    await producer.send(b"\x00binary\xff", content_type="application/octet-stream")
    await producer.send(b"urgent", priority=9, persistent=False)
    consumer = await session.consumer("/queue/basic")
    first = await consumer.receive(timeout=5)
    assert first is not None
    assert first.body == b"urgent"  # priority 9 overtakes
    assert first.priority == 9
    assert first.persistent is False
    text = await consumer.receive(timeout=5)
    assert text is not None
    assert text.text == "text body"
    assert text.headers["region"] == "EU"
    assert text.persistent is True  # persistent by default, as in JMS
    assert text.destination == "/queue/basic"
    assert text.delivery_count == 1
    assert not text.redelivered
    binary = consumer.receive_no_wait()
    assert binary is not None
    assert binary.body == b"\x00binary\xff"
    assert binary.headers["content-type"] == "application/octet-stream"
    assert consumer.receive_no_wait() is None
    assert await consumer.receive(timeout=0.05) is None  # times out with None


async def test_time_to_live(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session()
    producer = session.producer("/queue/ttl", time_to_live=0.05)
    await producer.send("short-lived")
    await producer.send("kept", time_to_live=60)
    await asyncio.sleep(0.1)  # time passing is the point: the first one's time to live runs out
    assert await drain(connection, "/queue/ttl") == ["kept"]


async def test_async_iteration_and_selector(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session()
    producer = session.producer("/queue/orders")
    for i in range(10):
        region = "EU" if i % 2 else "US"
        await producer.send(f"{i}", headers={"region": region, "amount": str(i * 100)})
    consumer = await session.consumer("/queue/orders", "region = 'EU' AND amount > 200")
    got = []
    async for message in consumer:
        got.append(message.text)
        if len(got) == 3:
            break
    assert got == ["3", "5", "7"]
    # "9" matches too and sits in the open consumer's buffer; the others are left in the queue.
    assert sorted(await drain(connection, "/queue/orders")) == ["0", "1", "2", "4", "6", "8"]
    await consumer.close()  # hands "9" back
    assert await drain(connection, "/queue/orders") == ["9"]


async def test_queue_browser_sees_without_consuming(connect: ConnectTo) -> None:
    connection = await connect(queue_browser_max_messages_per_retrieve=3)
    session = connection.session()
    producer = session.producer("/queue/browse")
    for i in range(10):
        await producer.send(f"{i}", headers={"n": str(i)})
    browser = await session.browser("/queue/browse")
    assert [m.text for m in await browser.messages()] == [str(i) for i in range(10)]
    evens = await session.browser("/queue/browse", "n IN ('0', '2', '4')")
    assert [m.text for m in await evens.messages()] == ["0", "2", "4"]
    assert await drain(connection, "/queue/browse") == [str(i) for i in range(10)]


async def test_refused_persistent_send_raises_with_status_destination_and_limit(
    make_broker: Callable[[Mapping[str, str]], BrokerThread],
) -> None:
    broker = make_broker({"imq.message.max_size": "1k"})
    async with await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect() as connection:
        producer = connection.session().producer("/queue/big")
        with pytest.raises(EntityTooLarge) as raised:
            await producer.send(b"x" * 2000)
        error = raised.value
        assert error.status == 423
        assert error.destination == "/queue/big"
        assert error.limit == "imq.message.max_size"
        assert error.limit_value == "1024"
        assert "2000 bytes" in str(error)
        await producer.send(b"small")  # the connection is still open
        assert await drain(connection, "/queue/big") == ["small"]


async def test_ack_on_produce_decides_which_sends_wait(
    make_broker: Callable[[Mapping[str, str]], BrokerThread],
) -> None:
    broker = make_broker({"imq.message.max_size": "1k"})
    address = f"stomp://127.0.0.1:{broker.port}"
    async with await ConnectionFactory(address, ack_on_produce=True).connect() as connection:
        producer = connection.session().producer("/queue/aop")
        with pytest.raises(EntityTooLarge):
            await producer.send(b"x" * 2000, persistent=False)  # waits, so it hears the refusal
    connection = await ConnectionFactory(address, ack_on_produce=False).connect()
    producer = connection.session().producer("/queue/aop")
    await producer.send(b"x" * 2000)  # persistent, but not waiting: returns at once
    # The broker refuses it with an ERROR, which ends a connection that did not ask for a receipt.
    await eventually(lambda: connection.closed)
    with pytest.raises(ConnectionClosedError):
        await producer.send(b"small")
    await connection.close()


async def test_retry_policy_retries_until_its_deadline(
    make_broker: Callable[[Mapping[str, str]], BrokerThread], caplog: pytest.LogCaptureFixture
) -> None:
    broker = make_broker({"imq.message.max_size": "1k"})
    policy = RetryPolicy(
        pause=0.05, backoff=1.5, max_pause=0.1, deadline=0.5, retry_on=(EntityTooLarge,)
    )
    address = f"stomp://127.0.0.1:{broker.port}"
    async with await ConnectionFactory(address).connect() as connection:
        producer = connection.session().producer("/queue/retry", retry=policy)
        started = time.monotonic()
        with (
            caplog.at_level(logging.INFO, logger="sluiceway.client.producer"),
            pytest.raises(EntityTooLarge),
        ):
            await producer.send(b"x" * 2000)
        elapsed = time.monotonic() - started
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) >= 3
    assert 0.2 <= elapsed <= 1.5  # gave up around the deadline, not at once, not never


async def test_client_acknowledge(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session(AckMode.CLIENT)
    producer = session.producer("/queue/client-ack")
    for i in range(4):
        await producer.send(f"{i}")
    consumer = await session.consumer("/queue/client-ack")
    first, second = await consumer.receive(5), await consumer.receive(5)
    assert first is not None
    assert second is not None
    await second.acknowledge()  # acknowledges both: everything the session handed over
    third = await consumer.receive(5)
    assert third is not None
    await session.close()  # third was never acknowledged: it comes back
    other = await connect()
    assert await drain(other, "/queue/client-ack") == ["2", "3"]


async def test_dups_ok_acknowledges_lazily_but_surely(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session(AckMode.DUPS_OK)
    producer = session.producer("/queue/dups")
    for i in range(40):
        await producer.send(f"{i}")
    consumer = await session.consumer("/queue/dups")
    got = [m.text for m in [await consumer.receive(5) for _ in range(40)] if m is not None]
    assert len(got) == 40
    await session.close()
    assert await drain(await connect(), "/queue/dups") == []  # all were acknowledged


async def test_transacted_session(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session(transacted=True)
    producer = session.producer("/queue/tx-out")
    await producer.send("one")
    await producer.send("two")
    watcher = await connect()
    assert await drain(watcher, "/queue/tx-out") == []  # nothing before the commit
    await session.commit()
    consumer = await session.consumer("/queue/tx-out")
    received = [await consumer.receive(5), await consumer.receive(5)]
    assert [m.text for m in received if m] == ["one", "two"]
    await session.rollback()  # the two are delivered again
    again = [await consumer.receive(5), await consumer.receive(5)]
    assert [m.text for m in again if m] == ["one", "two"]
    assert all(m is not None and m.redelivered for m in again)
    await session.commit()
    await session.close()
    assert await drain(watcher, "/queue/tx-out") == []


async def test_listener_async_and_plain_functions(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session()
    producer = session.producer("/topic/events")
    seen_async: list[str] = []
    seen_plain: list[str] = []
    done = asyncio.Event()

    async def on_message(message: Message) -> None:
        seen_async.append(message.text)
        if len(seen_async) == 5:
            done.set()

    def on_message_in_thread(message: Message) -> None:
        seen_plain.append(message.text)

    (await session.consumer("/topic/events")).set_listener(on_message)
    (await session.consumer("/topic/events")).set_listener(on_message_in_thread)
    for i in range(5):
        await producer.send(f"{i}")
    await asyncio.wait_for(done.wait(), 5)
    await eventually(lambda: len(seen_plain) == 5)
    assert seen_async == ["0", "1", "2", "3", "4"]
    assert seen_plain == ["0", "1", "2", "3", "4"]


async def test_a_failing_listener_gets_the_message_again(connect: ConnectTo) -> None:
    connection = await connect()
    session = connection.session()
    attempts: list[int] = []
    done = asyncio.Event()

    async def flaky(message: Message) -> None:
        attempts.append(message.delivery_count)
        if message.delivery_count < 3:
            raise RuntimeError("not yet")
        done.set()

    consumer = await session.consumer("/queue/flaky")
    consumer.set_listener(flaky)
    await session.producer("/queue/flaky").send("m")
    await asyncio.wait_for(done.wait(), 5)
    assert attempts == [1, 2, 3]
