"""Fixtures: a broker core on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from sluiceway.config import BrokerConfig, build_config
from sluiceway.core.broker import Broker
from sluiceway.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_broker(clock: FakeClock) -> Callable[[Mapping[str, str]], Broker]:
    """A broker configured with the given properties (Open MQ names)."""

    def make(properties: Mapping[str, str]) -> Broker:
        return Broker(build_config(properties), clock=clock)

    return make


@pytest.fixture
def broker(clock: FakeClock) -> Broker:
    return Broker(BrokerConfig(), clock=clock)
