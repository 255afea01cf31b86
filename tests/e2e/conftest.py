"""Fixtures: real brokers on real sockets (port 0) and clients connected to them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import stomp

from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder, connect

__all__ = ["BrokerFactory", "ClientFactory", "StompFactory"]

ClientFactory = Callable[..., RawClient]
StompFactory = Callable[..., tuple[Any, Recorder]]


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


@pytest.fixture
def stomp_clients(make_broker: BrokerFactory) -> Iterator[StompFactory]:
    """stomp.py connections (`stomp_clients(port, **connect_headers)`), disconnected after the
    test, before its brokers stop (this fixture depends on make_broker, so it is torn down
    first)."""
    opened: list[Any] = []

    def make(port: int, **headers: str) -> tuple[Any, Recorder]:
        connection, recorder = connect(port, **headers)
        opened.append(connection)
        return connection, recorder

    yield make
    for connection in opened:
        # A connection the broker ended may close between the check and the DISCONNECT: it
        # is gone either way, which is what this is for.
        with contextlib.suppress(stomp.exception.NotConnectedException, OSError):
            if connection.is_connected():
                connection.disconnect()
