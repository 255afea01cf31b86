"""One STOMP 1.2 connection on an asyncio Protocol, and a sampler of a process's resident memory.

Only standard STOMP is used here, so the same code talks to Sluiceway, ActiveMQ, Artemis or
RabbitMQ. The CONNECT `host` header is the virtual host ("/" is RabbitMQ's default one; the
others ignore it).

The generator must cost as little per message as it can, since it shares the machine with the
broker it measures: what arrives is decoded in the transport's callback, and a worker on its hot
path takes the frames there too (`on_data`), with no task woken, no future made and no timer set
per read. Frames are read either that way or, off the hot path, by awaiting `next_frame`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion

V12 = StompVersion.V1_2
BATCH_BYTES = 64 * 1024  # frames queued with `queue` go out once this many bytes wait, or sooner
WRITE_BUFFER_HIGH = 1 << 20  # bytes waiting in the transport before `drain` waits


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


class StompStream(asyncio.Protocol):
    """One STOMP 1.2 connection.

    Reading is bounded: the transport is paused whenever decoded frames wait that nobody has
    asked for (no `on_data` and no `next_frame` waiting), so the decoder holds at most one read.
    """

    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.transport = cast(asyncio.Transport, None)  # set by connection_made
        # Called after each read with the decoder fed, and once the connection is lost: it
        # takes the frames (the hot path).
        self.on_data: Callable[[], None] | None = None
        self.on_writable: Callable[[], None] | None = None  # called when writing resumes
        self.lost: Exception | None = None  # why the connection ended, once it has
        self._read_waiter: asyncio.Future[None] | None = None  # next_frame, waiting
        self._write_waiter: asyncio.Future[None] | None = None  # drain or close, waiting
        self._reading = True
        self._writing = True
        # Frames queued to go out together: one system call for many frames, as a client that
        # batches its writes does. Flushed before every wait, so nothing waits behind a wait.
        self._batch: list[bytes] = []
        self._batch_bytes = 0

    @classmethod
    async def connect(cls, port: int, address: str = "127.0.0.1") -> StompStream:
        """A connected stream that has said nothing yet."""
        loop = asyncio.get_running_loop()
        _, stream = await loop.create_connection(cls, address, port)
        return stream

    @classmethod
    async def open(
        cls, port: int, address: str = "127.0.0.1", virtual_host: str = "/", **headers: str
    ) -> StompStream:
        """A stream whose CONNECT the broker has answered with CONNECTED."""
        stream = await cls.connect(port, address)
        connect = {"accept-version": "1.2", "host": virtual_host, **headers}
        stream.transport.write(encode_frame(Frame("CONNECT", connect)))
        try:
            frame = await stream.next_frame()
        except BaseException:
            stream.transport.close()
            raise
        if frame.command != "CONNECTED":
            stream.transport.close()
            reason = frame.headers.get("message", "") or frame.body.decode(errors="replace")
            raise Refused(f"CONNECT refused: {reason.strip()}")
        stream.decoder.version = V12
        return stream

    # -- asyncio callbacks -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        if self.on_data is not None:
            self.on_data()
        elif self._read_waiter is not None and not self._read_waiter.done():
            self._read_waiter.set_result(None)
        else:
            self.pause_reading()  # nobody is reading: what was decoded waits for next_frame

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("the broker closed the connection")
        _wake(self._read_waiter)
        _wake(self._write_waiter)
        if self.on_data is not None:
            self.on_data()

    def pause_writing(self) -> None:
        self._writing = False

    def resume_writing(self) -> None:
        self._writing = True
        _wake(self._write_waiter)
        if self.on_writable is not None:
            self.on_writable()

    # -- reading -------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if self._reading and self.lost is None:
            self._reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading and self.lost is None:
            self._reading = True
            self.transport.resume_reading()

    @property
    def reading(self) -> bool:
        """The transport reads (it is paused while decoded frames wait for a reader)."""
        return self._reading

    async def next_frame(self) -> Frame:
        """The next frame, read for it if need be (heart-beats are skipped)."""
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Frame):
                return event
            if event is None:
                if self.lost is not None:
                    raise ConnectionError("the broker closed the connection") from self.lost
                self.resume_reading()
                self._read_waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._read_waiter
                finally:
                    self._read_waiter = None

    # -- writing -------------------------------------------------------------------------------

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
            self.transport.write(b"".join(self._batch))
            self._batch.clear()
            self._batch_bytes = 0

    @property
    def writable(self) -> bool:
        """Fewer than WRITE_BUFFER_HIGH bytes wait in the transport (or it has closed)."""
        return self._writing or self.lost is not None

    async def drain(self) -> None:
        """Flush, and wait while the transport holds more than WRITE_BUFFER_HIGH bytes."""
        self.flush()
        while not self.writable:
            await self._wait_writing()

    async def close(self) -> None:
        self.flush()
        self.transport.close()
        while self.lost is None:
            await self._wait_writing()

    async def _wait_writing(self) -> None:
        """Until writing resumes or the connection ends."""
        self._write_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._write_waiter
        finally:
            self._write_waiter = None


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
