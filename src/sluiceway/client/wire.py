"""One physical STOMP connection of the client: socket, codec, heart-beats and pending receipts.

It reuses the broker's sans-IO codec. Frames are written with `send`; a frame that must be
confirmed goes through `request`, which waits for its RECEIPT. Every pending request is kept in
one store and all of them fail together, with a clear error, when the connection goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, TypeAlias

from sluiceway.client.protocol import (
    CLIENT_MAX_HEADER_COUNT,
    READ_CHUNK,
    Receipts,
    connected_version,
    refusal,
)
from sluiceway.errors import BrokerError, ConnectionClosedError, OperationTimeoutError
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import HEARTBEAT, Frame, StompVersion

log = logging.getLogger(__name__)

WRITE_HIGH_WATER: Final = 256 * 1024  # above this many unsent bytes, writers wait for the socket
HEARTBEAT_GRACE: Final = 2.0  # a broker silent for this many agreed intervals is taken for dead


# A request waiting for its RECEIPT: the future its sender awaits, and what to call with the
# RECEIPT as soon as it is read (see `Wire.request`).
Waiter: TypeAlias = tuple[asyncio.Future[Frame], Callable[[Frame], None] | None]


class Wire:
    """A connected STOMP session over one TCP connection."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_frame: Callable[[Frame], None],
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._decoder = FrameDecoder(max_header_count=CLIENT_MAX_HEADER_COUNT)
        self._receipts: Receipts[Waiter] = Receipts()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self._last_read = self._last_write = self._loop.time()
        self.version = StompVersion.V1_2
        self.connected: Frame | None = None
        self.closed = False
        self.closing = False  # a DISCONNECT was sent: losing the socket now is expected
        self.failure: BaseException | None = None
        self.heartbeats_received = 0  # EOLs the broker sent to keep the connection alive

    # -- opening ---------------------------------------------------------------------------------

    async def handshake(self, headers: dict[str, str], timeout: float) -> Frame:
        """Send CONNECT and wait for CONNECTED; raise the broker's refusal if it sends ERROR."""
        self._write(Frame("CONNECT", headers))
        async with asyncio.timeout(timeout):
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    raise ConnectionClosedError("the broker closed the connection during CONNECT")
                self._decoder.receive_data(data)
                frame = self._next_frame()
                if frame is None:
                    continue
                self.version = connected_version(frame)
                self.connected = frame
                self._decoder.version = self.version
                return frame

    def _next_frame(self) -> Frame | None:
        while (event := self._decoder.next_event()) is not None:
            if isinstance(event, Frame):
                return event
        return None

    def start(self, send_interval: float, receive_interval: float) -> None:
        """Start reading, and heart-beating at the negotiated intervals (0: none)."""
        self._tasks.append(asyncio.create_task(self._read_loop(), name="sluiceway-reader"))
        if send_interval or receive_interval:
            self._tasks.append(
                asyncio.create_task(
                    self._heartbeat_loop(send_interval, receive_interval),
                    name="sluiceway-heartbeat",
                )
            )
        # Frames that arrived together with CONNECTED.
        self._dispatch_buffered()

    # -- writing ---------------------------------------------------------------------------------

    def write(self, frame: Frame) -> None:
        """Write a small frame now, without waiting for the socket (acknowledgements)."""
        self._write(frame)

    def _write(self, frame: Frame) -> None:
        if self.closed:
            raise ConnectionClosedError("the connection is closed") from self.failure
        self._writer.write(encode_frame(frame, self.version))
        self._last_write = self._loop.time()

    async def send(self, frame: Frame) -> None:
        """Write a frame, waiting for the socket only when much is already unsent."""
        self._write(frame)
        transport = self._writer.transport
        if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            await self._writer.drain()

    @property
    def awaiting_receipt(self) -> int:
        """Frames written with a receipt request whose RECEIPT (or refusal) has not come yet."""
        return len(self._receipts)

    async def request(
        self,
        frame: Frame,
        timeout: float | None,
        on_receipt: Callable[[Frame], None] | None = None,
    ) -> Frame:
        """Write `frame` with a receipt and return the RECEIPT; raise the broker's refusal.

        `on_receipt` is called with a RECEIPT that is not a refusal as soon as it is read, before
        any frame behind it is dispatched: the MESSAGE frames that follow a SUBSCRIBE's RECEIPT
        must find the window it grants already in force.
        """
        future: asyncio.Future[Frame] = self._loop.create_future()
        asked = self._receipts.ask(frame, (future, on_receipt))
        try:
            await self.send(asked)
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise OperationTimeoutError(
                f"the broker did not confirm {frame.command} within {timeout} s "
                "(imqAckTimeout or the call's timeout)"
            ) from None
        finally:
            self._receipts.forget(asked)

    # -- reading ---------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while data := await self._reader.read(READ_CHUNK):
                self._last_read = self._loop.time()
                self._decoder.receive_data(data)
                self._dispatch_buffered()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the connection is over, whatever the reason
            self.lose(exc)
        else:
            self.lose(ConnectionClosedError("the broker closed the connection"))

    def _dispatch_buffered(self) -> None:
        while (event := self._decoder.next_event()) is not None:
            if event is HEARTBEAT:
                self.heartbeats_received += 1
                continue
            assert isinstance(event, Frame)
            if event.command == "RECEIPT":
                self._on_receipt_frame(event)
            elif event.command == "ERROR":
                self._on_error(event)
            else:
                self._on_frame(event)

    def _on_receipt_frame(self, frame: Frame) -> None:
        answer = self._receipts.answer(frame)
        if answer is None:
            return
        future, on_receipt = answer.waiter
        if future.done():
            return
        if answer.error is not None:  # a failed receipt: refused, the connection stays open
            future.set_exception(answer.error)
            return
        if on_receipt is not None:
            on_receipt(frame)
        future.set_result(frame)

    def _on_error(self, frame: Frame) -> None:
        error = refusal(frame)
        answer = self._receipts.answer(frame)
        if answer is not None and not answer.waiter[0].done():
            answer.waiter[0].set_exception(error)
        # The broker closes the connection after an ERROR: everything else pending fails.
        self.lose(error)

    async def _heartbeat_loop(self, send_interval: float, receive_interval: float) -> None:
        intervals = [i for i in (send_interval, receive_interval) if i]
        tick = min(intervals) / 2
        while not self.closed:
            await asyncio.sleep(tick)
            now = self._loop.time()
            if send_interval and now - self._last_write >= send_interval / 2:
                self._writer.write(b"\n")
                self._last_write = now
            if receive_interval and now - self._last_read > receive_interval * HEARTBEAT_GRACE:
                self.lose(
                    ConnectionClosedError(
                        f"the broker sent nothing for {now - self._last_read:.1f} s while "
                        f"heart-beats were agreed every {receive_interval:.1f} s"
                    )
                )
                return

    # -- closing ---------------------------------------------------------------------------------

    def lose(self, exc: BaseException) -> None:
        """The connection is gone: fail every pending request and tell the owner once."""
        if self.closed:
            return
        self.closed = True
        self.failure = exc
        lost = ConnectionClosedError(f"the connection was lost: {exc}")
        for future, _ in self._receipts.drain():
            if not future.done():
                future.set_exception(lost)
        self._writer.close()
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if not self.closing:
            self._on_lost(exc)

    async def close(self, timeout: float) -> None:
        """DISCONNECT politely (waiting for its RECEIPT up to `timeout`), then close."""
        self.closing = True
        if not self.closed:
            # Closing anyway: a refusal or a dead connection only means there is less to do.
            with contextlib.suppress(
                BrokerError, ConnectionClosedError, OperationTimeoutError, OSError
            ):
                await self.request(Frame("DISCONNECT"), timeout)
        self.closed = True
        self._writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
