"""Reading STOMP headers into typed values, with errors that name the header and what it accepts.

The extension headers are those of ARCHITECTURE.md's wire contract: `consumer-flow-limit`
(imqConsumerFlowLimit; also read from `activemq.prefetchSize` and `prefetch-count`, always as a
count of messages), `consumer-flow-threshold` (imqConsumerFlowThreshold, percent),
`consumer-flow-prefetch` (imqConsumerFlowLimitPrefetch), `consumer-pool-size` (the handlers that
serve the consumer, a floor for an adaptive window) on SUBSCRIBE, where `consumer-flow-limit` may
also be `auto` (an adaptive window, core.values.flow); `connection-flow-count`,
`connection-flow-limit`, `connection-flow-limit-enabled` on CONNECT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluiceway.core.model.subscription import AckMode
from sluiceway.core.values.flow import (
    AUTO,
    AUTO_TEXT,
    DEFAULT_CONNECTION_FLOW_COUNT,
    DEFAULT_CONNECTION_FLOW_LIMIT,
    DEFAULT_CONSUMER_FLOW_LIMIT,
    DEFAULT_CONSUMER_FLOW_THRESHOLD,
    ConnectionFlow,
)
from sluiceway.core.values.message import DEFAULT_PRIORITY, MAX_EXPIRES
from sluiceway.errors import BadRequest
from sluiceway.naming import DestinationName, parse_destination
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.session.render import BROKER_MESSAGE_HEADERS

SUPPORTED_VERSIONS: Final = (StompVersion.V1_0, StompVersion.V1_1, StompVersion.V1_2)
MAX_SEQUENCE: Final = 2**63 - 1  # sequence numbers are kept as u64 and compared as i64
MAX_HEARTBEAT_MS: Final = 2**31 - 1  # about 24 days: any longer interval means "never" in practice
MAX_FLOW: Final = 2**31 - 1  # flow limits and counts: Open MQ's properties are Java ints
_EXPIRES: Final = "ms since the epoch, kept as a 64-bit integer; 0: never"
# Spellings of the consumer window other brokers' clients send, in order of precedence.
FLOW_LIMIT_HEADERS: Final = ("consumer-flow-limit", "activemq.prefetchSize", "prefetch-count")

# Headers a producer cannot set on the MESSAGE its consumers receive: the broker writes these
# itself, or they only concern the SEND frame.
RESERVED_SEND_HEADERS: Final = frozenset(
    {
        "destination",
        "receipt",
        "transaction",
        "content-length",
        "message-id",
        "subscription",
        "ack",
        "redelivered",
        "delivery-count",
        "timestamp",
        "priority",
        "expires",
        "persistent",
        "sequence",
        "lease",
        "stage",  # only concern the SEND (core.features.stages)
        "stage-ttl",
    }
)


def required(frame: Frame, name: str) -> str:
    value = frame.headers.get(name)
    if value is None:
        raise BadRequest(
            f"missing {name} header", f"a {frame.command} frame must carry a {name} header"
        )
    return value


def integer(
    frame: Frame, name: str, default: int, *, minimum: int, maximum: int, unit: str = ""
) -> int:
    """Header `name` as a decimal integer from `minimum` to `maximum` (what the broker can
    store or use), or `default` when absent; `unit` says what the number counts."""
    text = frame.headers.get(name)
    if text is None:
        return default
    value = _decimal(text)
    if value is None or not minimum <= value <= maximum:
        raise BadRequest(
            f"invalid {name} header",
            f"the {name} header of a {frame.command} frame must be an integer from {minimum} to "
            f"{maximum}{f' ({unit})' if unit else ''}; got {text!r}",
        )
    return value


def _decimal(text: str) -> int | None:
    """`text` as a decimal integer: ASCII digits, with a minus sign or not (int() alone also
    takes spaces, a plus sign, underscores and the digits of other scripts); else None."""
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (thousands): out of every range
        return None


def boolean(frame: Frame, name: str, default: bool) -> bool:
    text = frame.headers.get(name)
    if text is None:
        return default
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise BadRequest(
        f"invalid {name} header",
        f"the {name} header of a {frame.command} frame must be true or false; got {text!r}",
    )


def destination(frame: Frame) -> DestinationName:
    text = required(frame, "destination")
    try:
        return parse_destination(text)
    except ValueError as exc:
        raise BadRequest("invalid destination", str(exc)) from None


def negotiate_version(frame: Frame) -> StompVersion | None:
    """The highest version both sides speak; a frame without accept-version means 1.0."""
    offered = frame.headers.get("accept-version")
    if offered is None:
        return StompVersion.V1_0
    wanted = {v.strip() for v in offered.split(",")}
    for version in reversed(SUPPORTED_VERSIONS):
        if version.value in wanted:
            return version
    return None


class UnsupportedVersion(BadRequest):
    """No protocol version in common; the ERROR lists the versions this broker speaks."""


def agreed_version(frame: Frame) -> StompVersion:
    """The version a CONNECT agrees on, or the error that says none is spoken by both."""
    version = negotiate_version(frame)
    if version is None:
        raise UnsupportedVersion(
            "unsupported protocol version",
            f"accept-version {frame.headers.get('accept-version')!r} names no version this "
            "broker speaks; it speaks STOMP 1.0, 1.1 and 1.2",
        )
    return version


@dataclass(frozen=True, slots=True)
class HeartBeat:
    """Negotiated heart-beat intervals in ms; 0: none in that direction."""

    send_ms: int  # broker to client
    receive_ms: int  # client to broker


def negotiate_heartbeat(frame: Frame, server_send: int, server_receive: int) -> HeartBeat:
    """STOMP heart-beating: each direction uses the larger of what one side can do and the
    other side wants, and is off when either side says 0."""
    text = frame.headers.get("heart-beat", "0,0")
    parts = [_decimal(part) for part in text.split(",")]
    client_send = parts[0] if len(parts) == 2 and parts[0] is not None else -1
    client_receive = parts[1] if len(parts) == 2 and parts[1] is not None else -1
    if not (0 <= client_send <= MAX_HEARTBEAT_MS and 0 <= client_receive <= MAX_HEARTBEAT_MS):
        raise BadRequest(
            "invalid heart-beat header",
            "the heart-beat header must be two integers from 0 to "
            f"{MAX_HEARTBEAT_MS} (milliseconds) such as 10000,10000; got {text!r}",
        )
    send = max(server_send, client_receive) if server_send and client_receive else 0
    receive = max(client_send, server_receive) if client_send and server_receive else 0
    return HeartBeat(send, receive)


def connection_flow(frame: Frame) -> ConnectionFlow:
    return ConnectionFlow(
        count=integer(
            frame,
            "connection-flow-count",
            DEFAULT_CONNECTION_FLOW_COUNT,
            minimum=0,
            maximum=MAX_FLOW,
            unit="MESSAGE frames per turn of flow metering; 0: off",
        ),
        limit=integer(
            frame,
            "connection-flow-limit",
            DEFAULT_CONNECTION_FLOW_LIMIT,
            minimum=1,
            maximum=MAX_FLOW,
            unit="unconsumed messages",
        ),
        limit_enabled=boolean(frame, "connection-flow-limit-enabled", False),
    )


def ack_mode(frame: Frame) -> AckMode:
    text = frame.headers.get("ack", "auto")
    try:
        return AckMode(text)
    except ValueError:
        raise BadRequest(
            "invalid ack header",
            f"the ack header must be auto, client or client-individual; got {text!r}",
        ) from None


@dataclass(frozen=True, slots=True)
class FlowRequest:
    """What a SUBSCRIBE asks for; the core caps it with the destination's consumerFlowLimit."""

    limit: int  # AUTO: an adaptive window
    threshold: int
    prefetch: bool
    pool: int = 0  # handlers serving the consumer (consumer-pool-size); 0: not declared


