"""What a client frame must be before the session handles it, and what an ACK or NACK names.

A frame is refused (400) for an unknown command, a frame other than CONNECT before one, a second
CONNECT, a body on a frame that may not carry one, or a receipt or subscription id that the
session's STOMP version could not write back. An ACK or NACK names its delivery by the `ack`
header's id in STOMP 1.2, by `message-id` (and `subscription`, required in 1.1) before.
"""

from __future__ import annotations

from sluiceway.core.connection import CoreConnection
from sluiceway.core.model.subscription import Subscription
from sluiceway.errors import BadRequest
from sluiceway.protocol.frames import (
    BODY_COMMANDS,
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    StompVersion,
)
from sluiceway.session import headers as h
from sluiceway.session.render import echoable, parse_ack_id


def check_frame(
    frame: Frame,
    version: StompVersion | None,
    *,
    known: bool,
    awaiting_connect: bool,
    connected: bool,
) -> None:
    """Raise the BadRequest that refuses `frame` (`known`: the session handles its command)."""
    command = frame.command
    if not known:
        kind = "a server frame" if command in SERVER_COMMANDS else "not a STOMP command"
        raise BadRequest(
            "unknown command",
            f"{command} is {kind}; a client may send " + ", ".join(sorted(CLIENT_COMMANDS)),
        )
    connecting = command in ("CONNECT", "STOMP")
    if awaiting_connect and not connecting:
        raise BadRequest(
            "not connected", f"the first frame must be CONNECT or STOMP, not {command}"
        )
    if connected and connecting:
        raise BadRequest("already connected", f"{command} was sent on a connected session")
    if frame.body and command not in BODY_COMMANDS:
        raise BadRequest(
            "unexpected body",
            f"a {command} frame must not have a body (only SEND may); "
            f"this one has {len(frame.body)} bytes",
        )
    # Values the broker writes back (receipt ids, subscription ids) must be expressible in
    # the session's STOMP version, or the replies could never be written.
    for name in ("receipt", "id") if command == "SUBSCRIBE" else ("receipt",):
        value = frame.headers.get(name)
        if value is not None and not echoable(value, version):
            raise BadRequest(
                f"invalid {name} header",
                f"the {name} header contains a carriage return, which STOMP "
                f"{version.value if version else ''} cannot write back; "
                "use STOMP 1.2 or leave it out",
            )


def acked(
    core: CoreConnection, version: StompVersion | None, frame: Frame
) -> tuple[Subscription, str]:
    """The subscription and message an ACK or NACK names, per the session's version."""
    if version is StompVersion.V1_2:
        text = h.required(frame, "id")
        parsed = parse_ack_id(text)
        subscription = core.subscription_by_number(parsed[0]) if parsed else None
        if parsed is None or subscription is None:
            raise BadRequest(
                f"{frame.command} for an unknown id",
                f"{frame.command} id {text!r} is not the ack header of a message delivered on "
                "this connection",
            )
        return subscription, parsed[1]
    message_id = h.required(frame, "message-id")
    sub_id = frame.headers.get("subscription")
    if sub_id is None and version is StompVersion.V1_1:
        sub_id = h.required(frame, "subscription")
    found = core.subscription(sub_id) if sub_id is not None else core.find_unacked(message_id)
    if found is None:
        raise BadRequest(
            f"{frame.command} for an unknown message",
            f"{frame.command} names message {message_id!r}"
            + (f" on subscription {sub_id!r}" if sub_id is not None else "")
            + ", which is not awaiting acknowledgement on this connection",
        )
    return found, message_id
