"""Packed SENDs (docs/pipelines-protocol.md, "Packed sends"): the messages of a SEND that
carries `pack-count`, read out of its body (the pack format of packed reads) and checked as a
SEND's headers are, with errors that name what was wrong.

A packed SEND carries only the headers that steer the frame: its messages' own headers,
priorities, expiry times and persistence are in the pack. It must ask for a receipt: a pack
is taken whole or refused whole, and its sender then sends the messages one by one.
"""

from __future__ import annotations

from typing import Final

from sluiceway.core.values.message import MAX_EXPIRES, PackedSend
from sluiceway.errors import BadRequest, RemoteProtocolError
from sluiceway.protocol.frames import Frame
from sluiceway.protocol.pack import MAX_PACK, PERSISTENT, read_pack
from sluiceway.session import headers as h
from sluiceway.session.render import BROKER_MESSAGE_HEADERS

PACK_COUNT: Final = "pack-count"
FRAME_HEADERS: Final = frozenset(
    {"destination", "receipt", "stage", "stage-ttl", PACK_COUNT, "content-length"}
)


def packed_send(frame: Frame, max_header_count: int) -> list[PackedSend]:
    """The messages of a packed SEND, in order."""
    count = h.integer(frame, PACK_COUNT, 0, minimum=1, maximum=MAX_PACK)
    other = sorted(frame.headers.keys() - FRAME_HEADERS)
    if other:
        raise BadRequest(
            "invalid header on a packed SEND",
            f"a SEND with {PACK_COUNT} takes its messages' headers, priorities, expiry and "
            f"persistence from the pack, and may carry only {', '.join(sorted(FRAME_HEADERS))}; "
            f"this one carries {', '.join(other)}",
        )
    if "receipt" not in frame.headers:
        raise BadRequest(
            "packed SEND without receipt",
            f"a SEND with {PACK_COUNT} must ask for a receipt: a pack is taken whole or refused "
            "whole, and a refused one is sent again message by message",
        )
    try:
        pack = read_pack(frame.body)
    except RemoteProtocolError as exc:
        raise BadRequest(
            "invalid pack",
            f"the body of a SEND with {PACK_COUNT} is not a pack ({exc}); its format is in "
            "docs/pipelines-protocol.md, Packed reads",
        ) from None
    if pack.count != count:
        raise BadRequest(
            "invalid pack",
            f"the {PACK_COUNT} header says {count} messages and the pack holds {pack.count}",
        )
    if count and max(pack.priorities) > 9:
        raise BadRequest(
            "invalid pack", "a packed message's priority is above 9: priorities are 0 to 9"
        )
    expires = pack.expires
    if count and not 0 <= min(expires) <= max(expires) <= MAX_EXPIRES:
        raise BadRequest(
            "invalid pack",
            "a packed message's expiry time is out of range: 0 (never) or milliseconds since "
            f"the epoch up to {MAX_EXPIRES}",
        )
    allowed = max_header_count - BROKER_MESSAGE_HEADERS
    messages: list[PackedSend] = []
    for index in range(count):
        own = tuple(pack.own_headers(index))
        if own:
            own = _checked(own, allowed, index)
        messages.append(
            (
                pack.body(index),
                own,
                pack.priorities[index],
                expires[index],
                bool(pack.flags[index] & PERSISTENT),
            )
        )
    return messages


def _checked(
    own: tuple[tuple[str, str], ...], allowed: int, index: int
) -> tuple[tuple[str, str], ...]:
    """A packed message's own headers, those the broker writes itself left out."""
    if len(own) > allowed:
        raise BadRequest(
            "too many headers",
            f"packed message {index} has {len(own)} headers; a message may carry at most "
            f"{allowed} (imq.stomp.max_header_count less what the broker adds to each MESSAGE)",
        )
    reserved = h.RESERVED_SEND_HEADERS
    if any(name in reserved for name, _ in own):  # left out, as from a SEND's own headers
        return tuple((name, value) for name, value in own if name not in reserved)
    return own
