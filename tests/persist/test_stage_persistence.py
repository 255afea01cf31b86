"""Stages in the journal: their records, restarts, a journal cut at the COMMIT, rotation.

A broker core on a real journal is restarted on the same directory; a crash is a journal whose
tail was cut at a record boundary (what a killed broker leaves once recovery has cut its torn
tail). The end-to-end crash tests with a killed broker process are in tests/pipelines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.features.stages import StageState
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.staging import (
    CommitRecord,
    OpenStage,
    PublishedStage,
    StagedHead,
    StageName,
    StageSnapshot,
)
from sluiceway.naming import parse_destination
from sluiceway.persist.format import RecordType
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.stage_payloads import (
    decode_add,
    decode_add_head,
    decode_commit,
    decode_discard,
    decode_open,
    decode_snapshot,
    encode_add,
    encode_commit,
    encode_discard,
    encode_open,
    encode_snapshot,
)
from sluiceway.testing import FakeClock
from tests.core.helpers import Client
from tests.core.test_stages import QUEUE, TOPIC, stage
from tests.persist.helpers import journal_broker

RECORD_HEADER = 17  # bytes before a journal record's payload (persist.journal)


class Restartable:
    """A broker core on a real journal in `path`, restarted at will on a fake clock."""

    def __init__(self, path: Path, clock: FakeClock, **properties: str) -> None:
        self.path, self.clock, self.properties = path, clock, properties
        self.broker = self._open()

    def _open(self) -> Broker:
        journal = Journal(self.path, sync=SyncPolicy.OS, segment_size=1 << 30)
        broker, _ = journal_broker(build_config(self.properties), journal, clock=self.clock)
        return broker

    @property
    def store(self) -> JournalStore:
        store = self.broker.store
        assert isinstance(store, JournalStore)
        return store

    def restart(self) -> Broker:
        self.store.flush()
        self.store.close()
        self.broker = self._open()
        return self.broker

    def crash_at(self, record_type: RecordType, *, keep: bool) -> Broker:
        """Cut the journal just before the last record of `record_type` (or just after it,
        with `keep`), as a crash would, and start again."""
        store = self.store
        store.flush()
        found = [r for r in store.journal.scan() if r.type == record_type]
        assert found, f"no {record_type.name} record"
        record = found[-1]
        cut = record.position.offset + (RECORD_HEADER + len(record.payload) if keep else 0)
        segment = self.path / f"{record.position.segment:020d}.log"
        store.close()
        with segment.open("r+b") as handle:
            handle.truncate(cut)
        self.broker = self._open()
        return self.broker

    def queue(self, path: str = QUEUE) -> Queue:
        found = self.broker.registry.get(parse_destination(path))
        assert isinstance(found, Queue)
        return found

    def waiting(self, path: str = QUEUE) -> list[tuple[int, bytes]]:
        """(sequence number, body) of the messages waiting in a queue, in delivery order."""
        return [(m.seq, m.body) for m in self.queue(path).pending]


@pytest.fixture
def node(tmp_path: Path, clock: FakeClock) -> Restartable:
    return Restartable(tmp_path / "journal", clock)


def test_records_round_trip() -> None:
    name = StageName("sink-1", 2**63 - 1, "task/with:odd chars é")
    opened = OpenStage(7, name)
    assert decode_open(encode_open(opened)) == opened
    published = PublishedStage(7, ((parse_destination(QUEUE), 41), (parse_destination(TOPIC), 3)))
    commit = CommitRecord("sink-1", 12, (published,), (3, 4))
    assert decode_commit(encode_commit(commit)) == commit
    assert decode_discard(encode_discard((1, 2**64 - 1))) == (1, 2**64 - 1)
    restated = PublishedStage(7, published.firsts, commit_lsn=99, last_lsn=98)
    snapshot = StageSnapshot(9, (("sink-1", 12), ("b", 0)), (opened,), (restated,))
    assert decode_snapshot(encode_snapshot(snapshot)) == snapshot
    client_message = Client(Broker(build_config({})))
    message_id = stage(client_message, "s/1/0.0", b"body")
    (staged,) = client_message.broker.stages
    (message,) = next(staged.messages.drain())
    head = StagedHead(7, 5, -1)
    payload = encode_add(head, message)
    assert decode_add_head(payload) == head
    decoded_head, decoded = decode_add(payload)
    assert (decoded_head, decoded.id, decoded.body) == (head, message_id, b"body")


def test_an_open_stage_survives_a_restart_unseen_and_is_committed_after_it(
    node: Restartable, clock: FakeClock
) -> None:
    producer = Client(node.broker)
    producer.send(QUEUE, b"plain", persistent=True)
    stage(producer, "s/1/1.0", b"b1", persistent=False)  # staged: in the journal anyway
    stage(producer, "s/1/0.0", b"a1", ttl_ms=50_000)
    stage(producer, "s/1/1.0", b"b2")
    broker = node.restart()
    assert node.waiting() == [(1, b"plain")]
    assert (node.queue().staged_count, node.queue().staged_bytes) == (3, 6)
    assert node.queue().fullness().count == 4
    assert sorted(str(s.name) for s in broker.stages) == ["s/1/0.0", "s/1/1.0"]
    clock.advance(55)  # past the 50 s of task 0.0, within the 60 s of task 1.0
    broker.tick()
    assert [str(s.name) for s in broker.stages] == ["s/1/1.0"]
    head = node.queue().last_seq  # numbering resumes above what was reserved before
    outcome = broker.stages.commit("s", 1, ["0.0", "1.0"])
    assert outcome.count == 2
    assert node.waiting() == [(1, b"plain"), (head + 1, b"b1"), (head + 2, b"b2")]
    # Staged non-persistent, published non-persistent: it does not outlive the next restart.
    node.restart()
    assert node.waiting() == [(1, b"plain"), (head + 2, b"b2")]


def test_published_messages_come_back_with_their_numbers_in_sequence_order(
    node: Restartable,
) -> None:
    producer = Client(node.broker)
    producer.send(QUEUE, b"n1", persistent=True)
    stage(producer, "s/4/1.0", b"b1")
    stage(producer, "s/4/0.0", b"a1")
    producer.send(QUEUE, b"n2", persistent=True)
    stage(producer, "s/4/1.0", b"b2")
    stage(producer, "s/4/2.0", b"never listed")
    node.broker.stages.commit("s", 4, ["0.0", "1.0"])
    producer.send(QUEUE, b"n3", persistent=True)
    expected = [(1, b"n1"), (2, b"n2"), (3, b"a1"), (4, b"b1"), (5, b"b2"), (6, b"n3")]
    assert node.waiting() == expected
    broker = node.restart()
    assert node.waiting() == expected
    assert len(broker.stages) == 0
    assert node.queue().staged_count == 0
    again = broker.stages.commit("s", 4, ["0.0", "1.0"])
    assert again.state is StageState.COMMITTED_BEFORE
    Client(broker).send(QUEUE, b"n4", persistent=True)
    (last_seq, last_body) = node.waiting()[-1]
    assert (last_seq > 6, last_body) == (True, b"n4")  # never a number handed out before


def test_consumed_published_messages_do_not_come_back(node: Restartable) -> None:
    producer = Client(node.broker)
    for body in (b"a", b"b", b"c"):
        stage(producer, "s/1/0.0", body)
    node.broker.stages.commit("s", 1, ["0.0"])
    consumer = Client(node.broker)
    consumer.subscribe(QUEUE)
    first, second, _ = consumer.take()
    consumer.ack(second)
    node.restart()
    assert node.waiting() == [(1, b"a"), (3, b"c")]
    assert [m.delivery_count for m in node.queue().pending] == [1, 1]  # delivered before
    assert first.message.body == b"a"


def test_a_crash_before_the_commit_record_publishes_nothing(node: Restartable) -> None:
    producer = Client(node.broker)
    stage(producer, "s/2/0.0", b"a")
    stage(producer, "s/2/1.0", b"b")
    node.broker.stages.commit("s", 2, ["0.0", "1.0"])
    broker = node.crash_at(RecordType.STAGE_COMMIT, keep=False)
    assert node.waiting() == []
    assert sorted(str(s.name) for s in broker.stages) == ["s/2/0.0", "s/2/1.0"]
    assert not broker.stages.is_committed("s", 2)
    # The writer retries the COMMIT: now it happens, once.
    assert broker.stages.commit("s", 2, ["0.0", "1.0"]).count == 2
    node.restart()
    assert node.waiting() == [(1, b"a"), (2, b"b")]


def test_a_crash_right_after_the_commit_record_publishes_everything(node: Restartable) -> None:
    producer = Client(node.broker)
    producer.send(QUEUE, b"n1", persistent=True)
    stage(producer, "s/2/0.0", b"a", path=TOPIC)  # no subscriber, not retained: dropped
    stage(producer, "s/2/0.0", b"b")
    stage(producer, "s/2/1.0", b"c")
    stage(producer, "s/2/2.0", b"unlisted")
    node.broker.stages.commit("s", 2, ["1.0", "0.0"])
    # Everything publishing wrote after the STAGE_COMMIT is lost; the record decides.
    broker = node.crash_at(RecordType.STAGE_COMMIT, keep=True)
    assert node.waiting() == [(1, b"n1"), (2, b"c"), (3, b"b")]
    assert len(broker.stages) == 0
    assert broker.stages.commit("s", 2, ["1.0", "0.0"]).state is StageState.COMMITTED_BEFORE
    broker.tick()  # the topic keeps nothing for nobody
    node.restart()
    assert node.waiting() == [(1, b"n1"), (2, b"c"), (3, b"b")]


def test_aborted_and_expired_stages_stay_gone(node: Restartable, clock: FakeClock) -> None:
    producer = Client(node.broker)
    stage(producer, "s/1/0.0", b"aborted")
    stage(producer, "s/1/1.0", b"expired", ttl_ms=1000)
    stage(producer, "s/1/2.0", b"kept")
    node.broker.stages.abort("s", 1, ["0.0"])
    clock.advance(2)
    node.broker.tick()
    broker = node.restart()
    assert [str(s.name) for s in broker.stages] == ["s/1/2.0"]
    assert node.queue().staged_count == 1
    broker.stages.commit("s", 1, ["0.0", "1.0", "2.0"])
    assert node.waiting() == [(1, b"kept")]


def test_stages_are_restated_across_rotations_and_their_segments_reclaimed(
    node: Restartable,
) -> None:
    producer = Client(node.broker)
    consumer = Client(node.broker)
    stage(producer, "s/1/0.0", b"published " + b"p" * 200)
    stage(producer, "s/1/0.0", b"consumed " + b"c" * 200)
    stage(producer, "s/2/0.0", b"open " + b"o" * 200)
    stage(producer, "other/9/0.0", b"discarded " + b"d" * 200)
    node.broker.stages.commit("s", 1, ["0.0"])
    node.broker.stages.abort("other", 9, None)
    consumer.subscribe(QUEUE, ack=AckMode.CLIENT_INDIVIDUAL)
    first, second = consumer.take()
    consumer.ack(second)
    for _ in range(3):  # every record of those stages is now in an older segment, or gone
        node.broker.compact()
    broker = node.restart()
    assert [(seq, body[:9]) for seq, body in node.waiting()] == [(1, b"published")]
    assert [str(s.name) for s in broker.stages] == ["s/2/0.0"]
    assert broker.stages.is_committed("s", 1)
    assert not broker.stages.is_committed("other", 9)
    assert first.message.seq == 1
    # Consume the rest and commit the open stage: nothing is left that needs the old segments.
    broker.stages.commit("s", 2, ["0.0"])
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    for delivery in consumer.take():
        consumer.ack(delivery)
    broker.compact()
    segments = node.store.journal.segments()
    assert len(segments) == 1  # only the active one, holding the snapshots
    broker = node.restart()
    assert node.waiting() == []
    assert broker.stages.is_committed("s", 2)
    assert broker.stages.commit("s", 2, ["0.0"]).state is StageState.COMMITTED_BEFORE


def test_a_topic_keeps_published_messages_only_for_its_durable_subscriptions(
    node: Restartable,
) -> None:
    broker = node.broker
    durable = Client(broker)
    durable.connection.client_id = "app"
    durable.connection.subscribe(
        "d1",
        parse_destination(TOPIC),
        AckMode.CLIENT_INDIVIDUAL,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        durable_name="keeper",
    )
    durable.connection.unsubscribe("d1")  # away: the topic keeps what the subscription accepts
    producer = Client(broker)
    stage(producer, "s/1/0.0", b"kept for the durable subscription", path=TOPIC)
    stage(producer, "s/1/0.0", b"not persistent", path=TOPIC, persistent=False)
    broker.stages.commit("s", 1, ["0.0"])
    node.restart()
    topic = node.broker.registry.get(parse_destination(TOPIC))
    assert isinstance(topic, Topic)
    assert [m.body for m in topic.log.read(0, 10)] == [b"kept for the durable subscription"]
