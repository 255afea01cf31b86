"""Fixtures of the persistence tests: clients closed and in-process brokers let go after each
test, whatever its outcome."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from sluiceway.persist.simulated import SimulatedDisk
from sluiceway.testing import FakeClock
from tests.persistence.inprocess import Node
from tests.persistence.raw import close_all

StartNode = Callable[[Path, SimulatedDisk, Mapping[str, str]], Node]


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_all()


@pytest.fixture
def start_node() -> Iterator[StartNode]:
    """Start in-process brokers on a simulated disk (one fake clock for all); any still running
    when the test ends is let go as if its process died."""
    started: list[Node] = []
    clock = FakeClock()

    def start(root: Path, disk: SimulatedDisk, properties: Mapping[str, str]) -> Node:
        node = Node(root, disk, clock, properties)
        started.append(node)
        return node

    yield start
    for node in started:
        if node.running:
            node.abandon()
