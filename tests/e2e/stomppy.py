"""Helpers around stomp.py, the third-party client the end-to-end tests use."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import stomp

from tests.e2e.support import WAIT, wait_until

__all__ = [
    "WAIT",
    "Recorder",
    "connect",
    "end",
    "subscribe",
    "sync",
    "wait_until",
    "with_receipt",
]


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    """Collects what stomp.py receives and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.receipts: dict[str, dict[str, str]] = {}
        self.errors: list[Any] = []
        self.disconnected = False
        self._cond = threading.Condition()

    def _record(self, update: Callable[[], None]) -> None:
        with self._cond:
            update()
            self._cond.notify_all()

    def on_message(self, frame: Any) -> None:
        self._record(lambda: self.messages.append(frame))

    def on_receipt(self, frame: Any) -> None:
        self._record(lambda: self.receipts.__setitem__(frame.headers["receipt-id"], frame.headers))

    def on_error(self, frame: Any) -> None:
        self._record(lambda: self.errors.append(frame))

    def on_disconnected(self) -> None:
        self._record(lambda: setattr(self, "disconnected", True))

    def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise TimeoutError(f"condition not met within {timeout} s")

    def wait_messages(self, count: int, timeout: float = WAIT) -> list[Any]:
        self.wait_for(lambda: len(self.messages) >= count, timeout)
        return list(self.messages)

    def take(self) -> list[Any]:
        with self._cond:
            taken = list(self.messages)
            self.messages.clear()
            return taken


_receipts = itertools.count(1)


def connect(port: int, *, version: str = "1.2", **connect_headers: str) -> tuple[Any, Recorder]:
    """A connected stomp.py connection of the given protocol version, and its recorder."""
    cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}
    connection = cls[version]([("127.0.0.1", port)], auto_content_length=True)
    recorder = Recorder()
    connection.set_listener("recorder", recorder)
    connection.connect(wait=True, headers=connect_headers)
    return connection, recorder


def end(connection: Any, recorder: Recorder) -> None:
    """Disconnect, or, after an ERROR, wait for the broker to close the connection: a DISCONNECT
    sent then races stomp.py's own reader closing the socket."""
    if recorder.errors:
        recorder.wait_for(lambda: recorder.disconnected)
    elif not recorder.disconnected:
        connection.disconnect()


def with_receipt(recorder: Recorder, send: Callable[[str], None]) -> dict[str, str]:
    """Call `send(receipt)` and wait for that RECEIPT; return its headers."""
    receipt = f"receipt-{next(_receipts)}"
    send(receipt)
    recorder.wait_for(lambda: receipt in recorder.receipts)
    return recorder.receipts[receipt]


def sync(connection: Any, recorder: Recorder) -> None:
    """The same barrier as RawClient.sync, with stomp.py."""
    tx = f"sync-{next(_receipts)}"
    with_receipt(recorder, lambda r: connection.begin(tx, headers={"receipt": r}))
    with_receipt(recorder, lambda r: connection.abort(tx, headers={"receipt": r}))


def subscribe(
    connection: Any,
    recorder: Recorder,
    destination: str,
    sub_id: str,
    *,
    ack: str = "client-individual",
    **headers: str,
) -> dict[str, str]:
    """Subscribe with stomp.py and wait for the RECEIPT; `headers` use _ for -."""
    extra = {k.replace("_", "-"): v for k, v in headers.items()}

    def send(receipt: str) -> None:
        connection.subscribe(destination, id=sub_id, ack=ack, headers={**extra, "receipt": receipt})

    return with_receipt(recorder, send)
