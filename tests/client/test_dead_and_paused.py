"""The dead message queue and paused destinations, seen through the project's client."""

from __future__ import annotations

import asyncio

from sluiceway.client import AckMode, ConnectionFactory
from sluiceway.core.broker import PauseTarget
from sluiceway.naming import parse_destination
from tests.conftest import BrokerFactory
from tests.e2e.support import eventually

DMQ = "/queue/mq.sys.dmq"


async def test_a_consumer_of_the_dmq_reads_why_each_message_died(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.jobs.maxNumMsgs": "2",
            "imq.destination.queue.jobs.limitBehavior": "REMOVE_OLDEST",
            "imq.destination.queue.jobs.maxDeliveryCount": "1",
        }
    )
    factory = ConnectionFactory(f"stomp://127.0.0.1:{broker.port}")
    async with await factory.connect() as connection:
        session = connection.session(AckMode.CLIENT)
        producer = session.producer("/queue/jobs")
        for body in ("a", "b", "c"):
            await producer.send(body)  # "a" is evicted to make room for "c"
        consumer = await session.consumer("/queue/jobs")
        first = await consumer.receive(5)
        assert first is not None
        assert first.text == "b"
        await session.recover()  # delivered once, maxDeliveryCount 1: "b" is dead now
        dead_consumer = await connection.session().consumer(DMQ)
        dead = [await dead_consumer.receive(5) for _ in range(2)]
    reasons = {m.text: m.headers["JMS_SUN_DMQ_UNDELIVERED_REASON"] for m in dead if m is not None}
    assert reasons == {"a": "OLDEST", "b": "UNDELIVERABLE"}
    for message in dead:
        assert message is not None
        assert message.headers["JMS_SUN_DMQ_UNDELIVERED_DESTINATION"] == "/queue/jobs"
        assert message.persistent  # the copy keeps the original's delivery mode


async def test_a_send_to_a_paused_destination_waits_until_resumed(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    core = broker.broker
    assert core is not None
    name = parse_destination("/queue/paused")
    factory = ConnectionFactory(f"stomp://127.0.0.1:{broker.port}")
    async with await factory.connect() as connection:
        producer = connection.session().producer("/queue/paused")
        await producer.send("before")
        broker.call(lambda: core.pause(name, PauseTarget.PRODUCERS))
        sending = asyncio.create_task(producer.send("during"))  # persistent: waits for receipt
        await eventually(lambda: bool(broker.call(core.producers.held)))
        assert not sending.done()
        (held,) = broker.call(core.producers.held)
        assert held.reason == "producers paused"
        broker.call(lambda: core.resume(name, PauseTarget.PRODUCERS))
        await asyncio.wait_for(sending, 5)
        consumer = await connection.session().consumer("/queue/paused")
        received = [await consumer.receive(5) for _ in range(2)]
    assert [m.text for m in received if m is not None] == ["before", "during"]
