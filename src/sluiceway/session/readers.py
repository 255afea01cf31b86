"""The frames of topic cursors and queue leases (docs/pipelines-protocol.md), read and answered.

A browser SUBSCRIBE with `cursor:GROUP` opens a cursor and reads a topic from it
(`cursor-start`, `from-sequence`, `to-sequence`); a SUBSCRIBE with `lease:GROUP/N` reads a queue
lease (`lease-max-messages`, `lease-max-bytes`, `lease-ttl`). An ACK with `cursor` and
`sequence` commits a cursor; an ACK or NACK with `lease` acknowledges or releases a lease; an
UNSUBSCRIBE with `cursor` deletes one. Every malformed header is refused with status 400 naming
it; GROUP follows destination-name rules and numbers are decimal from 0 to 2^63-1.
"""

from __future__ import annotations

from typing import Final

from sluiceway.core.broker import Broker
from sluiceway.core.features.cursors import CursorRead, CursorStart
from sluiceway.core.features.leases import MAX_NUMBER, LeaseRead
from sluiceway.errors import BadRequest
from sluiceway.naming import DestinationKind, DestinationName, validate_name
from sluiceway.protocol.frames import Frame
from sluiceway.protocol.pack import MAX_PACK
from sluiceway.session import headers as h

CURSOR: Final = "cursor"
LEASE: Final = "lease"
# SUBSCRIBE headers that ask for something a lease read cannot be.
_NOT_WITH_LEASE: Final = ("selector", *h.DURABLE_NAME_HEADERS)


def _group(frame: Frame, header: str, text: str) -> str:
    try:
        validate_name(text)
    except ValueError as exc:
        raise BadRequest(
            f"invalid {header} header",
            f"the group named by the {header} header of a {frame.command} frame follows "
            f"destination-name rules (letters, digits and . - _ $ :, up to 200 characters): "
            f"{exc}",
        ) from None
    return text


def _number(frame: Frame, header: str) -> int | None:
    """Header `header` as a number from 0 to 2^63-1, or None when absent."""
    if header not in frame.headers:
        return None
    return h.integer(frame, header, 0, minimum=0, maximum=MAX_NUMBER)


def _positive(frame: Frame, header: str) -> int | None:
    if header not in frame.headers:
        return None
    return h.integer(frame, header, 1, minimum=1, maximum=MAX_NUMBER)


def lease_name(frame: Frame) -> tuple[str, int]:
    """The (group, number) of the frame's `lease:GROUP/N` header."""
    text = h.required(frame, LEASE)
    group, separator, number = text.rpartition("/")
    if not separator or not (number.isascii() and number.isdigit()) or int(number) > MAX_NUMBER:
        raise BadRequest(
            "invalid lease header",
            f"the lease header of a {frame.command} frame must be GROUP/N, N a number from 0 "
            f"to {MAX_NUMBER}; got {text!r}",
        )
    return _group(frame, LEASE, group), int(number)


def read_request(frame: Frame) -> tuple[CursorRead | None, LeaseRead | None]:
    """The cursor or lease a SUBSCRIBE asks to read, if any."""
    cursor, lease = frame.headers.get(CURSOR), frame.headers.get(LEASE)
    if cursor is not None and lease is not None:
        raise BadRequest(
            "cursor and lease together",
            "a SUBSCRIBE reads a topic by cursor or a queue by lease, not both",
        )
    if cursor is not None:
        return _cursor_read(frame, cursor), None
    if lease is not None:
        return None, _lease_read(frame)
    return None, None


def _cursor_read(frame: Frame, group: str) -> CursorRead:
    if not h.boolean(frame, "browser", False):
        raise BadRequest(
            "cursor without browser:true",
            "a cursor is read by a browser SUBSCRIBE: add browser:true to read the topic from "
            "the cursor without moving it (ACK with the cursor header moves it)",
        )
    text = frame.headers.get("cursor-start", CursorStart.LATEST.value)
    start: CursorStart | int
    if text in (CursorStart.EARLIEST.value, CursorStart.LATEST.value):
        start = CursorStart(text)
    elif text.isascii() and text.isdigit() and int(text) <= MAX_NUMBER:
        start = int(text)
    else:
        raise BadRequest(
            "invalid cursor-start header",
            f"the cursor-start header must be earliest, latest or a sequence number from 0 to "
            f"{MAX_NUMBER}; got {text!r}",
        )
    return CursorRead(
        group=_group(frame, CURSOR, group),
        start=start,
        from_seq=_number(frame, "from-sequence"),
        to_seq=_number(frame, "to-sequence"),
    )