def flow_request(frame: Frame) -> FlowRequest:
    limit = DEFAULT_CONSUMER_FLOW_LIMIT
    for name in FLOW_LIMIT_HEADERS:
        if name in frame.headers:
            if name == FLOW_LIMIT_HEADERS[0] and frame.headers[name] == AUTO_TEXT:
                limit = AUTO
                break
            unit = "messages; -1 or 0: no limit of the consumer's own"
            if name == FLOW_LIMIT_HEADERS[0]:
                unit += "; auto: a window the broker sizes"
            limit = integer(frame, name, limit, minimum=-1, maximum=MAX_FLOW, unit=unit)
            break
    return FlowRequest(
        pool=integer(
            frame,
            "consumer-pool-size",
            0,
            minimum=0,
            maximum=MAX_FLOW,
            unit="handlers serving the consumer; 0: none declared",
        ),
        limit=limit,
        threshold=integer(
            frame,
            "consumer-flow-threshold",
            DEFAULT_CONSUMER_FLOW_THRESHOLD,
            minimum=0,
            maximum=100,
            unit="percent",
        ),
        prefetch=boolean(frame, "consumer-flow-prefetch", True),
    )


class SendRequest:
    """A SEND frame, read. A class, not a named tuple: one is made per SEND, and a named
    tuple's __new__ is interpreted Python even in the compiled build."""

    __slots__ = ("destination", "expires", "headers", "persistent", "priority", "transaction")

    def __init__(
        self,
        *,
        destination: DestinationName,
        priority: int,
        expires: int,
        persistent: bool,
        transaction: str | None,
        headers: tuple[tuple[str, str], ...],
    ) -> None:
        self.destination = destination
        self.priority = priority
        self.expires = expires
        self.persistent = persistent
        self.transaction = transaction
        self.headers = headers

    # Written out, as a named tuple had them (tests compare and print these); not per message.
    def __repr__(self) -> str:
        names = ("destination", "priority", "expires", "persistent", "transaction", "headers")
        values = zip(names, self._fields(), strict=True)
        fields = ", ".join(f"{name}={value!r}" for name, value in values)
        return f"SendRequest({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SendRequest):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def _fields(self) -> tuple[object, ...]:
        return (
            self.destination,
            self.priority,
            self.expires,
            self.persistent,
            self.transaction,
            self.headers,
        )


