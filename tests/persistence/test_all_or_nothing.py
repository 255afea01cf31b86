"""All or nothing, end to end, on a broker process restarted on its data directory.

A SEND whose `expires` the journal cannot keep is refused with status 400 naming the header, in
a transaction or not; a transaction around it publishes nothing. A COMMIT refused for a message
the journal cannot keep publishes none of its messages and undoes its acknowledgements. In each
case a consumer attached all along gets nothing of it, and after the broker is killed and started
again nothing of it is there.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import stomp.exception

from sluiceway.protocol.codec import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.testing import BrokerProcess
from tests.e2e.stomppy import connect, subscribe, sync
from tests.persistence.raw import client, drain

OUT = "/queue/out"
IN = "/queue/in"
TOO_LATE = "99999999999999999999"  # the issue's expires: beyond the 64-bit integer kept
RANGE = "0 to 9223372036854775807"


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    return encode_frame(Frame(command, headers, body), StompVersion.V1_2)


def persistent(body: bytes, **headers: str) -> bytes:
    return frame("SEND", {"destination": OUT, "persistent": "true", **headers}, body)


def test_the_issue_with_the_raw_client(tmp_path: Path) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        consumer = client(broker.port)
        consumer.subscribe(OUT)
        producer = client(broker.port)
        # One read: the broker stops at the refused SEND; what follows is never handled.
        producer.send_bytes(
            frame("BEGIN", {"transaction": "tx"})
            + persistent(b"one", transaction="tx")
            + persistent(b"two", transaction="tx", expires=TOO_LATE)
            + persistent(b"three", transaction="tx")
            + frame("COMMIT", {"transaction": "tx", "receipt": "commit"})
        )
        error = producer.expect("ERROR")
        assert error.headers["status"] == "400"
        assert error.headers["message"] == "invalid expires header"
        assert RANGE in error.body.decode()
        assert "receipt-id" not in error.headers  # the SEND asked for none; the COMMIT went unread
        producer.expect_closed()  # the transaction ended with the connection: rolled back
        consumer.sync()
        assert consumer.drain() == []
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, OUT) == []


def test_the_issue_with_stomp_py(tmp_path: Path) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        consumer, received = connect(broker.port)
        subscribe(consumer, received, OUT, "out")
        producer, recorder = connect(broker.port)
        producer.begin("tx")
        headers = {"persistent": "true", "transaction": "tx"}
        producer.send(OUT, "one", headers=headers)
        producer.send(OUT, "two", headers={**headers, "expires": TOO_LATE})
        # stomp.py may see the connection end before these: they are refused on its side then.
        with contextlib.suppress(stomp.exception.NotConnectedException):
            producer.send(OUT, "three", headers=headers)
            producer.commit("tx")
        recorder.wait_for(lambda: bool(recorder.errors) and recorder.disconnected)
        (error,) = recorder.errors
        assert error.headers["status"] == "400"
        assert "expires" in error.headers["message"]
        assert RANGE in error.body
        sync(consumer, received)
        assert received.take() == []
        consumer.disconnect()
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, OUT) == []


def test_a_plain_send_with_the_issues_expires_is_refused_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        producer = client(broker.port, failed_receipts="true")
        refused = producer.request(
            "SEND", {"destination": OUT, "persistent": "true", "expires": TOO_LATE}, b"late"
        )
        assert refused.headers["status"] == "400"
        assert refused.headers["message"] == "invalid expires header"
        assert RANGE in refused.headers["detail"]
        # The connection goes on, and takes a SEND in range.
        ok = producer.request("SEND", {"destination": OUT, "persistent": "true"}, b"kept")
        assert "status" not in ok.headers
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, OUT) == [(b"kept", "false")]


def test_a_commit_with_a_message_the_journal_cannot_keep_is_refused_whole(
    tmp_path: Path,
) -> None:
    """Header lines up to 256 KiB are accepted, but the journal keeps 65535 bytes of a header:
    the SEND is taken into the transaction, and its COMMIT is refused."""
    data = str(tmp_path)
    with BrokerProcess("-D", "imq.stomp.max_header_length=256k", data_dir=data) as broker:
        consumer = client(broker.port)
        consumer.subscribe(OUT)
        producer = client(broker.port, failed_receipts="true")
        producer.request("SEND", {"destination": IN, "persistent": "true"}, b"acked")
        producer.subscribe(IN, "in")
        (acked,) = producer.receive(1)
        producer.request("BEGIN", {"transaction": "tx"})
        producer.request("ACK", {"id": acked.headers["ack"], "transaction": "tx"})
        for body, extra in ((b"one", {}), (b"two", {"x-big": "v" * 70_000}), (b"three", {})):
            headers = {"destination": OUT, "persistent": "true", "transaction": "tx", **extra}
            producer.request("SEND", headers, body)
        refused = producer.request("COMMIT", {"transaction": "tx"})
        assert refused.headers["status"] == "400"
        assert refused.headers["message"] == "transaction rolled back"
        for words in ("header 'x-big'", "70000 bytes", "65535", "acknowledgements undone"):
            assert words in refused.headers["detail"]
        (again,) = producer.receive(1)  # its acknowledgement undone: delivered again
        assert again.headers["message-id"] == acked.headers["message-id"]
        assert again.headers["redelivered"] == "true"
        consumer.sync()
        assert consumer.drain() == []
        # The connection goes on: another transaction commits.
        producer.request("BEGIN", {"transaction": "after"})
        producer.request(
            "SEND", {"destination": OUT, "persistent": "true", "transaction": "after"}, b"after"
        )
        assert "status" not in producer.request("COMMIT", {"transaction": "after"}).headers
        (after,) = consumer.receive(1)
        assert after.body == b"after"
        consumer.request("ACK", {"id": after.headers["ack"]})
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, OUT) == []
        assert drain(broker.port, IN) == [(b"acked", "true")]
