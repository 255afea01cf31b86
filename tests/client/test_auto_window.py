"""Adaptive consumer windows from the client's side: imqConsumerFlowLimit=auto, the handler pool a
consumer declares (pool_size), what the RECEIPT tells the consumer, and the pool warnings."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest

from sluiceway.admin.model import ConsumerSnapshot, consumers
from sluiceway.client import AckMode, Message
from sluiceway.client import sync as sync_client
from sluiceway.client.settings import UNLIMITED_CONSUMER_WINDOW, build_settings
from sluiceway.core.values.flow import ConsumerFlow
from sluiceway.errors import ConfigError
from sluiceway.testing import BrokerThread
from tests.client.conftest import ConnectTo
from tests.client.support import caught_up, queue_state
from tests.conftest import BrokerFactory

WAIT = 30.0  # generous: a loaded machine slows the consumer, never the rule
ACCEPTED = "an integer from -1, or auto"

# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "keywords"),
    [
        ({"imqConsumerFlowLimit": "auto"}, {}),
        ({"imqConsumerFlowLimit": " AUTO "}, {}),
        ({}, {"consumer_flow_limit": "auto"}),
        ({}, {"consumer_flow_limit": "Auto"}),
        ({"imqConsumerFlowLimit": "100"}, {"consumer_flow_limit": "auto"}),  # keywords win
    ],
)
def test_auto_is_read_from_properties_and_keywords(
    properties: dict[str, str], keywords: dict[str, Any]
) -> None:
    settings = build_settings(None, properties, **keywords)
    assert settings.consumer_flow_limit == "auto"
    assert settings.consumer_flow_auto is True
    assert settings.consumer_window == "auto"


@pytest.mark.parametrize(
    ("properties", "keywords", "window"),
    [
        ({"imqConsumerFlowLimit": "250"}, {}, 250),
        ({"imqConsumerFlowLimit": "0"}, {}, UNLIMITED_CONSUMER_WINDOW),
        ({}, {"consumer_flow_limit": -1}, UNLIMITED_CONSUMER_WINDOW),
        ({"imqConsumerFlowLimit": "auto"}, {"consumer_flow_limit": 30}, 30),
    ],
)
def test_numbers_still_ask_for_a_fixed_window(
    properties: dict[str, str], keywords: dict[str, Any], window: int
) -> None:
    settings = build_settings(None, properties, **keywords)
    assert settings.consumer_flow_auto is False
    assert settings.consumer_window == window


@pytest.mark.parametrize("text", ["bogus", "-2", "autoo", "", "1.5"])
def test_a_bad_open_mq_flow_limit_is_refused_naming_the_attribute(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build_settings(None, {"imqConsumerFlowLimit": text})
    assert raised.value.name == "imqConsumerFlowLimit"
    assert f"imqConsumerFlowLimit has the value {text!r}; accepted: {ACCEPTED}" in str(raised.value)


@pytest.mark.parametrize("value", ["bogus", "100", -2, True, 1.5, None])
def test_a_bad_flow_limit_keyword_is_refused_naming_the_attribute(value: object) -> None:
    with pytest.raises(ConfigError) as raised:
        build_settings(None, consumer_flow_limit=value)
    message = str(raised.value)
    assert f"consumer_flow_limit (imqConsumerFlowLimit) = {value!r}" in message
    assert f"accepted: {ACCEPTED}" in message


# -- what the broker sees and says -----------------------------------------------------------


def snapshot(broker: BrokerThread, path: str) -> ConsumerSnapshot:
    """The one consumer of `path`, as the broker's admin model shows it."""

    def find() -> ConsumerSnapshot:
        assert broker.broker is not None
        (found,) = [c for c in consumers(broker.broker) if c.destination == path]
        return found

    return broker.call(find)


def flows(broker: BrokerThread, path: str) -> list[ConsumerFlow]:
    """The negotiated flow settings of every subscription to `path`, browsers included."""

    def look() -> list[ConsumerFlow]:
        core = broker.broker
        assert core is not None
        return [
            subscription.flow
            for connection in core.connections.values()
            for subscription in connection.subscriptions.values()
            if subscription.destination.name.path == path
        ]

    return broker.call(look)


async def send(connect: ConnectTo, path: str, count: int) -> None:
    connection = await connect()
    producer = connection.session().producer(path, persistent=False)
    for i in range(count):
        await producer.send(f"{i}")
    await caught_up(connection)
    await connection.close()


