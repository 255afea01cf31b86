"""Byte tables for the STOMP codec: what each input decodes to, and what each frame encodes to."""

from __future__ import annotations

import itertools

import pytest

from sluiceway.errors import FrameLimitExceeded, LocalProtocolError, RemoteProtocolError
from sluiceway.protocol.codec import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_COUNT,
    DEFAULT_MAX_HEADER_LENGTH,
    HEARTBEAT_BYTES,
    FrameDecoder,
    encode_frame,
)
from sluiceway.protocol.frames import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    SERVER_COMMANDS,
    AckRun,
    Frame,
    HeartBeat,
    StompVersion,
)

V10 = StompVersion.V1_0
V11 = StompVersion.V1_1
V12 = StompVersion.V1_2
ALL_VERSIONS = [None, V10, V11, V12]

Event = Frame | HeartBeat | AckRun


def drain(decoder: FrameDecoder) -> list[Event]:
    events: list[Event] = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events


def decode_all(
    data: bytes,
    version: StompVersion | None = None,
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_header_count: int = DEFAULT_MAX_HEADER_COUNT,
    max_header_length: int = DEFAULT_MAX_HEADER_LENGTH,
) -> list[Event]:
    decoder = FrameDecoder(
        version=version,
        max_frame_size=max_frame_size,
        max_header_count=max_header_count,
        max_header_length=max_header_length,
    )
    decoder.receive_data(data)
    return drain(decoder)


# --- every command -------------------------------------------------------------------------------

COMMAND_CASES = [
    pytest.param(
        b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:broker.example\nheart-beat:0,10000\n\n\0",
        Frame(
            "CONNECT",
            {"accept-version": "1.0,1.1,1.2", "host": "broker.example", "heart-beat": "0,10000"},
        ),
        id="CONNECT",
    ),
    pytest.param(
        b"STOMP\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0",
        Frame(
            "STOMP", {"accept-version": "1.2", "host": "/", "login": "guest", "passcode": "guest"}
        ),
        id="STOMP",
    ),
    pytest.param(
        b"CONNECTED\nversion:1.2\nsession:s-1\nserver:sluiceway/0.1\nheart-beat:10000,0\n\n\0",
        Frame(
            "CONNECTED",
            {
                "version": "1.2",
                "session": "s-1",
                "server": "sluiceway/0.1",
                "heart-beat": "10000,0",
            },
        ),
        id="CONNECTED",
    ),
    pytest.param(
        b"SEND\ndestination:/queue/a\ncontent-type:text/plain\ncontent-length:5\n\nhello\0",
        Frame(
            "SEND",
            {"destination": "/queue/a", "content-type": "text/plain", "content-length": "5"},
            b"hello",
        ),
        id="SEND",
    ),
    pytest.param(
        b"SUBSCRIBE\nid:0\ndestination:/topic/t\nack:client-individual\n\n\0",
        Frame("SUBSCRIBE", {"id": "0", "destination": "/topic/t", "ack": "client-individual"}),
        id="SUBSCRIBE",
    ),
    pytest.param(b"UNSUBSCRIBE\nid:0\n\n\0", Frame("UNSUBSCRIBE", {"id": "0"}), id="UNSUBSCRIBE"),
    pytest.param(
        b"ACK\nid:m-1\ntransaction:tx1\n\n\0",
        Frame("ACK", {"id": "m-1", "transaction": "tx1"}),
        id="ACK",
    ),
    pytest.param(b"NACK\nid:m-2\n\n\0", Frame("NACK", {"id": "m-2"}), id="NACK"),
    pytest.param(
        b"BEGIN\ntransaction:tx1\n\n\0", Frame("BEGIN", {"transaction": "tx1"}), id="BEGIN"
    ),
    pytest.param(
        b"COMMIT\ntransaction:tx1\n\n\0", Frame("COMMIT", {"transaction": "tx1"}), id="COMMIT"
    ),
    pytest.param(
        b"ABORT\ntransaction:tx1\n\n\0", Frame("ABORT", {"transaction": "tx1"}), id="ABORT"
    ),
    pytest.param(
        b"DISCONNECT\nreceipt:77\n\n\0", Frame("DISCONNECT", {"receipt": "77"}), id="DISCONNECT"
    ),
    pytest.param(
        b"MESSAGE\nsubscription:0\nmessage-id:m-1\ndestination:/queue/a\nack:a-1\n\nbody\0",
        Frame(
            "MESSAGE",
            {"subscription": "0", "message-id": "m-1", "destination": "/queue/a", "ack": "a-1"},
            b"body",
        ),
        id="MESSAGE",
    ),
    pytest.param(
        b"RECEIPT\nreceipt-id:77\n\n\0", Frame("RECEIPT", {"receipt-id": "77"}), id="RECEIPT"
    ),
    pytest.param(
        b"ERROR\nmessage:malformed frame\ncontent-type:text/plain\n\nwhat went wrong\0",
        Frame(
            "ERROR",
            {"message": "malformed frame", "content-type": "text/plain"},
            b"what went wrong",
        ),
        id="ERROR",
    ),
]


