"""Bad input over real sockets: each gets an ERROR that says what was wrong, then the connection is
closed, and nobody else notices. Ends with a fuzz test that throws random and mutated bytes at one
broker."""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.testing import BrokerThread
from tests.e2e.conftest import ClientFactory
from tests.e2e.rawclient import ConnectionClosed, RawClient
from tests.e2e.stomppy import connect, sync, with_receipt
from tests.e2e.support import wait_connection_count

WITNESS_QUEUE = "/queue/witness"


# -- helpers --------------------------------------------------------------------------------------


class Witness:
    """A client connected before the bad one; it must keep working afterwards."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.sent = 0
        client.subscribe(WITNESS_QUEUE, "witness", ack="auto")

    def check(self) -> None:
        self.sent += 1
        body = b"witness %d" % self.sent
        self.client.request("SEND", {"destination": WITNESS_QUEUE}, body)
        (message,) = self.client.receive(1)
        assert message.body == body


@pytest.fixture
def witness(raw: ClientFactory) -> Witness:
    return Witness(raw())


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    return encode_frame(Frame(command, headers or {}, body), StompVersion.V1_2)


@dataclass(frozen=True)
class Bad:
    """Bytes that must be refused: what the ERROR must say, and in which session they arrive."""

    data: bytes
    words: tuple[str, ...]  # must all appear in the ERROR body (case-insensitive)
    status: str = "400"
    version: str | None = "1.2"  # None: sent before any CONNECT
    extra: dict[str, str] = field(default_factory=dict)  # headers the ERROR must carry


SEND_OK = {"destination": "/queue/bad"}

CASES: dict[str, Bad] = {
    "lower-case command": Bad(
        b"send\ndestination:/queue/bad\n\nx\x00", ("malformed command", "upper-case")
    ),
    "header without colon": Bad(
        b"SEND\ndestination:/queue/bad\nnocolon\n\n\x00", ("nocolon", "no colon")
    ),
    "header with empty name": Bad(b"SEND\n:value\n\n\x00", ("empty name",)),
    "bad escape in 1.2": Bad(b"SEND\ndestination:/queue/bad\nx:a\\tb\n\n\x00", ("escape", "\\\\t")),
    "bad escape \\r in 1.1": Bad(
        b"SEND\ndestination:/queue/bad\nx:a\\rb\n\n\x00", ("escape", "\\\\r"), version="1.1"
    ),
    "header not UTF-8": Bad(b"SEND\ndestination:/queue/bad\nx:\xff\xfe\n\n\x00", ("utf-8",)),
    "body longer than content-length": Bad(
        b"SEND\ndestination:/queue/bad\ncontent-length:2\n\nabc\x00", ("content-length",)
    ),
    "content-length not a number": Bad(
        b"SEND\ndestination:/queue/bad\ncontent-length:-1\n\n\x00", ("content-length",)
    ),
    "over-long header": Bad(
        frame("SEND", {**SEND_OK, "long": "x" * 9000}), ("imq.stomp.max_header_length",)
    ),
    "too many headers": Bad(
        frame("SEND", {**SEND_OK, **{f"h{i}": "v" for i in range(300)}}),
        ("imq.stomp.max_header_count",),
    ),
    "unknown command": Bad(b"FOO\n\n\x00", ("FOO", "not a STOMP command")),
    "server command MESSAGE": Bad(frame("MESSAGE", SEND_OK), ("MESSAGE", "server frame")),
    "server command CONNECTED": Bad(frame("CONNECTED"), ("CONNECTED", "server frame")),
    "ACK unknown id": Bad(frame("ACK", {"id": "nope"}), ("ACK", "'nope'")),
    "ACK unknown subscription number": Bad(frame("ACK", {"id": "9/m1"}), ("ACK", "'9/m1'")),
    "ACK id with a non-ASCII digit": Bad(frame("ACK", {"id": "\u00b2/m1"}), ("ACK",)),
    "ACK without id": Bad(frame("ACK"), ("id header",)),
    "ACK 1.1 unknown message": Bad(
        frame("ACK", {"message-id": "nope", "subscription": "s"}), ("ACK", "'nope'"), version="1.1"
    ),
    "ACK 1.0 unknown message": Bad(
        frame("ACK", {"message-id": "nope"}), ("ACK", "'nope'"), version="1.0"
    ),
    "NACK unknown id": Bad(frame("NACK", {"id": "nope"}), ("NACK", "'nope'")),
    "SEND unknown prefix": Bad(
        frame("SEND", {"destination": "/exchange/x"}), ("/exchange/x", "prefix")
    ),
    "SEND bad destination name": Bad(
        frame("SEND", {"destination": "/queue/a b"}), ("destination name",)
    ),
    "SEND without destination": Bad(frame("SEND", {}, b"x"), ("destination header",)),
    "SEND unknown transaction": Bad(
        frame("SEND", {**SEND_OK, "transaction": "nope"}), ("transaction", "'nope'")
    ),
    "SUBSCRIBE without id": Bad(frame("SUBSCRIBE", {"destination": "/queue/bad"}), ("id header",)),
    "SUBSCRIBE invalid ack": Bad(
        frame("SUBSCRIBE", {"destination": "/queue/bad", "id": "1", "ack": "sometimes"}),
        ("ack header", "sometimes"),
    ),
    "SUBSCRIBE with body": Bad(
        frame("SUBSCRIBE", {"destination": "/queue/bad", "id": "1"}, b"body"),
        ("SUBSCRIBE", "must not have a body"),
    ),
    "SUBSCRIBE threshold 101": Bad(
        frame(
            "SUBSCRIBE",
            {"destination": "/queue/bad", "id": "1", "consumer-flow-threshold": "101"},
        ),
        ("consumer-flow-threshold", "101"),
    ),
    "SUBSCRIBE flow limit not a number": Bad(
        frame("SUBSCRIBE", {"destination": "/queue/bad", "id": "1", "consumer-flow-limit": "x"}),
        ("consumer-flow-limit",),
    ),
    "SUBSCRIBE prefetch not boolean": Bad(
        frame(
            "SUBSCRIBE",
            {"destination": "/queue/bad", "id": "1", "consumer-flow-prefetch": "maybe"},
        ),
        ("consumer-flow-prefetch", "true or false"),
    ),
    "UNSUBSCRIBE unknown id": Bad(frame("UNSUBSCRIBE", {"id": "nope"}), ("'nope'",)),
    "priority 10": Bad(frame("SEND", {**SEND_OK, "priority": "10"}), ("priority", "0 to 9")),
    "priority -1": Bad(frame("SEND", {**SEND_OK, "priority": "-1"}), ("priority", "0 to 9")),
    "priority high": Bad(frame("SEND", {**SEND_OK, "priority": "high"}), ("priority", "'high'")),
    "expires negative": Bad(frame("SEND", {**SEND_OK, "expires": "-5"}), ("expires",)),
    "expires beyond 64 bits": Bad(
        frame("SEND", {**SEND_OK, "persistent": "true", "expires": "99999999999999999999"}),
        ("expires", "0 to 9223372036854775807"),
    ),
    "consumer-flow-limit beyond 32 bits": Bad(
        frame(
            "SUBSCRIBE",
            {"destination": "/queue/bad", "id": "1", "consumer-flow-limit": "2147483648"},
        ),
        ("consumer-flow-limit", "-1 to 2147483647"),
    ),
    "persistent not boolean": Bad(
        frame("SEND", {**SEND_OK, "persistent": "yes"}), ("persistent", "true or false")
    ),
    "frame before CONNECT": Bad(frame("SEND", SEND_OK), ("first frame", "CONNECT"), version=None),
    "second CONNECT": Bad(
        frame("CONNECT", {"accept-version": "1.2", "host": "localhost"}),
        ("CONNECT", "connected"),
    ),
    "second STOMP": Bad(
        frame("STOMP", {"accept-version": "1.2", "host": "localhost"}), ("STOMP", "connected")
    ),
    "unsupported accept-version": Bad(
        frame("CONNECT", {"accept-version": "2.0", "host": "localhost"}),
        ("'2.0'", "1.0, 1.1 and 1.2"),
        version=None,
        extra={"version": "1.0,1.1,1.2"},
    ),
    "invalid heart-beat": Bad(
        frame("CONNECT", {"accept-version": "1.2", "heart-beat": "fast"}),
        ("heart-beat", "'fast'"),
        version=None,
    ),
    "invalid connection-flow-limit": Bad(
        frame("CONNECT", {"accept-version": "1.2", "connection-flow-limit": "0"}),
        ("connection-flow-limit",),
        version=None,
    ),
    "BEGIN twice": Bad(
        frame("BEGIN", {"transaction": "t"}) + frame("BEGIN", {"transaction": "t"}),
        ("transaction", "'t'", "already"),
    ),
    "COMMIT unknown transaction": Bad(
        frame("COMMIT", {"transaction": "nope"}), ("transaction", "'nope'", "not open")
    ),
    "ABORT unknown transaction": Bad(
        frame("ABORT", {"transaction": "nope"}), ("transaction", "'nope'", "not open")
    ),
    "COMMIT without transaction": Bad(frame("COMMIT"), ("transaction header",)),
    "ERROR carries receipt-id": Bad(
        frame("SEND", {"destination": "/exchange/x", "receipt": "oops-1"}),
        ("/exchange/x",),
        extra={"receipt-id": "oops-1"},
    ),
}


def expect_refused(client: RawClient, case: Bad) -> Frame:
    """The ERROR `case` must get, then the close."""
    error = client.expect("ERROR")
    assert error.headers.get("message"), error
    assert error.headers.get("status") == case.status, error
    body = error.body.decode().lower()
    for word in case.words:
        assert word.lower() in body, (word, error)
    for name, value in case.extra.items():
        assert error.headers.get(name) == value, (name, error)
    client.expect_closed()
    return error


# -- bad frames, one at a time --------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_input_gets_an_error_and_a_close(
    raw: ClientFactory, witness: Witness, case: Bad
) -> None:
    bad = raw(connect=case.version is not None, version=case.version or "1.2")
    bad.send_bytes(case.data)
    expect_refused(bad, case)
    witness.check()


def test_ack_on_an_auto_subscription_is_refused(raw: ClientFactory, witness: Witness) -> None:
    bad = raw()
    bad.subscribe("/queue/auto", "auto", ack="auto")
    bad.request("SEND", {"destination": "/queue/auto"}, b"x")
    (message,) = bad.receive(1)
    assert "ack" not in message.headers
    bad.send("ACK", {"id": f"1/{message.headers['message-id']}"})
    expect_refused(bad, Bad(b"", ("ack:auto",)))
    witness.check()


def test_ack_twice_is_refused(raw: ClientFactory, witness: Witness) -> None:
    bad = raw()
    bad.subscribe("/queue/twice", "s")
    bad.request("SEND", {"destination": "/queue/twice"}, b"x")
    (message,) = bad.receive(1)
    bad.request("ACK", {"id": message.headers["ack"]})
    bad.send("ACK", {"id": message.headers["ack"]})
    expect_refused(bad, Bad(b"", ("already acknowledged",)))
    witness.check()


def test_duplicate_subscription_id_is_refused(raw: ClientFactory, witness: Witness) -> None:
    bad = raw()
    bad.subscribe("/queue/dup", "same")
    bad.send("SUBSCRIBE", {"destination": "/queue/other", "id": "same"})
    expect_refused(bad, Bad(b"", ("'same'",), status="409"))
    witness.check()


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_receipt_the_version_cannot_echo_is_refused(
    raw: ClientFactory, witness: Witness, version: str
) -> None:
    """STOMP 1.0 and 1.1 header values may hold a CR, which no RECEIPT of theirs can carry back.

    The client must be told (an ERROR), not dropped without a word.
    """
    client = raw(version=version)
    client.send_bytes(b"BEGIN\ntransaction:t\nreceipt:a\rb\n\n\x00")
    error = client.expect("ERROR")
    assert error.headers.get("message"), error
    assert error.headers.get("status") == "400", error
    assert "receipt" in error.body.decode()
    client.expect_closed()
    witness.check()


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_subscription_id_the_version_cannot_echo_is_refused(
    raw: ClientFactory, witness: Witness, version: str
) -> None:
    """A STOMP 1.0 or 1.1 id may hold a CR; MESSAGE frames of that subscription could not name it.

    The SUBSCRIBE must be refused, rather than messages silently never arriving.
    """
    client = raw(version=version)
    client.send_bytes(b"SUBSCRIBE\ndestination:/queue/cr\nid:a\rb\nreceipt:r\n\n\x00")
    error = client.expect("ERROR")
    assert error.headers.get("status") == "400", error
    client.expect_closed()
    witness.check()


def next_reply(client: RawClient, timeout: float = 5.0) -> Frame:
    """The next frame other than MESSAGE, whatever its command."""
    deadline = time.monotonic() + timeout
    while not client.other:
        client.read_some(deadline)
    return client.other.popleft()


@pytest.mark.parametrize("which", ["send", "receive"])
def test_heart_beat_too_large_to_schedule_gets_an_answer(
    raw: ClientFactory, witness: Witness, which: str
) -> None:
    """A heart-beat value of hundreds of digits is refused (ERROR) or accepted (CONNECTED, and
    the session works); the connection is never dropped without a word."""
    huge = "9" * 400
    heart_beat = f"{huge},0" if which == "send" else f"0,{huge}"
    client = raw(connect=False)
    client.send_bytes(frame("CONNECT", {"accept-version": "1.2", "heart-beat": heart_beat}))
    try:
        reply = next_reply(client)
    except ConnectionClosed:
        pytest.fail("the broker closed the connection without a CONNECTED or ERROR frame")
    if reply.command == "ERROR":
        assert reply.headers.get("status") == "400", reply
        assert "heart-beat" in reply.body.decode()
        client.expect_closed()
    else:
        assert reply.command == "CONNECTED", reply
        client.version = client.decoder.version = StompVersion.V1_2
        client.request("BEGIN", {"transaction": "t"})
    witness.check()


# -- with stomp.py --------------------------------------------------------------------------------

StompAction = Callable[[Any], None]


@dataclass(frozen=True)
class StompBad:
    action: StompAction
    word: str  # must appear in the ERROR body
    receipt: str | None = None  # the receipt-id the ERROR must carry


STOMP_PY_CASES: dict[str, StompBad] = {
    "unknown prefix": StompBad(lambda c: c.send("/exchange/x", "x"), "/exchange/x"),
    "no destination": StompBad(lambda c: c.send_frame("SEND", {}, "x"), "destination header"),
    "invalid priority": StompBad(
        lambda c: c.send("/queue/bad", "x", headers={"priority": "10"}), "priority"
    ),
    "expires beyond 64 bits": StompBad(
        lambda c: c.send(
            "/queue/bad", "x", headers={"persistent": "true", "expires": "99999999999999999999"}
        ),
        "0 to 9223372036854775807",
    ),
    "invalid ack mode": StompBad(
        lambda c: c.subscribe("/queue/bad", id="1", ack="sometimes"), "sometimes"
    ),
    "threshold 101": StompBad(
        lambda c: c.subscribe("/queue/bad", id="1", headers={"consumer-flow-threshold": "101"}),
        "consumer-flow-threshold",
    ),
    "ACK unknown id": StompBad(lambda c: c.ack("nope"), "'nope'"),
    "NACK unknown id": StompBad(lambda c: c.nack("nope"), "'nope'"),
    "COMMIT unknown transaction": StompBad(lambda c: c.commit("nope"), "'nope'"),
    "unknown command": StompBad(lambda c: c.send_frame("FOO", {}), "FOO"),
    "server command": StompBad(lambda c: c.send_frame("MESSAGE", {}), "MESSAGE"),
    "second CONNECT": StompBad(lambda c: c.send_frame("CONNECT", {}), "CONNECT"),
    "receipt-id on the ERROR": StompBad(
        lambda c: c.send("/exchange/x", "x", headers={"receipt": "oops-2"}),
        "/exchange/x",
        receipt="oops-2",
    ),
}


@pytest.mark.parametrize("case", list(STOMP_PY_CASES.values()), ids=list(STOMP_PY_CASES))
def test_stomp_py_bad_input(broker: BrokerThread, case: StompBad) -> None:
    survivor, survived = connect(broker.port)
    with_receipt(
        survived, lambda r: survivor.subscribe(WITNESS_QUEUE, id="w", headers={"receipt": r})
    )
    bad, recorder = connect(broker.port)
    case.action(bad)
    recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
    (error,) = recorder.errors
    assert error.headers["message"]
    assert error.headers["status"] == "400"
    assert case.word in error.body
    assert error.headers.get("receipt-id") == case.receipt
    wait_connection_count(broker, 1)

    survivor.send(WITNESS_QUEUE, "after")
    (message,) = survived.wait_messages(1)
    assert message.body == "after"
    sync(survivor, survived)
    survivor.disconnect(receipt="bye")
    survived.wait_for(lambda: "bye" in survived.receipts and survived.disconnected)


# -- abrupt endings -------------------------------------------------------------------------------


def abort(client: RawClient) -> None:
    """Close with a TCP reset rather than an orderly FIN."""
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


@pytest.mark.parametrize(
    "stream",
    [
        (b"", b"\x00\xff\x13garbage\n\n"),
        (b"", b"SEND\ndestination:/queue/abrupt\ncontent-length:100\n\nonly part of"),
        (b"", b"SEND\ndestination:/queue/abrupt\nhalf-a-head"),
        # A consumer of the witness's own queue vanishes while holding an unfinished frame.
        (
            frame("SUBSCRIBE", {"destination": WITNESS_QUEUE, "id": "x", "receipt": "r"}),
            b"SEND\ndestination:/queue/witness\ncontent-length:5\n\nab",
        ),
    ],
    ids=["garbage", "mid-body", "mid-header", "consumer-vanishes-mid-frame"],
)
@pytest.mark.parametrize("ending", ["reset", "close"])
def test_abrupt_disconnect_mid_frame_disturbs_nobody(
    broker: BrokerThread,
    raw: ClientFactory,
    witness: Witness,
    stream: tuple[bytes, bytes],
    ending: str,
) -> None:
    prelude, data = stream
    wait_connection_count(broker, 1)
    bad = raw()
    if prelude:
        bad.send_bytes(prelude)
        bad.expect("RECEIPT")
    bad.send_bytes(data)
    if ending == "reset":
        abort(bad)
    else:
        bad.close()
    wait_connection_count(broker, 1)
    witness.check()
    witness.check()


# -- fuzzing --------------------------------------------------------------------------------------

VALID_STREAMS = [
    frame("CONNECT", {"accept-version": version, "host": "localhost", "heart-beat": "0,0"})
    + frame("SUBSCRIBE", {"destination": "/queue/fuzz", "id": "1", "ack": "client"})
    + frame("SEND", {"destination": "/queue/fuzz", "x-h": "a\\cb", "receipt": "r"}, b"\x00body")
    + frame("BEGIN", {"transaction": "t"})
    + frame("ACK", {"id": "1/m", "transaction": "t"})
    + frame("COMMIT", {"transaction": "t"})
    + frame("UNSUBSCRIBE", {"id": "1"})
    + b"\n\r\n"
    + frame("DISCONNECT", {"receipt": "bye"})
    for version in ("1.0", "1.1", "1.2", "1.0,1.1,1.2")
]
CONNECT_PREFIXES = [
    frame("CONNECT", {"accept-version": version, "host": "localhost"})
    for version in ("1.0", "1.1", "1.2")
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid frame sequence with bytes flipped, inserted and deleted."""
    data = bytearray(draw(st.sampled_from(VALID_STREAMS)))
    for _ in range(draw(st.integers(1, 8))):
        where = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["flip", "insert", "delete", "special"]))
        if kind == "flip":
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[where : where + draw(st.integers(1, 8))]
        else:
            data[where:where] = draw(st.sampled_from([b"\x00", b"\n", b"\r", b":", b"\\"]))
        if not data:
            break
    return bytes(data)


