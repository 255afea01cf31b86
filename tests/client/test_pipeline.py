"""The blocking pipeline connection against a real broker: range reads, cursors, leases, stages,
sends with receipts and retries, credentials, and pickling."""

from __future__ import annotations

import logging
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TypeVar, cast

import pytest

from sluiceway.client.pipeline import (
    LeaseState,
    OutgoingMessage,
    PipelineConnection,
    PipelineSettings,
    Read,
    StageState,
)
from sluiceway.client.producer import RetryPolicy
from sluiceway.errors import BrokerError, ConnectFailedError, NotFound, ResourceFull, Unauthorized
from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.support import wait_until

WAIT = 5.0

T = TypeVar("T")


def shipped_copy(value: T) -> T:
    """`value` after a round trip through pickle, as Spark ships readers to executors."""
    copy = pickle.loads(pickle.dumps(value))  # noqa: S301  (bytes this test made just now)
    return cast("T", copy)


def connect(
    broker: BrokerThread,
    *,
    username: str | None = None,
    password: str | None = None,
    retry: RetryPolicy | None = None,
    max_inflight: int = 512,
) -> PipelineConnection:
    settings = PipelineSettings(
        port=broker.port,
        username=username,
        password=password,
        timeout=WAIT,
        retry=retry or RetryPolicy(pause=0.05, deadline=WAIT),
        max_inflight=max_inflight,
    )
    return PipelineConnection(settings)


def messages(destination: str, count: int, start: int = 0) -> list[OutgoingMessage]:
    return [OutgoingMessage(destination, f"m{i}".encode()) for i in range(start, start + count)]


def bodies(read: Read) -> list[str]:
    return [m.body.decode() for m in read]