def test_command_table_covers_every_command() -> None:
    covered = {
        value.command
        for param in COMMAND_CASES
        for value in param.values
        if isinstance(value, Frame)
    }
    assert covered == CLIENT_COMMANDS | SERVER_COMMANDS


@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize(("data", "frame"), COMMAND_CASES)
def test_decodes_every_command(data: bytes, frame: Frame, version: StompVersion | None) -> None:
    assert decode_all(data, version) == [frame]


@pytest.mark.parametrize(("data", "frame"), COMMAND_CASES)
def test_decodes_every_command_with_crlf_lines(data: bytes, frame: Frame) -> None:
    head, _, body = data.partition(b"\n\n")
    crlf = head.replace(b"\n", b"\r\n") + b"\r\n\r\n" + body
    assert decode_all(crlf, V12) == [frame]


# --- value escapes -------------------------------------------------------------------------------

ESCAPE_CASES = [
    # STOMP 1.2: \r \n \c \\ in names and values.
    pytest.param(
        V12, b"SEND\na\\cb:c\\\\d\\ne\\rf\n\n\0", {"a:b": "c\\d\ne\rf"}, id="1.2-all-escapes"
    ),
    pytest.param(V12, b"SEND\nk\\n\\r:v\n\n\0", {"k\n\r": "v"}, id="1.2-escapes-in-name"),
    pytest.param(V12, b"SEND\nk:\\\\c\n\n\0", {"k": "\\c"}, id="1.2-escaped-backslash-then-c"),
    pytest.param(
        None, b"SEND\na\\cb:c\\\\d\\ne\\rf\n\n\0", {"a:b": "c\\d\ne\rf"}, id="none-is-1.2"
    ),
    # STOMP 1.1: the same without \r.
    pytest.param(V11, b"SEND\na\\cb:c\\\\d\\ne\n\n\0", {"a:b": "c\\d\ne"}, id="1.1-all-escapes"),
    # STOMP 1.0: a backslash is an ordinary character.
    pytest.param(
        V10, b"SEND\nk\\c:a\\nb\\c\\t\\\n\n\0", {"k\\c": "a\\nb\\c\\t\\"}, id="1.0-no-escapes"
    ),
    # CONNECT, STOMP and CONNECTED are never unescaped, whatever the version.
    pytest.param(V12, b"CONNECT\nlogin:a\\cb\\t\n\n\0", {"login": "a\\cb\\t"}, id="CONNECT-raw"),
    pytest.param(V11, b"STOMP\npasscode:p\\\\w\n\n\0", {"passcode": "p\\\\w"}, id="STOMP-raw"),
    pytest.param(None, b"CONNECTED\nserver:s\\n\\\n\n\0", {"server": "s\\n\\"}, id="CONNECTED-raw"),
]


@pytest.mark.parametrize(("version", "data", "headers"), ESCAPE_CASES)
def test_unescapes_per_version(
    version: StompVersion | None, data: bytes, headers: dict[str, str]
) -> None:
    [frame] = decode_all(data, version)
    assert isinstance(frame, Frame)
    assert frame.headers == headers


def test_version_applies_from_the_next_frame() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"CONNECTED\nversion:1.0\n\n\0SEND\nk:a\\tb\n\n\0")
    assert decoder.next_event() == Frame("CONNECTED", {"version": "1.0"})
    decoder.version = V10
    assert decoder.next_event() == Frame("SEND", {"k": "a\\tb"})


# --- line endings, heart-beats, bodies, header rules --------------------------------------------

