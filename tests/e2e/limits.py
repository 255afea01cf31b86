"""Helpers for the end-to-end tests of limits and dead messages: core calls on the broker's
loop, and checks of refusals, receipts and dead-message headers."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sluiceway.config import DestinationSettings
from sluiceway.core.broker import Broker
from sluiceway.naming import parse_destination
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerThread
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import Recorder, with_receipt

T = TypeVar("T")

DMQ = "/queue/mq.sys.dmq"
KIB, MIB, GIB = 1024, 1024**2, 1024**3


def on_loop(broker: BrokerThread, fn: Callable[[Broker], T]) -> T:
    """Run `fn(core broker)` on the broker's own event loop and return its result."""
    core = broker.broker
    assert core is not None
    return broker.call(lambda: fn(core))


def stat(broker: BrokerThread, path: str, counter: str) -> int:
    """One of a destination's statistics (`dropped`, `expired`, `dead`, ...)."""
    value = on_loop(
        broker, lambda b: getattr(b.destination(parse_destination(path)).stats, counter)
    )
    assert isinstance(value, int)
    return value


def settings_of(broker: BrokerThread, path: str) -> DestinationSettings:
    return on_loop(broker, lambda b: b.destination(parse_destination(path)).settings)


def update(broker: BrokerThread, path: str, properties: Mapping[str, str]) -> DestinationSettings:
    """Change destination properties at run time through the core API."""
    return on_loop(broker, lambda b: b.update_destination(parse_destination(path), properties))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def assert_refused(
    headers: Mapping[str, str], status: int, destination: str, limit: str, value: str
) -> None:
    """An ERROR or failed RECEIPT refusing a frame because of `limit`."""
    assert headers.get("status") == str(status), headers
    assert headers.get("message"), headers
    assert headers.get("destination") == destination, headers
    assert headers.get("limit") == limit, headers
    assert headers.get("limit-value") == value, headers


def assert_accepted(headers: Mapping[str, str]) -> None:
    """A plain RECEIPT: the frame was accepted."""
    assert "status" not in headers, headers


def assert_dead(
    headers: Mapping[str, str],
    *,
    reason: str,
    origin: str,
    since_ms: int,
    delivery_count: str = "0",
    truncated: bool = False,
) -> None:
    """A MESSAGE from the dead message queue: a new message carrying the JMS_SUN_DMQ_* headers."""
    assert headers["destination"] == DMQ, headers
    assert headers["JMS_SUN_DMQ_UNDELIVERED_REASON"] == reason, headers
    assert headers["JMS_SUN_DMQ_UNDELIVERED_DESTINATION"] == origin, headers
    assert since_ms <= int(headers["JMS_SUN_DMQ_UNDELIVERED_TIMESTAMP"]) <= now_ms(), headers
    assert headers["JMS_SUN_DMQ_UNDELIVERED_COMMENT"], headers
    assert headers["JMS_SUN_DMQ_DELIVERY_COUNT"] == delivery_count, headers
    assert headers["JMS_SUN_DMQ_DEAD_BROKER"], headers
    assert headers["JMS_SUN_DMQ_BODY_TRUNCATED"] == ("true" if truncated else "false"), headers
    assert headers["original-message-id"], headers
    assert headers["original-message-id"] != headers["message-id"], headers
    assert headers["expires"] == "0", headers  # a dead message never expires


def send_receipted(
    connection: Any, recorder: Recorder, destination: str, body: str, **headers: str
) -> dict[str, str]:
    """SEND with stomp.py asking for a receipt; the RECEIPT's headers."""

    def send(receipt: str) -> None:
        connection.send(destination, body, headers={**headers, "receipt": receipt})

    return with_receipt(recorder, send)


def send_raw(client: RawClient, destination: str, body: bytes = b"x", **headers: str) -> Frame:
    """SEND with a raw client asking for a receipt; the RECEIPT (`headers` use _ for -)."""
    fields = {k.replace("_", "-"): v for k, v in headers.items()}
    return client.request("SEND", {"destination": destination, **fields}, body)


def bodies(frames: list[Any]) -> list[Any]:
    return [f.body for f in frames]


def expect_error_and_close(client: RawClient) -> Frame:
    error = client.expect("ERROR")
    assert error.body, error  # the body explains the refusal
    client.expect_closed()
    return error
