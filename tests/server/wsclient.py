"""A STOMP client over WebSocket for the tests (aiohttp's client), checking the framing too.

Every WebSocket message the broker sends must hold one whole STOMP frame (or heart-beat EOLs),
as TEXT when it is valid UTF-8 and BINARY otherwise; `WsStomp` asserts that on each message.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections import deque
from typing import Any

import aiohttp

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import HEARTBEAT, Frame, StompVersion

TIMEOUT = 5.0


class Closed(Exception):
    """The broker closed the WebSocket."""


class WsStomp:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.decoder = FrameDecoder(version=StompVersion.V1_2)
        self.messages: deque[Frame] = deque()
        self.other: deque[Frame] = deque()
        self.kinds: list[tuple[str, aiohttp.WSMsgType]] = []  # (command, message type) received
        self.heartbeats = 0
        self._ids = itertools.count(1)

    @classmethod
    async def open(
        cls,
        session: aiohttp.ClientSession,
        url: str,
        *,
        protocols: tuple[str, ...] = ("v12.stomp",),
        ssl_context: ssl.SSLContext | None = None,
        connect: bool = True,
        **headers: str,
    ) -> WsStomp:
        ws = await session.ws_connect(
            url,
            protocols=protocols,
            ssl=ssl_context if ssl_context is not None else True,
            max_msg_size=0,  # the tests send and receive frames far larger than the default
            autoping=True,
        )
        client = cls(ws)
        if connect:
            await client.connect(**headers)
        return client

    async def connect(self, **extra: str) -> Frame:
        headers = {"accept-version": "1.2", "host": "localhost", "heart-beat": "0,0"}
        headers.update({k.replace("_", "-"): v for k, v in extra.items()})
        await self.send("CONNECT", headers)
        return await self.expect("CONNECTED")

    async def send(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        data = encode_frame(Frame(command, dict(headers or {}), body), StompVersion.V1_2)
        if data.isascii():
            await self.ws.send_str(data.decode())
        else:
            await self.ws.send_bytes(data)

    async def request(
        self, command: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Frame:
        receipt = f"r{next(self._ids)}"
        await self.send(command, {**(headers or {}), "receipt": receipt}, body)
        frame = await self.expect("RECEIPT")
        assert frame.headers["receipt-id"] == receipt, frame
        return frame

    async def subscribe(self, destination: str, sub_id: str = "s1", **headers: str) -> Frame:
        fields = {"destination": destination, "id": sub_id, "ack": "client-individual"}
        fields.update({k.replace("_", "-"): v for k, v in headers.items()})
        return await self.request("SUBSCRIBE", fields)

    async def sync(self) -> None:
        """The same barrier as RawClient.sync: every MESSAGE owed so far has arrived after it."""
        tx = f"sync{next(self._ids)}"
        await self.request("BEGIN", {"transaction": tx})
        await self.request("ABORT", {"transaction": tx})

    async def read_one(self, timeout: float = TIMEOUT) -> None:
        """Take one WebSocket message and sort what it holds."""
        message = await self.ws.receive(timeout)
        if message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            data: Any = message.data
            raw = data.encode() if isinstance(data, str) else bytes(data)
            self._sort(raw, message.type)
            return
        raise Closed(f"the broker closed the WebSocket: {message.type.name} {message.data!r}")

    def _sort(self, raw: bytes, kind: aiohttp.WSMsgType) -> None:
        self.decoder.receive_data(raw)
        events = []
        while (event := self.decoder.next_event()) is not None:
            events.append(event)
        assert self.decoder.buffered == 0, f"a message ended inside a frame: {raw[:80]!r}"
        if all(event is HEARTBEAT for event in events):
            assert kind is aiohttp.WSMsgType.TEXT
            self.heartbeats += len(events)
            return
        (frame,) = events  # one frame per message
        assert isinstance(frame, Frame)
        try:
            raw.decode()
            expected = aiohttp.WSMsgType.TEXT
        except UnicodeDecodeError:
            expected = aiohttp.WSMsgType.BINARY
        assert kind is expected, (frame.command, kind)
        self.kinds.append((frame.command, kind))
        (self.messages if frame.command == "MESSAGE" else self.other).append(frame)

    async def expect(self, command: str, timeout: float = TIMEOUT) -> Frame:
        async with asyncio.timeout(timeout):
            while not self.other:
                await self.read_one()
        frame = self.other.popleft()
        assert frame.command == command, f"expected {command}, got {frame}"
        return frame

    async def receive(self, count: int = 1, timeout: float = TIMEOUT) -> list[Frame]:
        async with asyncio.timeout(timeout):
            while len(self.messages) < count:
                await self.read_one()
        return [self.messages.popleft() for _ in range(count)]

    def drain(self) -> list[Frame]:
        taken = list(self.messages)
        self.messages.clear()
        return taken

    async def expect_closed(self, timeout: float = TIMEOUT) -> int | None:
        """Read until the broker closes; the close code."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await self.read_one()
                except Closed:
                    return self.ws.close_code

    async def close(self) -> None:
        await self.ws.close()