STRUCTURE_CASES = [
    pytest.param(
        b"SEND\r\ndestination:/q\r\n\r\nhi\0",
        [Frame("SEND", {"destination": "/q"}, b"hi")],
        id="crlf-lines",
    ),
    pytest.param(
        b"SEND\r\na:1\nb:2\r\n\nx\0",
        [Frame("SEND", {"a": "1", "b": "2"}, b"x")],
        id="mixed-lf-and-crlf",
    ),
    pytest.param(b"SEND\nk:v\r\r\n\n\0", [Frame("SEND", {"k": "v\r"})], id="only-one-cr-dropped"),
    pytest.param(b"SEND\nk:a\rb\n\n\0", [Frame("SEND", {"k": "a\rb"})], id="inner-cr-kept"),
    pytest.param(b"SEND\nk:a\0b\n\n\0", [Frame("SEND", {"k": "a\0b"})], id="nul-in-header-kept"),
    pytest.param(
        b"\n\r\n\nDISCONNECT\n\n\0",
        [HEARTBEAT, HEARTBEAT, HEARTBEAT, Frame("DISCONNECT")],
        id="heart-beats-before",
    ),
    pytest.param(
        b"BEGIN\ntransaction:t\n\n\0\n\r\nCOMMIT\ntransaction:t\n\n\0\n",
        [
            Frame("BEGIN", {"transaction": "t"}),
            HEARTBEAT,
            HEARTBEAT,
            Frame("COMMIT", {"transaction": "t"}),
            HEARTBEAT,
        ],
        id="heart-beats-between-and-after",
    ),
    pytest.param(b"\n", [HEARTBEAT], id="heart-beat-alone"),
    pytest.param(
        b"SEND\ncontent-length:5\n\na\0b\0c\0",
        [Frame("SEND", {"content-length": "5"}, b"a\0b\0c")],
        id="content-length-body-with-nul",
    ),
    pytest.param(
        b"SEND\ncontent-length:0\n\n\0",
        [Frame("SEND", {"content-length": "0"})],
        id="content-length-zero",
    ),
    pytest.param(
        b"SEND\ncontent-length:002\n\n\n\n\0",
        [Frame("SEND", {"content-length": "002"}, b"\n\n")],
        id="content-length-leading-zeros-body-of-eols",
    ),
    pytest.param(
        b"SEND\n\nno length here\0", [Frame("SEND", {}, b"no length here")], id="body-to-nul"
    ),
    pytest.param(b"SEND\n\n\r\n\xff\0", [Frame("SEND", {}, b"\r\n\xff")], id="binary-body-to-nul"),
    pytest.param(
        b"MESSAGE\nfoo:1\nfoo:2\nbar:x\nfoo:3\n\n\0",
        [Frame("MESSAGE", {"foo": "1", "bar": "x"})],
        id="repeated-header-first-wins",
    ),
    pytest.param(
        b"SEND\ncontent-length:1\ncontent-length:3\n\nA\0",
        [Frame("SEND", {"content-length": "1"}, b"A")],
        id="repeated-content-length-first-wins",
    ),
    pytest.param(
        b"SEND\ndestination:a:b::c\n\n\0",
        [Frame("SEND", {"destination": "a:b::c"})],
        id="colon-inside-value",
    ),
    pytest.param(b"SEND\nempty:\n\n\0", [Frame("SEND", {"empty": ""})], id="empty-value"),
    pytest.param(
        "SEND\nnäme:välue ✓\n\n\0".encode(),
        [Frame("SEND", {"näme": "välue ✓"})],
        id="utf-8-header",
    ),
    pytest.param(b"X\n\n\0", [Frame("X")], id="unknown-command-is-the-session's-business"),
]


@pytest.mark.parametrize(("data", "events"), STRUCTURE_CASES)
def test_decodes_structure(data: bytes, events: list[Event]) -> None:
    assert decode_all(data) == events


def test_events_need_complete_input() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"\r")
    assert decoder.next_event() is None
    decoder.receive_data(b"\n")
    assert decoder.next_event() == HEARTBEAT
    for partial in (b"SEND", b"\n", b"k:v", b"\r", b"\n", b"\r\n", b"bo", b"dy"):
        decoder.receive_data(partial)
        assert decoder.next_event() is None
    decoder.receive_data(b"\0")
    assert decoder.next_event() == Frame("SEND", {"k": "v"}, b"body")
    assert decoder.next_event() is None


def test_content_length_body_waits_for_every_byte() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"SEND\ncontent-length:4\n\n\0\0\0")
    assert decoder.next_event() is None
    decoder.receive_data(b"\0")
    assert decoder.next_event() is None
    decoder.receive_data(b"\0")
    assert decoder.next_event() == Frame("SEND", {"content-length": "4"}, b"\0\0\0\0")


def test_buffered_counts_partial_frames_whole() -> None:
    decoder = FrameDecoder()
    assert decoder.buffered == 0
    decoder.receive_data(b"\nSEND\nk:v\n")
    assert decoder.next_event() == HEARTBEAT
    assert decoder.next_event() is None
    assert decoder.buffered == len(b"SEND\nk:v\n")
    decoder.receive_data(b"\nbody")
    assert decoder.next_event() is None
    assert decoder.buffered == len(b"SEND\nk:v\n\nbody")
    decoder.receive_data(b"\0\r")
    assert decoder.next_event() == Frame("SEND", {"k": "v"}, b"body")
    assert decoder.next_event() is None
    assert decoder.buffered == 1  # a CR that may start a CRLF heart-beat


