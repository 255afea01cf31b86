"""The load generator's STOMP stream: frames queued go out together, in one write."""

from __future__ import annotations

import asyncio

import pytest

from sluiceway.bench.stream import BATCH_BYTES, StompStream
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from tests.e2e.support import eventually, loop_turns


async def _pair() -> tuple[StompStream, asyncio.Queue[bytes], asyncio.Server]:
    """A stream connected to a local server that reports each chunk it reads."""
    chunks: asyncio.Queue[bytes] = asyncio.Queue()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 20):
            await chunks.put(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return await StompStream.connect(port), chunks, server


MARK = b"\n\n"  # written past the stream's batch, straight to its socket: not a frame


async def _written_before_mark(stream: StompStream, chunks: asyncio.Queue[bytes]) -> bytes:
    """What the server read ahead of a mark written to the socket now, past the batch.

    TCP keeps the order: anything the stream wrote before reaches the server first.
    """
    stream.transport.write(MARK)
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


async def _server_writing(
    data: bytes,
) -> tuple[StompStream, asyncio.Server, list[asyncio.StreamWriter]]:
    """A stream connected to a local server that writes `data` to it at once."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        writer.write(data)
        await reader.read()  # until the stream hangs up
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    stream = await StompStream.connect(server.sockets[0].getsockname()[1])
    await eventually(lambda: bool(writers))
    return stream, server, writers


READ_MAX = 256 * 1024  # the most asyncio's transport takes in one read


def test_reading_stops_while_nobody_takes_the_frames() -> None:
    """Frames nobody asked for stay in the kernel, not in the decoder; none is lost."""

    async def run() -> None:
        frames = [_message(n, b"x" * 1000) for n in range(8000)]  # about 8 MB
        data = b"".join(encode_frame(f, StompVersion.V1_2) for f in frames)
        stream, server, writers = await _server_writing(data)
        # The server cannot write it all: the stream stopped reading.
        await eventually(lambda: writers[0].transport.get_write_buffer_size() > 0)
        await loop_turns(20)
        assert 0 < stream.decoder.buffered <= READ_MAX
        assert not stream.reading
        got = [int((await asyncio.wait_for(stream.next_frame(), 5)).headers["n"]) for _ in frames]
        assert got == list(range(8000))
        await stream.close()
        server.close()

    asyncio.run(run())


def test_frames_go_to_the_data_callback_as_they_are_read() -> None:
    async def run() -> None:
        data = b"".join(encode_frame(_message(n, b"y"), StompVersion.V1_2) for n in range(50))
        stream, server, _ = await _server_writing(data)
        got: list[int] = []

        def take() -> None:
            while (event := stream.decoder.next_event()) is not None:
                assert isinstance(event, Frame)
                got.append(int(event.headers["n"]))

        stream.on_data = take
        take()  # anything read before the callback was set
        await eventually(lambda: len(got) == 50)
        assert got == list(range(50))
        await stream.close()
        server.close()

    asyncio.run(run())


def test_drain_waits_while_the_peer_does_not_read() -> None:
    async def run() -> None:
        resume = asyncio.Event()
        read: list[int] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await resume.wait()  # read nothing until told
            while data := await reader.read(1 << 20):
                read.append(len(data))
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        stream = await StompStream.connect(server.sockets[0].getsockname()[1])
        body = b"z" * 60_000
        for n in range(200):  # about 12 MB: more than the kernel's buffers and WRITE_BUFFER_HIGH
            stream.queue(_send(n, body))
        stream.flush()

        def writable() -> bool:  # read afresh each time: mypy would narrow the property
            return stream.writable

        assert not writable()
        draining = asyncio.ensure_future(stream.drain())
        await loop_turns(20)
        assert not draining.done()
        resume.set()
        await asyncio.wait_for(draining, 5)
        assert writable()
        await stream.close()
        await eventually(lambda: sum(read) >= 200 * 60_000)
        server.close()

    asyncio.run(run())


def test_a_lost_connection_reaches_the_callback_and_ends_next_frame() -> None:
    async def run() -> None:
        stream, server, writers = await _server_writing(b"")
        calls: list[Exception | None] = []
        stream.on_data = lambda: calls.append(stream.lost)
        writers[0].close()  # the broker hangs up
        await eventually(lambda: bool(calls))
        assert isinstance(calls[0], ConnectionError)
        with pytest.raises(ConnectionError, match="closed the connection"):
            await asyncio.wait_for(stream.next_frame(), 5)
        await asyncio.wait_for(stream.close(), 5)  # already closed: returns at once
        server.close()

    asyncio.run(run())


def _message(n: int, body: bytes) -> Frame:
    return Frame("MESSAGE", {"destination": "/queue/q", "n": str(n)}, body)
