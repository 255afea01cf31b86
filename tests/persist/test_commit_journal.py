"""A COMMIT on a real journal is all or nothing.

What may refuse a COMMIT (a message the journal cannot keep, the disk refusing the write, an
internal error) happens before any of it takes effect. Then no consumer gets a message of it, its
acknowledgements are undone (the messages come back redelivered), the journal holds none of it
after a restart, and the broker goes on serving. A COMMIT that succeeds writes each of its records
once: publishing adopts the records written before it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast, overload

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.model.store import MessageStore
from sluiceway.core.model.subscription import AckMode, Delivery
from sluiceway.core.values.message import Message
from sluiceway.errors import BadRequest, InternalError
from sluiceway.naming import parse_destination
from sluiceway.persist.files import OS_FILES, Files
from sluiceway.persist.format import RecordType, encode_position, encode_tx
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.replay import Recovery
from sluiceway.persist.restoring import Delivering, restore_broker
from sluiceway.persist.simulated import SimulatedDisk
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies

IN, OUT = "/queue/in", "/queue/out"
BIG = (("x-big", "v" * 70_000),)  # more than the 65535 bytes a record keeps of a header
RECORD_HEADER = 17  # bytes before a journal record's payload (persist.journal)


class Node:
    """A broker core on a real journal in `directory` (of `files`), restarted at will."""

    def __init__(
        self,
        directory: Path,
        files: Files = OS_FILES,
        properties: dict[str, str] | None = None,
    ) -> None:
        self.directory, self.files, self.properties = directory, files, properties or {}
        self.recovery: Recovery | None = None
        self.broker = self.open()

    def open(self, wrap: type[Any] | None = None) -> Broker:
        """A broker on the journal; with `wrap`, its store is `wrap(the JournalStore)`."""
        self.store = JournalStore(Journal(self.directory, sync=SyncPolicy.OS, files=self.files))
        config, clock = build_config(self.properties), FakeClock()
        if wrap is None:
            self.broker = Broker(config, clock=clock, store=self.store)
            self.recovery = restore_broker(self.store, self.broker)
        else:
            self.store.recover(Delivering(lambda m: None))  # (a new journal: nothing to give back)
            wrapped = cast(MessageStore, wrap(self.store))
            self.broker = Broker(config, clock=clock, store=wrapped)
        return self.broker

    @property
    def journal(self) -> Journal:
        return self.store.journal

    def restart(self) -> Broker:
        self.store.flush()
        self.store.close()
        return self.open()

    def records(self) -> list[RecordType]:
        self.store.flush()
        return [RecordType(record.type) for record in self.journal.scan()]


def held(broker: Broker, path: str) -> list[bytes]:
    """The bodies a fresh consumer of `path` gets (acknowledged as it goes)."""
    reader = Client(broker)
    reader.subscribe(path, "reader")
    deliveries = reader.take()
    for delivery in deliveries:
        reader.ack(delivery)
    return bodies(deliveries)


class Scene:
    """A consumer of OUT, and a producer that acknowledged, in transaction `tx`, a persistent
    message of IN delivered to it, then sent three persistent messages to OUT in `tx`, the
    second with `second` as its headers."""

    def __init__(self, broker: Broker, second: tuple[tuple[str, str], ...] = ()) -> None:
        self.broker = broker
        self.consumer = Client(broker)
        self.consumer.subscribe(OUT, "out")
        self.producer = Client(broker)
        self.producer.send(IN, b"acked", persistent=True)
        self.producer.subscribe(IN, "in")
        (self.acked,) = self.producer.take()
        self.producer.connection.begin("tx")
        self.producer.ack(self.acked, transaction="tx")
        self.producer.send(OUT, b"one", persistent=True, transaction="tx")
        self.producer.send(OUT, b"two", persistent=True, transaction="tx", headers=second)
        self.producer.send(OUT, b"three", persistent=True, transaction="tx")
        self.broker.store.flush()

    def check_nothing_took_effect(self) -> None:
        assert self.consumer.take() == []
        out = self.broker.registry.get(parse_destination(OUT))
        assert out is not None
        assert (out.held_count, out.last_seq, out.stats.msgs_in) == (0, 0, 0)
        (again,) = self.producer.take()  # the acknowledgement was undone
        assert again.message is self.acked.message
        assert again.delivery_count == 2
        with pytest.raises(BadRequest, match="not open"):
            self.producer.connection.commit("tx")  # rolled back, not left open

    def commit_another(self) -> Delivery:
        """The broker goes on: a new transaction of the same connection commits."""
        self.producer.connection.begin("after")
        self.producer.send(OUT, b"after", persistent=True, transaction="after")
        self.producer.connection.commit("after")
        (delivery,) = self.consumer.take()
        assert delivery.message.body == b"after"
        self.consumer.ack(delivery)
        return delivery


def test_a_commit_writes_each_of_its_records_once_before_publishing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    scene = Scene(node.broker)
    before = node.records()
    scene.producer.connection.commit("tx")
    # The numbers the messages take are reserved first, then their TX and its records.
    assert node.records()[len(before) :] == [
        RecordType.SEQ,
        RecordType.TX,
        RecordType.ADD,
        RecordType.ADD,
        RecordType.ADD,
        RecordType.REMOVE,
    ]
    assert bodies(scene.consumer.take()) == [b"one", b"two", b"three"]
    broker = node.restart()
    assert held(broker, IN) == []
    assert held(broker, OUT) == [b"one", b"two", b"three"]


def test_a_topic_commit_writes_what_its_durable_subscription_keeps_once(tmp_path: Path) -> None:
    node = Node(tmp_path)
    subscriber = Client(node.broker)
    subscriber.connection.client_id = "app"
    subscriber.connection.subscribe(
        "d",
        parse_destination("/topic/t"),
        AckMode.CLIENT_INDIVIDUAL,
        requested_limit=10,
        threshold=50,
        prefetch=True,
        durable_name="keep",
    )
    producer = Client(node.broker)
    producer.connection.begin("tx")
    for body in (b"one", b"two"):
        producer.send("/topic/t", body, persistent=True, transaction="tx")
    before = node.records()
    producer.connection.commit("tx")
    kept = [RecordType.SEQ, RecordType.TX, RecordType.ADD, RecordType.ADD]
    assert node.records()[len(before) :] == kept
    assert bodies(subscriber.take()) == [b"one", b"two"]


def test_a_committed_message_no_room_can_be_made_for_leaves_no_record(tmp_path: Path) -> None:
    """Under REMOVE_OLDEST a message that fills the queue while being delivered cannot be
    evicted: the committed one is dropped, and its ADD, written before, must die with it."""
    node = Node(
        tmp_path,
        properties={
            "imq.destination.queue.q.maxNumMsgs": "1",
            "imq.destination.queue.q.limitBehavior": "REMOVE_OLDEST",
        },
    )
    consumer = Client(node.broker)
    consumer.send("/queue/q", b"delivered", persistent=True)
    consumer.subscribe("/queue/q")
    assert bodies(consumer.take()) == [b"delivered"]
    consumer.connection.begin("tx")
    consumer.send("/queue/q", b"dropped", persistent=True, transaction="tx")
    consumer.connection.commit("tx")
    queue = node.broker.registry.get(parse_destination("/queue/q"))
    assert queue is not None
    assert queue.stats.dropped == 1
    assert consumer.take() == []
    broker = node.restart()
    assert held(broker, "/queue/q") == [b"delivered"]


def test_an_unstorable_message_refuses_the_commit_before_anything_is_published(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    scene = Scene(node.broker, second=BIG)
    before = node.records()
    with pytest.raises(BadRequest) as refused:
        scene.producer.connection.commit("tx")
    assert refused.value.status == 400
    assert refused.value.summary == "transaction rolled back"
    for words in ("'tx'", "header 'x-big'", "70000 bytes", "65535"):
        assert words in str(refused.value)
    scene.check_nothing_took_effect()
    assert RecordType.TX not in node.records()[len(before) :]
    scene.commit_another()
    broker = node.restart()
    assert held(broker, IN) == [b"acked"]
    assert held(broker, OUT) == []  # "after" was consumed


class _BreaksAtSecond(Sequence[Message]):
    """Messages for the store that break at the second one (raising what a bug would)."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self._messages = list(messages)

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...
    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if index == 1:
            raise RuntimeError("injected: the store broke at the second message")
        return self._messages[index]