def test_long_streams_survive_buffer_compaction() -> None:
    frame = Frame("SEND", {"destination": "/queue/a", "content-length": "1000"}, b"x" * 1000)
    wire = encode_frame(frame) * 200 + b"\n" * 70_000
    decoder = FrameDecoder()
    decoder.receive_data(wire + b"SEND\ndestination:/q")
    events = drain(decoder)
    assert events == [frame] * 200 + [HEARTBEAT] * 70_000
    decoder.receive_data(b"ueue/b\n\n" + b"y" * 100)  # compacts while the frame is partial
    assert decoder.next_event() is None
    decoder.receive_data(b"\0")
    assert decoder.next_event() == Frame("SEND", {"destination": "/queue/b"}, b"y" * 100)
    assert decoder.buffered == 0


def test_large_body_without_content_length_arrives_in_pieces() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"SEND\n\n")
    for _ in range(100):
        decoder.receive_data(b"z" * 1000)
        assert decoder.next_event() is None
    decoder.receive_data(b"\0")
    assert decoder.next_event() == Frame("SEND", {}, b"z" * 100_000)


LARGE = Frame("SEND", {"destination": "/queue/big", "content-length": "200000"}, b"b" * 200_000)
AFTER = Frame("SEND", {"destination": "/queue/small", "content-length": "3"}, b"abc")


@pytest.mark.parametrize(
    "cuts",
    [
        [30, 65_000, 130_000, 200_040],  # the last chunk ends the body, its NUL, and a frame
        [10, 20],  # the head in pieces, then everything else at once
        [200_032, 200_033],  # a chunk ending just before the NUL, one holding the NUL alone
        list(range(0, 200_100, 4096)),  # socket-sized chunks
    ],
)
def test_a_large_body_kept_in_chunks_gives_the_same_frames(cuts: list[int]) -> None:
    wire = encode_frame(LARGE) + b"\n" + encode_frame(AFTER) + encode_frame(LARGE)
    whole = FrameDecoder()
    whole.receive_data(wire)
    expected = drain(whole)
    assert expected == [LARGE, HEARTBEAT, AFTER, LARGE]
    decoder = FrameDecoder()
    events = []
    edges = [0, *cuts, len(wire)]
    for start, end in itertools.pairwise(edges):
        decoder.receive_data(wire[start:end])
        assert decoder.buffered <= end  # what is held counts, chunks kept aside included
        events += drain(decoder)
    assert events == expected
    assert decoder.buffered == 0


def test_chunks_received_before_the_decoder_is_asked_are_all_kept() -> None:
    wire = encode_frame(LARGE) + encode_frame(AFTER)
    decoder = FrameDecoder()
    decoder.receive_data(wire[:100_000])
    assert decoder.next_event() is None
    for start in range(100_000, len(wire), 10_000):
        decoder.receive_data(wire[start : start + 10_000])
    assert decoder.buffered == len(wire)
    assert drain(decoder) == [LARGE, AFTER]


def test_a_large_body_longer_than_its_content_length_is_refused() -> None:
    wire = encode_frame(LARGE)[:-1] + b"X\0"
    decoder = FrameDecoder()
    decoder.receive_data(wire[:1000])
    assert decoder.next_event() is None
    decoder.receive_data(wire[1000:])
    with pytest.raises(RemoteProtocolError, match="200000 bytes: byte b'X' follows"):
        decoder.next_event()


# --- malformed input -----------------------------------------------------------------------------

ERROR_CASES = [
    pytest.param(None, b"send\n\n\0", r"malformed command line b'send'", id="lower-case-command"),
    pytest.param(None, b"SE ND\n\n\0", r"malformed command line b'SE ND'", id="space-in-command"),
    pytest.param(None, b"S3ND\n\n\0", r"malformed command line b'S3ND'", id="digit-in-command"),
    pytest.param(None, b"\x00\x01\n", r"malformed command line b'\\x00\\x01'", id="binary-command"),
    pytest.param(None, b"\r\r\n", r"malformed command line b'\\r'", id="cr-command"),
    pytest.param(
        None, b"SEND:x\n\n\0", r"malformed command line b'SEND:x'", id="header-as-command"
    ),
    pytest.param(
        None,
        b"A" * 30 + b"-" * 30 + b"\n",
        r"malformed command line b'A{30}-{10}'\.\.\.",
        id="long-command-quote-truncated",
    ),
    pytest.param(None, b"SEND\nfoo\n\n\0", r"header line b'foo' .*has no colon", id="no-colon"),
    pytest.param(None, b"SEND\n:bar\n\n\0", r"header line b':bar' .*empty name", id="empty-name"),
    pytest.param(None, b"SEND\nk:\xff\n\n\0", r"b'k:\\xff' .*not valid UTF-8", id="bad-utf8-value"),
    pytest.param(None, b"SEND\n\xc3(:v\n\n\0", r"not valid UTF-8", id="bad-utf8-name"),
    pytest.param(V12, b"SEND\nk:a\\tb\n\n\0", r"escape sequence '\\\\t'", id="1.2-tab-escape"),
    pytest.param(None, b"SEND\nk:a\\\n\n\0", r"escape sequence '\\\\'", id="1.2-lone-backslash"),
    pytest.param(V11, b"SEND\nk:a\\rb\n\n\0", r"escape sequence '\\\\r'", id="1.1-cr-escape"),
    pytest.param(V11, b"SEND\nk\\x:v\n\n\0", r"escape sequence '\\\\x'", id="1.1-bad-escape-name"),
    pytest.param(
        V12, b"MESSAGE\nk:\\\\\\q\n\n\0", r"escape sequence '\\\\q'", id="after-escaped-backslash"
    ),
    pytest.param(None, b"SEND\ncontent-length:abc\n\n\0", r"content-length 'abc'", id="cl-word"),
    pytest.param(None, b"SEND\ncontent-length:-1\n\n\0", r"content-length '-1'", id="cl-negative"),
    pytest.param(None, b"SEND\ncontent-length:+1\n\nx\0", r"content-length '\+1'", id="cl-plus"),
    pytest.param(None, b"SEND\ncontent-length: 1\n\nx\0", r"content-length ' 1'", id="cl-space"),
    pytest.param(None, b"SEND\ncontent-length:1.0\n\nx\0", r"content-length '1.0'", id="cl-dot"),
    pytest.param(None, b"SEND\ncontent-length:\n\n\0", r"content-length ''", id="cl-empty"),
    pytest.param(
        None, "SEND\ncontent-length:٣\n\nabc\0".encode(), r"content-length '٣'", id="cl-non-ascii"
    ),
    pytest.param(
        None,
        b"SEND\ncontent-length:2\n\nabc\0",
        r"body longer than its content-length of 2 bytes: byte b'c'",
        id="no-nul-after-body",
    ),
]


