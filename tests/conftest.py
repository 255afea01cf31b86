"""Fixtures shared by the test packages: real brokers on real sockets (port 0)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest

from sluiceway.testing import BrokerThread

BrokerFactory = Callable[..., BrokerThread]


@pytest.fixture
def make_broker() -> Iterator[BrokerFactory]:
    """Start brokers with the given properties (Open MQ names); all are stopped after the test."""
    started: list[BrokerThread] = []

    def make(properties: Mapping[str, str] | None = None) -> BrokerThread:
        broker = BrokerThread(properties)
        broker.start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker()
