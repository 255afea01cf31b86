"""The load generator's STOMP stream: frames queued go out together, in one write."""

from __future__ import annotations

import asyncio

from sluiceway.bench.stream import BATCH_BYTES, StompStream
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion


async def _pair() -> tuple[StompStream, asyncio.Queue[bytes], asyncio.Server]:
    """A stream connected to a local server that reports each chunk it reads."""
    chunks: asyncio.Queue[bytes] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 20):
            await chunks.put(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return StompStream(reader, writer), chunks, server


MARK = b"\n\n"  # written past the stream's batch, straight to its socket: not a frame


async def _written_before_mark(stream: StompStream, chunks: asyncio.Queue[bytes]) -> bytes:
    """What the server read ahead of a mark written to the socket now, past the batch.

    TCP keeps the order: anything the stream wrote before reaches the server first.
    """
    stream.writer.write(MARK)
    received = b""
    while not received.endswith(MARK):
        received += await asyncio.wait_for(chunks.get(), 5)
    return received[: -len(MARK)]


def _frames(data: bytes) -> list[Frame]:
    decoder = FrameDecoder()
    decoder.version = StompVersion.V1_2
    decoder.receive_data(data)
    frames = []
    while (event := decoder.next_event()) is not None:
        assert isinstance(event, Frame)
        frames.append(event)
    return frames


def test_queued_frames_wait_for_flush_and_leave_in_order() -> None:
    async def run() -> None:
        stream, chunks, server = await _pair()
        for i in range(3):
            stream.queue(Frame("ACK", {"id": str(i)}))
        assert await _written_before_mark(stream, chunks) == b""  # nothing before the flush
        stream.flush()
        received = b""
        while len(_frames(received)) < 3:
            received += await asyncio.wait_for(chunks.get(), 5)
        assert [f.headers["id"] for f in _frames(received)] == ["0", "1", "2"]
        stream.send(Frame("ACK", {"id": "now"}))  # send: written at once
        assert _frames(await asyncio.wait_for(chunks.get(), 5))[0].headers["id"] == "now"
        await stream.close()
        server.close()

    asyncio.run(run())


def test_a_full_batch_is_written_without_a_flush() -> None:
    async def run() -> None:
        stream, chunks, server = await _pair()
        body = b"x" * 1000
        frame_bytes = len(encode_frame(_send(0, body), StompVersion.V1_2))
        per_batch = -(-BATCH_BYTES // frame_bytes)  # frames that fill a batch
        for i in range(per_batch + 2):
            stream.queue(_send(i, body))
        received = await _written_before_mark(stream, chunks)
        assert len(_frames(received)) == per_batch  # the rest is still queued
        stream.flush()
        while len(_frames(received)) < per_batch + 2:
            received += await asyncio.wait_for(chunks.get(), 5)
        assert [int(f.headers["n"]) for f in _frames(received)] == list(range(per_batch + 2))
        await stream.close()
        server.close()

    asyncio.run(run())


def _send(n: int, body: bytes) -> Frame:
    return Frame("SEND", {"destination": "/queue/q", "n": str(n)}, body)
