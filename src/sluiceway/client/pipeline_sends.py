"""The window of a pipelined `send_many`: sends in flight, and refused ones sent again.

Every SEND asks for a receipt. Up to `max_inflight` sends (and `max_inflight_bytes` of bodies)
wait for theirs at once, which is what makes persistent sends cheap: the broker syncs its
journal once for many. A send refused with a status of the retry policy (414: a destination or
system limit, or a send held longer than `imq.producer.hold.timeout`), or with 503 (a stage sent
to a cluster member still taking its sink over from a member that failed), is kept; once the
window has emptied, the refused sends go again, in their order, after a pause that grows by the
policy's `backoff` up to `max_pause`. One refused for longer than the policy's `deadline` ends
the send with the broker's refusal, its class and headers kept, saying how long it was tried.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Final, Protocol

from sluiceway.client.pipeline_failover import restated
from sluiceway.client.pipeline_send_packs import OutgoingPack
from sluiceway.client.pipeline_values import OutgoingMessage, PipelineSettings
from sluiceway.client.protocol import Receipts
from sluiceway.errors import BrokerError, EntityTooLarge, ResourceFull, Unavailable
from sluiceway.protocol.frames import Frame

log = logging.getLogger("sluiceway.client.pipeline")

# Receipt ids of sends start with this (other requests' with another letter), so a log line
# tells which operation a receipt answered.
SEND_RECEIPT: Final = "s"

# Headers that steer a SEND frame itself rather than travel with the message: a message's own
# headers never set them (a `transaction` copied from elsewhere would capture the send).
_FRAME_HEADERS: Final = frozenset(
    {"transaction", "receipt", "content-length", "stage", "stage-ttl", "destination"}
)
# Refusals of a pack after which its messages are sent one by one: each then gets what a
# single SEND gets (held, retried, refused with its own reason). Others end the send.
_UNPACK_ON: Final = (ResourceFull, EntityTooLarge, Unavailable)

Sendable = OutgoingMessage | OutgoingPack


class FrameLink(Protocol):
    """What the window needs of a connection: frames out and in, receipt ids, its settings."""

    settings: PipelineSettings
    receipt_numbers: Iterator[int]  # shared by every request on the connection

    def write_frame(self, frame: Frame) -> None: ...

    def next_frame(self) -> Frame: ...

    def failed(self, frame: Frame) -> BrokerError: ...


class SendWindow:
    """The window of one `send_many`: sends in flight, and the refused ones to send again."""

    def __init__(self, connection: FrameLink, stage: str | None, stage_ttl_ms: int | None) -> None:
        self.connection = connection
        self.settings = connection.settings
        self.extra: dict[str, str] = {}
        if stage is not None:
            self.extra["stage"] = stage
            if stage_ttl_ms is not None:
                self.extra["stage-ttl"] = str(stage_ttl_ms)
        self.inflight: Receipts[Sendable] = Receipts(connection.receipt_numbers)
        self.inflight_bytes = 0
        self.refused: list[tuple[OutgoingMessage, BrokerError]] = []
        # The messages of refused packs, to send singly: at most what was in flight (bounded
        # by max_inflight_bytes, plus the last pack written), as no pack is written meanwhile.
        self.unpacked: deque[OutgoingMessage] = deque()
        self.first_refused: dict[int, float] = {}  # id(message) -> when it was first refused
        self.pause = self.settings.retry.pause  # before the next retry; grows by `backoff`
        self.sent = 0

    def add(self, item: Sendable) -> None:
        if isinstance(item, OutgoingPack):
            self._write_pack(item)
        else:
            self._write(item)
        self._settle_while_full()
        self._send_unpacked()
        if self.refused:
            self._resend_refused()

    def finish(self) -> None:
        while self.inflight or self.refused or self.unpacked:
            while self.inflight:
                self._settle_one()
            self._send_unpacked()
            if self.refused:
                self._resend_refused()

    def _settle_while_full(self) -> None:
        settings = self.settings
        while len(self.inflight) >= settings.max_inflight or (
            self.inflight_bytes >= settings.max_inflight_bytes
        ):
            self._settle_one()

    def _send_unpacked(self) -> None:
        while self.unpacked:
            self._write(self.unpacked.popleft())
            self._settle_while_full()

    def _write_pack(self, pack: OutgoingPack) -> None:
        headers = {"destination": pack.destination, "pack-count": str(pack.count)}
        headers.update(self.extra)
        send = Frame("SEND", headers, pack.body)
        self.connection.write_frame(self.inflight.ask(send, pack, SEND_RECEIPT))
        self.inflight_bytes += len(pack.body)

    def _write(self, message: OutgoingMessage) -> None:
        headers = {k: v for k, v in message.headers.items() if k not in _FRAME_HEADERS}
        headers.update(self.extra)
        headers.update(
            {
                "destination": message.destination,
                "persistent": "true" if message.persistent else "false",
                "priority": str(message.priority),
            }
        )
        if message.expires:
            headers["expires"] = str(message.expires)
        send = Frame("SEND", headers, message.body)
        self.connection.write_frame(self.inflight.ask(send, message, SEND_RECEIPT))
        self.inflight_bytes += len(message.body)

    def _settle_one(self) -> None:
        """Wait for the next receipt of a send in flight."""
        frame = self.connection.next_frame()
        if frame.command == "ERROR":
            raise self.connection.failed(frame)
        answer = self.inflight.answer(frame)
        if answer is None:
            return
        message, error = answer.waiter, answer.error
        self.inflight_bytes -= len(message.body)
        if isinstance(message, OutgoingPack):
            self._pack_settled(message, error)
            return
        if error is None:
            self.sent += 1
            if self.first_refused.pop(id(message), None) is not None and not self.first_refused:
                self.pause = self.settings.retry.pause  # every refused one got through
            return
        if not isinstance(error, (*self.settings.retry.retry_on, Unavailable)):
            raise error
        self.refused.append((message, error))

    def _pack_settled(self, pack: OutgoingPack, error: BrokerError | None) -> None:
        if error is None:
            self.sent += pack.count
            return
        if not isinstance(error, _UNPACK_ON):
            raise error
        log.debug(
            "a pack of %d messages to %s was refused (%s); sending them one by one",
            pack.count,
            pack.destination,
            error,
        )
        self.unpacked.extend(pack.messages())

    def _resend_refused(self) -> None:
        """Let the window empty, pause, then send the refused messages again in their order."""
        while self.inflight:
            self._settle_one()
        policy = self.settings.retry
        now = time.monotonic()
        for message, _error in self.refused:
            self.first_refused.setdefault(id(message), now)
        message, error = self.refused[0]
        waited = now - min(self.first_refused[id(m)] for m, _ in self.refused)
        if waited + self.pause > policy.deadline:
            raise gave_up(error, waited, len(self.refused))
        log.info(
            "%d send(s) to %s refused (%s); retrying in %.2f s",
            len(self.refused),
            error.destination or message.destination,
            error.summary,
            self.pause,
        )
        time.sleep(self.pause)
        self.pause = min(self.pause * policy.backoff, policy.max_pause)
        again, self.refused = self.refused, []
        for message, _error in again:
            self._write(message)


def gave_up(error: BrokerError, waited: float, count: int) -> BrokerError:
    """The broker's refusal, the same class and headers, saying how long the client tried."""
    where = f" to {error.destination}" if error.destination else ""
    limit = f"; limit {error.limit}={error.limit_value}" if error.limit else ""
    return restated(
        error,
        f"{count} send(s){where} still refused after retrying for {waited:.1f} s "
        f"(status {int(error.status)}: {error.summary}{limit}): {error}",
    )
