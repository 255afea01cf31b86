"""The decoder's frame limit may change between frames, and the memory it holds is given back."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from sluiceway.errors import FrameLimitExceeded, RemoteProtocolError
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import AckRun, Frame, StompVersion

CONNECT = encode_frame(Frame("CONNECT", {"accept-version": "1.2"}))
BIG = 4 * 1024 * 1024


def frames(decoder: FrameDecoder) -> list[object]:
    events: list[object] = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events


def test_a_lower_first_limit_names_its_own_property() -> None:
    decoder = FrameDecoder(max_frame_size=100, frame_limit="imq.stomp.connect.max_frame_size")
    decoder.receive_data(b"CONNECT\ncontent-length:500\n\n")
    with pytest.raises(FrameLimitExceeded) as caught:
        decoder.next_event()
    assert caught.value.limit == "imq.stomp.connect.max_frame_size"
    assert caught.value.value == 100
    assert str(caught.value) == (
        "frame of 529 bytes exceeds the limit of 100 bytes (imq.stomp.connect.max_frame_size)"
    )


def test_a_large_frame_without_content_length_is_refused_as_it_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=100, frame_limit="imq.stomp.connect.max_frame_size")
    decoder.receive_data(b"CONNECT\n\n" + b"x" * 80)
    assert frames(decoder) == []
    decoder.receive_data(b"x" * 80)
    with pytest.raises(FrameLimitExceeded, match=r"connect\.max_frame_size"):
        decoder.next_event()


def test_the_limit_changes_from_the_next_frame_on() -> None:
    """A CONNECT and a large SEND in one read: once the CONNECT is taken, the SEND may be as
    large as the general limit allows."""
    send = encode_frame(Frame("SEND", {"destination": "/queue/a"}, b"y" * 5000))
    decoder = FrameDecoder(max_frame_size=200, frame_limit="imq.stomp.connect.max_frame_size")
    decoder.receive_data(CONNECT + send)
    assert decoder.next_event() == Frame("CONNECT", {"accept-version": "1.2"})
    decoder.limit_frames(10_000)
    assert decoder.next_event() == Frame(
        "SEND", {"destination": "/queue/a", "content-length": "5000"}, b"y" * 5000
    )
    decoder.receive_data(encode_frame(Frame("SEND", {}, b"z" * 20_000)))
    with pytest.raises(FrameLimitExceeded) as caught:
        decoder.next_event()
    assert caught.value.limit == "imq.stomp.max_frame_size"  # the default name


def test_ack_runs_follow_the_limit() -> None:
    """Plain ACKs read whole stay within the frame limit in force."""
    decoder = FrameDecoder(max_frame_size=20, version=StompVersion.V1_2)
    decoder.limit_frames(1000)
    decoder.ack_runs = True
    long_id = "i" * 100  # longer than a 20-byte frame could hold
    decoder.receive_data(b"ACK\nid:" + long_id.encode() + b"\n\n\0")
    assert frames(decoder) == [AckRun([long_id])]


def test_buffered_counts_the_partial_frame_whole() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"SEND\ncontent-length:1000\n\n" + b"x" * 300)
    assert frames(decoder) == []
    assert decoder.buffered == len(b"SEND\ncontent-length:1000\n\n") + 300


def test_release_drops_everything_and_parses_no_more() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"SEND\ncontent-length:1000\n\n" + b"x" * 300)
    assert frames(decoder) == []
    decoder.release()
    assert decoder.buffered == 0
    decoder.receive_data(b"x" * 700 + b"\0")
    assert decoder.buffered == 0  # not kept
    with pytest.raises(RemoteProtocolError, match="released"):
        decoder.next_event()


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def held_after(feed: list[bytes], decoder: FrameDecoder) -> int:
    """Bytes still allocated once `feed` has been decoded and its frames dropped. Each chunk is
    handed over as a fresh copy, as a socket read would make it: the decoder may keep it."""
    before = tracemalloc.get_traced_memory()[0]
    for chunk in feed:
        decoder.receive_data(bytes(bytearray(chunk)))
        frames(decoder)
    return tracemalloc.get_traced_memory()[0] - before


def chunks(data: bytes, size: int = 256 * 1024) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.usefixtures("traced")
def test_a_large_frame_read_gives_its_buffer_back_at_once() -> None:
    """An idle connection that sent one large frame keeps no large buffer."""
    decoder = FrameDecoder()
    big = encode_frame(Frame("SEND", {"destination": "/queue/a"}, b"x" * BIG))
    assert held_after(chunks(big), decoder) < 64 * 1024


@pytest.mark.usefixtures("traced")
def test_release_frees_a_large_partial_frame() -> None:
    decoder = FrameDecoder()
    head = b"SEND\ncontent-length:%d\n\n" % (2 * BIG)
    held = held_after([head, *chunks(b"x" * BIG)], decoder)
    assert held > BIG  # the partial frame is held...
    before = tracemalloc.get_traced_memory()[0]
    decoder.release()
    assert before - tracemalloc.get_traced_memory()[0] > BIG  # ...and given back
