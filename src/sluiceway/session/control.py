"""The control frames a session has queued (CONNECTED, RECEIPT, ERROR), each with the journal
position it waits for.

They go out in order: a RECEIPT promises that every earlier frame was handled, so nothing
overtakes a receipt that waits for the journal to sync. MESSAGE frames are not queued here
(but the answer to a listing, session.listing, which comes before its RECEIPT): the I/O layer
pulls them when the socket can take more (`StompSession.take_payload`).
"""

from __future__ import annotations

from collections import deque
from typing import Final

# Control frames (RECEIPT, ERROR...) that may wait to be written, most of them for the journal
# to sync, before the session takes no further frame: past this a slow disk (or a client that
# does not read) paces the client, and the bytes it sends wait in the socket, not in memory.
MAX_WAITING_CONTROL: Final = 4096


class ControlFrames:
    """Encoded control frames, in order, each with the journal position it depends on (0: none)."""

    def __init__(self, hold_max_messages: int) -> None:
        self._frames: deque[tuple[int, bytes]] = deque()
        # Its bound: frames are handled only while fewer than MAX_WAITING_CONTROL wait, and a
        # frame queues at most two (a listing: its MESSAGE and its RECEIPT); a held SEND's
        # answer comes later (at most imq.producer.hold.max_messages are held); then a closing
        # ERROR and a DISCONNECT's RECEIPT.
        self.limit = MAX_WAITING_CONTROL + 1 + hold_max_messages + 2
        self.lsn = 0  # the furthest journal position a queued frame named

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, data: bytes, lsn: int) -> bool:
        """Queue `data` to go once the journal is synced up to `lsn`; False (and nothing
        queued) when `limit` frames wait already."""
        if len(self._frames) >= self.limit:
            return False
        self._frames.append((lsn, data))
        self.lsn = max(self.lsn, lsn)
        return True

    def ready(self, synced_lsn: int) -> bytes:
        """The frames at the front whose records are durable (synced up to `synced_lsn`)."""
        frames = self._frames
        if not frames:
            return b""
        found = []
        while frames and frames[0][0] <= synced_lsn:
            found.append(frames.popleft()[1])
        return b"".join(found)
