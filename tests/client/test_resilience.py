"""Surviving the network: reconnection, a killed or frozen broker, timeouts. Nothing hangs."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sluiceway.client import (
    ConnectionClosedError,
    ConnectionFactory,
    OperationTimeoutError,
    TransactionRolledBackError,
)
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.e2e.support import eventually


def reconnecting(port: int, **keywords: Any) -> ConnectionFactory:
    return ConnectionFactory(
        f"stomp://127.0.0.1:{port}",
        reconnect_enabled=True,
        reconnect_attempts=-1,
        reconnect_interval=0.05,
        **keywords,
    )


async def test_reconnect_after_the_broker_restarts() -> None:
    first = BrokerThread()
    first.start()
    port = first.port
    connection = await reconnecting(port).connect()
    try:
        session = connection.session()
        consumer = await session.consumer("/queue/restart")
        producer = session.producer("/queue/restart")
        await producer.send("before")
        received = await consumer.receive(5)
        assert received is not None
        assert received.text == "before"
        pending_receive = asyncio.create_task(consumer.receive(20))

        await asyncio.to_thread(first.stop)
        await eventually(lambda: not connection.connected)
        failed = connection.failed_reconnect_attempts
        sending = asyncio.create_task(producer.send("during the outage"))
        # Two more attempts to reconnect fail while the send is under way: a send that failed
        # for want of a connection, rather than wait for one, would have failed by then.
        await eventually(lambda: connection.failed_reconnect_attempts >= failed + 2)
        assert not sending.done()  # waits for the reconnection instead of failing

        second = BrokerThread({"imq.stomp.tcp.port": str(port)})
        await asyncio.to_thread(second.start)
        try:
            await asyncio.wait_for(sending, 10)
            message = await asyncio.wait_for(pending_receive, 10)
            assert message is not None
            assert message.text == "during the outage"  # the consumer subscribed again
            assert connection.reconnects == 1
        finally:
            await connection.close()
            await asyncio.to_thread(second.stop)
    finally:
        await connection.close()
        await asyncio.to_thread(first.stop)


async def test_an_open_transaction_is_rolled_back_by_a_reconnection() -> None:
    first = BrokerThread()
    first.start()
    port = first.port
    connection = await reconnecting(port).connect()
    second = BrokerThread({"imq.stomp.tcp.port": str(port)})
    try:
        session = connection.session(transacted=True)
        producer = session.producer("/queue/tx-lost")
        await producer.send("lost with the transaction")
        await asyncio.to_thread(first.stop)
        await eventually(lambda: not connection.connected)
        await asyncio.to_thread(second.start)
        await eventually(lambda: connection.connected, 10)
        with pytest.raises(TransactionRolledBackError, match="rolled it back"):
            await session.commit()
        await producer.send("kept")  # a new transaction
        await session.commit()
        reader = connection.session()
        consumer = await reader.consumer("/queue/tx-lost")
        message = await consumer.receive(5)
        assert message is not None
        assert message.text == "kept"
        assert await consumer.receive(0.2) is None
    finally:
        await connection.close()
        await asyncio.to_thread(second.stop)
        await asyncio.to_thread(first.stop)


async def test_a_killed_broker_fails_every_pending_operation_at_once() -> None:
    with BrokerProcess() as broker:
        connection = await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect()
        session = connection.session()
        consumer = await session.consumer("/queue/dead")
        receiving = asyncio.create_task(consumer.receive())  # would wait forever
        tx_session = connection.session(transacted=True)
        await tx_session.producer("/queue/dead").send("in a transaction")
        broker.freeze()  # so the next send and the commit are still waiting when it dies
        sending = asyncio.create_task(session.producer("/queue/dead").send("unconfirmed"))
        committing = asyncio.create_task(tx_session.commit())
        await eventually(lambda: connection.awaiting_receipt == 2)  # both written, unanswered
        assert not receiving.done()
        assert not sending.done()
        assert not committing.done()
        broker.kill()
        started = time.monotonic()
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(receiving, 5)
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(sending, 5)
        with pytest.raises(TransactionRolledBackError):
            await asyncio.wait_for(committing, 5)
        assert time.monotonic() - started < 2
        assert connection.closed
        with pytest.raises(ConnectionClosedError):
            await session.producer("/queue/dead").send("after")
        await connection.close()


async def test_heart_beats_detect_a_frozen_broker() -> None:
    with BrokerProcess("-D", "imq.stomp.heartbeat.send=100") as broker:
        factory = ConnectionFactory(f"stomp://127.0.0.1:{broker.port}", ping_interval=0.1)
        connection = await factory.connect()
        consumer = await connection.session().consumer("/queue/frozen")
        receiving = asyncio.create_task(consumer.receive())
        # Idle for five heart-beat intervals, over twice as long as the client waits for a silent
        # broker before taking it for dead: only the heart-beats keep the connection open.
        beats = connection.heartbeats_received
        await eventually(lambda: connection.heartbeats_received >= beats + 5)
        assert not receiving.done()  # heart-beats keep the idle connection alive
        assert connection.connected
        broker.freeze()
        started = time.monotonic()
        with pytest.raises(ConnectionClosedError, match="heart-beats"):
            await asyncio.wait_for(receiving, 5)
        assert time.monotonic() - started < 1.5
        await connection.close()


async def test_ack_timeout_bounds_a_send_the_broker_does_not_answer() -> None:
    with BrokerProcess() as broker:
        address = f"stomp://127.0.0.1:{broker.port}"
        connection = await ConnectionFactory(address, properties={"imqAckTimeout": "300"}).connect()
        producer = connection.session().producer("/queue/slow")
        broker.freeze()
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError, match="imqAckTimeout"):
            await producer.send("no answer")
        assert 0.25 < time.monotonic() - started < 2
        with pytest.raises(OperationTimeoutError):
            await producer.send("per call", timeout=0.1)
        broker.thaw()
        await connection.close()


async def test_reconnection_gives_up_after_its_attempts() -> None:
    broker = BrokerThread()
    broker.start()
    factory = ConnectionFactory(
        f"stomp://127.0.0.1:{broker.port}",
        reconnect_enabled=True,
        reconnect_attempts=2,
        reconnect_interval=0.05,
    )
    connection = await factory.connect()
    consumer = await connection.session().consumer("/queue/gone")
    receiving = asyncio.create_task(consumer.receive())
    await asyncio.to_thread(broker.stop)
    with pytest.raises(ConnectionClosedError, match="could not connect"):
        await asyncio.wait_for(receiving, 5)
    assert connection.closed
    await connection.close()


async def test_without_reconnect_a_lost_connection_is_closed_for_good(
    broker: BrokerThread,
) -> None:
    connection = await ConnectionFactory(f"stomp://127.0.0.1:{broker.port}").connect()
    consumer = await connection.session().consumer("/queue/q")
    receiving = asyncio.create_task(consumer.receive())
    await asyncio.to_thread(broker.stop)
    with pytest.raises(ConnectionClosedError, match="shutting down"):
        await asyncio.wait_for(receiving, 5)
    assert connection.closed
    await connection.close()
