"""One STOMP 1.2 connection over asyncio streams, and a sampler of a process's resident memory.

Only standard STOMP is used here, so the same code talks to Sluiceway, ActiveMQ, Artemis or
RabbitMQ. The CONNECT `host` header is the virtual host ("/" is RabbitMQ's default one; the
others ignore it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion

V12 = StompVersion.V1_2
READ_CHUNK = 256 * 1024  # bytes per read: large enough that a busy consumer reads in big gulps
BATCH_BYTES = 64 * 1024  # frames queued with `queue` go out once this many bytes wait, or sooner


class Refused(Exception):
    """The broker answered CONNECT with an ERROR (bad login, unknown virtual host...)."""


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes (Linux /proc); 0 once it has ended."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class RssSampler(threading.Thread):
    """Samples a process's RSS every `interval` seconds; `peak` is the highest seen."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True, name=f"rss-{pid}")
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._finished = threading.Event()

    def run(self) -> None:
        while not self._finished.wait(self.interval):
            self.peak = max(self.peak, rss(self.pid))

    def stop(self) -> int:
        self._finished.set()
        self.join()
        return self.peak


class StompStream:
    """One STOMP 1.2 connection over asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()
        # Frames queued to go out together: one system call for many frames, as a client that
        # batches its writes does. Flushed before every wait, so nothing waits behind a wait.
        self._batch: list[bytes] = []
        self._batch_bytes = 0

    @classmethod
    async def open(
        cls, port: int, address: str = "127.0.0.1", virtual_host: str = "/", **headers: str
    ) -> StompStream:
        reader, writer = await asyncio.open_connection(address, port)
        stream = cls(reader, writer)
        connect = {"accept-version": "1.2", "host": virtual_host, **headers}
        writer.write(encode_frame(Frame("CONNECT", connect)))
        try:
            frame = await stream.next_frame()
        except BaseException:
            writer.close()
            raise
        if frame.command != "CONNECTED":
            writer.close()
            reason = frame.headers.get("message", "") or frame.body.decode(errors="replace")
            raise Refused(f"CONNECT refused: {reason.strip()}")
        stream.decoder.version = V12
        return stream

    def send(self, frame: Frame) -> None:
        """Write `frame` now (after anything queued)."""
        self.queue(frame)
        self.flush()

    def queue(self, frame: Frame) -> None:
        """Add `frame` to the batch; it is written by `flush`, or once the batch is full."""
        data = encode_frame(frame, V12)
        self._batch.append(data)
        self._batch_bytes += len(data)
        if self._batch_bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the queued frames, in one write."""
        if self._batch:
            self.writer.write(b"".join(self._batch))
            self._batch.clear()
            self._batch_bytes = 0

    async def next_frame(self) -> Frame:
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is None:
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                self.decoder.receive_data(data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):  # reset by the broker: closed either way
            await self.writer.wait_closed()
