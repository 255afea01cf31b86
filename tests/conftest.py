"""Fixtures shared by the test packages: real brokers on real sockets (port 0)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest
from hypothesis import settings

from sluiceway.testing import BrokerThread

BrokerFactory = Callable[..., BrokerThread]

# Property tests are bounded by their example counts and the suite's timeouts, never by the time
# one example takes: Hypothesis's default 200 ms deadline fails them on a loaded machine.
settings.register_profile("sluiceway", deadline=None)
settings.load_profile("sluiceway")


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