@pytest.mark.parametrize(("version", "data", "message"), ERROR_CASES)
def test_rejects_malformed_input(version: StompVersion | None, data: bytes, message: str) -> None:
    decoder = FrameDecoder(version=version)
    decoder.receive_data(data)
    with pytest.raises(RemoteProtocolError, match=message) as caught:
        drain(decoder)
    assert not isinstance(caught.value, FrameLimitExceeded)


def test_frames_before_an_error_are_delivered() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"BEGIN\ntransaction:t\n\n\0\nbad\n\n\0")
    assert decoder.next_event() == Frame("BEGIN", {"transaction": "t"})
    assert decoder.next_event() == HEARTBEAT
    with pytest.raises(RemoteProtocolError, match="malformed command"):
        decoder.next_event()


def test_error_poisons_the_decoder() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(b"SEND\nno colon\n\n\0")
    with pytest.raises(RemoteProtocolError) as first:
        decoder.next_event()
    decoder.receive_data(b"\nDISCONNECT\n\n\0")
    for _ in range(3):
        with pytest.raises(RemoteProtocolError) as again:
            decoder.next_event()
        assert again.value is first.value
    assert decoder.buffered == len(b"SEND\nno colon\n\n\0")  # later bytes are not kept


def test_limit_error_poisons_the_decoder() -> None:
    decoder = FrameDecoder(max_header_count=1)
    decoder.receive_data(b"SEND\na:1\nb:2\n\n\0")
    with pytest.raises(FrameLimitExceeded) as first:
        decoder.next_event()
    with pytest.raises(FrameLimitExceeded) as again:
        decoder.next_event()
    assert again.value is first.value


def test_receive_data_never_raises_even_on_garbage() -> None:
    decoder = FrameDecoder(max_frame_size=10, max_header_length=4)
    decoder.receive_data(b"\xff" * 100)
    decoder.receive_data(b"")
    assert decoder.buffered == 100


# --- limits --------------------------------------------------------------------------------------


def limit_error(
    chunks: list[bytes], *, size: int = 1000, count: int = 10, length: int = 100
) -> FrameLimitExceeded:
    """Feed `chunks` one by one, draining after each, and return the limit error raised."""
    decoder = FrameDecoder(max_frame_size=size, max_header_count=count, max_header_length=length)
    with pytest.raises(FrameLimitExceeded) as caught:  # noqa: PT012  (the raising chunk varies)
        for chunk in chunks:
            decoder.receive_data(chunk)
            drain(decoder)
    return caught.value


def test_header_line_at_the_limit_is_accepted() -> None:
    line = b"k:" + b"v" * 98
    assert decode_all(b"SEND\n" + line + b"\r\n\n\0", max_header_length=100) == [
        Frame("SEND", {"k": "v" * 98})
    ]


def test_header_line_over_the_limit() -> None:
    error = limit_error([b"SEND\nk:" + b"v" * 99 + b"\n\n\0"])
    assert error.limit == "imq.stomp.max_header_length"
    assert error.value == 100
    assert str(error) == (
        "header line of 101 bytes exceeds the limit of 100 bytes (imq.stomp.max_header_length)"
    )


