"""Raw STOMP clients for the persistence tests, closed after each test (tests/persistence/
conftest.py), and what the tests do with them most."""

from __future__ import annotations

from tests.e2e.rawclient import RawClient

_opened: list[RawClient] = []


def client(port: int, timeout: float = 5.0, **headers: str) -> RawClient:
    """A connected client (CONNECT `headers`, _ for -), closed when the test ends."""
    raw = RawClient(port, timeout=timeout)
    _opened.append(raw)
    raw.connect(**headers)
    return raw


def close_all() -> None:
    while _opened:
        _opened.pop().close()


def send(raw: RawClient, destination: str, body: bytes, **headers: str) -> None:
    """A SEND confirmed by its RECEIPT."""
    raw.request("SEND", {"destination": destination, **headers}, body)


def drain(port: int, destination: str) -> list[tuple[bytes, str]]:
    """(body, redelivered) of everything a fresh consumer gets, acknowledged as it goes."""
    raw = client(port)
    got = [(m.body, m.headers["redelivered"]) for m in raw.consume_all(destination)]
    raw.close()
    return got
