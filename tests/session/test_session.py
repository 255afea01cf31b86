"""The STOMP session without sockets or an event loop: bytes in, frames out, on a fake clock."""

from __future__ import annotations

import pytest

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.session.session import SessionState
from sluiceway.testing import FakeClock
from tests.session.peer import Peer


@pytest.fixture
def broker() -> Broker:
    return Broker(BrokerConfig(), clock=FakeClock())


def test_connect_negotiates_and_answers(broker: Broker) -> None:
    peer = Peer(broker, version="")
    peer.feed("STOMP", {"accept-version": "1.1,1.2", "heart-beat": "500,20000"})
    (connected,) = peer.control()
    assert connected.headers["version"] == "1.2"
    assert connected.headers["heart-beat"] == "10000,10000"
    assert peer.session.state is SessionState.CONNECTED
    # client sends every max(500, 10000) ms; broker sends every max(10000, 20000) ms
    assert (peer.session.heartbeat.receive_ms, peer.session.heartbeat.send_ms) == (10000, 20000)


def test_payload_is_pulled_and_receipts_are_immediate(broker: Broker) -> None:
    producer, consumer = Peer(broker), Peer(broker)
    consumer.feed("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "receipt": "r1"})
    (receipt,) = consumer.control()
    assert receipt.headers["consumer-flow-limit"] == "1000"
    for i in range(5):
        producer.feed("SEND", {"destination": "/queue/q"}, b"%d" % i)
    assert consumer.ready == 1  # the I/O layer is told once that there is something to write
    assert [m.body for m in consumer.payload(limit=3)] == [b"0", b"1", b"2"]
    assert [m.body for m in consumer.payload()] == [b"3", b"4"]


def test_an_error_closes_the_session_and_nothing_more_is_read(broker: Broker) -> None:
    peer = Peer(broker)
    peer.feed("FOO", {"receipt": "r"})
    (error,) = peer.control()
    assert error.command == "ERROR"
    assert error.headers["status"] == "400"
    assert error.headers["receipt-id"] == "r"
    assert b"FOO is not a STOMP command" in error.body
    assert peer.session.closing
    peer.feed("SEND", {"destination": "/queue/q", "receipt": "r2"}, b"ignored")
    assert peer.control() == []


def test_disconnect_returns_unacked_messages(broker: Broker) -> None:
    producer, consumer = Peer(broker), Peer(broker)
    consumer.feed("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client"})
    producer.feed("SEND", {"destination": "/queue/q"}, b"m")
    (message,) = consumer.payload()
    consumer.feed("DISCONNECT", {"receipt": "bye"})
    (receipt,) = consumer.control()
    assert receipt.headers["receipt-id"] == "bye"
    assert consumer.session.closing
    other = Peer(broker)
    other.feed("SUBSCRIBE", {"destination": "/queue/q", "id": "s"})
    (again,) = other.payload()
    assert again.headers["message-id"] == message.headers["message-id"]
    assert again.headers["redelivered"] == "true"


def test_stomp_10_session_uses_message_id_acks(broker: Broker) -> None:
    producer, consumer = Peer(broker), Peer(broker, version="1.0")
    assert consumer.session.version is StompVersion.V1_0
    consumer.feed("SUBSCRIBE", {"destination": "/queue/q", "ack": "client"})
    producer.feed("SEND", {"destination": "/queue/q"}, b"m")
    (message,) = consumer.payload()
    assert "ack" not in message.headers  # 1.0 acknowledges by message-id
    assert message.headers["subscription"] == "/queue/q"  # 1.0: the destination is the id
    consumer.feed("ACK", {"message-id": message.headers["message-id"], "receipt": "a"})
    (receipt,) = consumer.control()
    assert receipt.command == "RECEIPT"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_message_headers_are_the_same_for_every_subscriber_and_version(
    broker: Broker, version: str
) -> None:
    # A topic message is encoded once for all its subscribers in STOMP 1.2; what each receives
    # must read as the general encoding does: broker headers first, the producer's own after
    # (escaped), a producer's header that names a broker header left out.
    producer = Peer(broker)
    first, second = Peer(broker, version), Peer(broker, version)
    first.feed("SUBSCRIBE", {"destination": "/topic/t", "id": "a:1", "ack": "client"})
    second.feed("SUBSCRIBE", {"destination": "/topic/t", "id": "b", "ack": "auto"})
    app = {"content-type": "text/plain", "note": "x:y\\z", "redelivered": "?", "sequence": "?"}
    producer.feed("SEND", {"destination": "/topic/t", **app}, b"\0body")
    (one,) = first.payload()
    (two,) = second.payload()
    for frame, sub_id in ((one, "a:1"), (two, "b")):
        assert frame.command == "MESSAGE"
        assert frame.body == b"\0body"
        assert frame.headers["subscription"] == sub_id
        assert frame.headers["destination"] == "/topic/t"
        assert frame.headers["content-type"] == "text/plain"
        assert frame.headers["note"] == "x:y\\z"
        assert frame.headers["priority"] == "4"
        assert frame.headers["sequence"].isdigit()
        assert frame.headers["redelivered"] == "false"
        assert frame.headers["delivery-count"] == "1"
        assert frame.headers["content-length"] == "5"
    assert one.headers["message-id"] == two.headers["message-id"]
    if version == "1.2":
        assert one.headers["ack"] == f"1/{one.headers['message-id']}"
    assert "ack" not in two.headers


