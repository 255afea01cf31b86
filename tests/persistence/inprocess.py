"""A broker in-process on a simulated disk, with the I/O layer's part done by hand.

`Node` opens the broker the way `sluiceway broker` does (app.storage.Storage: the journal, the
swap area, recovery), but on a `SimulatedDisk` (or another `Files`: the jdbc store's) and a fake
clock, with the group policy's fsync rounds run when the test says (`sync`). `Link` is one client
connection: a real `StompSession` fed frame bytes, whose output is decoded back into frames.
After every input the node does what server/connection.py does: let held SENDs settle, flush
the journal to the operating system before any frame leaves, write the control frames whose
records are durable, pump the MESSAGE frames each connection may take. No socket, no event
loop, no thread: a history replays exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sluiceway.app.storage import Storage
from sluiceway.config import build_config
from sluiceway.errors import InternalError
from sluiceway.persist.files import Files
from sluiceway.persist.journal import Journal
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.replay import Recovery
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame
from sluiceway.session.session import StompSession
from sluiceway.testing import FakeClock

WRITE_CHUNK = 32  # MESSAGE frames taken at a time, as the I/O layer does
MAX_PUMP_TURNS = 100_000  # a bound: flow control stops every pump long before


class Link:
    """One client connection: frames in, the frames the broker wrote back."""

    def __init__(self, node: Node, name: str) -> None:
        self.node = node
        self.name = name
        self.session = StompSession(node.broker, on_ready=lambda: None, peer=name)
        self.decoder = FrameDecoder()
        self.received: list[Frame] = []  # not yet taken by the test
        self.closed = False

    def send(self, command: str, headers: Mapping[str, str], body: bytes = b"") -> None:
        """Hand the broker one frame, then do the I/O layer's work."""
        assert not self.closed
        data = encode_frame(Frame(command, dict(headers), body), self.session.version)
        self.session.receive_data(data)
        self.node.settle()

    def take(self) -> list[Frame]:
        frames, self.received = self.received, []
        return frames

    def write_control(self) -> None:
        """Write the control frames whose records are durable; close after an ERROR."""
        session = self.session
        self._decode(session.data_to_send(self.node.store.synced_lsn))
        if session.closing and not session.waiting_for_sync and not self.closed:
            self.drop()

    def write_payload(self) -> bool:
        """One chunk of MESSAGE frames, after the records they depend on: whether any went."""
        if self.closed:
            return False
        self.node.flush()
        data, count = self.session.take_payload(WRITE_CHUNK)
        self.node.flush()
        self._decode(data)
        return count > 0

    def drop(self) -> None:
        """The connection is gone (closed after an ERROR, or by the test)."""
        if not self.closed:
            self.closed = True
            self.session.connection_lost()
            self.node.settle()

    def _decode(self, data: bytes) -> None:
        if not data:
            return
        self.decoder.receive_data(data)
        while (event := self.decoder.next_event()) is not None:
            assert isinstance(event, Frame)
            if event.command == "CONNECTED":
                self.decoder.version = self.session.version
            self.received.append(event)


class Node:
    """One broker process on a simulated disk (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        disk: Files,
        clock: FakeClock,
        properties: Mapping[str, str],
    ) -> None:
        self.disk = disk
        self.clock = clock
        config = build_config({"imq.persist.file.directory": str(root), **properties})
        self.storage = Storage(config, files=disk, sync_thread=False)
        try:
            broker, recovery = self.storage.open_broker(clock)
        except BaseException:
            self.abandon()
            raise
        assert isinstance(self.storage.store, JournalStore)
        assert recovery is not None
        self.broker = broker
        self.store: JournalStore = self.storage.store
        self.journal: Journal = self.store.journal
        self.recovery: Recovery = recovery
        self.links: list[Link] = []
        self.running = True

    def connect(self, name: str, **headers: str) -> Link:
        link = Link(self, name)
        self.links.append(link)
        link.send("CONNECT", {"accept-version": "1.2", "heart-beat": "0,0", **headers})
        return link

    # -- the I/O layer's work ----------------------------------------------------------------

    def flush(self) -> None:
        if self.store.buffered:
            self.store.flush()

    def settle(self) -> None:
        """After input or output: held SENDs settle, records reach the OS, frames are written."""
        self.broker.settle()
        for link in self.links:
            if not link.closed and link.session.waiting_for_sync:
                self.store.request_sync(link.session.waiting_lsn)
        self.flush()
        self.write_all()

    def write_all(self) -> None:
        for link in self.links:
            if not link.closed:
                link.write_control()
        for _ in range(MAX_PUMP_TURNS):
            wrote = False
            for link in self.links:
                if not link.closed and link.session.has_payload:
                    link.write_control()
                    wrote = link.write_payload() or wrote
            if not wrote:
                break
            self.broker.settle()
            self.flush()
        else:
            raise AssertionError(f"the pump did not stop after {MAX_PUMP_TURNS} turns")
        for link in self.links:
            if not link.closed:
                link.write_control()

    def sync(self) -> None:
        """One fsync round (the group policy's thread, run now); then what waited for it."""
        self.journal.sync_round()
        self.write_all()

    def tick(self, seconds: float = 1.0) -> None:
        """Time passes, then the broker's once-a-second work."""
        self.clock.advance(seconds)
        self.broker.tick()
        self.settle()

    # -- ending --------------------------------------------------------------------------------

    def stop(self) -> None:
        """A clean shutdown, as the server does it: every connection is told and closed in one
        go (what one gives back is not written to another), then the journal is closed."""
        for link in self.links:
            if not link.closed:
                link.closed = True
                link.session.fail(InternalError("broker shutting down", "shutting down"))
        self.links = []
        self.broker.close()
        self.storage.close()
        self.running = False

    def abandon(self) -> None:
        """The process died: nothing more reaches the disk. What the OS keeps for a dead
        process (its lock, its descriptors) is let go; the journal's files are the disk's."""
        self.running = False
        lock = self.storage._lock_file  # (the OS would release it with the process)
        if lock is not None:
            lock.close()
            self.storage._lock_file = None
        if self.storage.swap is not None:
            self.storage.swap.close()
