"""A blocking STOMP client that speaks raw frames, for end-to-end tests of the wire.

`sync()` is the barrier tests use instead of sleeping: it makes two receipt round trips in a row.
The broker writes MESSAGE frames from a pump it schedules while handling a frame, and that pump
runs before the broker reads anything sent after the first RECEIPT came back; so once `sync()`
returns, every MESSAGE the broker was going to send because of earlier frames has arrived.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections import deque

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import HEARTBEAT, Frame, StompVersion

DEFAULT_TIMEOUT = 5.0


class ConnectionClosed(Exception):
    """The broker closed the connection."""


class RawClient:
    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        timeout: float = DEFAULT_TIMEOUT,
        receive_buffer: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            # Set before connecting, so the TCP window is negotiated with it.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.decoder = FrameDecoder()
        self.version: StompVersion | None = None
        self.messages: deque[Frame] = deque()  # MESSAGE frames received and not yet taken
        self.other: deque[Frame] = deque()  # RECEIPT, ERROR, CONNECTED frames not yet taken
        self.heartbeats = 0
        self.wire: bytearray | None = None  # every byte received, once a test sets it
        self.closed = False
        self._ids = itertools.count(1)

    # -- sending ---------------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.send_bytes(encode_frame(Frame(command, dict(headers or {}), body), self.version))

    def connect(self, version: str = "1.2", **extra: str) -> Frame:
        headers = {"accept-version": version, "host": "localhost"}
        headers.update({k.replace("_", "-"): v for k, v in extra.items()})
        self.send("CONNECT", headers)
        frame = self.expect("CONNECTED")
        self.version = StompVersion(frame.headers.get("version", "1.0"))
        self.decoder.version = self.version
        return frame

    def request(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Frame:
        """Send a frame asking for a receipt and return the RECEIPT."""
        receipt = f"r{next(self._ids)}"
        self.send(command, {**(headers or {}), "receipt": receipt}, body)
        frame = self.expect("RECEIPT")
        assert frame.headers["receipt-id"] == receipt, frame
        return frame

    def subscribe(self, destination: str, sub_id: str = "s1", **headers: str) -> Frame:
        fields = {"destination": destination, "id": sub_id, "ack": "client-individual"}
        fields.update({k.replace("_", "-"): v for k, v in headers.items()})
        return self.request("SUBSCRIBE", fields)

    def ack(self, message: Frame, command: str = "ACK") -> None:
        self.send(command, {"id": message.headers["ack"]})

    def sync(self) -> None:
        """Barrier: afterwards every MESSAGE caused by earlier frames has been received."""
        tx = f"sync{next(self._ids)}"
        self.request("BEGIN", {"transaction": tx})
        self.request("ABORT", {"transaction": tx})

    # -- receiving ------------------------------------------------------------------------------

    def read_some(self, deadline: float) -> None:
        """Read once from the socket (until `deadline`) and sort what arrived."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("nothing arrived in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("nothing arrived in time") from None
        if not data:
            self.closed = True
            raise ConnectionClosed("the broker closed the connection")
        if self.wire is not None:
            self.wire += data
        self.decoder.receive_data(data)
        while (event := self.decoder.next_event()) is not None:
            if event is HEARTBEAT:
                self.heartbeats += 1
            elif isinstance(event, Frame):
                (self.messages if event.command == "MESSAGE" else self.other).append(event)

    def expect(self, command: str, timeout: float | None = None) -> Frame:
        """The next non-MESSAGE frame; it must be `command`."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not self.other:
            self.read_some(deadline)
        frame = self.other.popleft()
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    def receive(self, count: int = 1, timeout: float | None = None) -> list[Frame]:
        """The next `count` MESSAGE frames."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.messages) < count:
            self.read_some(deadline)
        return [self.messages.popleft() for _ in range(count)]

    def drain(self) -> list[Frame]:
        """Every MESSAGE received so far (after a sync(), everything that will come)."""
        taken = list(self.messages)
        self.messages.clear()
        return taken

    def consume_all(self, destination: str, sub_id: str = "drain") -> list[Frame]:
        """SUBSCRIBE and take every message until none comes, acknowledging each; the
        subscription stays."""
        self.subscribe(destination, sub_id)
        got: list[Frame] = []
        while True:
            self.sync()
            messages = self.drain()
            if not messages:
                return got
            for message in messages:
                got.append(message)
                self.ack(message)

    def expect_closed(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.timeout)
        try:
            while True:
                self.read_some(deadline)
        except ConnectionClosed:
            return

    def close(self) -> None:
        self.sock.close()
