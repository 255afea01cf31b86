"""Stages over the wire (docs/pipelines-protocol.md, "Stages: publishing a batch exactly once").

Real brokers on port 0: a raw-frame client and stomp.py stage messages with `stage:SINK/BATCH/
TASK` and publish them with a COMMIT; restarts reuse the data directory; crash tests kill a broker
process with SIGKILL between staging and commit, right after a commit, and during one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, subscribe, with_receipt
from tests.e2e.support import wait_until

QUEUE = "/queue/results"


@pytest.fixture
def opened() -> Iterator[list[RawClient]]:
    clients: list[RawClient] = []
    yield clients
    for client in clients:
        client.close()


def client(port: int, opened: list[RawClient], **headers: str) -> RawClient:
    raw = RawClient(port)
    opened.append(raw)
    raw.connect(**headers)
    return raw


def stage(raw: RawClient, name: str, body: bytes, **headers: str) -> Frame:
    """A staged SEND, waiting for its RECEIPT."""
    fields = {"destination": QUEUE, "stage": name, "persistent": "true", **headers}
    return raw.request("SEND", fields, body)


def commit(raw: RawClient, batch: str, tasks: str) -> Frame:
    return raw.request("COMMIT", {"transaction": "stage", "stage": batch, "stage-tasks": tasks})


def drain(raw: RawClient, destination: str = QUEUE) -> list[Frame]:
    """Everything a consumer gets until the queue is empty, acknowledged as it goes."""
    got = raw.consume_all(destination)
    raw.request("UNSUBSCRIBE", {"id": "drain"})
    return got


def browse(raw: RawClient) -> list[Frame]:
    raw.subscribe(QUEUE, "browse", browser="true", ack="auto")
    found: list[Frame] = []
    while True:
        (message,) = raw.receive(1)
        if message.headers.get("browser") == "end":
            return found
        found.append(message)


def test_staged_messages_are_unseen_until_the_commit_publishes_them_in_task_order(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    consumer = client(broker.port, opened)
    consumer.subscribe(QUEUE, "c")
    producer = client(broker.port, opened)
    producer.request("SEND", {"destination": QUEUE}, b"plain")
    stage(producer, "orders/42/3.0", b"task 3, first")
    stage(producer, "orders/42/0.0", b"task 0", **{"content-type": "text/plain"})
    stage(producer, "orders/42/3.0", b"task 3, second")
    stage(producer, "orders/42/7.0", b"a task not listed")
    consumer.sync()
    assert [m.body for m in consumer.drain()] == [b"plain"]
    assert browse(client(broker.port, opened)) == []  # browsers do not see them either
    receipt = commit(producer, "orders/42", "0.0,3.0,9.9")
    assert receipt.headers["stage-state"] == "committed"
    assert receipt.headers["stage-count"] == "3"
    published = consumer.receive(3)
    consumer.sync()
    assert consumer.drain() == []
    assert [m.body for m in published] == [b"task 0", b"task 3, first", b"task 3, second"]
    assert [int(m.headers["sequence"]) for m in published] == [2, 3, 4]
    assert published[0].headers["content-type"] == "text/plain"
    assert all("stage" not in m.headers and "stage-ttl" not in m.headers for m in published)
    assert published[0].headers["persistent"] == "true"


def test_a_replayed_commit_publishes_nothing(broker: BrokerThread, opened: list[RawClient]) -> None:
    producer = client(broker.port, opened)
    stage(producer, "s/1/0.0", b"once")
    assert commit(producer, "s/1", "0.0").headers["stage-state"] == "committed"
    # The batch runs again (a replay after a failure): its SENDs are accepted, and dropped.
    stage(producer, "s/1/0.0", b"once")
    other = client(broker.port, opened)
    again = commit(other, "s/1", "0.0")
    assert (again.headers["stage-state"], again.headers["stage-count"]) == (
        "committed-before",
        "0",
    )
    assert commit(other, "s/0", "0.0").headers["stage-state"] == "committed-before"
    assert [m.body for m in drain(other)] == [b"once"]


def test_a_commit_is_remembered_across_a_restart(tmp_path: Path, opened: list[RawClient]) -> None:
    properties = {"imq.persist.file.directory": str(tmp_path / "data")}
    with BrokerThread(properties) as broker:
        producer = client(broker.port, opened)
        stage(producer, "s/5/0.0", b"a")
        stage(producer, "s/5/1.0", b"b", persistent="false")
        stage(producer, "s/6/0.0", b"next batch, open")
        assert commit(producer, "s/5", "0.0,1.0").headers["stage-count"] == "2"
    with BrokerThread(properties) as broker:
        raw = client(broker.port, opened)
        assert commit(raw, "s/5", "0.0,1.0").headers["stage-state"] == "committed-before"
        # The persistent one is back; the non-persistent one, published, did not survive.
        assert [m.body for m in drain(raw)] == [b"a"]
        assert commit(raw, "s/6", "0.0").headers["stage-count"] == "1"
        assert [m.body for m in drain(raw)] == [b"next batch, open"]


def test_abort_discards_the_batch_or_some_tasks(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    raw = client(broker.port, opened)
    for task in ("0.0", "1.0", "2.0"):
        stage(raw, f"s/3/{task}", task.encode())
    some = raw.request("ABORT", {"transaction": "stage", "stage": "s/3", "stage-tasks": "1.0"})
    assert (some.headers["stage-state"], some.headers["stage-count"]) == ("aborted", "1")
    rest = raw.request("ABORT", {"transaction": "stage", "stage": "s/3"})
    assert rest.headers["stage-count"] == "2"
    assert commit(raw, "s/3", "0.0,1.0,2.0").headers["stage-count"] == "0"
    assert drain(raw) == []


def test_a_stage_past_its_ttl_is_discarded(broker: BrokerThread, opened: list[RawClient]) -> None:
    raw = client(broker.port, opened)
    stage(raw, "s/1/0.0", b"forgotten", **{"stage-ttl": "100"})
    stage(raw, "s/1/1.0", b"kept", **{"stage-ttl": "600000"})
    assert broker.broker is not None
    stages = broker.broker.stages
    # Deadlines are checked on the broker's tick, once a second.
    wait_until(lambda: broker.call(lambda: len(stages)) == 1, timeout=5)
    assert commit(raw, "s/1", "0.0,1.0").headers["stage-count"] == "1"
    assert [m.body for m in drain(raw)] == [b"kept"]


def test_staged_sends_are_held_on_a_full_destination_until_a_consumer_makes_room(
    make_broker: BrokerFactory, opened: list[RawClient]
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.results.maxNumMsgs": "2",
            "imq.destination.queue.results.limitBehavior": "FLOW_CONTROL",
        }
    )
    producer = client(broker.port, opened)
    producer.request("SEND", {"destination": QUEUE, "persistent": "true"}, b"plain")
    stage(producer, "s/1/0.0", b"staged 1")
    producer.send(
        "SEND",
        {"destination": QUEUE, "stage": "s/1/0.0", "persistent": "true", "receipt": "held"},
        b"staged 2",
    )
    producer.sync()  # other frames are answered; the held SEND is not
    core = broker.broker
    assert core is not None
    held = broker.call(lambda: [(p.reason, p.held_sends) for p in core.producers.held()])
    assert held == [("destination full", 1)]
    consumer = client(broker.port, opened)
    consumer.subscribe(QUEUE, "c")
    (plain,) = consumer.receive(1)
    consumer.ack(plain)  # consuming makes the room the held staged SEND waits for
    assert producer.expect("RECEIPT").headers["receipt-id"] == "held"
    consumer.sync()
    assert consumer.drain() == []  # still staged
    assert commit(producer, "s/1", "0.0").headers["stage-count"] == "2"
    assert [m.body for m in consumer.receive(2)] == [b"staged 1", b"staged 2"]


def test_stomp_py_stages_and_commits(broker: BrokerThread) -> None:
    connection, recorder = connect(broker.port)
    try:
        subscribe(connection, recorder, QUEUE, "c", ack="auto")
        for task, body in (("b", "second"), ("a", "first")):
            headers = {"stage": f"py/1/{task}"}

            def send(receipt: str, body: str = body, headers: dict[str, str] = headers) -> None:
                connection.send(QUEUE, body, headers={**headers, "receipt": receipt})

            with_receipt(recorder, send)
        receipt = with_receipt(
            recorder,
            lambda r: connection.commit(
                "stage", headers={"stage": "py/1", "stage-tasks": "a,b", "receipt": r}
            ),
        )
        assert (receipt["stage-state"], receipt["stage-count"]) == ("committed", "2")
        messages: list[Any] = recorder.wait_messages(2)
        assert [m.body for m in messages] == ["first", "second"]
    finally:
        connection.disconnect()


@pytest.mark.parametrize(
    ("command", "headers", "named"),
    [
        ("SEND", {"stage": "s/1"}, "stage"),
        ("SEND", {"stage": "s/-1/t"}, "stage"),
        ("SEND", {"stage": "s/9223372036854775808/t"}, "stage"),
        ("SEND", {"stage": "bad sink/1/t"}, "stage"),
        ("SEND", {"stage": "s/1/a,b"}, "stage"),
        ("SEND", {"stage": "s/1/" + "t" * 201}, "stage"),
        ("SEND", {"stage": "s/1/t", "stage-ttl": "0"}, "stage-ttl"),
        ("SEND", {"stage": "s/1/t", "transaction": "tx"}, "transaction"),
        ("COMMIT", {"transaction": "stage", "stage": "s/1/t", "stage-tasks": "t"}, "stage"),
        ("COMMIT", {"transaction": "stage", "stage": "s/x", "stage-tasks": "t"}, "stage"),
        ("COMMIT", {"transaction": "stage", "stage": "s/1"}, "stage-tasks"),
        ("COMMIT", {"transaction": "stage", "stage": "s/1", "stage-tasks": "a,,b"}, "stage-tasks"),
        ("COMMIT", {"transaction": "stage", "stage": "s/1", "stage-tasks": "a,b,a"}, "stage-tasks"),
        ("COMMIT", {"transaction": "tx", "stage": "s/1", "stage-tasks": "a"}, "transaction"),
        ("ABORT", {"stage": "s/1"}, "transaction"),
    ],
)
def test_malformed_stage_headers_are_refused_with_400_naming_the_header(
    broker: BrokerThread,
    opened: list[RawClient],
    command: str,
    headers: dict[str, str],
    named: str,
) -> None:
    raw = client(broker.port, opened, **{"failed-receipts": "true"})
    fields = {"destination": QUEUE, **headers} if command == "SEND" else headers
    refused = raw.request(command, fields, b"x" if command == "SEND" else b"")
    assert refused.headers["status"] == "400"
    assert named in refused.headers["message"] or named in refused.body.decode()
    stage(raw, "s/1/t", b"the connection goes on")
    core = broker.broker
    assert core is not None
    assert broker.call(lambda: len(core.stages)) == 1


def test_without_failed_receipts_a_malformed_stage_gets_an_error(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    raw = client(broker.port, opened)
    raw.send("SEND", {"destination": QUEUE, "stage": "s/1", "receipt": "r"}, b"x")
    error = raw.expect("ERROR")
    assert (error.headers["status"], error.headers["message"]) == ("400", "invalid stage header")
    assert "SINK/BATCH/TASK" in error.body.decode()
    raw.expect_closed()


# -- a broker process killed with SIGKILL ---------------------------------------------------------


def killed_client(port: int, opened: list[RawClient]) -> RawClient:
    raw = RawClient(port, timeout=10)
    opened.append(raw)
    raw.connect()
    return raw


@pytest.mark.slow
def test_stages_survive_sigkill_between_staging_and_commit(
    tmp_path: Path, opened: list[RawClient]
) -> None:
    data = str(tmp_path / "data")
    bodies = [b"%03d" % i for i in range(200)]
    with BrokerProcess(data_dir=data) as broker:
        raw = killed_client(broker.port, opened)
        for i, body in enumerate(bodies):
            # Half of them non-persistent: staged messages are in the journal all the same.
            persistent = "true" if i % 2 else "false"
            stage(raw, f"k/1/{i % 4}.0", body, persistent=persistent)
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        raw = killed_client(broker.port, opened)
        assert commit(raw, "k/1", "0.0,1.0,2.0,3.0").headers["stage-count"] == "200"
        expected = [body for task in range(4) for body in bodies[task::4]]
        assert [m.body for m in drain(raw)] == expected
        broker.stop()


@pytest.mark.slow
def test_a_commit_survives_sigkill_right_after_its_receipt(
    tmp_path: Path, opened: list[RawClient]
) -> None:
    data = str(tmp_path / "data")
    bodies = [b"m%03d" % i for i in range(300)]
    with BrokerProcess(data_dir=data) as broker:
        raw = killed_client(broker.port, opened)
        for i, body in enumerate(bodies):
            stage(raw, f"k/7/{i % 3}.0", body)
        assert commit(raw, "k/7", "2.0,0.0,1.0").headers["stage-state"] == "committed"
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        raw = killed_client(broker.port, opened)
        assert commit(raw, "k/7", "2.0,0.0,1.0").headers["stage-state"] == "committed-before"
        got = drain(raw)
        assert [m.body for m in got] == [b for task in (2, 0, 1) for b in bodies[task::3]]
        sequences = [int(m.headers["sequence"]) for m in got]
        assert sequences == sorted(sequences)
        assert len(set(sequences)) == len(sequences)
        broker.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_commit_cut_by_sigkill_publishes_all_or_nothing_and_never_twice(
    tmp_path: Path, opened: list[RawClient]
) -> None:
    """The COMMIT is sent and the broker killed a moment later: before, during or after its
    work. After the restart the batch is either wholly there or wholly staged; retrying the
    COMMIT then publishes it exactly once either way."""
    # How long after the COMMIT the kill comes (seconds): this chooses the moment of the crash,
    # it waits for nothing. The batch takes some milliseconds to publish.
    for attempt, delay in enumerate((0.0, 0.002, 0.005, 0.01, 0.02, 0.05)):
        data = str(tmp_path / f"data{attempt}")
        bodies = [b"a%d-%04d" % (attempt, i) + b"." * 200 for i in range(1500)]
        with BrokerProcess(data_dir=data) as broker:
            raw = killed_client(broker.port, opened)
            for start in range(0, len(bodies), 100):
                # Pipelined, one receipt per hundred: the last RECEIPT confirms those before.
                for body in bodies[start : start + 99]:
                    fields = {"destination": QUEUE, "stage": "cut/1/0.0", "persistent": "true"}
                    raw.send("SEND", fields, body)
                stage(raw, "cut/1/0.0", bodies[start + 99])
            raw.send("COMMIT", {"transaction": "stage", "stage": "cut/1", "stage-tasks": "0.0"})
            time.sleep(delay)
            broker.kill()
        with BrokerProcess(data_dir=data) as broker:
            raw = killed_client(broker.port, opened)
            present = [m.body for m in drain(raw)]
            assert present in ([], bodies)
            retry = commit(raw, "cut/1", "0.0").headers["stage-state"]
            assert retry == ("committed-before" if present else "committed")
            after = [m.body for m in drain(raw)]
            assert present + after == bodies  # exactly once, in order
            broker.stop()


def test_a_connection_closed_while_staging_leaves_the_stage(
    broker: BrokerThread, opened: list[RawClient]
) -> None:
    writer = client(broker.port, opened)
    stage(writer, "s/1/0.0", b"kept")
    writer.send("DISCONNECT", {"receipt": "bye"})
    writer.expect("RECEIPT")
    writer.expect_closed()
    driver = client(broker.port, opened)
    assert commit(driver, "s/1", "0.0").headers["stage-count"] == "1"
    assert [m.body for m in drain(driver)] == [b"kept"]
