"""Packed reads (protocol.pack) with a real broker: a range, cursor or lease read with `pack`
gets its messages many to a frame, the same messages with the same headers as without; the
columns as they came (`Read.packs()`); refusals of a bad `pack` header; and a lease read
resumed after a failover, pack by pack."""

from __future__ import annotations

import pytest

from sluiceway.client.pipeline import (
    LeaseState,
    OutgoingMessage,
    PipelineConnection,
    PipelineSettings,
)
from sluiceway.client.pipeline_failover import LeaseResume, RangeResume
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.client.pipeline_values import PipelineMessage
from sluiceway.errors import BadRequest, RemoteProtocolError
from sluiceway.protocol.pack import PACK_BYTES, PackWriter, read_pack
from sluiceway.testing import BrokerThread

pytestmark = pytest.mark.timeout(60)

QUEUE = "/queue/packed"
TOPIC = "/topic/packed"


def client(broker: BrokerThread) -> PipelineConnection:
    return PipelineConnection(PipelineSettings(port=broker.port, timeout=30.0))


def fill(connection: PipelineConnection, destination: str, count: int) -> None:
    connection.send_many(
        OutgoingMessage(
            destination,
            f"m{i}".encode() if i % 7 else b"\xff\xfe",
            headers={"n": str(i), "odd:name": "a\nb\\c"} if i % 3 == 0 else {},
            persistent=i % 2 == 0,
            priority=i % 10,
            expires=0 if i % 5 else 4_102_444_800_000,
        )
        for i in range(count)
    )


def comparable(message: PipelineMessage) -> tuple[bytes, dict[str, str]]:
    headers = {k: v for k, v in message.headers.items() if k not in ("subscription", "ack")}
    headers.pop("content-length", None)
    return message.body, headers


def test_a_packed_range_read_gives_the_same_messages_as_a_plain_one(
    broker: BrokerThread,
) -> None:
    with client(broker) as connection:
        fill(connection, QUEUE, 250)
        plain = [comparable(m) for m in connection.read_range(QUEUE, 0, None)]
        read = connection.read_range(QUEUE, 0, None, pack=100)
        packs = list(read.packs())
        assert [p.count for p in packs] == [100, 100, 50]
        packed = [comparable(m) for p in packs for m in p.messages()]
        assert packed == plain
        assert read.end is not None
        assert read.end.next_sequence == max(int(h["sequence"]) for _, h in plain) + 1
        assert [comparable(m) for m in connection.read_range(QUEUE, 0, None, pack=7)] == plain


def test_packed_lease_and_cursor_reads(broker: BrokerThread) -> None:
    with client(broker) as connection:
        fill(connection, QUEUE, 30)
        connection.open_cursor(TOPIC, "g", "earliest")
        fill(connection, TOPIC, 30)
        lease = connection.read_lease(QUEUE, "g/1", max_messages=20, pack=8)
        packs = list(lease.packs())
        assert [p.count for p in packs] == [8, 8, 4]
        assert {dict(p.shared)["lease"] for p in packs} == {"g/1"}
        assert lease.end is not None
        assert (lease.end.lease_count, lease.end.lease_state) == (20, LeaseState.OPEN)
        # The same lease read again, plain: the same messages, each labelled.
        again = list(connection.read_lease(QUEUE, "g/1"))
        assert [m.body for p in packs for m in p.messages()] == [m.body for m in again]
        assert {m.headers["lease"] for p in packs for m in p.messages()} == {"g/1"}
        cursor = connection.read_range(TOPIC, 0, None, cursor="g", pack=1000)
        assert sum(p.count for p in cursor.packs()) == 30


def test_a_pack_closes_at_its_byte_bound(broker: BrokerThread) -> None:
    size = PACK_BYTES // 4 + 1
    with client(broker) as connection:
        connection.send_many(OutgoingMessage(QUEUE, b"x" * size) for _ in range(9))
        counts = [p.count for p in connection.read_range(QUEUE, 0, None, pack=1000).packs()]
        assert counts == [4, 4, 1]


def test_a_bad_pack_header_is_refused(broker: BrokerThread) -> None:
    with client(broker) as connection:
        for value in ("0", "10001", "x"):
            read = connection.read_range(QUEUE, 0, None)
            read._headers["pack"] = value
            with pytest.raises(BadRequest, match="pack header must be a number"):
                read.drain()


def test_packs_hold_what_was_packed_and_refuse_what_is_not_a_pack() -> None:
    writer = PackWriter()
    writer.add(
        "id-1",
        b"body",
        sequence=5,
        timestamp=7,
        expires=0,
        priority=9,
        persistent=True,
        delivery_count=2,
        headers=[("a:b", "c\nd\\e")],
    )
    body = writer.finish()
    pack = read_pack(body)
    assert (pack.count, pack.body(0), pack.message_id(0)) == (1, b"body", "id-1")
    assert pack.own_headers(0) == [("a:b", "c\nd\\e")]
    assert (pack.sequences[0], pack.priorities[0], pack.flags[0]) == (5, 9, 3)
    for broken in (b"", b"XXXX" + body[4:], body[:-1], body[:12] + b"\xff" * 4 + body[16:]):
        with pytest.raises(RemoteProtocolError):
            read_pack(broken)


def packed(first: int, count: int) -> MessagePack:
    return MessagePack.of(
        [
            PipelineMessage(b"x", {"message-id": f"id{i}", "sequence": str(i)})
            for i in range(first, first + count)
        ]
    )


def test_a_resumed_lease_read_skips_what_packs_gave_before() -> None:
    resume = LeaseResume({}, "read of lease g/1")
    assert resume.admit_pack(packed(0, 5)) is not None
    resume.restart()  # read again after a failover: the same messages come back
    assert resume.admit_pack(packed(0, 3)) is None
    kept = resume.admit_pack(packed(3, 4))
    assert kept is not None
    assert [m.message_id for m in kept.messages()] == ["id5", "id6"]
    resume.restart()
    with pytest.raises(RemoteProtocolError, match="other messages"):
        resume.admit_pack(packed(100, 7))
    ranges = RangeResume({"from-sequence": "0"}, "range read")
    ranges.admit_pack(packed(0, 10))
    assert ranges.headers()["from-sequence"] == "10"