class BreaksOnce:
    """A real JournalStore whose first COMMIT with two messages or more breaks at the second."""

    def __init__(self, store: JournalStore) -> None:
        self.store = store
        self.broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write_transaction(self, adds: Sequence[Message], removes: Sequence[Message]) -> None:
        if not self.broken and len(adds) > 1:
            self.broken = True
            adds = _BreaksAtSecond(adds)
        self.store.write_transaction(adds, removes)


def test_an_internal_error_in_the_middle_of_a_commit_publishes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(tmp_path)
    broker = node.open(wrap=BreaksOnce)
    scene = Scene(broker)
    with pytest.raises(InternalError) as refused:
        scene.producer.connection.commit("tx")
    assert refused.value.status == 500
    assert "'tx'" in str(refused.value)
    assert "failed internally" in str(refused.value)
    assert "injected: the store broke" in caplog.text  # the cause, in the broker's log
    scene.check_nothing_took_effect()
    scene.commit_another()
    broker = node.restart()
    assert held(broker, IN) == [b"acked"]
    assert held(broker, OUT) == []


def test_a_disk_that_fills_up_in_the_middle_of_a_commit_write_keeps_none_of_it() -> None:
    disk = SimulatedDisk()
    node = Node(Path("/data/journal"), files=disk)
    scene = Scene(node.broker)
    # Room for the SEQ and TX records the COMMIT writes first, and 30 bytes of its first ADD:
    # the write stops in the middle.
    seq = RECORD_HEADER + len(encode_position(parse_destination(OUT), 1000))
    disk.capacity = disk.used() + seq + RECORD_HEADER + len(encode_tx(4)) + 30
    with pytest.raises(InternalError) as refused:
        scene.producer.connection.commit("tx")
    assert "the journal could not write its records" in str(refused.value)
    scene.check_nothing_took_effect()
    disk.capacity = None
    disk.crash(random.Random(0), power=False)
    broker = node.open()
    # The journal cut off at once what of the write reached the file, and took the COMMIT's
    # records back: none of it is on disk, not even a TX for recovery to void.
    assert node.journal.report.torn_bytes == 0
    assert node.recovery is not None
    assert node.recovery.discarded_tx == 0
    assert held(broker, OUT) == []
    assert held(broker, IN) == [b"acked"]