FUZZ_INPUTS = st.one_of(
    st.binary(max_size=512),
    mutated(),
    st.tuples(st.sampled_from(CONNECT_PREFIXES), st.binary(max_size=256)).map(b"".join),
)


def throw(port: int, data: bytes) -> bytes:
    """Send `data` on a fresh connection, half-close it, and return whatever came back."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    received = bytearray()
    try:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (ConnectionResetError, BrokenPipeError):
            return b""  # refused before it was all sent: the broker was quick, not hurt
        deadline = time.monotonic() + 5.0
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail(f"the broker kept the connection open after EOF; input {data!r}")
    finally:
        sock.close()
    return bytes(received)


def test_fuzz_random_and_mutated_bytes_never_hurt_the_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with BrokerThread({"imq.stomp.connect.timeout": "2000"}) as broker:
        healthy = RawClient(broker.port)
        try:
            healthy.connect("1.2")
            watcher = Witness(healthy)

            @settings(
                max_examples=1000,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(data=FUZZ_INPUTS)
            def survive(data: bytes) -> None:
                reply = throw(broker.port, data)
                assert b"\nstatus:500\n" not in reply, (data, reply)
                assert broker._thread.is_alive()
                watcher.check()

            survive()
            wait_connection_count(broker, 1)
        finally:
            healthy.close()
    crashes = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name in ("asyncio", "sluiceway.session.session")
    ]
    assert crashes == [], [r.getMessage() for r in crashes]