async def test_an_auto_consumer_is_told_the_cap_and_consumes_normally(
    connect: ConnectTo, broker: BrokerThread
) -> None:
    path, count = "/queue/auto-plain", 50
    await send(connect, path, count)
    connection = await connect(consumer_flow_limit="auto")
    consumer = await connection.session(AckMode.AUTO).consumer(path)
    # The destination's default consumerFlowLimit caps the adaptive window and bounds the buffer.
    assert (consumer.flow_auto, consumer.flow_limit) == (True, 1000)
    seen = snapshot(broker, path)
    assert (seen.window_auto, seen.window_max) == (True, 1000)
    received = []
    for _ in range(count):
        message = await consumer.receive(timeout=WAIT)
        assert message is not None
        received.append(message.text)
    assert received == [f"{i}" for i in range(count)]
    await caught_up(connection)
    state = queue_state(broker, path)
    assert (state.consumed, state.outstanding, state.waiting) == (count, 0, 0)


@pytest.mark.parametrize(
    ("destination_limit", "asked", "adopted"),
    [
        (None, 100, (False, 100)),  # numbers on both sides: a fixed window, as before
        ("auto", 200, (True, 200)),  # the destination adapts, within what the consumer asked
        ("40", "auto", (True, 40)),  # the consumer adapts, within the destination's cap
    ],
)
async def test_the_receipt_says_whether_the_window_adapts(
    make_broker: BrokerFactory,
    connect: ConnectTo,
    destination_limit: str | None,
    asked: int | str,
    adopted: tuple[bool, int],
) -> None:
    properties = {"imq.autocreate.queue.consumerFlowLimit": destination_limit}
    broker = make_broker(properties if destination_limit is not None else None)
    connection = await connect(broker.port, consumer_flow_limit=asked)
    consumer = await connection.session().consumer("/queue/receipt")
    assert (consumer.flow_auto, consumer.flow_limit) == adopted
    assert snapshot(broker, "/queue/receipt").window_auto is adopted[0]


async def test_browsers_ask_for_their_batch_size_never_auto(
    connect: ConnectTo, broker: BrokerThread
) -> None:
    path = "/queue/auto-browsed"
    await send(connect, path, 3)
    connection = await connect(
        consumer_flow_limit="auto", queue_browser_max_messages_per_retrieve=7
    )
    browser = await connection.session().browser(path)
    seen: list[str] = []
    async for message in browser:
        if not seen:  # while the browse is on, its subscription is on the broker
            (flow,) = flows(broker, path)
            assert (flow.auto, flow.limit) == (False, 7)
        seen.append(message.text)
    assert seen == ["0", "1", "2"]


# -- the declared handler pool ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool_size", "error"),
    [(-1, ValueError), (2**31, ValueError), ("8", TypeError), (True, TypeError), (1.5, TypeError)],
)
async def test_a_bad_pool_size_is_refused_before_subscribing(
    connect: ConnectTo, broker: BrokerThread, pool_size: object, error: type[Exception]
) -> None:
    connection = await connect(consumer_flow_limit="auto")
    with pytest.raises(error) as raised:
        await connection.session().consumer("/queue/pool-bad", pool_size=pool_size)
    assert "pool_size must be an integer from 0 to 2147483647" in str(raised.value)
    assert repr(pool_size) in str(raised.value)
    await caught_up(connection)
    assert flows(broker, "/queue/pool-bad") == []


