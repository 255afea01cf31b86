"""Properties of the STOMP codec over generated frames, streams and garbage."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.errors import RemoteProtocolError
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    UNESCAPED_COMMANDS,
    AckRun,
    Frame,
    HeartBeat,
    StompVersion,
)

Event = Frame | HeartBeat | AckRun

COMMANDS = sorted(CLIENT_COMMANDS | SERVER_COMMANDS)
VERSIONS = [None, StompVersion.V1_0, StompVersion.V1_1, StompVersion.V1_2]
# Characters with a meaning to the frame format or the encoder, drawn often so that escaping gets
# exercised.
FORMAT_CHARACTERS = ["\\", ":", "\n", "\r", "c", "n", "r", "\0", "\1"]


def texts(excluded: str, *, min_size: int = 0) -> st.SearchStrategy[str]:
    """Text without the characters in `excluded`, rich in the frame format's own characters."""
    allowed = [char for char in FORMAT_CHARACTERS if char not in excluded]
    alphabet = st.sampled_from(allowed) | st.characters(codec="utf-8", exclude_characters=excluded)
    return st.text(alphabet=alphabet, min_size=min_size, max_size=12)


def frames(version: StompVersion | None) -> st.SearchStrategy[Frame]:
    """Frames whose every header `version` can carry, with unique names."""

    @st.composite
    def build(draw: st.DrawFn) -> Frame:
        command = draw(st.sampled_from(COMMANDS) | st.from_regex(r"[A-Z]{1,12}", fullmatch=True))
        if command in UNESCAPED_COMMANDS or version is StompVersion.V1_0:
            names, values = texts("\n\r:", min_size=1), texts("\n\r")
        elif version is StompVersion.V1_1:
            names, values = texts("\r", min_size=1), texts("\r")
        else:
            names, values = texts("", min_size=1), texts("")
        headers = draw(
            st.dictionaries(names.filter(lambda name: name != "content-length"), values, max_size=6)
        )
        body = draw(st.binary(max_size=40))
        return Frame(command, headers, body)

    return build()


def expected_after_decoding(frame: Frame) -> Frame:
    """`frame` as the decoder returns it: with the content-length the encoder adds."""
    if not frame.body:
        return frame
    return Frame(
        frame.command, {**frame.headers, "content-length": str(len(frame.body))}, frame.body
    )


