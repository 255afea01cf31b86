"""The link that serves a durable subscription living on another member to its subscriber here
(cluster.durables): it attaches at that member to the subscription itself and publishes what it
gets into the queue the subscriber reads here.

It is a PeerLink with one route and three differences: it connects to the home member with the
subscription's client id (a durable subscription belongs to a client id), subscribes with the
subscription's name and the subscriber's selector rather than the links' selector (the
subscription keeps messages that crossed from other members too), and publishes to the queue
here, not to the topic: this broker's own subscribers of the topic get the topic's messages
already, through the links or from its producers. The order, the window, the room budget, the
ACK after this broker stored the message and the de-duplication are the links'
(cluster.peer_link).

`end_at_home` ends a subscription at its home when its subscriber ended it here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

from sluiceway.client.link import Link
from sluiceway.cluster.durables import Attachment, Key
from sluiceway.cluster.forwarding import VIA_HEADER, Seen, forwarded
from sluiceway.cluster.peer_link import Budget, LinkSettings, PeerLink, Route
from sluiceway.cluster.peers import Peer
from sluiceway.errors import BrokerError, ClientError, Status
from sluiceway.naming import DestinationName
from sluiceway.protocol.frames import Frame

# The topic a message was published to, on the copy a subscriber reads from its queue here
# (whose MESSAGE names that queue as its destination).
TOPIC_HEADER: Final = "sluiceway_topic"


class DurableLink(PeerLink):
    """Brings durable subscription `attachment`, living on `peer`, to `queue` here."""

    def __init__(
        self,
        peer: Peer,
        settings: LinkSettings,
        attachment: Attachment,
        queue: DestinationName,
        *,
        seen: Seen,
        budget: Budget,
        read: Callable[[], bool],
    ) -> None:
        super().__init__(peer, settings, seen, budget)
        self.attachment = attachment
        self.queue = queue
        self.read = read  # whether a subscriber reads the queue here now

    def _may_publish(self) -> bool:
        # Checked at each batch, not only at each demand reading: a subscriber that left keeps
        # what it might have been brought at home, not in a queue here it no longer reads.
        return self.read()

    def _upstream_client_id(self) -> str:
        return self.attachment.client_id

    def _subscription(self, route: Route) -> dict[str, str]:
        attachment = self.attachment
        headers = {
            "destination": attachment.topic.path,
            "durable-subscription-name": attachment.name,
        }
        if attachment.selector:
            headers["selector"] = attachment.selector
        return headers

    def _forwarded(self, frame: Frame) -> Frame:
        send = forwarded(frame, self.peer.broker_id)
        headers = dict(send.headers)
        headers["destination"] = self.queue.path
        headers[TOPIC_HEADER] = frame.headers.get("destination", "")
        # Without the via: what the subscriber leaves in the queue here may cross once more,
        # to the member it attaches on next (cluster.links.wanted_routes).
        del headers[VIA_HEADER]
        return Frame("SEND", headers, send.body)


async def end_at_home(peer: Peer, settings: LinkSettings, key: Key) -> None:
    """End durable subscription `key` (client id, name) on its home `peer`; one already gone
    counts as ended. Raises ClientError, BrokerError or OSError when it could not be done (a
    subscriber attached there: Conflict)."""
    client_id, name = key
    link = Link(settings.client(peer.host, peer.port, client_id))
    frame = Frame("UNSUBSCRIBE", {"durable-subscription-name": name})
    try:
        async with asyncio.timeout(settings.timeout):
            await link.open()
            await link.request(frame, settings.timeout)
    except BrokerError as exc:
        if exc.status is not Status.NOT_FOUND:
            raise
    finally:
        with contextlib.suppress(ClientError, BrokerError, OSError):
            await link.close()
