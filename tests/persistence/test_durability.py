"""Persistence end to end: restarts, crashes, durable subscriptions, damage, reclaiming disk."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluiceway.client import ConnectionFactory
from sluiceway.core.model.topic import Topic
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.persist.journal_store import JournalStore
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.e2e.stomppy import connect, subscribe, sync, with_receipt
from tests.persistence.raw import client, drain, send


def test_persistent_messages_survive_a_restart_and_others_do_not(tmp_path: Path) -> None:
    data = str(tmp_path)
    with BrokerThread({"imq.persist.file.directory": data}) as broker:
        raw = client(broker.port)
        send(raw, "/queue/keep", b"kept", persistent="true")
        send(raw, "/queue/keep", b"forgotten", persistent="false")
        raw.close()
    with BrokerThread({"imq.persist.file.directory": data}) as broker:
        assert drain(broker.port, "/queue/keep") == [(b"kept", "false")]
    with BrokerThread({"imq.persist.file.directory": data}) as broker:
        assert drain(broker.port, "/queue/keep") == []  # acknowledged: gone for good


def test_delivered_but_unacknowledged_comes_back_redelivered_after_sigkill(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        raw = client(broker.port)
        for body in (b"one", b"two", b"three"):
            send(raw, "/queue/kill", body, persistent="true")
        consumer = client(broker.port)
        consumer.subscribe("/queue/kill")
        first, _, _ = consumer.receive(3)
        consumer.request("ACK", {"id": first.headers["ack"]})
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, "/queue/kill") == [(b"two", "true"), (b"three", "true")]


def test_committed_transaction_survives_a_crash_and_an_open_one_does_not(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    with BrokerProcess(data_dir=data) as broker:
        raw = client(broker.port)
        raw.request("BEGIN", {"transaction": "done"})
        send(raw, "/queue/tx", b"committed", persistent="true", transaction="done")
        raw.request("COMMIT", {"transaction": "done"})
        raw.request("BEGIN", {"transaction": "open"})
        send(raw, "/queue/tx", b"never committed", persistent="true", transaction="open")
        broker.kill()
    with BrokerProcess(data_dir=data) as broker:
        assert drain(broker.port, "/queue/tx") == [(b"committed", "false")]


def test_sequence_numbers_keep_rising_across_restarts(tmp_path: Path) -> None:
    data = str(tmp_path)
    seen = []
    for _ in range(3):
        with BrokerProcess(data_dir=data) as broker:
            raw = client(broker.port)
            raw.subscribe("/queue/seq", ack="auto")
            send(raw, "/queue/seq", b"x", persistent="false")
            (message,) = raw.receive(1)
            seen.append(int(message.headers["sequence"]))
            broker.kill()
    assert seen == sorted(seen)
    assert len(set(seen)) == 3


def test_durable_subscription_receives_while_away_and_across_a_restart(tmp_path: Path) -> None:
    data = str(tmp_path)
    with BrokerThread({"imq.persist.file.directory": data}) as broker:
        subscriber = client(broker.port, client_id="app")
        subscriber.subscribe("/topic/news", "n", durable_subscription_name="reader")
        producer = client(broker.port)
        send(producer, "/topic/news", b"while present", persistent="true")
        (present,) = subscriber.receive(1)
        subscriber.ack(present)
        subscriber.request("UNSUBSCRIBE", {"id": "n"})  # away: the subscription stays
        send(producer, "/topic/news", b"while away", persistent="true")
        send(producer, "/topic/news", b"also while away", persistent="true")
        subscriber.close()
    with BrokerThread({"imq.persist.file.directory": data}) as broker:
        subscriber = client(broker.port, client_id="app")
        subscriber.subscribe("/topic/news", "n", durable_subscription_name="reader")
        bodies = [m.body for m in subscriber.receive(2)]
        assert bodies == [b"while away", b"also while away"]
        subscriber.sync()
        assert subscriber.drain() == []
        # Removing it for good: nothing more is kept for it.
        subscriber.request("UNSUBSCRIBE", {"id": "n", "durable-subscription-name": "reader"})
        send(client(broker.port), "/topic/news", b"after removal", persistent="true")
        subscriber.subscribe("/topic/news", "n2", durable_subscription_name="reader")
        subscriber.sync()
        assert subscriber.drain() == []  # a new subscription starts from now


def test_durable_subscription_with_stomp_py(broker: BrokerThread) -> None:
    connection, recorder = connect(broker.port, **{"client-id": "stomp-app"})
    subscribe(
        connection,
        recorder,
        "/topic/t",
        "d",
        ack="client-individual",
        **{"activemq.subscriptionName": "audit"},
    )
    connection.disconnect()
    producer, _ = connect(broker.port)
    producer.send("/topic/t", "kept for you", headers={"persistent": "true"})
    again, recorder = connect(broker.port, **{"client-id": "stomp-app"})
    subscribe(again, recorder, "/topic/t", "d", **{"activemq.subscriptionName": "audit"})
    (frame,) = recorder.wait_messages(1)
    assert frame.body == "kept for you"
    again.ack(frame.headers["ack"])
    sync(again, recorder)
    again.disconnect()
    producer.disconnect()


def test_durable_subscription_with_the_python_client(tmp_path: Path) -> None:
    async def scenario(port: int) -> list[str]:
        factory = ConnectionFactory(f"stomp://127.0.0.1:{port}", client_id="py-app")
        async with await factory.connect() as connection:
            session = connection.session()
            consumer = await session.durable_subscriber("/topic/py", "py-reader")
            await consumer.close()
            await session.producer("/topic/py").send("one")
            await session.producer("/topic/py").send("two")
            consumer = await session.durable_subscriber("/topic/py", "py-reader")
            got = [m.text for m in [await consumer.receive(5), await consumer.receive(5)] if m]
            await consumer.close()
            await session.unsubscribe("py-reader")
            return got

    with BrokerThread({"imq.persist.file.directory": str(tmp_path)}) as broker:
        assert asyncio.run(scenario(broker.port)) == ["one", "two"]


def test_a_durable_subscription_is_used_by_one_subscriber_at_a_time(broker: BrokerThread) -> None:
    first = client(broker.port, client_id="solo")
    first.subscribe("/topic/one", "a", durable_subscription_name="only")
    second = client(broker.port, client_id="solo")
    second.send(
        "SUBSCRIBE",
        {"destination": "/topic/one", "id": "b", "durable-subscription-name": "only"},
    )
    error = second.expect("ERROR")
    assert error.headers["status"] == "409"


def test_range_reads_of_a_topic_log(broker: BrokerThread) -> None:
    holder = client(broker.port, client_id="keeper")
    holder.subscribe("/topic/log", "h", durable_subscription_name="keep", consumer_flow_limit="1")
    producer = client(broker.port)
    for i in range(10):
        send(producer, "/topic/log", b"%d" % i, persistent="true")
    reader = client(broker.port)
    (first,) = holder.receive(1)
    start = int(first.headers["sequence"])
    reader.subscribe(
        "/topic/log",
        "r",
        browser="true",
        from_sequence=str(start + 2),
        to_sequence=str(start + 5),
    )
    messages = reader.receive(4)
    assert [m.body for m in messages[:3]] == [b"2", b"3", b"4"]
    assert [int(m.headers["sequence"]) for m in messages[:3]] == [start + 2, start + 3, start + 4]
    end = messages[3]
    assert end.headers["browser"] == "end"
    assert int(end.headers["next-sequence"]) == start + 5
    assert int(end.headers["head-sequence"]) == start + 9


def test_corrupt_record_in_the_middle_stops_start_up_until_told_to_skip(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data_dir=str(data)) as broker:
        raw = client(broker.port)
        for i in range(50):
            send(raw, "/queue/damaged", b"message %d" % i + b"." * 200, persistent="true")
        broker.stop()
    (segment,) = sorted((data / "journal").glob("*.log"))
    content = bytearray(segment.read_bytes())
    middle = len(content) // 2
    content[middle] ^= 0xFF
    segment.write_bytes(bytes(content))
    printed = start_failing(data)
    assert segment.name in printed
    assert "imq.persist.file.skip_corrupt" in printed
    with BrokerProcess("-D", "imq.persist.file.skip_corrupt=true", data_dir=str(data)) as broker:
        remaining = drain(broker.port, "/queue/damaged")
        assert 40 <= len(remaining) < 50  # the damaged record's message is lost, not the rest
        _, log = broker.stop()
    assert "skipped" in log
    assert list((data / "journal" / "discarded").iterdir())  # the bad bytes were kept


def test_torn_tail_is_cut_and_saved(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with BrokerProcess(data_dir=str(data)) as broker:
        send(client(broker.port), "/queue/torn", b"whole", persistent="true")
        broker.stop()
    (segment,) = sorted((data / "journal").glob("*.log"))
    with segment.open("ab") as handle:
        handle.write(b"\x40\x00\x00\x00half a record")
    with BrokerProcess(data_dir=str(data)) as broker:
        assert drain(broker.port, "/queue/torn") == [(b"whole", "false")]
        _, log = broker.stop()
    assert "a record cut short by a crash while it was being written" in log
    assert "never confirmed to any client" in log


def start_failing(data: Path) -> str:
    """Start a broker on `data` that must refuse to start: what it printed."""
    result = subprocess.run(
        [sys.executable, "-m", "sluiceway", "broker", "--port", "0", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    return result.stderr


def test_a_damaged_confirmed_last_record_is_reported_with_what_it_held(tmp_path: Path) -> None:
    """A flipped bit in the journal's last record, which a RECEIPT had confirmed: the broker
    says so, with the message it held, instead of cutting it as a write a crash interrupted."""
    data = tmp_path / "data"
    with BrokerProcess(data_dir=str(data)) as broker:
        raw = client(broker.port)
        send(raw, "/queue/rot", b"first", persistent="true")
        send(raw, "/queue/rot", b"confirmed, then damaged", persistent="true")
        status, _ = broker.stop()
        assert status == 0
    (segment,) = sorted((data / "journal").glob("*.log"))
    content = bytearray(segment.read_bytes())
    content[-3] ^= 0x01  # in the last message's body
    segment.write_bytes(bytes(content))
    printed = start_failing(data)
    assert segment.name in printed
    assert "may have been confirmed to a client" in printed
    assert "It held ADD, a persistent message: lost" in printed
    assert "to /queue/rot" in printed
    with BrokerProcess("-D", "imq.persist.file.skip_corrupt=true", data_dir=str(data)) as broker:
        assert drain(broker.port, "/queue/rot") == [(b"first", "false")]
        _, log = broker.stop()
    assert "was damaged on disk after it was written" in log
    assert "lost: ADD, a persistent message: lost" in log
    assert "never confirmed" not in log


def test_disk_use_follows_the_live_messages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    properties = {
        "imq.persist.file.directory": str(data),
        "imq.persist.file.segment.size": "64k",
    }
    with BrokerThread(properties) as broker:
        producer = client(broker.port)
        consumer = client(broker.port)
        consumer.subscribe("/queue/churn", ack="client-individual")
        for i in range(600):
            send(producer, "/queue/churn", b"%d " % i + b"x" * 500, persistent="true")
            (message,) = consumer.receive(1)
            consumer.ack(message)
        consumer.sync()
        send(producer, "/queue/churn", b"the one that stays" + b"x" * 500, persistent="true")
        journal = data / "journal"
        assert broker.broker is not None
        store = broker.broker.store
        assert isinstance(store, JournalStore)
        # Every message went through the journal (its ADD, DELIVERED and REMOVE), whatever the
        # tick reclaimed meanwhile.
        records = broker.call(lambda: store.journal.next_lsn)
        broker.call(store.compact)
        after = sum(p.stat().st_size for p in journal.glob("*.log"))
    assert records > 3 * 600
    assert after < 64 * 1024 * 2  # what is left: the live message, a snapshot, the active segment
    with BrokerThread(properties) as broker:
        assert [body[:18] for body, _ in drain(broker.port, "/queue/churn")] == [
            b"the one that stays"
        ]


def test_a_second_broker_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    with BrokerProcess(data_dir=str(tmp_path)):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sluiceway",
                "broker",
                "--port",
                "0",
                "--data-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1
    assert "in use by another broker" in result.stderr


@pytest.mark.parametrize("policy", ["always", "group", "os"])
def test_every_sync_policy_delivers(tmp_path: Path, policy: str) -> None:
    properties = {
        "imq.persist.file.directory": str(tmp_path),
        "imq.persist.file.sync.policy": policy,
    }
    with BrokerThread(properties) as broker:
        raw = client(broker.port)
        for i in range(20):
            send(raw, "/queue/policy", b"%d" % i, persistent="true")
    with BrokerThread(properties) as broker:
        assert [b for b, _ in drain(broker.port, "/queue/policy")] == [b"%d" % i for i in range(20)]


def test_receipts_do_not_wait_for_the_sync_delay(tmp_path: Path) -> None:
    """Under `group`, writes nothing waits for are fsynced up to imq.persist.file.sync.delay
    later; a SEND with a receipt has its fsync at once (ten of them one after the other would
    take ten seconds otherwise)."""
    properties = {
        "imq.persist.file.directory": str(tmp_path),
        "imq.persist.file.sync.delay": "1000",
    }
    with BrokerThread(properties) as broker:
        raw = client(broker.port)
        connection, recorder = connect(broker.port)
        started = time.monotonic()
        for i in range(5):
            send(raw, "/queue/delay", b"raw %d" % i, persistent="true")
            body = b"stomp.py %d" % i

            def send_persistent(receipt: str, body: bytes = body) -> None:
                headers = {"persistent": "true", "receipt": receipt}
                connection.send("/queue/delay", body, headers=headers)

            with_receipt(recorder, send_persistent)
        assert time.monotonic() - started < 5.0
        connection.disconnect()
    with BrokerThread(properties) as broker:
        assert len(drain(broker.port, "/queue/delay")) == 10


def test_memory_store_keeps_nothing(tmp_path: Path) -> None:
    properties = {
        "imq.persist.store": "memory",
        "imq.persist.file.directory": str(tmp_path / "unused"),
    }
    with BrokerThread(properties) as broker:
        send(client(broker.port), "/queue/volatile", b"gone at restart", persistent="true")
    with BrokerThread(properties) as broker:
        assert drain(broker.port, "/queue/volatile") == []
    assert not (tmp_path / "unused").exists()


def test_compact_reclaims_what_a_durable_subscription_no_longer_needs(tmp_path: Path) -> None:
    properties = {
        "imq.persist.file.directory": str(tmp_path),
        "imq.persist.file.segment.size": "64k",
    }
    with BrokerThread(properties) as broker:
        subscriber = client(broker.port, client_id="c")
        subscriber.subscribe("/topic/big", "s", durable_subscription_name="d", ack="auto")
        producer = client(broker.port)
        for _ in range(300):
            send(producer, "/topic/big", b"x" * 1000, persistent="true")
        subscriber.receive(300)  # auto-acknowledged as delivered
        assert broker.broker is not None
        core = broker.broker
        broker.call(core.compact)
        # 300 KB of acknowledged messages went over 64 KB segments; whether the tick or this
        # compaction deleted them, what is left is the active segment and at most one more.
        segments = list((tmp_path / "journal").glob("*.log"))
        assert segments
        assert sum(p.stat().st_size for p in segments) < 2 * 64 * 1024
        topic = core.registry.get(DestinationName(DestinationKind.TOPIC, "big"))
        assert isinstance(topic, Topic)
        assert broker.call(lambda: len(topic.log)) == 0  # nothing kept that nobody needs


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def test_receipted_messages_survive_the_deletion_of_an_older_segment(tmp_path: Path) -> None:
    """Acknowledgements written in a later segment outlive the segment of their messages,
    which the upkeep deletes; a restart must take them for dead, not for records of another
    segment (which lost a receipted message here in every run before)."""
    data = str(tmp_path)
    first = tmp_path / "journal" / f"{1:020d}.log"
    with BrokerProcess("-D", "imq.persist.file.segment.size=1m", data_dir=data) as broker:
        raw = client(broker.port)
        body = b"a" * 1024
        sent_a = 0
        while len(list((tmp_path / "journal").glob("*.log"))) < 2:
            send(raw, "/queue/a", body, persistent="true")
            sent_a += 1
        bodies = [b"b%d" % i for i in range(3000)]
        for small in bodies:
            send(raw, "/queue/b", small, persistent="true")
        consumer = client(broker.port)
        consumer.subscribe("/queue/a", consumer_flow_limit="100")
        for _ in range(sent_a):
            (message,) = consumer.receive(1)
            consumer.request("ACK", {"id": message.headers["ack"]})
        wait_for(lambda: not first.exists(), 30, "deleting the first segment")
        status, _ = broker.stop()
        assert status == 0
    with BrokerProcess(data_dir=data) as broker:
        got = drain(broker.port, "/queue/b")
        assert sorted(b for b, _ in got) == sorted(bodies)
        assert drain(broker.port, "/queue/a") == []
        assert "named messages of segments deleted since" in broker.log