def test_header_line_over_the_limit_is_refused_before_its_eol() -> None:
    error = limit_error([b"SEND\nk:" + b"v" * 99])
    assert error.limit == "imq.stomp.max_header_length"
    assert str(error) == (
        "header line of more than 100 bytes (101 received so far) exceeds the limit of 100 bytes "
        "(imq.stomp.max_header_length)"
    )


@pytest.mark.parametrize(
    ("size", "length", "longest"),
    [(1000, 100, 97), (30, 100, 20), (1000, 3, 0), (10, 100, 0)],
)
def test_a_run_of_acks_keeps_the_limits(size: int, length: int, longest: int) -> None:
    """An id fits when "id:" and it fit the header line and the whole frame (10 bytes more) the
    frame size; a longer one takes the general way, which refuses it."""
    decoder = FrameDecoder(max_frame_size=size, max_header_length=length)
    decoder.ack_runs = True
    fits = [f"1/{'m' * (longest - 2)}"] if longest > 2 else []
    decoder.receive_data(b"".join(b"ACK\nid:%s\n\n\0" % i.encode() for i in fits))
    assert drain(decoder) == ([AckRun(fits)] if fits else [])
    decoder.receive_data(b"ACK\nid:" + b"m" * (longest + 1) + b"\n\n\0")
    with pytest.raises(FrameLimitExceeded):
        drain(decoder)


def test_much_longer_header_line_gets_its_length() -> None:
    error = limit_error([b"SEND\nk:" + b"v" * 148 + b"\r\nnext:line\n"])
    assert str(error).startswith("header line of 150 bytes exceeds the limit of 100 bytes")


def test_line_at_the_limit_waits_on_a_trailing_cr() -> None:
    decoder = FrameDecoder(max_header_length=100)
    decoder.receive_data(b"SEND\nk:" + b"v" * 98 + b"\r")
    assert decoder.next_event() is None
    decoder.receive_data(b"\n\n\0")
    assert decoder.next_event() == Frame("SEND", {"k": "v" * 98})


def test_command_line_over_the_limit_is_refused_before_its_eol() -> None:
    error = limit_error([b"S" * 60, b"S" * 41], length=100)
    assert error.limit == "imq.stomp.max_header_length"
    assert str(error).startswith("command line of more than 100 bytes")


def test_header_count_at_the_limit_is_accepted() -> None:
    data = b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(10)) + b"\n\0"
    [frame] = decode_all(data, max_header_count=10)
    assert isinstance(frame, Frame)
    assert len(frame.headers) == 10


def test_header_count_over_the_limit() -> None:
    data = b"SEND\n" + b"".join(b"h:v\n" for _ in range(11)) + b"\n\0"
    error = limit_error([data], count=10)
    assert error.limit == "imq.stomp.max_header_count"
    assert error.value == 10
    assert str(error) == (
        "SEND frame with more than 10 header lines exceeds the limit of 10 "
        "(imq.stomp.max_header_count)"
    )


def test_header_count_over_the_limit_is_refused_before_the_line_ends() -> None:
    data = b"SEND\n" + b"".join(b"h:v\n" for _ in range(10)) + b"x"
    assert limit_error([data], count=10).limit == "imq.stomp.max_header_count"


def test_frame_at_the_size_limit_is_accepted() -> None:
    data = b"SEND\n\n" + b"x" * 93 + b"\0"
    assert len(data) == 100
    assert decode_all(data, max_frame_size=100) == [Frame("SEND", {}, b"x" * 93)]
    data = b"SEND\ncontent-length:75\n\n" + b"x" * 75 + b"\0"
    assert len(data) == 100
    assert len(decode_all(data, max_frame_size=100)) == 1


def test_frame_over_the_size_limit_without_content_length() -> None:
    error = limit_error([b"SEND\n\n" + b"x" * 94 + b"\0"], size=100)
    assert error.limit == "imq.stomp.max_frame_size"
    assert error.value == 100
    assert str(error) == (
        "frame of at least 101 bytes exceeds the limit of 100 bytes (imq.stomp.max_frame_size)"
    )


def test_frame_size_is_refused_before_the_nul_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    decoder.receive_data(b"SEND\n\n" + b"x" * 93)
    assert decoder.next_event() is None  # 99 bytes: the NUL may still make it 100
    decoder.receive_data(b"x")
    with pytest.raises(FrameLimitExceeded, match="max_frame_size"):
        decoder.next_event()


def test_content_length_over_the_size_limit_is_refused_before_the_body() -> None:
    head = b"SEND\ncontent-length:80000000\n\n"
    error = limit_error([head], size=DEFAULT_MAX_FRAME_SIZE)
    assert error.limit == "imq.stomp.max_frame_size"
    assert error.value == DEFAULT_MAX_FRAME_SIZE == 75497472
    assert str(error) == (
        f"frame of {len(head) + 80000000 + 1} bytes exceeds the limit of 75497472 bytes "
        "(imq.stomp.max_frame_size)"
    )