async def test_a_declared_pool_keeps_the_adaptive_window_at_least_that_large(
    connect: ConnectTo, broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight handlers taking 20 ms each: the broker measures the consumer's pace and sizes its
    window from it, but never below the eight handlers declared."""
    path, count, pool = "/queue/auto-pool", 400, 8
    await send(connect, path, count)
    connection = await connect(consumer_flow_limit="auto")
    consumer = await connection.session(AckMode.AUTO).consumer(path, pool_size=pool)
    assert (consumer.flow_auto, consumer.pool_size) == (True, pool)
    (flow,) = flows(broker, path)
    assert (flow.auto, flow.pool) == (True, pool)  # consumer-pool-size reached the broker

    def handler(message: Message) -> None:
        time.sleep(0.02)  # the handler's work on the message

    with caplog.at_level(logging.WARNING, logger="sluiceway.client.consumer"):
        consumer.set_listener(handler, concurrency=pool)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    smallest = await _smallest_window_until_consumed(broker, path, count)
    final = snapshot(broker, path)
    assert final.window_auto is True
    assert final.pace_ms is not None  # the window was sized from a measured pace
    assert final.window_limit >= pool
    assert smallest >= pool


async def _smallest_window_until_consumed(broker: BrokerThread, path: str, count: int) -> int:
    """Poll the broker until `count` messages of `path` are consumed (failing after WAIT
    seconds); return the smallest window its consumer had at any of the looks."""
    deadline = time.monotonic() + WAIT
    smallest = snapshot(broker, path).window_limit
    while queue_state(broker, path).consumed < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} messages not consumed within {WAIT} s")
        smallest = min(smallest, snapshot(broker, path).window_limit)
        await asyncio.sleep(0.01)
    return min(smallest, snapshot(broker, path).window_limit)


async def test_durable_subscribers_declare_their_pool_too(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    factory = sync_client.ConnectionFactory(
        f"stomp://127.0.0.1:{broker.port}", consumer_flow_limit="AUTO", client_id="pooled"
    )
    with factory.connect() as connection:
        session = connection.session()
        consumer = session.durable_subscriber("/topic/pooled", "keeper", pool_size=3)
        assert (consumer.flow_auto, consumer.flow_limit, consumer.pool_size) == (True, 1000, 3)
        (flow,) = flows(broker, "/topic/pooled")
        assert (flow.auto, flow.pool) == (True, 3)
        consumer.close()
        session.unsubscribe("keeper")


def test_the_synchronous_consumer_declares_its_pool(broker: BrokerThread) -> None:
    factory = sync_client.ConnectionFactory(
        f"stomp://127.0.0.1:{broker.port}", consumer_flow_limit="auto"
    )
    with factory.connect() as connection:
        session = connection.session()
        consumer = session.consumer("/queue/sync-pool", pool_size=5)
        assert (consumer.flow_auto, consumer.flow_limit, consumer.pool_size) == (True, 1000, 5)
        (flow,) = flows(broker, "/queue/sync-pool")
        assert (flow.auto, flow.pool) == (True, 5)
        with pytest.raises(ValueError, match="pool_size must be an integer from 0"):
            session.consumer("/queue/sync-pool", pool_size=-3)


# -- warnings for listener pools ---------------------------------------------------------------

POOL_HINT = "declare pool_size=8 when creating the consumer"
CAP_HINT = "flow limit is 4 messages but 8 handlers serve it"


@dataclass(frozen=True)
class PoolCase:
    """A listener of eight handlers on a consumer: what is set, and the warnings expected."""

    cap: str | None  # the destination's consumerFlowLimit; None: the default, 1000
    asked: int | str  # imqConsumerFlowLimit
    pool_size: int  # declared on subscribing
    warned: tuple[str, ...]  # a fragment of each warning, in order


@pytest.mark.parametrize(
    "case",
    [
        PoolCase(None, "auto", 0, (POOL_HINT,)),  # the window may shrink below eight handlers
        PoolCase(None, "auto", 5, (POOL_HINT,)),
        PoolCase(None, "auto", 8, ()),  # declared: the broker keeps the window at eight or more
        PoolCase("4", "auto", 8, (CAP_HINT,)),  # the cap itself is below the pool
        PoolCase("4", "auto", 2, (CAP_HINT, "may fall below 4 messages")),
        PoolCase(None, 1000, 0, ()),  # a fixed window of 1000: room for every handler
    ],
)
async def test_a_listener_pool_larger_than_the_window_may_be_is_warned_of(
    make_broker: BrokerFactory,
    connect: ConnectTo,
    caplog: pytest.LogCaptureFixture,
    case: PoolCase,
) -> None:
    cap, warned = case.cap, case.warned
    broker = make_broker({"imq.autocreate.queue.consumerFlowLimit": cap} if cap else None)
    connection = await connect(broker.port, consumer_flow_limit=case.asked)
    consumer = await connection.session().consumer("/queue/warned", pool_size=case.pool_size)

    async def handler(message: Message) -> None:
        return None

    with caplog.at_level(logging.WARNING, logger="sluiceway.client.consumer"):
        consumer.set_listener(handler, concurrency=8)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(warned), warnings
    for fragment, warning in zip(warned, warnings, strict=True):
        assert fragment in warning
    if cap is not None:
        assert "raise the destination's consumerFlowLimit" in warnings[0]
    await consumer.close()
