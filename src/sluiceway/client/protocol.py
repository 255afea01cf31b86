"""The client's side of STOMP, without sockets: what both client stacks say and how they read
the broker's answers.

The asyncio client (`wire`, `link`) and the blocking pipeline client (`pipeline`) move bytes
their own way, one on an event loop, the other on a plain socket from one thread, but they build
the same CONNECT, read CONNECTED the same way, match RECEIPTs to the requests that asked for
them with one `Receipts` book, turn every ERROR frame and failed receipt into an exception with
one mapping (`refusal`), and recognise the end marker of a read (a MESSAGE with `browser:end`,
see docs/pipelines-protocol.md) with `is_end_marker`. Nothing here waits, sleeps or reads a
clock, so it is tested with frames alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from sluiceway.errors import BrokerError, RemoteProtocolError, broker_error
from sluiceway.protocol.frames import Frame, StompVersion

# The client accepts more headers per frame than the broker does: the broker adds its own
# headers to each MESSAGE on top of what the producer sent.
CLIENT_MAX_HEADER_COUNT: Final = 1024
# Bytes a client asks of its socket at a time: the stacks differ in how they read, not in how
# much.
READ_CHUNK: Final = 256 * 1024

# The header, and its value, that mark the last MESSAGE of a browse or of a range, cursor or
# lease read: it carries the read's positions, not a message.
END_MARKER_HEADER: Final = "browser"
END_MARKER_VALUE: Final = "end"

W = TypeVar("W")


# -- CONNECT and CONNECTED ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """What a client puts in its CONNECT frame.

    `heartbeat_ms` is offered both ways (0: no heart-beats); `extensions` are the broker's own
    CONNECT headers (Open MQ's connection flow settings), sent as given. The password is never
    shown in the repr.
    """

    host: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    client_id: str | None = None
    heartbeat_ms: int = 0
    extensions: Mapping[str, str] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        """The CONNECT headers. STOMP names the credentials `login` and `passcode` on the wire;
        `failed-receipts` asks the broker to answer a refused request with a RECEIPT carrying a
        status rather than with an ERROR that ends the connection."""
        headers = {
            "accept-version": StompVersion.V1_2.value,
            "host": self.host,
            "heart-beat": f"{self.heartbeat_ms},{self.heartbeat_ms}",
            **self.extensions,
            "failed-receipts": "true",
        }
        if self.username is not None:
            headers["login"] = self.username
        if self.password is not None:
            headers["passcode"] = self.password
        if self.client_id is not None:
            headers["client-id"] = self.client_id
        return headers

    def refused(self, error: BrokerError, port: int) -> BrokerError:
        """The broker's refusal of this CONNECT (401 wrong credentials, 403 not allowed...), the
        same class, saying which broker and which user (never the password)."""
        who = f"user {self.username!r}" if self.username else "a connection without a user name"
        return type(error)(
            error.summary,
            f"the broker at {self.host}:{port} refused {who}: {error}",
            destination=error.destination,
            limit=error.limit,
            limit_value=error.limit_value,
        )


def connected_version(frame: Frame) -> StompVersion:
    """The version a CONNECTED frame agrees on; raise the broker's refusal if it is an ERROR,
    RemoteProtocolError if it is anything else."""
    if frame.command == "ERROR":
        raise refusal(frame)
    if frame.command != "CONNECTED":
        raise RemoteProtocolError(f"expected CONNECTED, got {frame.command}")
    return StompVersion(frame.headers.get("version", StompVersion.V1_2.value))


def heartbeat_intervals(offered_ms: int, connected: Frame) -> tuple[float, float]:
    """(send, receive) heart-beat intervals in seconds (0: none), from what the client offered
    both ways and the `heart-beat` header of CONNECTED (STOMP 1.2, "Heart-beating")."""
    try:
        server_send, server_receive = (int(v) for v in connected.headers["heart-beat"].split(","))
    except (KeyError, ValueError):
        return 0.0, 0.0
    send = max(offered_ms, server_receive) if offered_ms and server_receive else 0
    receive = max(offered_ms, server_send) if offered_ms and server_send else 0
    return send / 1000, receive / 1000


# -- refusals ----------------------------------------------------------------------------------


def refusal(frame: Frame) -> BrokerError:
    """The BrokerError an ERROR frame, or a failed RECEIPT, stands for.

    The `status` header is Open MQ's status code (500 when missing or not a number); `message`,
    `detail`, `destination`, `limit`, `limit-value`, `member` and `member-address` are kept as
    the broker wrote them. An
    ERROR without `detail` carries its explanation in the body.
    """
    headers = frame.headers
    try:
        status = int(headers.get("status", "500"))
    except ValueError:
        status = 500
    detail = headers.get("detail")
    if detail is None and frame.command == "ERROR":
        detail = frame.body.decode("utf-8", "replace").strip() or None
    return broker_error(
        status,
        headers.get("message", "refused by the broker"),
        detail,
        destination=headers.get("destination"),
        limit=headers.get("limit"),
        limit_value=headers.get("limit-value"),
        member=headers.get("member"),
        member_address=headers.get("member-address"),
    )


def is_failed_receipt(frame: Frame) -> bool:
    """A RECEIPT with a status: the request was refused, the connection stays open."""
    return "status" in frame.headers


# -- receipts ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer(Generic[W]):
    """The broker's answer to one request: the RECEIPT, the waiter the request was registered
    with, and the refusal when the receipt failed (None when the request was carried out)."""

    receipt: Frame
    waiter: W
    error: BrokerError | None


class Receipts(Generic[W]):
    """Requests waiting for their RECEIPT, each with what its sender attached (a future, a
    message to send again...).

    Receipt ids are a prefix and a number; the numbers come from `numbers`, which several books
    on one connection may share so that no two requests ever carry the same id (a RECEIPT that
    arrives after its request was given up must not answer a later one).
    """

    def __init__(self, numbers: Iterator[int] | None = None) -> None:
        self._numbers = numbers if numbers is not None else itertools.count(1)
        self._waiting: dict[str, W] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def ask(self, frame: Frame, waiter: W, prefix: str = "c") -> Frame:
        """`frame` with a new receipt id, registered with `waiter` until its answer comes."""
        receipt = f"{prefix}{next(self._numbers)}"
        self._waiting[receipt] = waiter
        return Frame(frame.command, {**frame.headers, "receipt": receipt}, frame.body)

    def answer(self, frame: Frame) -> Answer[W] | None:
        """The answer a RECEIPT (or an ERROR naming a receipt) gives, or None when it answers no
        request of this book. The request is no longer waiting afterwards."""
        if frame.command not in ("RECEIPT", "ERROR"):
            return None
        receipt = frame.headers.get("receipt-id", "")
        if receipt not in self._waiting:  # a waiter may itself be None: test the key
            return None
        waiter = self._waiting.pop(receipt)
        failed = frame.command == "ERROR" or is_failed_receipt(frame)
        return Answer(frame, waiter, refusal(frame) if failed else None)

    def forget(self, frame: Frame) -> None:
        """Stop waiting for the answer to `frame` (given up: timed out, cancelled)."""
        self._waiting.pop(frame.headers.get("receipt", ""), None)

    def drain(self) -> list[W]:
        """Every waiter still waiting, in the order asked; the book is then empty."""
        waiters = list(self._waiting.values())
        self._waiting.clear()
        return waiters


# -- end markers -------------------------------------------------------------------------------


def is_end_marker(headers: Mapping[str, str]) -> bool:
    """The MESSAGE with these headers ends a browse or a range, cursor or lease read."""
    return headers.get(END_MARKER_HEADER) == END_MARKER_VALUE
