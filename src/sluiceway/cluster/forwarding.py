"""A message carried from one member to another: the MESSAGE a link receives at its home broker
becomes the SEND it publishes here, and the link's subscription takes only messages that were
published at that broker.

What the SEND keeps: the destination, `persistent`, `priority`, `expires` (an instant, so the
message expires when it would have at home) and every header of the producer's (`content-type`,
correlation ids, application properties), with the body. What it adds: `sluiceway_via`, the
broker the message came from, and `sluiceway_origin_id`, its message id there. What it loses:
the home broker's message id, timestamp and sequence number (this broker gives its own, as to
any SEND; the origin id says where it came from), and the delivery count: a message redelivered
to the link arrives here as a first delivery.

Loop prevention rests on `sluiceway_via`: a link subscribes with the selector
`sluiceway_via IS NULL` (LINK_SELECTOR). Selectors see the producer's headers
(core.values.selector), so a message that crossed once is never taken by another link, and
never comes back. A producer that sets `sluiceway_via` itself keeps its message on the broker
it published to.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from sluiceway.protocol.frames import DELIVERY_HEADERS, Frame

VIA_HEADER: Final = "sluiceway_via"
ORIGIN_ID_HEADER: Final = "sluiceway_origin_id"
LINK_SELECTOR: Final = f"{VIA_HEADER} IS NULL"

# The MESSAGE headers the home broker wrote for its delivery, not the producer's: the SEND here
# leaves them to this broker (destination, persistent, priority and expires are set again).
_DELIVERY_HEADERS: Final = DELIVERY_HEADERS

# Message ids remembered per link as published here: enough to cover the messages a link can
# have in flight (its windows, at most imq.cluster.consumerFlowLimit per destination) many times
# over; about 100 bytes each.
SEEN_CAPACITY: Final = 16_384


def forwarded(message: Frame, origin: str) -> Frame:
    """The SEND that publishes `message`, received from member `origin`, on this broker."""
    source = message.headers
    headers = {
        "destination": source.get("destination", ""),
        "persistent": source.get("persistent", "false"),
    }
    for name in ("priority", "expires"):
        value = source.get(name)
        if value is not None:
            headers[name] = value
    for name, value in source.items():
        if name not in _DELIVERY_HEADERS and name not in headers:
            headers[name] = value
    headers[VIA_HEADER] = origin
    headers[ORIGIN_ID_HEADER] = source.get("message-id", "")
    return Frame("SEND", headers, message.body)


class Seen:
    """The home broker's ids of the messages a link published here, the latest `capacity`.

    A link that loses its connection gets the messages it had not acknowledged again, flagged
    redelivered; one it had already published here (its ACK was lost with the connection) is
    recognised by its id and acknowledged without being published twice. Bounded: the oldest
    ids are forgotten first, so this narrows duplicates rather than ruling them out; and it
    lives in memory, so it does not outlive this broker.
    """

    def __init__(self, capacity: int = SEEN_CAPACITY) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message_id: str) -> None:
        if not message_id:
            return
        self._ids[message_id] = None
        self._ids.move_to_end(message_id)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