def acks(*ids: str) -> bytes:
    """Plain STOMP 1.2 ACK frames for `ids`, as one read."""
    return b"".join(encode_frame(Frame("ACK", {"id": ack_id}), StompVersion.V1_2) for ack_id in ids)


def bodies(frames: list[Frame]) -> list[bytes]:
    return [frame.body for frame in frames]


def test_a_read_of_acks_frees_the_window_once_all_are_handled(broker: Broker) -> None:
    producer, consumer = Peer(broker), Peer(broker)
    consumer.feed(
        "SUBSCRIBE",
        {"destination": "/queue/q", "id": "s", "ack": "client-individual", "prefetch-count": "2"},
    )
    for i in range(5):
        producer.feed("SEND", {"destination": "/queue/q"}, b"%d" % i)
    first = consumer.payload()
    assert bodies(first) == [b"0", b"1"]
    consumer.session.receive_data(acks(*(m.headers["ack"] for m in first)) + b"\n\r\n")
    assert consumer.control() == []
    assert consumer.session.frames_in == 1 + 1 + 2  # CONNECT, SUBSCRIBE and the two ACKs
    second = consumer.payload()
    assert bodies(second) == [b"2", b"3"]
    # Acknowledged messages are gone; the one delivered and not acknowledged comes back.
    consumer.session.receive_data(acks(second[0].headers["ack"]))
    assert bodies(consumer.payload()) == [b"4"]
    consumer.feed("DISCONNECT")
    other = Peer(broker)
    other.feed("SUBSCRIBE", {"destination": "/queue/q", "id": "t"})
    assert sorted(bodies(other.payload())) == [b"3", b"4"]


def test_a_run_of_acks_keeps_each_ones_meaning_and_stops_at_a_bad_one(broker: Broker) -> None:
    producer, consumer = Peer(broker), Peer(broker)
    consumer.feed("SUBSCRIBE", {"destination": "/queue/a", "id": "a", "ack": "client-individual"})
    consumer.feed("SUBSCRIBE", {"destination": "/queue/b", "id": "b", "ack": "client"})
    for name in ("a", "b"):
        for i in range(3):
            producer.feed("SEND", {"destination": f"/queue/{name}"}, b"%s%d" % (name.encode(), i))
    delivered = {m.body.decode(): m.headers["ack"] for m in consumer.payload()}
    assert len(delivered) == 6
    # b1 acknowledges b0 as well (ack:client is cumulative); the unknown id ends the session
    # and the ACK after it is never handled.
    run = [delivered["a0"], delivered["b1"], delivered["a1"], "99/nothing", delivered["a2"]]
    consumer.session.receive_data(acks(*run))
    (error,) = consumer.control()
    assert error.command == "ERROR"
    assert b"'99/nothing'" in error.body
    assert consumer.session.closing
    for name, left in (("a", [b"a2"]), ("b", [b"b2"])):
        other = Peer(broker)
        other.feed("SUBSCRIBE", {"destination": f"/queue/{name}", "id": "s"})
        assert bodies(other.payload()) == left


@pytest.mark.parametrize(
    ("threshold", "after_seven", "after_three"),
    [
        # 7 acknowledged in one read leave 3 unconsumed, at or below floor(10 * 50 / 100) = 5:
        # a batch of 10 - 3 = 7. The other 3 leave 7 unconsumed, above 5 again: nothing more.
        ("50", 7, 0),
        # Only 0 unconsumed refills the window, with the whole window, however the ACKs are read.
        ("0", 0, 10),
    ],
)
def test_the_refill_depends_on_how_many_unconsumed_the_acks_of_a_read_leave(
    broker: Broker, threshold: str, after_seven: int, after_three: int
) -> None:
    producer, consumer = Peer(broker), Peer(broker)
    consumer.feed(
        "SUBSCRIBE",
        {
            "destination": "/queue/q",
            "id": "s",
            "ack": "client-individual",
            "consumer-flow-limit": "10",
            "consumer-flow-threshold": threshold,
        },
    )
    for i in range(20):
        producer.feed("SEND", {"destination": "/queue/q"}, b"%d" % i)
    first = consumer.payload()
    assert len(first) == 10
    ids = [m.headers["ack"] for m in first]
    consumer.session.receive_data(acks(*ids[:7]))
    assert len(consumer.payload()) == after_seven
    consumer.session.receive_data(acks(*ids[7:]))
    assert len(consumer.payload()) == after_three
