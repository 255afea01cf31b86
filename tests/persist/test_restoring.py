"""Recovered messages back into their destinations (persist.restoring): beyond the swap point a
queue's messages are packed for the swap area as their records hold them, never decoded. The
broker must come back exactly as when every message is decoded: the same messages, in the same
order, with the same delivery counts and journal bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.message import Message
from sluiceway.naming import parse_destination
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.replay import Recovery
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, message_fields
from tests.core.test_stages import stage
from tests.persist.helpers import journal_broker

QUEUE = "/queue/results"  # (the queue test_stages.stage sends to)
OTHER = "/queue/other"
TOPIC = "/topic/news"
SWAP_POINT = "16k"  # a few messages in memory, the rest beyond the swap point


class Node:
    """A broker core on a journal in `directory`, started again at will, with or without a
    swap area (without one, every recovered message is decoded and kept in memory)."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self.directory, self.clock = directory, clock
        self.swap: SwapArea | None = None
        self.broker, self.recovery = self.start(swap=False)

    def start(self, *, swap: bool) -> tuple[Broker, Recovery]:
        journal = Journal(self.directory / "journal", sync=SyncPolicy.OS, segment_size=1 << 30)
        self.swap = SwapArea(self.directory / "swap") if swap else None
        if self.swap is not None:
            self.swap.open()
        config = build_config({"imq.swap.threshold": SWAP_POINT})
        return journal_broker(config, journal, clock=self.clock, spill=self.swap)

    def restart(self, *, swap: bool) -> Broker:
        store = self.broker.store
        assert isinstance(store, JournalStore)
        store.flush()
        store.close()
        if self.swap is not None:
            self.swap.close()
        self.broker, self.recovery = self.start(swap=swap)
        return self.broker

    def queue(self, path: str) -> Queue:
        found = self.broker.registry.get(parse_destination(path))
        assert isinstance(found, Queue)
        return found

    def topic(self) -> Topic:
        found = self.broker.registry.get(parse_destination(TOPIC))
        assert isinstance(found, Topic)
        return found

    def drain(self, path: str) -> list[Message]:
        """What the queue holds, taken in delivery order."""
        pending = self.queue(path).pending
        taken = []
        while (message := pending.pop()) is not None:
            taken.append(message)
        return taken


def fields(messages: list[Message]) -> list[tuple[object, ...]]:
    return [message_fields(message) for message in messages]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def send(client: Client, path: str, number: int, *, priority: int = 4) -> None:
    headers = (("number", str(number)), ("kind", "é" * (number % 3)))
    client.connection.send(
        parse_destination(path),
        b"body %d " % number + b"x" * 900,
        headers,
        priority=priority,
        expires=client.broker.clock.time_ms() + 3_600_000 if number % 5 == 0 else 0,
        persistent=True,
    )
    client.broker.settle()


def fill(node: Node) -> None:
    """Two queues interleaved, three priorities, some delivered and never acknowledged (they
    come back with a delivery count and their marks), some consumed."""
    producer = Client(node.broker)
    for number in range(300):
        send(producer, QUEUE if number % 3 else OTHER, number, priority=(0, 4, 9)[number % 3])
    consumer = Client(node.broker)
    consumer.subscribe(QUEUE, limit=40)
    delivered = consumer.take()
    for delivery in delivered[:15]:
        consumer.ack(delivery)
    consumer.connection.close()  # the other 25 go back, delivered once
    again = Client(node.broker)
    again.subscribe(QUEUE, limit=10)
    again.take()
    again.connection.close()  # delivered twice, some of them


def test_a_backlog_beyond_the_swap_point_comes_back_as_if_decoded(
    tmp_path: Path, clock: FakeClock
) -> None:
    node = Node(tmp_path, clock)
    fill(node)
    node.restart(swap=False)
    decoded = {path: fields(node.drain(path)) for path in (QUEUE, OTHER)}
    counts = node.recovery.messages
    assert len(decoded[QUEUE]) == 200 - 15
    assert {m[9] for m in decoded[QUEUE]} == {0, 1, 2}  # (delivery counts)
    node.restart(swap=True)
    assert node.queue(QUEUE).pending.spilled > 150  # most of them packed, not decoded
    assert node.queue(OTHER).pending.spilled > 50
    assert {path: fields(node.drain(path)) for path in (QUEUE, OTHER)} == decoded
    assert node.recovery.messages == counts


def test_the_accounting_of_packed_messages_is_that_of_decoded_ones(
    tmp_path: Path, clock: FakeClock
) -> None:
    node = Node(tmp_path, clock)
    fill(node)

    def accounts() -> list[tuple[int, ...]]:
        system = node.broker.context.system
        found: list[tuple[int, ...]] = [(system.count, system.bytes)]
        for path in (QUEUE, OTHER):
            queue = node.queue(path)
            fullness = queue.fullness()
            found.append((queue.held_count, queue.held_bytes, fullness.count, fullness.bytes))
            found.append((len(queue.pending), queue.pending.bytes, queue.last_seq))
        return found

    node.restart(swap=False)
    expected = accounts()
    node.restart(swap=True)
    assert accounts() == expected


def test_a_republished_stage_keeps_its_place_among_packed_messages(
    tmp_path: Path, clock: FakeClock
) -> None:
    node = Node(tmp_path, clock)
    producer = Client(node.broker)
    for number in range(60):
        send(producer, QUEUE, number)
    for task in ("0.0", "1.0"):
        stage(producer, f"s/1/{task}", b"staged " + task.encode() + b"x" * 900)
    for number in range(60, 90):
        send(producer, QUEUE, number)
    node.broker.stages.commit("s", 1, ["0.0", "1.0"])  # published after the 90
    for number in range(90, 150):
        send(producer, QUEUE, number)
    stage(producer, "s/2/0.0", b"still staged")
    node.restart(swap=False)
    decoded = node.drain(QUEUE)
    assert [m.body[:9] for m in decoded[88:93]] == [
        b"body 88 x",
        b"body 89 x",
        b"staged 0.",
        b"staged 1.",
        b"body 90 x",
    ]
    node.restart(swap=True)
    assert node.queue(QUEUE).pending.spilled > 100
    assert fields(node.drain(QUEUE)) == fields(decoded)
    assert [str(s.name) for s in node.broker.stages] == ["s/2/0.0"]


def test_a_topic_takes_its_messages_decoded(tmp_path: Path, clock: FakeClock) -> None:
    node = Node(tmp_path, clock)
    subscriber = Client(node.broker)
    subscriber.connection.client_id = "c1"
    subscriber.connection.subscribe(
        "d1",
        parse_destination(TOPIC),
        AckMode.CLIENT_INDIVIDUAL,
        requested_limit=1,
        threshold=0,
        prefetch=False,
        durable_name="keep",
    )
    subscriber.connection.close()
    producer = Client(node.broker)
    for number in range(50):
        send(producer, TOPIC, number)
    node.restart(swap=False)
    decoded = fields(node.topic().log.read(0, 100))
    node.restart(swap=True)
    assert fields(node.topic().log.read(0, 100)) == decoded
    assert len(decoded) == 50
    assert node.recovery.messages[parse_destination(TOPIC)] == 50