def feed(decoder: FrameDecoder, chunks: list[bytes]) -> list[Event]:
    events: list[Event] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        while (event := decoder.next_event()) is not None:
            events.append(event)
    return events


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (taken modulo its length, in any order)."""
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    bounds = [0, *points, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_round_trip(version: StompVersion | None, data: st.DataObject) -> None:
    frame = data.draw(frames(version))
    decoder = FrameDecoder(version=version)
    assert feed(decoder, [encode_frame(frame, version)]) == [expected_after_decoding(frame)]
    assert decoder.buffered == 0


def with_crlf(wire: bytes) -> bytes:
    """An encoded 1.2 frame with every header-section line ending in CR LF instead."""
    head, _, rest = wire.partition(b"\n\n")
    return head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + rest


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    """Encoded 1.2 frames and heart-beats, and the events they stand for."""
    parts: list[bytes] = []
    events: list[Event] = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        if draw(st.booleans()):
            parts.append(draw(st.sampled_from([b"\n", b"\r\n"])))
            events.append(HEARTBEAT)
        else:
            frame = draw(frames(StompVersion.V1_2))
            wire = encode_frame(frame, StompVersion.V1_2)
            parts.append(with_crlf(wire) if draw(st.booleans()) else wire)
            events.append(expected_after_decoding(frame))
    return b"".join(parts), events


@settings(max_examples=200, deadline=None)
@given(stream=streams(), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_any_split_gives_the_same_events(
    stream: tuple[bytes, list[Event]], cuts: list[int]
) -> None:
    data, events = stream
    assert feed(FrameDecoder(), [data]) == events
    assert feed(FrameDecoder(), split(data, cuts)) == events


@settings(max_examples=50, deadline=None)
@given(stream=streams())
def test_byte_by_byte_gives_the_same_events(stream: tuple[bytes, list[Event]]) -> None:
    data, events = stream
    assert feed(FrameDecoder(), [data[i : i + 1] for i in range(len(data))]) == events


def flattened(events: list[Event]) -> list[Event]:
    """`events` with each AckRun as the ACK frames it stands for, and no heart-beats (a run takes
    in the EOLs after its frames)."""
    flat: list[Event] = []
    for event in events:
        if isinstance(event, AckRun):
            flat.extend(Frame("ACK", {"id": ack_id}) for ack_id in event.ids)
        elif event is not HEARTBEAT:
            flat.append(event)
    return flat


def with_ack_runs(decoder: FrameDecoder) -> FrameDecoder:
    decoder.ack_runs = True
    return decoder


ack_ids = texts("", min_size=1) | st.from_regex(r"[0-9]{1,3}/[ -~]{1,30}", fullmatch=True)


@st.composite
def ack_streams(draw: st.DrawFn) -> bytes:
    """1.2 streams rich in ACK frames: plain ones, ones with escapes or CR LF, other frames."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        kind = draw(st.integers(min_value=0, max_value=4))
        if kind == 0:
            parts.append(draw(streams())[0])
            continue
        headers = {"id": draw(ack_ids)}
        if kind == 1:
            headers["receipt"] = "r"
        wire = encode_frame(Frame("ACK", headers), StompVersion.V1_2)
        parts.append(with_crlf(wire) if kind == 2 else wire)
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(data=ack_streams(), cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_ack_runs_stand_for_the_same_frames(data: bytes, cuts: list[int]) -> None:
    expected = flattened(feed(FrameDecoder(version=StompVersion.V1_2), [data]))
    decoder = with_ack_runs(FrameDecoder(version=StompVersion.V1_2))
    events = feed(decoder, split(data, cuts))
    assert flattened(events) == expected
    assert decoder.buffered == 0
    # Only plain ACKs (an id of printable ASCII without a backslash, LF line ends) form a run.
    for event in events:
        if isinstance(event, AckRun):
            assert event.ids
            assert all(ack_id.isascii() and ack_id.isprintable() for ack_id in event.ids)
            assert not any("\\" in ack_id for ack_id in event.ids)


# Pieces of frames, valid and broken, that steer random bytes into every state of the decoder.
FRAGMENTS = [
    b"SEND\n",
    b"MESSAGE\n",
    b"CONNECT\n",
    b"ACK\n",
    b"id:1/m\n",
    b"k:v\n",
    b"k:w\r\n",
    b"a\\cb:c\\nd\n",
    b"x:\\t\n",
    b"n:\xff\n",
    b"content-length:3\n",
    b"content-length:0\n",
    b"content-length:-1\n",
    b"content-length:99\n",
    b"\n",
    b"\r\n",
    b"\r",
    b"\0",
    b"body",
    b":",
    b"\\",
    b"x" * 20,
]
MAX_FRAME_SIZE = 96


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """A valid stream with a few bytes replaced, inserted or deleted."""
    data = bytearray(draw(streams())[0])
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        width = draw(st.integers(min_value=0, max_value=2))
        data[at : at + width] = draw(st.binary(max_size=3))
    return bytes(data)


garbage = st.lists(st.sampled_from(FRAGMENTS) | st.binary(max_size=8), max_size=40).map(b"".join)


def fuzz_decoder(version: StompVersion | None) -> FrameDecoder:
    return FrameDecoder(
        max_frame_size=MAX_FRAME_SIZE, max_header_count=4, max_header_length=24, version=version
    )


def feed_bounded(decoder: FrameDecoder, chunks: list[bytes]) -> tuple[list[Event], bool]:
    """Feed `chunks`, checking the buffer bound; the events and whether an error was raised."""
    events: list[Event] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        try:
            while (event := decoder.next_event()) is not None:
                events.append(event)
        except RemoteProtocolError as exc:
            error = exc
        else:
            # Drained without error: what is left is one partial frame (or a lone CR).
            assert decoder.buffered < MAX_FRAME_SIZE
            continue
        with pytest.raises(RemoteProtocolError) as again:
            decoder.next_event()
        assert again.value is error  # poisoned: the same error, every time
        return events, True
    return events, False


@settings(max_examples=400, deadline=None)
@given(
    data=garbage | mutated_streams() | ack_streams() | st.binary(max_size=200),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    bytewise=st.booleans(),
    version=st.sampled_from(VERSIONS),
)
def test_garbage_only_raises_remote_protocol_errors(
    data: bytes, cuts: list[int], bytewise: bool, version: StompVersion | None
) -> None:
    chunks = [data[i : i + 1] for i in range(len(data))] if bytewise else split(data, cuts)
    chunked = feed_bounded(fuzz_decoder(version), chunks)
    # Limits are enforced as soon as bytes prove them exceeded, so where the stream is cut
    # changes neither the events nor whether it fails.
    assert chunked == feed_bounded(fuzz_decoder(version), [data])
    # Reading runs of plain ACKs keeps every limit and error, wherever the stream is cut.
    events, failed = feed_bounded(with_ack_runs(fuzz_decoder(version)), chunks)
    assert (flattened(events), failed) == (flattened(chunked[0]), chunked[1])
