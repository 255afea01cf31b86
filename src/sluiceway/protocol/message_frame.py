"""The MESSAGE frame as the broker writes it in STOMP 1.2, from plain values, in few steps.

A MESSAGE is the one frame written once per delivery, so it is assembled from parts instead of
going through `encode_frame` (the broker writes the parts of many frames with one join, so a
body is copied once on its way out):

- the head: the command line and the headers of this delivery (`subscription`, `message-id`,
  `ack` for client-acknowledged subscriptions, `redelivered`, `delivery-count`), one f-string;
- the tail: the headers that are the same in every delivery of a message (`destination`,
  `priority`, `persistent`, `expires`, `timestamp`, `sequence`, the producer's own headers,
  `content-length`) and the blank line, encoded once and kept by the caller for the next
  delivery of the same message.

The bytes are those `encode_frame` writes for the same headers in the same order (a property
test holds the two together). What `encode_frame` would refuse, a name or value with no UTF-8
form, comes back as None here: the caller then goes through `encode_frame`, whose error names
the header. STOMP 1.0 and 1.1 MESSAGEs, rare and escaped differently, go through
`encode_frame` alone.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from sluiceway.protocol.encoder import escape_value, header_lines
from sluiceway.protocol.frames import StompVersion

# Subscription ids and destination names recur on every MESSAGE: escaped once each.
escape_name: Final = lru_cache(maxsize=4096)(escape_value)


def message_head(subscription: str, message_id: str, ack: str, delivery_count: int) -> bytes | None:
    """The command line and the per-delivery headers, which `tail` (from `plain_tail` or
    `header_tail`), the body and the NUL follow. `subscription` as the client named it;
    `message_id` and `ack` (the ack header's value, "" for none) already escaped, as the caller
    keeps them with the tail. None when a value has no UTF-8 form."""
    # Constant pairs, no string built: the ack line costs nothing when there is none.
    ack_name, ack_end = ("ack:", "\n") if ack else ("", "")
    head = (
        f"MESSAGE\nsubscription:{escape_name(subscription)}\nmessage-id:{message_id}\n"
        f"{ack_name}{ack}{ack_end}redelivered:{'true' if delivery_count > 1 else 'false'}\n"
        f"delivery-count:{delivery_count}\n"
    )
    try:
        return head.encode()
    except UnicodeEncodeError:
        return None


def plain_tail(  # noqa: PLR0917  (positional: called per message)
    destination: str,
    priority: int,
    persistent: bool,
    expires: int,
    timestamp: int,
    sequence: int,
    body_length: int,
) -> bytes:
    """The tail of a message without headers of its producer's (the usual case), written
    directly. `destination` is a validated destination name: it always has a UTF-8 form."""
    return (
        f"destination:{escape_name(destination)}\n"
        f"priority:{priority}\n"
        f"persistent:{'true' if persistent else 'false'}\n"
        f"expires:{expires}\ntimestamp:{timestamp}\n"
        f"sequence:{sequence}\ncontent-length:{body_length}\n\n"
    ).encode()


def header_tail(headers: dict[str, str]) -> bytes | None:
    """The tail from its headers in order (content-length last), escaped as STOMP 1.2 escapes
    a MESSAGE; None when a name or value has no UTF-8 form."""
    try:
        return (header_lines("MESSAGE", headers, StompVersion.V1_2) + "\n").encode()
    except UnicodeEncodeError:
        return None
