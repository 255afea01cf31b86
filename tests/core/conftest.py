"""Fixtures: a broker core on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from sluiceway.config import BrokerConfig, build_config
from sluiceway.core.broker import Broker
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.swapping import SEGMENT_SIZE


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


@pytest.fixture
def swap_dir(tmp_path: Path) -> Path:
    return tmp_path / "swap"


@pytest.fixture
def swap(swap_dir: Path) -> Iterator[SwapArea]:
    area = SwapArea(swap_dir, segment_size=SEGMENT_SIZE)
    area.open()
    yield area
    area.close()