def test_range_reads_by_sequence_consume_nothing(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        assert connection.send_many(messages("/queue/range", 30)) == 30
        head = connection.head("/queue/range")
        assert head.head_sequence == 30
        assert head.first_sequence == 1
        assert head.message_count == 30
        assert head.consumer_flow_limit == 1000

        read = connection.read_range("/queue/range", 11, 21)
        got = [(m.sequence, m.body) for m in read]
        assert got == [(s, f"m{s - 1}".encode()) for s in range(11, 21)]
        assert read.end is not None
        assert read.end.next_sequence == 21
        # Nothing was consumed: the whole queue reads again, and the head did not move.
        assert [m.sequence for m in connection.read_range("/queue/range", 0, None)] == list(
            range(1, 31)
        )
        assert connection.head("/queue/range").message_count == 30


def test_leaving_a_read_early_closes_the_connection_and_the_next_call_reopens(
    broker: BrokerThread,
) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/early", 50))
        for message in connection.read_range("/queue/early", 0, None):
            assert message.sequence == 1
            break
        assert not connection.connected
        assert connection.head("/queue/early").head_sequence == 50


def test_a_connection_pickles_without_its_socket(broker: BrokerThread) -> None:
    connection = connect(broker)
    connection.send_many(messages("/queue/pickled", 3))
    assert connection.connected
    copy = shipped_copy(connection)
    assert not copy.connected
    assert copy.settings == connection.settings
    assert [m.sequence for m in copy.read_range("/queue/pickled", 0, None)] == [1, 2, 3]
    copy.close()
    connection.close()


def test_topic_cursor_holds_messages_until_committed(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        opened = connection.open_cursor("/topic/prices", "readers", "latest")
        assert opened.cursor_sequence == 1
        connection.send_many(messages("/topic/prices", 20))
        # The cursor keeps everything after its position; reading does not move it.
        assert [m.sequence for m in connection.read_range("/topic/prices", 1, 11)] == list(
            range(1, 11)
        )
        assert connection.open_cursor("/topic/prices", "readers").cursor_sequence == 1
        connection.commit_cursor("/topic/prices", "readers", 11)
        head = connection.head("/topic/prices", cursor="readers")
        assert head.cursor_sequence == 11
        assert head.first_sequence == 11
        assert [m.sequence for m in connection.read_range("/topic/prices", 0, None)] == list(
            range(11, 21)
        )
        connection.delete_cursor("/topic/prices", "readers")
        with pytest.raises(NotFound):
            connection.commit_cursor("/topic/prices", "readers", 15)


def test_a_lease_returns_the_same_messages_until_acknowledged(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/jobs", 25))
        first = connection.read_lease("/queue/jobs", "etl/1", max_messages=10)
        taken = [m.sequence for m in first]
        assert taken == list(range(1, 11))
        assert first.end is not None
        assert first.end.lease_state is LeaseState.OPEN
        assert first.end.lease_count == 10
        assert first.end.message_count == 15  # leased messages no longer wait
    # Another connection (as after a crash) reads the same lease again.
    with connect(broker) as connection:
        again = connection.read_lease("/queue/jobs", "etl/1", max_messages=99)
        assert [m.sequence for m in again] == taken
        assert connection.ack_lease("/queue/jobs", "etl/1") is LeaseState.ACKNOWLEDGED
        assert connection.ack_lease("/queue/jobs", "etl/1") is LeaseState.ACKNOWLEDGED
        after = connection.read_lease("/queue/jobs", "etl/1")
        assert list(after) == []
        assert after.end is not None
        assert after.end.lease_state is LeaseState.ACKNOWLEDGED
        assert connection.head("/queue/jobs").message_count == 15


def test_a_released_lease_gives_its_messages_back_redelivered(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/back", 6))
        assert len(list(connection.read_lease("/queue/back", "g/1", max_messages=4))) == 4
        assert connection.release_lease("/queue/back", "g/1") is LeaseState.EXPIRED
        # A lower number than one used before is never a new lease.
        read = connection.read_lease("/queue/back", "g/2", max_messages=10)
        redelivered = {m.sequence: m.redelivered for m in read}
        assert sorted(redelivered) == [1, 2, 3, 4, 5, 6]
        assert all(redelivered[s] for s in (1, 2, 3, 4))
        stale = connection.read_lease("/queue/back", "g/1")
        assert list(stale) == []
        assert stale.end is not None
        assert stale.end.lease_state is LeaseState.EXPIRED


def test_a_lease_expires_after_its_time_to_live(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/ttl", 3))
        read = connection.read_lease("/queue/ttl", "g/1", ttl_ms=300)
        assert len(list(read)) == 3
        wait_until(lambda: connection.head("/queue/ttl").message_count == 3)  # the lease expired
        assert connection.ack_lease("/queue/ttl", "g/1") is LeaseState.EXPIRED


def test_staged_messages_are_published_once_by_the_commit(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/out", 3), stage="sink-a/7/0.0")
        connection.send_many(messages("/queue/out", 2, start=3), stage="sink-a/7/1.0")
        connection.send_many(messages("/queue/out", 5, start=100), stage="sink-a/7/1.1")
        assert connection.head("/queue/out").message_count == 0  # staged: nobody sees them
        result = connection.commit_stage("sink-a", 7, ["0.0", "1.0"])
        assert result.state is StageState.COMMITTED
        assert result.count == 5
        replay = connection.commit_stage("sink-a", 7, ["0.0", "1.0"])
        assert replay.state is StageState.COMMITTED_BEFORE
        assert replay.count == 0
        assert bodies(connection.read_range("/queue/out", 0, None)) == [
            "m0",
            "m1",
            "m2",
            "m3",
            "m4",
        ]


def test_a_commit_whose_counts_the_stages_do_not_hold_publishes_nothing(
    broker: BrokerThread,
) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/counted", 3), stage="sink-c/4/0.0")
        connection.send_many(messages("/queue/counted", 2, start=3), stage="sink-c/4/1.0")
        # Task 2.0 staged 4 messages elsewhere (a broker that failed): this one has none.
        with pytest.raises(BrokerError) as refused:
            connection.commit_stage("sink-c", 4, ["0.0", "1.0", "2.0"], [3, 2, 4])
        assert refused.value.status == 409
        assert "stage sink-c/4/2.0 holds 0 messages here" in str(refused.value)
        assert connection.head("/queue/counted").message_count == 0  # nothing published
        with pytest.raises(BrokerError, match="stage-counts header"):
            connection.commit_stage("sink-c", 4, ["0.0", "1.0"], [3])
        # The refusals changed nothing: the right counts commit what is there.
        result = connection.commit_stage("sink-c", 4, ["0.0", "1.0", "2.0"], [3, 2, 0])
        assert (result.state, result.count) == (StageState.COMMITTED, 5)
        assert connection.head("/queue/counted").message_count == 5


def test_an_aborted_stage_publishes_nothing(broker: BrokerThread) -> None:
    with connect(broker) as connection:
        connection.send_many(messages("/queue/aborted", 4), stage="sink-b/1/0.0")
        connection.abort_stage("sink-b", 1)
        assert connection.commit_stage("sink-b", 1, ["0.0"]).count == 0
        assert connection.head("/queue/aborted").message_count == 0


def test_refused_sends_are_retried_until_a_consumer_makes_room(
    make_broker: BrokerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.client.pipeline")
    broker = make_broker({"imq.destination.queue.full.maxNumMsgs": "5"})  # REJECT_NEWEST
    retry = RetryPolicy(pause=0.02, deadline=WAIT)
    received: list[str] = []

    def refusals() -> int:
        return sum("refused" in r.getMessage() for r in caplog.records)

    def drain() -> None:
        # Makes room only once the producer has met the full queue, then consumes in leases of 5
        # as messages come.
        wait_until(lambda: refusals() > 0)
        with connect(broker) as consumer:
            number = 0
            while len(received) < 30:
                wait_until(lambda: bool(consumer.head("/queue/full").message_count))
                number += 1
                lease = f"drain/{number}"
                received.extend(bodies(consumer.read_lease("/queue/full", lease, max_messages=5)))
                consumer.ack_lease("/queue/full", lease)

    with connect(broker, retry=retry, max_inflight=3) as producer:
        thread = threading.Thread(target=drain)
        thread.start()
        sent = producer.send_many(messages("/queue/full", 30))
        thread.join(WAIT * 3)
    assert sent == 30
    assert sorted(received) == sorted(f"m{i}" for i in range(30))
    assert refusals(), "the queue never refused a send: the test did not test retrying"


def test_a_send_refused_past_the_deadline_carries_the_brokers_reason(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker({"imq.destination.queue.stuck.maxNumMsgs": "2"})
    retry = RetryPolicy(pause=0.05, deadline=0.5)
    with connect(broker, retry=retry) as connection:
        started = time.monotonic()
        with pytest.raises(ResourceFull) as refused:
            connection.send_many(messages("/queue/stuck", 4))
        assert 0.3 <= time.monotonic() - started < WAIT
    error = refused.value
    assert error.destination == "/queue/stuck"
    assert error.limit == "maxNumMsgs"
    assert error.limit_value == "2"
    assert "still refused after retrying" in str(error)
    assert "status 414" in str(error)


def test_credentials_are_sent_and_a_refusal_names_the_user(
    make_broker: BrokerFactory, tmp_path: Path
) -> None:
    users = UserFile(tmp_path / "passwd")
    users.add("pipe", "pipe-pw-1", ("writers",))
    broker = make_broker(
        {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(tmp_path / "passwd"),
        }
    )
    good = connect(broker, username="pipe", password="pipe-pw-1")  # noqa: S106  (a test's)
    with good as connection:
        assert connection.head("/queue/secured").head_sequence == 0
    bad = "wrong-pw-7"
    refused_connection = connect(broker, username="pipe", password=bad)
    with pytest.raises(Unauthorized) as refused:
        refused_connection.head("/queue/secured")
    assert "user 'pipe'" in str(refused.value)
    assert "wrong-pw-7" not in str(refused.value)
    assert not refused_connection.connected
    # Settings end up in Spark's logs and plans: their repr leaves the password out.
    assert "wrong-pw-7" not in repr(refused_connection.settings)


def test_the_documented_example_runs(broker: BrokerThread) -> None:
    guide = Path(__file__).resolve().parents[2] / "docs" / "client.md"
    blocks = re.findall(r"```python\n(.*?)```", guide.read_text(), re.S)
    (block,) = [b for b in blocks if "sluiceway.client.pipeline" in b]
    code = block.replace("port=61613", f"port={broker.port}")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=45, check=False
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 100
    with connect(broker) as connection:
        assert connection.head("/queue/orders").message_count == 900


def test_held_sends_wait_then_end_with_the_brokers_reason(make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.held.maxNumMsgs": "2",
            "imq.destination.queue.held.limitBehavior": "FLOW_CONTROL",
            "imq.producer.hold.timeout": "300",
        }
    )
    retry = RetryPolicy(pause=0.1, deadline=1.5)
    with connect(broker, retry=retry) as connection:
        started = time.monotonic()
        with pytest.raises(ResourceFull) as refused:
            connection.send_many(messages("/queue/held", 3))
        waited = time.monotonic() - started
    # Held (not refused at once), retried after each "held too long", then given up.
    assert 1.0 <= waited < WAIT * 2
    assert refused.value.summary == "send held too long"
    assert "still refused after retrying" in str(refused.value)
    assert refused.value.limit == "maxNumMsgs"


def test_the_first_broker_of_the_address_list_that_answers_is_used(broker: BrokerThread) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]  # bound, never listening: connections are refused
        settings = PipelineSettings(
            timeout=WAIT, addresses=(("127.0.0.1", dead), ("127.0.0.1", broker.port))
        )
        settings = shipped_copy(settings)
        with PipelineConnection(settings) as connection:
            assert connection.send_many(messages("/queue/listed", 3)) == 3
            assert bodies(connection.read_range("/queue/listed", 1, 10)) == ["m0", "m1", "m2"]
        only_dead = PipelineSettings(timeout=WAIT, addresses=(("127.0.0.1", dead),))
        with pytest.raises(ConnectFailedError, match=rf"127.0.0.1:{dead}: .*refused"):
            PipelineConnection(only_dead).connect()