def _lease_read(frame: Frame) -> LeaseRead:
    for header in _NOT_WITH_LEASE:
        if header in frame.headers:
            raise BadRequest(
                f"{header} with a lease",
                f"a lease takes messages from the head of the queue, in queue order: it cannot "
                f"be combined with the {header} header",
            )
    group, number = lease_name(frame)
    return LeaseRead(
        group=group,
        number=number,
        max_messages=_positive(frame, "lease-max-messages"),
        max_bytes=_positive(frame, "lease-max-bytes"),
        ttl_ms=_positive(frame, "lease-ttl"),
        create=_flag(frame, "lease-create", default=True),
        send=_flag(frame, "lease-messages", default=True),
        strict_bytes=_flag(frame, "lease-bytes-strict", default=False),
    )


def _flag(frame: Frame, name: str, *, default: bool) -> bool:
    text = frame.headers.get(name)
    if text is None:
        return default
    if text not in ("true", "false"):
        raise BadRequest(
            f"invalid {name} header", f"the {name} header must be true or false; got {text!r}"
        )
    return text == "true"


def pack_size(frame: Frame, reads: bool) -> int:
    """`pack:N` of a range, cursor or lease read (`reads`): messages per MESSAGE frame, 1 to
    MAX_PACK (protocol.pack); 0 without the header."""
    text = frame.headers.get("pack")
    if text is None:
        return 0
    if not reads:
        raise BadRequest(
            "pack on a subscription",
            "the pack header is for reads (browser:true, a cursor or a lease); a subscriber "
            "gets one message per MESSAGE frame",
        )
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_PACK):
        raise BadRequest(
            "invalid pack header",
            f"the pack header must be a number of messages from 1 to {MAX_PACK}; got {text!r}",
        )
    return int(text)


def is_position_ack(frame: Frame) -> bool:
    """An ACK or NACK of a cursor or a lease, not of a message."""
    return CURSOR in frame.headers or LEASE in frame.headers


def position_ack(broker: Broker, frame: Frame, *, release: bool) -> dict[str, str]:
    """Commit a cursor (ACK), or acknowledge (ACK) or release (NACK) a lease; return the
    headers of the RECEIPT."""
    destination = h.destination(frame)
    if "transaction" in frame.headers:
        raise BadRequest(
            f"{frame.command} of a {CURSOR if CURSOR in frame.headers else LEASE} in a transaction",
            "cursor commits and lease acknowledgements take effect at once and are idempotent; "
            "send them without a transaction header",
        )
    if CURSOR in frame.headers:
        return _commit(broker, frame, destination, release=release)
    group, number = lease_name(frame)
    if destination.kind is not DestinationKind.QUEUE:
        raise BadRequest("lease on a topic", f"leases are for queues and {destination} is a topic")
    leases = broker.leases
    end = leases.release if release else leases.acknowledge
    return {"lease-state": end(destination, group, number).value}


def _commit(
    broker: Broker, frame: Frame, destination: DestinationName, *, release: bool
) -> dict[str, str]:
    if release:
        raise BadRequest(
            "NACK of a cursor",
            "a cursor only moves forward, by ACK with the cursor and sequence headers; there is "
            "nothing to release",
        )
    group = _group(frame, CURSOR, h.required(frame, CURSOR))
    seq = _number(frame, "sequence")
    if seq is None:
        raise BadRequest(
            "missing sequence header",
            "an ACK that commits a cursor must carry the sequence header: the position the "
            "cursor moves to (the next-sequence of the last read)",
        )
    _check_topic(destination)
    cursor = broker.cursors.commit(destination, group, seq)
    return {"cursor-sequence": str(cursor.position)}


def delete_cursor(broker: Broker, frame: Frame) -> None:
    """UNSUBSCRIBE with the cursor header: delete the cursor (404 when there is none)."""
    destination = h.destination(frame)
    group = _group(frame, CURSOR, h.required(frame, CURSOR))
    _check_topic(destination)
    broker.cursors.delete(destination, group)


def _check_topic(destination: DestinationName) -> None:
    if destination.kind is not DestinationKind.TOPIC:
        raise BadRequest(
            "cursor on a queue", f"cursors are for topics and {destination} is a queue"
        )