def send_request(frame: Frame, max_header_count: int) -> SendRequest:
    allowed = max_header_count - BROKER_MESSAGE_HEADERS
    if len(frame.headers) > allowed:
        raise BadRequest(
            "too many headers",
            f"a SEND may carry at most {allowed} headers (imq.stomp.max_header_count "
            f"{max_header_count}, less {BROKER_MESSAGE_HEADERS} the broker adds to each MESSAGE); "
            f"this one has {len(frame.headers)}",
        )
    return SendRequest(
        destination=destination(frame),
        priority=integer(frame, "priority", DEFAULT_PRIORITY, minimum=0, maximum=9),
        expires=integer(frame, "expires", 0, minimum=0, maximum=MAX_EXPIRES, unit=_EXPIRES),
        persistent=boolean(frame, "persistent", False),
        transaction=frame.headers.get("transaction"),
        headers=()
        if frame.headers.keys() <= RESERVED_SEND_HEADERS  # (the usual case: none of its own)
        else tuple(
            (name, value)
            for name, value in frame.headers.items()
            if name not in RESERVED_SEND_HEADERS
        ),
    )


DURABLE_NAME_HEADERS: Final = ("durable-subscription-name", "activemq.subscriptionName")


def durable_name(frame: Frame) -> str | None:
    """The durable subscription a SUBSCRIBE or UNSUBSCRIBE names, under either spelling."""
    for name in DURABLE_NAME_HEADERS:
        value = frame.headers.get(name)
        if value:
            return value
    return None


def sequence_range(frame: Frame) -> tuple[int, int | None]:
    """`from-sequence` (inclusive, 0: from the first retained) and `to-sequence` (exclusive),
    each from 0 to 2^63-1."""
    start = integer(frame, "from-sequence", 0, minimum=0, maximum=MAX_SEQUENCE)
    text = frame.headers.get("to-sequence")
    end = (
        None if text is None else integer(frame, "to-sequence", 0, minimum=0, maximum=MAX_SEQUENCE)
    )
    return start, end
