"""A WebSocket client on a blocking socket (RFC 6455 by hand), for tests that must send part of a
message and stop: a library client sends whole messages only."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from typing import Final

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame

TEXT: Final = 0x1
BINARY: Final = 0x2
CLOSE: Final = 0x8
TIMEOUT: Final = 5.0
_ZERO_MASK: Final = b"\0\0\0\0"  # a client must mask; XOR with zeros leaves the payload as is


class RawWebSocket:
    def __init__(self, port: int, path: str = "/stomp", timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buf = bytearray()
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: v12.stomp\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        status = self._read_until(b"\r\n\r\n", time.monotonic() + timeout)
        assert status.startswith(b"HTTP/1.1 101"), status

    def send_header(self, length: int, opcode: int = BINARY) -> None:
        """The header of a whole (FIN) message of `length` bytes; its payload follows by
        `send_payload`, as much of it as the test likes."""
        first = 0x80 | opcode
        if length < 126:
            head = struct.pack("!BB", first, 0x80 | length)
        elif length < 1 << 16:
            head = struct.pack("!BBH", first, 0x80 | 126, length)
        else:
            head = struct.pack("!BBQ", first, 0x80 | 127, length)
        self.sock.sendall(head + _ZERO_MASK)

    def send_payload(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, frame: Frame) -> None:
        """One STOMP frame as one TEXT message."""
        data = encode_frame(frame)
        self.send_header(len(data), TEXT)
        self.send_payload(data)

    def receive(self, timeout: float = TIMEOUT) -> tuple[int, bytes]:
        """The next message from the broker: its opcode and payload (servers do not mask)."""
        deadline = time.monotonic() + timeout
        first, second = self._read(2, deadline)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._read(2, deadline))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._read(8, deadline))
        return first & 0x0F, self._read(length, deadline)

    def expect_stomp(self, command: str, timeout: float = TIMEOUT) -> Frame:
        opcode, payload = self.receive(timeout)
        assert opcode in (TEXT, BINARY), (opcode, payload)
        decoder = FrameDecoder()
        decoder.receive_data(payload)
        frame = decoder.next_event()
        assert isinstance(frame, Frame), payload
        assert frame.command == command, frame
        return frame

    def expect_close(self, timeout: float = TIMEOUT) -> int:
        """The broker's close frame: its status code."""
        opcode, payload = self.receive(timeout)
        assert opcode == CLOSE, (opcode, payload)
        return int(struct.unpack("!H", payload[:2])[0]) if len(payload) >= 2 else 0

    def expect_close_or_reset(self, timeout: float = TIMEOUT) -> int | None:
        """The broker's close frame's status code, or None when the connection ended without
        one we could read: the broker closing while our own upload was still unread makes the
        kernel reset the connection, which discards what we had not read yet."""
        try:
            return self.expect_close(timeout)
        except ConnectionError:  # (a reset, or the end of the stream; never a timeout)
            return None

    def close(self) -> None:
        self.sock.close()

    def _read(self, size: int, deadline: float) -> bytes:
        while len(self._buf) < size:
            self._fill(deadline)
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data

    def _read_until(self, marker: bytes, deadline: float) -> bytes:
        while (end := self._buf.find(marker)) < 0:
            self._fill(deadline)
        data = bytes(self._buf[: end + len(marker)])
        del self._buf[: end + len(marker)]
        return data

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("nothing arrived in time")
        self.sock.settimeout(remaining)
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the broker closed the connection")
        self._buf += data
