"""Bounded waits and broker introspection shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sluiceway.server.snapshots import ConnectionInfo
from sluiceway.testing import BrokerThread

WAIT = 5.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll `predicate` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(0.005)


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """`wait_until` for asyncio tests: poll without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.005)


async def turns_until(condition: Callable[[], bool], limit: int = 100) -> None:
    """Run the event loop one turn at a time until `condition` holds; fail after `limit` turns."""
    turns = 0
    while not condition():
        if turns == limit:
            raise AssertionError(f"not reached within {limit} event-loop turns")
        await asyncio.sleep(0)
        turns += 1


async def loop_turns(count: int) -> None:
    """Let the event loop run `count` turns: for tests whose unit of time is the loop's turn
    (a pump writes at most so much per turn), where nothing is awaited but the turns themselves."""
    for _ in range(count):
        await asyncio.sleep(0)


def connection_infos(broker: BrokerThread) -> list[ConnectionInfo]:
    """A snapshot of the broker's connections, taken on its own event loop."""
    return broker.call(lambda: broker.server.connections() if broker.server else [])


def connection_count(broker: BrokerThread) -> int:
    return broker.call(lambda: broker.server.connection_count if broker.server else 0)


def wait_connection_count(broker: BrokerThread, expected: int, timeout: float = WAIT) -> None:
    """Wait until the broker holds `expected` connections (closing takes a loop turn)."""
    try:
        wait_until(lambda: connection_count(broker) == expected, timeout)
    except TimeoutError:
        raise AssertionError(
            f"{connection_count(broker)} connections, expected {expected}"
        ) from None
