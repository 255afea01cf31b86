"""Taking over a failed broker's store: what its journal held, adopted into a live broker.

Two real brokers on real sockets with their journals on disk: the first is given messages by
stomp.py, has some consumed, some delivered and not acknowledged, and a durable subscription
partly acknowledged, then stops. The second adopts the first's journal (the medium does not
matter: a cluster's journals are in PostgreSQL, these are files) and its clients must find
exactly what the first broker's clients were not yet done with: nothing acknowledged back,
nothing receipted lost, redelivered messages flagged.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.client.pipeline import (
    LeaseState,
    OutgoingMessage,
    PipelineConnection,
    PipelineMessage,
    StageState,
)
from sluiceway.client.pipeline_values import PipelineSettings
from sluiceway.cluster.adoption import AdoptionReport, StoreAdopter
from sluiceway.persist.journal import Journal
from sluiceway.persist.journal_store import JournalStore
from sluiceway.testing import BrokerThread
from tests.e2e.stomppy import connect, subscribe, sync, with_receipt

pytestmark = pytest.mark.timeout(120)

QUEUE = "/queue/orders"
TOPIC = "/topic/prices"


@pytest.fixture
def victim_directory() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="sluiceway-victim-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def send_all(port: int, destination: str, bodies: list[str]) -> None:
    connection, recorder = connect(port)
    try:
        for body in bodies:
            headers = {"persistent": "true"}
            with_receipt(
                recorder,
                functools.partial(send_one, connection, destination, body, headers),
            )
    finally:
        connection.disconnect()


def send_one(
    connection: Any, destination: str, body: str, headers: dict[str, str], receipt: str
) -> None:
    connection.send(destination, body, headers={**headers, "receipt": receipt})


def fill_the_victim(directory: Path) -> None:
    """Queue: 20 sent, 8 delivered, 5 of them acknowledged, which refills the window (threshold
    50%) with 5 more: 8 delivered and not acknowledged. Durable: 10 sent, 4 acknowledged."""
    properties = {"imq.persist.file.directory": str(directory)}
    with BrokerThread(properties) as victim:
        connection, recorder = connect(victim.port, **{"client-id": "app"})
        subscribe(connection, recorder, TOPIC, "d", durable_subscription_name="d")
        send_all(victim.port, QUEUE, [f"q{n}" for n in range(20)])
        send_all(victim.port, TOPIC, [f"t{n}" for n in range(10)])
        durable = recorder.wait_messages(10)
        for frame in durable[:4]:
            connection.ack(frame.headers["ack"])
        sync(connection, recorder)
        connection.disconnect()

        consumer, got = connect(victim.port)
        subscribe(consumer, got, QUEUE, "q", consumer_flow_limit="8")
        frames = got.wait_messages(8)
        for frame in frames[:5]:
            consumer.ack(frame.headers["ack"])
        sync(consumer, got)
        # The other three, and the five the acknowledgements made room for, were delivered:
        # the broker stops before they are acknowledged.
        got.wait_messages(13)
    # (the context stopped the broker; its consumer's three messages were given back)


def adopt(live: BrokerThread, directory: Path) -> AdoptionReport:
    assert live.broker is not None
    store = JournalStore(Journal(directory / "journal"))
    adopter = StoreAdopter(live.broker, live.config, live.call)
    result: list[AdoptionReport] = []
    # The adoption reads on a thread of its own, never the broker's loop.
    reader = threading.Thread(target=lambda: result.append(adopter.adopt(store)))
    reader.start()
    reader.join(60)
    store.close()
    assert result, "the adoption did not finish"
    return result[0]


def test_a_taken_over_store_gives_back_exactly_what_was_not_done(victim_directory: Path) -> None:
    fill_the_victim(victim_directory)
    with BrokerThread() as live:
        # Already here: a queue message of the live broker's own, and the durable subscriber,
        # reconnected before the takeover (its subscription made anew here, empty).
        send_all(live.port, QUEUE, ["own"])
        subscriber, durable = connect(live.port, **{"client-id": "app"})
        subscribe(subscriber, durable, TOPIC, "d", durable_subscription_name="d")
        other, other_got = connect(live.port, **{"client-id": "other"})
        subscribe(other, other_got, TOPIC, "o", durable_subscription_name="o")

        report = adopt(live, victim_directory)

        assert report.messages == 15
        assert report.redelivered == 8
        assert report.durables == 1
        assert report.durable_messages == 6
        frames = durable.wait_messages(6)
        assert [frame.body for frame in frames] == [f"t{n}" for n in range(4, 10)]
        consumer, got = connect(live.port)
        subscribe(consumer, got, QUEUE, "q")
        queue = got.wait_messages(16)
        assert [frame.body for frame in queue] == ["own", *(f"q{n}" for n in range(5, 20))]
        flagged = [frame.body for frame in queue if frame.headers.get("redelivered") == "true"]
        assert flagged == [f"q{n}" for n in range(5, 13)]
        # Another durable subscription here does not get the failed broker's messages.
        sync(other, other_got)
        assert other_got.messages == []
        for connection in (subscriber, consumer, other):
            connection.disconnect()


def test_what_was_adopted_survives_a_restart_of_the_adopter(victim_directory: Path) -> None:
    fill_the_victim(victim_directory)
    live_directory = Path(tempfile.mkdtemp(prefix="sluiceway-live-"))
    properties = {"imq.persist.file.directory": str(live_directory)}
    try:
        with BrokerThread(properties) as live:
            subscriber, durable = connect(live.port, **{"client-id": "app"})
            subscribe(subscriber, durable, TOPIC, "d", durable_subscription_name="d")
            subscriber.disconnect()
            report = adopt(live, victim_directory)
            assert report.messages == 15
        with BrokerThread(properties) as again:
            subscriber, durable = connect(again.port, **{"client-id": "app"})
            subscribe(subscriber, durable, TOPIC, "d", durable_subscription_name="d")
            assert [f.body for f in durable.wait_messages(6)] == [f"t{n}" for n in range(4, 10)]
            consumer, got = connect(again.port)
            subscribe(consumer, got, QUEUE, "q")
            queue = got.wait_messages(15)
            assert [frame.body for frame in queue] == [f"q{n}" for n in range(5, 20)]
            flagged = [f.body for f in queue if f.headers.get("redelivered") == "true"]
            assert flagged == [f"q{n}" for n in range(5, 13)]
            subscriber.disconnect()
            consumer.disconnect()
    finally:
        shutil.rmtree(live_directory, ignore_errors=True)


def pipe_to(broker: BrokerThread) -> PipelineConnection:
    return PipelineConnection(PipelineSettings(port=broker.port))


def bodies(read: Iterable[PipelineMessage]) -> list[str]:
    return [message.body.decode() for message in read]


def test_open_leases_are_adopted_under_their_numbers_with_their_messages(
    victim_directory: Path,
) -> None:
    """A pipeline reader that comes to the member that took its broker over reads the same
    leases again, and the numbers its group used stay used."""
    properties = {"imq.persist.file.directory": str(victim_directory)}
    with BrokerThread(properties) as victim, pipe_to(victim) as pipe:
        send_all(victim.port, QUEUE, [f"q{n}" for n in range(10)])
        assert bodies(pipe.read_lease(QUEUE, "g/1", max_messages=3)) == ["q0", "q1", "q2"]
        assert bodies(pipe.read_lease(QUEUE, "g/2", max_messages=2)) == ["q3", "q4"]
        assert bodies(pipe.read_lease(QUEUE, "g/3", max_messages=2)) == ["q5", "q6"]
        pipe.ack_lease(QUEUE, "g/2")  # consumed: q3 and q4 never come back
    live_directory = Path(tempfile.mkdtemp(prefix="sluiceway-live-"))
    live_properties = {"imq.persist.file.directory": str(live_directory)}
    try:
        with BrokerThread(live_properties) as live:
            report = adopt(live, victim_directory)
            assert (report.messages, report.leases) == (8, 2)
        with BrokerThread(live_properties) as again, pipe_to(again) as pipe:  # after a restart
            assert bodies(pipe.read_lease(QUEUE, "g/3")) == ["q5", "q6"]
            assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["q0", "q1", "q2"]
            assert pipe.ack_lease(QUEUE, "g/2") is LeaseState.ACKNOWLEDGED  # as it was there
            assert pipe.ack_lease(QUEUE, "g/1") is LeaseState.ACKNOWLEDGED
            assert pipe.release_lease(QUEUE, "g/3") is LeaseState.EXPIRED  # back to the queue
            assert bodies(pipe.read_lease(QUEUE, "g/4", max_messages=10)) == [
                "q5",
                "q6",
                "q7",
                "q8",
                "q9",
            ]
    finally:
        shutil.rmtree(live_directory, ignore_errors=True)


def test_a_lease_whose_number_is_used_here_gives_its_messages_to_the_queue(
    victim_directory: Path,
) -> None:
    properties = {"imq.persist.file.directory": str(victim_directory)}
    with BrokerThread(properties) as victim, pipe_to(victim) as pipe:
        send_all(victim.port, QUEUE, ["v0", "v1"])
        assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["v0", "v1"]
    with BrokerThread() as live, pipe_to(live) as pipe:
        send_all(live.port, QUEUE, ["l0"])
        assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["l0"]  # read here before the takeover
        report = adopt(live, victim_directory)
        assert (report.messages, report.leases) == (2, 0)
        assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["l0"]
        consumer, got = connect(live.port)
        subscribe(consumer, got, QUEUE, "q")
        frames = got.wait_messages(2)
        assert [(f.body, f.headers.get("redelivered")) for f in frames] == [
            ("v0", "true"),
            ("v1", "true"),
        ]
        consumer.disconnect()


def test_open_stages_are_adopted_and_a_commit_publishes_them(
    victim_directory: Path,
) -> None:
    """A COMMIT of a batch staged on the failed member before it failed publishes what was
    staged there, and a replayed COMMIT of a batch it had committed publishes nothing."""
    properties = {"imq.persist.file.directory": str(victim_directory)}
    with BrokerThread(properties) as victim, pipe_to(victim) as pipe:
        pipe.send_many(outgoing(["c0", "c1"]), stage="sink/4/t0")
        assert pipe.commit_stage("sink", 4, ["t0"], [2]).count == 2
        pipe.send_many(outgoing(["s0", "s1", "s2"]), stage="sink/5/t0")
        pipe.send_many(outgoing(["s3"]), stage="sink/5/t1")
    with BrokerThread() as live, pipe_to(live) as pipe:
        report = adopt(live, victim_directory)
        assert (report.messages, report.stages) == (2, 2)
        assert report.committed_kept
        assert pipe.commit_stage("sink", 4, ["t0"], [2]).state is StageState.COMMITTED_BEFORE
        result = pipe.commit_stage("sink", 5, ["t0", "t1"], [3, 1])
        assert (result.state, result.count) == (StageState.COMMITTED, 4)
        assert bodies(pipe.read_range(QUEUE, 0, None)) == ["c0", "c1", "s0", "s1", "s2", "s3"]


def outgoing(bodies: list[str]) -> list[OutgoingMessage]:
    return [OutgoingMessage(QUEUE, body.encode()) for body in bodies]


def test_a_sinks_committed_batch_is_not_taken_over_when_a_replay_could_read_otherwise(
    victim_directory: Path,
) -> None:
    """The failed member's lease group was read here before the takeover: a replay of its last
    batch may read other messages here, which `committed-before` would have acknowledged
    unwritten. So the replay publishes again (at least once)."""
    properties = {"imq.persist.file.directory": str(victim_directory)}
    with BrokerThread(properties) as victim, pipe_to(victim) as pipe:
        send_all(victim.port, QUEUE, ["v0"])
        assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["v0"]
        pipe.send_many(outgoing(["out0"]), stage="sink/1/t0")
        assert pipe.commit_stage("sink", 1, ["t0"], [1]).count == 1
    with BrokerThread() as live, pipe_to(live) as pipe:
        send_all(live.port, QUEUE, ["l0"])
        assert bodies(pipe.read_lease(QUEUE, "g/1")) == ["l0"]  # read here before the takeover
        report = adopt(live, victim_directory)
        assert not report.committed_kept
        pipe.send_many(outgoing(["replayed"]), stage="sink/1/t1")
        result = pipe.commit_stage("sink", 1, ["t1"], [1])
        assert (result.state, result.count) == (StageState.COMMITTED, 1)
