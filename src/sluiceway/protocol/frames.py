"""STOMP frame values, shared by the codec, the broker and the client.

A frame is a command, headers and a body. Headers are kept in a dict in wire order; when a header
name repeats on the wire only the first value is kept, as STOMP 1.2 requires ("only the first
header entry SHOULD be used as the value").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Final


class StompVersion(Enum):
    """The protocol versions the codec speaks; they differ in header escaping and line endings."""

    V1_0 = "1.0"
    V1_1 = "1.1"
    V1_2 = "1.2"


# Commands a client may send, and those a server may send (STOMP 1.2, "Client Frames" and
# "Server Frames"). The codec accepts any upper-case command; the session checks these.
CLIENT_COMMANDS = frozenset(
    {
        "CONNECT",
        "STOMP",
        "SEND",
        "SUBSCRIBE",
        "UNSUBSCRIBE",
        "ACK",
        "NACK",
        "BEGIN",
        "COMMIT",
        "ABORT",
        "DISCONNECT",
    }
)
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})

# CONNECT, STOMP and CONNECTED headers are never escaped, to stay readable by STOMP 1.0 peers.
UNESCAPED_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})

# Only these frames may carry a body (STOMP 1.2, "Body").
BODY_COMMANDS = frozenset({"SEND", "MESSAGE", "ERROR"})


@dataclass(slots=True, init=False)
class Frame:
    """One STOMP frame. `headers` keeps wire order; the first of repeated names wins.

    Not frozen: two frames are made per message on the broker's hot path, and a frozen
    dataclass takes three times as long to make. Nothing changes a frame once made. Its
    __init__ is written out: a generated one stays interpreted Python in the compiled build.
    """

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def __init__(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of header `name`, or `default` when the frame does not carry it."""
        return self.headers.get(name, default)


@dataclass(frozen=True, slots=True)
class HeartBeat:
    """An end-of-line received between frames: a STOMP heart-beat."""


HEARTBEAT = HeartBeat()


@dataclass(frozen=True, slots=True)
class AckRun:
    """Consecutive plain ACK frames (the command and an `id` header alone), as their ids in
    order: what a `FrameDecoder` with `ack_runs` on hands back for them instead of a `Frame` each.
    A STOMP 1.2 consumer acknowledging message by message sends little else."""

    ids: list[str]


# How much of a rejected input an error message quotes.
_QUOTE_LIMIT: Final = 40


def quote(data: bytes | bytearray | str) -> str:
    """`data` as a repr, cut to a readable length, for error messages."""
    if len(data) <= _QUOTE_LIMIT:
        return repr(bytes(data) if isinstance(data, bytearray) else data)
    head = data[:_QUOTE_LIMIT]
    return repr(bytes(head) if isinstance(head, bytearray) else head) + "..."


# The headers a broker writes on a MESSAGE for its delivery, not the producer's: a reader that
# keeps the producer's headers (the Spark source's headers column, a cluster link forwarding the
# message) leaves these out.
DELIVERY_HEADERS: Final = frozenset(
    {
        "subscription",
        "message-id",
        "destination",
        "ack",
        "redelivered",
        "delivery-count",
        "priority",
        "persistent",
        "expires",
        "timestamp",
        "sequence",
        "content-length",
    }
)
