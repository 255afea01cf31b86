"""Fixtures: a real broker on port 0 and connection factories pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sluiceway.client import Connection, ConnectionFactory
from sluiceway.testing import BrokerThread

ConnectTo = Callable[..., Any]


@pytest.fixture
async def connect(broker: BrokerThread) -> AsyncIterator[ConnectTo]:
    """Open client connections to `broker` (keywords are factory attributes); closed after."""
    opened: list[Connection] = []

    async def open_connection(port: int | None = None, **keywords: Any) -> Connection:
        address = f"stomp://127.0.0.1:{port or broker.port}"
        connection = await ConnectionFactory(address, **keywords).connect()
        opened.append(connection)
        return connection

    yield open_connection
    for connection in opened:
        await connection.close()
