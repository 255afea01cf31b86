"""deliveryOrder=deadline over real sockets with stomp.py: earliest deadline first, and the
deadline misses the admin model counts."""

from __future__ import annotations

import time

from sluiceway.admin import model
from sluiceway.naming import parse_destination
from tests.e2e.conftest import BrokerFactory
from tests.e2e.stomppy import connect, end, sync, with_receipt


def test_stomp_py_consumer_gets_the_earliest_deadline_first(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.destination.queue.jobs.deliveryOrder": "deadline"})
    producer, producer_recorder = connect(broker.port)
    now = int(time.time() * 1000)
    sent = [("no deadline", 0), ("in an hour", 3_600_000), ("in a minute", 60_000)]
    sent += [("in ten minutes", 600_000), ("already missed", -1_000)]
    for body, offset in sent:
        headers = {"expires": str(now + offset)} if offset else {}
        producer.send("/queue/jobs", body, headers=headers)
    sync(producer, producer_recorder)
    consumer, recorder = connect(broker.port)
    with_receipt(
        recorder,
        lambda r: consumer.subscribe(
            "/queue/jobs",
            id="1",
            ack="client-individual",
            headers={"consumer-flow-limit": "1", "receipt": r},
        ),
    )
    order = []
    for _ in range(4):
        (frame,) = recorder.wait_messages(1)
        recorder.take()
        order.append(frame.body)
        consumer.ack(frame.headers["ack"])
    assert order == ["in a minute", "in ten minutes", "in an hour", "no deadline"]

    def totals() -> model.Totals:
        assert broker.broker is not None
        destination = broker.broker.destination(parse_destination("/queue/jobs"))
        return model.destination_detail(broker.broker, destination).totals

    counted = broker.call(totals)
    assert (counted.expired, counted.late, counted.deadline_misses) == (1, 0, 1)
    end(consumer, recorder)
    end(producer, producer_recorder)
