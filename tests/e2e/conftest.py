"""Fixtures: real brokers on real sockets (port 0) and clients connected to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient

__all__ = ["BrokerFactory", "ClientFactory"]

ClientFactory = Callable[..., RawClient]


@pytest.fixture
def clients() -> Iterator[Callable[..., RawClient]]:
    """Raw clients of any broker (`clients(port, ...)`); all are closed after the test."""
    made: list[RawClient] = []

    def make(
        port: int, *, connect: bool = True, receive_buffer: int | None = None, **headers: str
    ) -> RawClient:
        client = RawClient(port, receive_buffer=receive_buffer)
        made.append(client)
        if connect:
            client.connect(**headers)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def raw(broker: BrokerThread) -> Iterator[ClientFactory]:
    """Raw-frame clients of `broker`, connected with STOMP 1.2 unless told otherwise."""
    clients: list[RawClient] = []

    def make(connect: bool = True, version: str = "1.2", **headers: str) -> RawClient:
        client = RawClient(broker.port)
        clients.append(client)
        if connect:
            client.connect(version, **headers)
        return client

    yield make
    for client in clients:
        client.close()
