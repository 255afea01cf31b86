"""Selectors, queue browsers, failed receipts and the message size limit, over real sockets."""

from __future__ import annotations

import pytest

from sluiceway.testing import BrokerThread
from tests.e2e.conftest import BrokerFactory, ClientFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, subscribe, sync


def publish(client: RawClient, destination: str, rows: list[dict[str, str]]) -> None:
    for number, headers in enumerate(rows):
        client.send("SEND", {"destination": destination, **headers}, b"%d" % number)
    client.sync()


def test_queue_selector_takes_only_matching_messages(raw: ClientFactory) -> None:
    producer, eu, everyone = raw(), raw(), raw()
    publish(
        producer,
        "/queue/sel",
        [{"region": "EU", "amount": "50"}, {"region": "US"}, {"region": "EU", "amount": "500"}],
    )
    eu.subscribe("/queue/sel", "eu", selector="region = 'EU' AND amount > 100", ack="auto")
    assert [m.body for m in eu.receive(1)] == [b"2"]
    everyone.subscribe("/queue/sel", ack="auto")
    assert sorted(m.body for m in everyone.receive(2)) == [b"0", b"1"]


def test_topic_selector_with_stomp_py(broker: BrokerThread) -> None:
    consumer, recorder = connect(broker.port)
    subscribe(consumer, recorder, "/topic/prices", "p", ack="auto", selector="JMSPriority > 5")
    producer, _ = connect(broker.port)
    producer.send("/topic/prices", "low", headers={"priority": "1"})
    producer.send("/topic/prices", "high", headers={"priority": "9"})
    recorder.wait_messages(1)
    sync(consumer, recorder)
    assert [f.body for f in recorder.take()] == ["high"]
    consumer.disconnect()
    producer.disconnect()


def test_invalid_selector_is_an_error_naming_the_position(raw: ClientFactory) -> None:
    client = raw()
    client.send(
        "SUBSCRIBE",
        {"destination": "/queue/q", "id": "s", "selector": "region = 'EU", "receipt": "r"},
    )
    error = client.expect("ERROR")
    assert error.headers["status"] == "400"
    assert b"unterminated string" in error.body
    client.expect_closed()


def test_browser_sees_the_queue_without_consuming_it(raw: ClientFactory) -> None:
    producer, browser, consumer = raw(), raw(), raw()
    publish(producer, "/queue/b", [{"n": str(i)} for i in range(5)])
    browser.subscribe("/queue/b", "look", browser="true", consumer_flow_limit="2")
    seen = browser.receive(6)
    assert [m.body for m in seen[:5]] == [b"0", b"1", b"2", b"3", b"4"]
    assert seen[5].headers["browser"] == "end"
    assert seen[5].body == b""
    consumer.subscribe("/queue/b", ack="auto")
    assert len(consumer.receive(5)) == 5  # all still there


def test_browsing_a_topic_without_durable_subscriptions_finds_nothing_retained(
    raw: ClientFactory,
) -> None:
    producer, reader = raw(), raw()
    publish(producer, "/topic/t", [{}, {}])  # nobody keeps them
    reader.subscribe("/topic/t", "s", browser="true")
    (end,) = reader.receive(1)
    assert end.headers["browser"] == "end"
    assert end.headers["head-sequence"] == "2"
    assert end.headers["next-sequence"] == "3"


def test_failed_receipt_keeps_the_connection_of_a_client_that_asks_for_it(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker({"imq.message.max_size": "100"})
    client = RawClient(broker.port)
    connected = client.connect(failed_receipts="true")
    assert connected.headers["failed-receipts"] == "true"
    client.send("SEND", {"destination": "/queue/m", "receipt": "big"}, b"x" * 200)
    receipt = client.expect("RECEIPT")
    assert receipt.headers["receipt-id"] == "big"
    assert receipt.headers["status"] == "423"
    assert receipt.headers["destination"] == "/queue/m"
    assert receipt.headers["limit"] == "imq.message.max_size"
    assert receipt.headers["limit-value"] == "100"
    assert "200 bytes" in receipt.headers["detail"]
    client.request("SEND", {"destination": "/queue/m"}, b"fits")  # still connected
    client.close()


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_message_size_limit_refuses_with_an_error_naming_the_limit(
    make_broker: BrokerFactory, version: str
) -> None:
    broker = make_broker({"imq.message.max_size": "1k"})
    connection, recorder = connect(broker.port, version=version)
    connection.send("/queue/big", "x" * 2000, headers={"receipt": "r"})
    recorder.wait_for(lambda: bool(recorder.errors))
    (error,) = recorder.errors
    assert error.headers["status"] == "423"
    assert error.headers["destination"] == "/queue/big"
    assert error.headers["limit"] == "imq.message.max_size"
    assert error.headers["limit-value"] == "1024"
