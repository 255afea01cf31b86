"""Packed SENDs over the wire (docs/pipelines-protocol.md, "Packed sends").

Real brokers on port 0: a raw-frame client, stomp.py and the pipeline client send many messages
per SEND, staged or not; a pack that cannot be taken whole is refused whole (nothing changes),
and the pipeline client then sends its messages one by one; bad packs are refused with 400; a
broker process killed right after a pack's RECEIPT has its persistent messages on restart.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.client.pipeline import (
    OutgoingMessage,
    OutgoingPack,
    PipelineConnection,
    PipelineSettings,
)
from sluiceway.client.pipeline_send_packs import packed
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, subscribe, with_receipt

QUEUE = "/queue/packed"


@pytest.fixture
def opened() -> Iterator[list[RawClient]]:
    clients: list[RawClient] = []
    yield clients
    for client in clients:
        client.close()


def client(port: int, opened: list[RawClient], **headers: str) -> RawClient:
    raw = RawClient(port)
    opened.append(raw)
    raw.connect(failed_receipts="true", **headers)
    return raw


def numbered(count: int, destination: str = QUEUE, **fields: object) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(destination, f"m{i}".encode(), {"n": str(i)}, **fields)  # type: ignore[arg-type]
        for i in range(count)
    ]


def send_pack(raw: RawClient, pack: OutgoingPack, **headers: str) -> Frame:
    fields = {"destination": pack.destination, "pack-count": str(pack.count), **headers}
    return raw.request("SEND", fields, pack.body)


class CountingConnection(PipelineConnection):
    """A pipeline connection that counts the SEND frames it writes."""

    sends = 0

    def write_frame(self, frame: Frame) -> None:
        if frame.command == "SEND":
            self.sends += 1
        super().write_frame(frame)


def test_a_pack_delivers_each_message_with_its_own_columns(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    messages = [
        OutgoingMessage(QUEUE, b"first", {"a": "1", "odd:name": "x\ny"}, priority=7),
        OutgoingMessage(QUEUE, b"", {}, persistent=False, priority=0, expires=4_102_444_800_000),
        OutgoingMessage(QUEUE, b"\x00third\xff", {"content-type": "application/x"}),
    ]
    producer = client(broker.port, opened)
    receipt = send_pack(producer, OutgoingPack.of(messages))
    assert "status" not in receipt.headers, receipt
    consumer = client(broker.port, opened)
    got = consumer.consume_all(QUEUE)
    # Priority orders a queue's delivery: the priority 7 message comes first.
    assert [m.body for m in got] == [b"first", b"\x00third\xff", b""]
    first, third, second = got
    assert (first.headers["a"], first.headers["odd:name"], first.headers["priority"]) == (
        "1",
        "x\ny",
        "7",
    )
    assert first.headers["persistent"] == "true"
    assert (second.headers["persistent"], second.headers["priority"]) == ("false", "0")
    assert second.headers["expires"] == "4102444800000"
    assert third.headers["content-type"] == "application/x"
    assert len({m.headers["message-id"] for m in got}) == 3
    assert sorted(int(m.headers["sequence"]) for m in got) == [1, 2, 3]


def test_stomppy_sends_a_pack(broker: BrokerThread, opened: list[RawClient]) -> None:
    pack = OutgoingPack.of(numbered(50))
    connection, recorder = connect(broker.port)
    try:
        answer = with_receipt(
            recorder,
            lambda receipt: connection.send(
                QUEUE,
                pack.body,
                headers={"pack-count": "50", "receipt": receipt},
            ),
        )
        assert "status" not in answer
        subscribe(connection, recorder, QUEUE, "s", ack="auto")
        recorder.wait_for(lambda: len(recorder.messages) == 50)
        assert [m.body for m in recorder.messages] == [f"m{i}" for i in range(50)]
    finally:
        connection.disconnect()


def test_the_pipeline_client_packs_staged_sends_and_the_commit_checks_them(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    settings = PipelineSettings(port=broker.port)
    connection = CountingConnection(settings)
    with connection:
        sent = connection.send_many(numbered(2_500), stage="sink/1/0.0")
        assert sent == 2_500
        assert connection.takes_packs
        assert connection.sends == 1  # 2,500 small messages: one pack
        result = connection.commit_stage("sink", 1, ["0.0"], [2_500])
        assert result.count == 2_500
    got = client(broker.port, opened).consume_all(QUEUE)
    assert [m.headers["n"] for m in got] == [str(i) for i in range(2_500)]


def test_packs_close_at_a_mebibyte_and_at_ten_thousand_messages() -> None:
    big = [OutgoingMessage(QUEUE, bytes(300_000)) for _ in range(7)]
    sizes = [item.count if isinstance(item, OutgoingPack) else 1 for item in packed(big)]
    assert sizes == [3, 3, 1]
    small = packed(numbered(10_001))
    assert [item.count for item in small if isinstance(item, OutgoingPack)] == [10_000]
    mixed = list(packed([*numbered(2), *numbered(2, "/queue/other"), *numbered(1)]))
    assert [(type(i).__name__, i.destination) for i in mixed] == [
        ("OutgoingPack", QUEUE),
        ("OutgoingPack", "/queue/other"),
        ("OutgoingMessage", QUEUE),
    ]
    alone = list(packed([OutgoingMessage(QUEUE, bytes(1 << 20))]))
    assert isinstance(alone[0], OutgoingMessage)


def test_a_pack_that_does_not_fit_is_refused_whole_and_changes_nothing(
    make_broker: BrokerFactory, opened: list[RawClient]
) -> None:
    broker = make_broker(
        {
            "imq.autocreate.destination.maxNumMsgs": "10",
            "imq.autocreate.destination.limitBehavior": "REJECT_NEWEST",
        }
    )
    raw = client(broker.port, opened)
    refused = send_pack(raw, OutgoingPack.of(numbered(11)))
    assert refused.headers["status"] == "414"
    assert "one by one" in refused.headers["detail"]
    taken = send_pack(raw, OutgoingPack.of(numbered(4)))
    assert "status" not in taken.headers
    # The refused pack left nothing behind: the queue holds the four of the second pack.
    assert [m.headers["n"] for m in raw.consume_all(QUEUE)] == ["0", "1", "2", "3"]


def test_a_refused_pack_goes_again_message_by_message_under_flow_control(
    make_broker: BrokerFactory, opened: list[RawClient]
) -> None:
    """A FLOW_CONTROL queue with room for 20: a pack of 200 cannot be taken whole, so its
    messages go one by one, held until a consumer makes room; each arrives once, in order."""
    broker = make_broker(
        {
            "imq.autocreate.destination.maxNumMsgs": "20",
            "imq.autocreate.destination.limitBehavior": "FLOW_CONTROL",
        }
    )
    consumer = client(broker.port, opened)
    consumer.subscribe(QUEUE, "c", ack="auto")
    connection = CountingConnection(PipelineSettings(port=broker.port))
    with connection:
        assert connection.send_many(numbered(200)) == 200
        assert connection.sends > 1  # the pack, then its messages singly (or in part)
    got = consumer.receive(200)
    assert [m.headers["n"] for m in got] == [str(i) for i in range(200)]


def test_a_pack_into_a_committed_batch_is_accepted_and_dropped(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    raw = client(broker.port, opened)
    assert "status" not in send_pack(raw, OutgoingPack.of(numbered(3)), stage="s/1/0.0").headers
    commit = {"transaction": "stage", "stage": "s/1", "stage-tasks": "0.0", "stage-counts": "3"}
    assert raw.request("COMMIT", commit).headers["stage-count"] == "3"
    replayed = send_pack(raw, OutgoingPack.of(numbered(3)), stage="s/1/0.0")
    assert "status" not in replayed.headers
    assert raw.request("COMMIT", commit).headers["stage-state"] == "committed-before"
    assert len(raw.consume_all(QUEUE)) == 3


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"pack-count": "2"}, OutgoingPack.of(numbered(3)).body, "says 2 messages"),
        ({"pack-count": "3"}, b"not a pack", "is not a pack"),
        ({"pack-count": "0"}, b"", "pack-count"),
        (
            {"pack-count": "3", "transaction": "t1"},
            OutgoingPack.of(numbered(3)).body,
            "transaction",
        ),
        ({"pack-count": "3", "priority": "9"}, OutgoingPack.of(numbered(3)).body, "priority"),
        (
            {"pack-count": "1"},
            OutgoingPack.of([OutgoingMessage(QUEUE, b"x", priority=12)]).body,
            "priorities are 0 to 9",
        ),
    ],
)
def test_a_bad_pack_is_refused_naming_what_is_wrong(
    broker: BrokerThread,
    opened: list[RawClient],
    headers: dict[str, str],
    body: bytes,
    expected: str,
) -> None:
    raw = client(broker.port, opened)
    if "transaction" in headers:
        raw.request("BEGIN", {"transaction": "t1"})
    refused = raw.request("SEND", {"destination": QUEUE, **headers}, body)
    assert refused.headers["status"] == "400", refused
    assert expected in refused.headers["detail"]
    assert raw.consume_all(QUEUE) == []


def test_a_pack_without_receipt_is_an_error(broker: BrokerThread, opened: list[RawClient]) -> None:
    raw = client(broker.port, opened)
    raw.send("SEND", {"destination": QUEUE, "pack-count": "1"}, OutgoingPack.of(numbered(1)).body)
    error = raw.expect("ERROR")
    assert "must ask for a receipt" in error.headers["message"] + error.body.decode()


def test_a_client_told_not_to_pack_sends_one_frame_per_message(broker: BrokerThread) -> None:
    connection = CountingConnection(PipelineSettings(port=broker.port, pack_sends=False))
    with connection:
        assert connection.send_packs([OutgoingPack.of(numbered(5))]) == 5
        assert connection.sends == 5


def test_persistent_packed_messages_survive_a_kill_after_the_receipt(
    tmp_path: object, opened: list[RawClient]
) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as first:
        with PipelineConnection(PipelineSettings(port=first.port)) as connection:
            assert connection.send_many(numbered(3_000)) == 3_000
        first.kill()
    with BrokerProcess(data_dir=data) as second:
        got = client(second.port, opened).consume_all(QUEUE)
    assert [m.headers["n"] for m in got] == [str(i) for i in range(3_000)]
