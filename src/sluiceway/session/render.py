"""The frames the broker writes: MESSAGE, RECEIPT, ERROR and CONNECTED, as bytes.

A MESSAGE carries the broker's headers first (`subscription`, `message-id`, `destination`, `ack`
in STOMP 1.2 client-acknowledged subscriptions, `redelivered`, `delivery-count`, `priority`,
`persistent`, `expires`, `timestamp`), then the producer's own headers (`content-type` among them)
and `content-length`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluiceway import __version__
from sluiceway.core.model.subscription import AckMode, Delivery
from sluiceway.core.values.flow import ConnectionFlow
from sluiceway.core.values.message import Message
from sluiceway.errors import BrokerError
from sluiceway.naming import DestinationKind
from sluiceway.protocol.encoder import encode_frame, escape_value
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.protocol.message_frame import header_tail, message_head, plain_tail

ACK_SEPARATOR = "/"  # ack id = "<subscription number>/<message id>": needs no escaping
# Headers the broker puts on every MESSAGE besides the producer's: a SEND may carry at most
# imq.stomp.max_header_count minus these, so the MESSAGE stays within the same limit.
BROKER_MESSAGE_HEADERS = 12


def ack_id(delivery: Delivery) -> str:
    return f"{delivery.subscription.number}{ACK_SEPARATOR}{delivery.message.id}"


def parse_ack_id(text: str) -> tuple[int, str] | None:
    """(subscription number, message id) from a STOMP 1.2 ack id, or None if it is not one."""
    number, separator, message_id = text.partition(ACK_SEPARATOR)
    # isdecimal() alone would accept digits of other scripts, which int() may still refuse.
    if not separator or not (number.isascii() and number.isdigit()) or not message_id:
        return None
    return int(number), message_id


# The broker's own MESSAGE headers: a producer's header of the same name is left out.
_BROKER_NAMES: Final = frozenset(
    ("subscription", "message-id", "destination", "ack", "redelivered", "delivery-count",
     "priority", "persistent", "expires", "timestamp", "sequence", "content-length")
)  # fmt: skip


# Read on every message: a Final name is a C static when compiled (setup.py says why).
_TOPIC: Final = DestinationKind.TOPIC


def message_parts(delivery: Delivery, version: StompVersion, out: list[bytes]) -> int:
    """Append the MESSAGE for `delivery` to `out` in parts, the body one of them uncopied, and
    return its length. In STOMP 1.2 the headers that are the same for every delivery of the
    message are encoded once (and kept on a topic's message for its other subscribers); only
    the subscription's and delivery's own are encoded per frame."""
    if version is not StompVersion.V1_2:
        return _whole(_message_frame(delivery, version), out)
    message = delivery.message
    wire = message.wire or _message_wire(message)
    if wire is None:
        return _whole(_message_frame(delivery, version), out)
    message_id, tail = wire
    subscription = delivery.subscription
    ack = ""
    if subscription.ack_mode is not AckMode.AUTO:
        ack = f"{subscription.number}{ACK_SEPARATOR}{message_id}"
    head = message_head(subscription.id, message_id, ack, delivery.delivery_count)
    if head is None:
        # encode_frame names the header it cannot send
        return _whole(_message_frame(delivery, version), out)
    body = message.body
    out += (head, tail, body, b"\0")
    return len(head) + len(tail) + len(body) + 1


def _whole(frame: bytes, out: list[bytes]) -> int:
    out.append(frame)
    return len(frame)


def _message_wire(message: Message) -> tuple[str, bytes] | None:
    """The escaped message id and the encoded headers after the per-delivery ones, up to the
    blank line; None when only the general encoding can render the message faithfully."""
    if not message.headers:
        # No header of the producer's (the usual case): written directly.
        plain = plain_tail(
            message.destination.path,
            message.priority,
            message.persistent,
            message.expires,
            message.timestamp,
            message.seq,
            len(message.body),
        )
        return _keep(message, (escape_value(message.id), plain))
    if any(name == "ack" for name, _ in message.headers):
        return None  # a producer's `ack` shows on ack:auto subscriptions only: not constant
    headers = _message_headers(message)
    for name, value in message.headers:
        if name not in _BROKER_NAMES:
            headers.setdefault(name, value)
    headers["content-length"] = str(len(message.body))
    tail = header_tail(headers)
    if tail is None:
        return None
    return _keep(message, (escape_value(message.id), tail))


def _message_headers(message: Message) -> dict[str, str]:
    """The broker's headers that describe the message itself, the same in every delivery
    (the producer's headers and content-length come after them)."""
    return {
        "destination": message.destination.path,
        "priority": str(message.priority),
        "persistent": "true" if message.persistent else "false",
        "expires": str(message.expires),
        "timestamp": str(message.timestamp),
        "sequence": str(message.seq),
    }


def _keep(message: Message, wire: tuple[str, bytes]) -> tuple[str, bytes]:
    if message.destination.kind is _TOPIC:
        message.wire = wire  # every subscriber gets the same
    return wire


def _message_frame(delivery: Delivery, version: StompVersion) -> bytes:
    subscription = delivery.subscription
    message = delivery.message
    headers = {
        "subscription": subscription.id,
        "message-id": message.id,
        "destination": message.destination.path,
    }
    if version is StompVersion.V1_2 and subscription.ack_mode is not AckMode.AUTO:
        headers["ack"] = ack_id(delivery)
    headers["redelivered"] = "true" if delivery.delivery_count > 1 else "false"
    headers["delivery-count"] = str(delivery.delivery_count)
    headers.update(_message_headers(message))
    if version is StompVersion.V1_2:
        for name, value in message.headers:
            headers.setdefault(name, value)
    else:
        for name, value in message.headers:
            if _representable(name, value, version):
                headers.setdefault(name, value)
    headers["content-length"] = str(len(message.body))  # also for an empty body
    return encode_frame(Frame("MESSAGE", headers, message.body), version)


def _representable(name: str, value: str, version: StompVersion) -> bool:
    """Whether a header a 1.2 producer sent can be written to an older client at all.

    STOMP 1.1 cannot escape a carriage return; 1.0 escapes nothing. Such headers are left out of
    the MESSAGE rather than corrupting the frame.
    """
    if "\r" in name or "\r" in value:
        return False
    if version is StompVersion.V1_0:
        return "\n" not in name and "\n" not in value and ":" not in name
    return True


def echoable(value: str, version: StompVersion | None) -> bool:
    """Whether a value the client sent can be written back to it in its version.

    STOMP 1.0 and 1.1 have no escape for a carriage return, which their decoders nevertheless
    accept inside a value; such a value cannot be echoed in a RECEIPT or a MESSAGE.
    """
    return version is StompVersion.V1_2 or version is None or "\r" not in value


def receipt_frame(
    receipt: str, version: StompVersion | None, extra: Mapping[str, str] | None = None
) -> bytes:
    if not extra and (version is StompVersion.V1_2 or version is None):
        # The common case, one per SEND with a receipt, written directly.
        try:
            return f"RECEIPT\nreceipt-id:{escape_value(receipt)}\n\n\0".encode()
        except UnicodeEncodeError:
            pass  # encode_frame names what cannot be sent
    headers = {"receipt-id": receipt}
    if extra:
        headers.update(extra)
    return encode_frame(Frame("RECEIPT", headers), version)


def error_frame(
    error: BrokerError,
    version: StompVersion | None,
    receipt: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> bytes:
    """An ERROR: `message` is the summary, `status` the Open MQ code, the body the explanation."""
    headers = {
        # One line, so it is a valid header value in every STOMP version.
        "message": " ".join(error.summary.split()),
        "status": str(int(error.status)),
        "content-type": "text/plain;charset=utf-8",
    }
    if receipt is not None and echoable(receipt, version):
        headers["receipt-id"] = receipt
    headers.update(_refusal_headers(error))
    if extra:
        headers.update(extra)
    body = (str(error) + "\n").encode()
    return encode_frame(Frame("ERROR", headers, body), version)


def connected_frame(
    version: StompVersion,
    session: str,
    flow: ConnectionFlow,
    failed_receipts: bool,
    heart_beat: tuple[int, int],
) -> bytes:
    """The CONNECTED that accepts a CONNECT: the version agreed, the connection's flow control
    and extensions, and (from STOMP 1.1) the broker's heart-beat send and receive periods."""
    headers = {
        "version": version.value,
        "server": f"Sluiceway/{__version__}",
        "session": session,
        "connection-flow-count": str(flow.count),
        "connection-flow-limit": str(flow.limit),
        "connection-flow-limit-enabled": "true" if flow.limit_enabled else "false",
        "failed-receipts": "true" if failed_receipts else "false",
        "pack-sends": "true",  # SENDs with pack-count are taken (session.send_packs)
    }
    if version is not StompVersion.V1_0:
        headers["heart-beat"] = f"{heart_beat[0]},{heart_beat[1]}"
    return encode_frame(Frame("CONNECTED", headers))


def failed_receipt_frame(receipt: str, error: BrokerError, version: StompVersion | None) -> bytes:
    """A RECEIPT saying the frame was refused (for clients that sent `failed-receipts:true`)."""
    headers = {
        "receipt-id": receipt,
        "status": str(int(error.status)),
        "message": " ".join(error.summary.split()),
        "detail": " ".join(str(error).split()),
    }
    headers.update(_refusal_headers(error))
    return encode_frame(Frame("RECEIPT", headers), version)


def _refusal_headers(error: BrokerError) -> dict[str, str]:
    """`destination`, `limit` and `limit-value` of a refusal caused by a limit; `member` and
    `member-address` of one of something that lives on another member of a cluster."""
    headers = {}
    if error.destination is not None:
        headers["destination"] = error.destination
    if error.limit is not None:
        headers["limit"] = error.limit
    if error.limit_value is not None:
        headers["limit-value"] = error.limit_value
    if error.member is not None:
        headers["member"] = error.member
    if error.member_address is not None:
        headers["member-address"] = error.member_address
    return headers