def test_content_length_with_too_many_digits() -> None:
    error = limit_error([b"SEND\ncontent-length:" + b"9" * 50 + b"\n\n"])
    assert error.limit == "imq.stomp.max_frame_size"
    assert "content-length of 50 digits" in str(error)


def test_content_length_with_many_leading_zeros_is_fine() -> None:
    data = b"SEND\ncontent-length:" + b"0" * 5000 + b"1\n\nx\0"
    [frame] = decode_all(data, max_header_length=6000)
    assert isinstance(frame, Frame)
    assert frame.body == b"x"


def test_header_block_over_the_size_limit_is_refused_before_its_end() -> None:
    # Also before the header count limit, which the frame would hit further on.
    data = b"SEND\n" + (b"h:" + b"v" * 40 + b"\n") * 20
    error = limit_error([data + b"\n\0"], size=100, count=10, length=100)
    assert error.limit == "imq.stomp.max_frame_size"


def test_partial_header_line_over_the_size_limit_is_refused_before_its_eol() -> None:
    decoder = FrameDecoder(max_frame_size=100, max_header_length=100)
    decoder.receive_data(b"SEND\nh:" + b"v" * 90)
    assert decoder.next_event() is None  # 97 bytes, then LF, LF and NUL: exactly 100
    decoder.receive_data(b"v")
    with pytest.raises(FrameLimitExceeded) as caught:
        decoder.next_event()
    assert caught.value.limit == "imq.stomp.max_frame_size"
    assert str(caught.value).startswith("frame of at least 101 bytes")


def test_header_only_frame_at_the_size_limit_is_accepted() -> None:
    data = b"SEND\nh:" + b"v" * 90 + b"\n\n\0"
    assert len(data) == 100
    assert decode_all(data, max_frame_size=100) == [Frame("SEND", {"h": "v" * 90})]


def test_complete_header_line_proving_the_frame_too_large() -> None:
    # 99 bytes up to this LF; the blank line and the NUL make at least 101.
    error = limit_error([b"SEND\nh:" + b"v" * 91 + b"\n"], size=100, length=100)
    assert str(error) == (
        "frame of at least 101 bytes exceeds the limit of 100 bytes (imq.stomp.max_frame_size)"
    )


def test_limit_defaults() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 70 * 1024 * 1024 + 256 * 8 * 1024
    assert DEFAULT_MAX_HEADER_COUNT == 256
    assert DEFAULT_MAX_HEADER_LENGTH == 8 * 1024


# --- encoding ------------------------------------------------------------------------------------

ENCODE_CASES = [
    pytest.param(
        Frame("SEND", {"destination": "/q"}, b"hi"),
        V12,
        b"SEND\ndestination:/q\ncontent-length:2\n\nhi\0",
        id="auto-content-length",
    ),
    pytest.param(Frame("DISCONNECT"), None, b"DISCONNECT\n\n\0", id="no-headers-no-body"),
    pytest.param(
        Frame("MESSAGE", {"content-length": "3", "destination": "/q"}, b"a\0b"),
        V12,
        b"MESSAGE\ncontent-length:3\ndestination:/q\n\na\0b\0",
        id="declared-content-length-kept-in-place",
    ),
    pytest.param(
        Frame("ACK", {"id": "m:1"}),
        V12,
        b"ACK\nid:m\\c1\n\n\0",
        id="1.2-colon-in-value",
    ),
    pytest.param(
        Frame("MESSAGE", {"a:b": "c\\d\ne\rf"}),
        V12,
        b"MESSAGE\na\\cb:c\\\\d\\ne\\rf\n\n\0",
        id="1.2-escapes",
    ),
    pytest.param(
        Frame("MESSAGE", {"a:b": "c\\d\ne\rf"}),
        None,
        b"MESSAGE\na\\cb:c\\\\d\\ne\\rf\n\n\0",
        id="none-is-1.2",
    ),
    pytest.param(
        Frame("MESSAGE", {"a:b": "c\\d\ne"}),
        V11,
        b"MESSAGE\na\\cb:c\\\\d\\ne\n\n\0",
        id="1.1-escapes",
    ),
    pytest.param(
        Frame("SEND", {"k": "a\\b:c"}, b"x"),
        V10,
        b"SEND\nk:a\\b:c\ncontent-length:1\n\nx\0",
        id="1.0-no-escapes",
    ),
    pytest.param(
        Frame("CONNECTED", {"version": "1.2", "server": "s\\1:2"}),
        V12,
        b"CONNECTED\nversion:1.2\nserver:s\\1:2\n\n\0",
        id="CONNECTED-unescaped",
    ),
    pytest.param(
        Frame("CONNECT", {"login": "a:b\\c"}),
        V11,
        b"CONNECT\nlogin:a:b\\c\n\n\0",
        id="CONNECT-unescaped",
    ),
    pytest.param(
        Frame("ERROR", {"message": "naïve ✓"}, "über".encode()),
        V12,
        "ERROR\nmessage:naïve ✓\ncontent-length:5\n\nüber\0".encode(),
        id="utf-8",
    ),
    pytest.param(Frame("SEND", {"empty": ""}), V12, b"SEND\nempty:\n\n\0", id="empty-value"),
    pytest.param(
        Frame("SEND", {"k:\0": "a\1:b", "x": "\0"}),
        V12,
        b"SEND\nk\\c\0:a\x01\\cb\nx:\0\n\n\0",
        id="nul-and-soh-beside-escapes",
    ),
]


