"""Fixtures: real brokers on real sockets (port 0) and clients connected to them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import pytest

from sluiceway.testing import BrokerThread
from tests.e2e.rawclient import RawClient

BrokerFactory = Callable[..., BrokerThread]
ClientFactory = Callable[..., RawClient]


@pytest.fixture
def make_broker() -> Iterator[BrokerFactory]:
    """Start brokers with the given properties; all are stopped after the test."""
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