@pytest.mark.parametrize(("frame", "version", "wire"), ENCODE_CASES)
def test_encodes(frame: Frame, version: StompVersion | None, wire: bytes) -> None:
    assert encode_frame(frame, version) == wire


@pytest.mark.parametrize(("frame", "version", "wire"), ENCODE_CASES)
def test_encoded_bytes_decode_back(frame: Frame, version: StompVersion | None, wire: bytes) -> None:
    [decoded] = decode_all(wire, version)
    assert isinstance(decoded, Frame)
    assert decoded.command == frame.command
    assert decoded.body == frame.body
    expected = dict(frame.headers)
    if frame.body:
        expected.setdefault("content-length", str(len(frame.body)))
    assert decoded.headers == expected


def test_heartbeat_bytes() -> None:
    assert HEARTBEAT_BYTES == b"\n"
    assert decode_all(HEARTBEAT_BYTES) == [HEARTBEAT]


REFUSED_CASES = [
    pytest.param(
        Frame("SEND", {"k": "a\rb"}), V11, r"'k'.*value.*carriage return.*1\.1", id="1.1-cr-value"
    ),
    pytest.param(
        Frame("SEND", {"k\r": "v"}), V11, r"'k\\r'.*name.*carriage return", id="1.1-cr-name"
    ),
    pytest.param(
        Frame("SEND", {"k": "a\nb"}), V10, r"'k'.*value.*line feed.*1\.0", id="1.0-lf-value"
    ),
    pytest.param(
        Frame("SEND", {"k": "a\rb"}), V10, r"'k'.*value.*carriage return", id="1.0-cr-value"
    ),
    pytest.param(Frame("SEND", {"k\n": "v"}), V10, r"'k\\n'.*name.*line feed", id="1.0-lf-name"),
    pytest.param(Frame("SEND", {"a:b": "v"}), V10, r"'a:b'.*name.*colon", id="1.0-colon-name"),
    pytest.param(
        Frame("CONNECT", {"login": "a\nb"}),
        V12,
        r"'login'.*value.*line feed.*unescaped CONNECT",
        id="CONNECT-lf-value",
    ),
    pytest.param(
        Frame("CONNECTED", {"a:b": "v"}), None, r"'a:b'.*name.*colon", id="CONNECTED-colon-name"
    ),
    pytest.param(
        Frame("SEND", {"content-length": "3"}, b"ab"),
        V12,
        r"content-length '3' but its body has 2 bytes",
        id="content-length-mismatch",
    ),
    pytest.param(
        Frame("SEND", {"content-length": "1"}),
        V12,
        r"content-length '1' but its body has 0 bytes",
        id="content-length-on-empty-body",
    ),
    pytest.param(
        Frame("SEND", {"content-length": "two"}, b"ab"),
        V12,
        r"content-length 'two'",
        id="content-length-not-a-number",
    ),
    pytest.param(Frame("send"), V12, r"command 'send'", id="lower-case-command"),
    pytest.param(Frame(""), V12, r"command ''", id="empty-command"),
    pytest.param(Frame("SE\nND"), V12, r"command 'SE\\nND'", id="lf-in-command"),
    pytest.param(
        Frame("SEND", {"k": "\udc80"}), V12, r"'k'.*value.*UTF-8", id="surrogate-in-value"
    ),
]


@pytest.mark.parametrize(("frame", "version", "message"), REFUSED_CASES)
def test_refuses_what_the_version_cannot_carry(
    frame: Frame, version: StompVersion | None, message: str
) -> None:
    with pytest.raises(LocalProtocolError, match=message):
        encode_frame(frame, version)


def test_a_command_of_non_ascii_capitals_is_malformed_whole_or_in_pieces() -> None:
    data = "SÉND\ndestination:/queue/q\n\n\0".encode()
    for chunks in ([data], [bytes([b]) for b in data]):
        decoder = FrameDecoder()
        for chunk in chunks:
            decoder.receive_data(chunk)
        with pytest.raises(RemoteProtocolError, match="malformed command line"):
            drain_events(decoder)


def drain_events(decoder: FrameDecoder) -> None:
    while decoder.next_event() is not None:
        pass
