"""Cursors and leases in the journal: record codecs, recovery, snapshots at rotation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.features.cursors import CursorRead, CursorStart
from sluiceway.core.features.leases import LeaseRead
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode, Delivery
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.leasing import (
    CursorRecord,
    GroupRecord,
    LeaseRecord,
    LeaseSnapshot,
    LeaseState,
    RecoveredLeases,
)
from sluiceway.core.values.message_codec import DecodeError
from sluiceway.naming import parse_destination
from sluiceway.persist.format import RecordType
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.lease_payloads import (
    decode_cursor,
    decode_cursor_end,
    decode_lease,
    decode_lease_end,
    decode_lease_mark,
    decode_lease_snapshot,
    encode_cursor,
    encode_cursor_end,
    encode_lease,
    encode_lease_end,
    encode_lease_mark,
    encode_lease_snapshot,
    replay_lease_record,
)
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies
from tests.persist.helpers import journal_broker

Q, T = "/queue/q", "/topic/t"
QUEUE, TOPIC = parse_destination(Q), parse_destination(T)


# -- codecs ---------------------------------------------------------------------------------------


def test_every_record_decodes_to_what_was_encoded() -> None:
    cursor = CursorRecord("orders", "spark:1", 2**63 - 1)
    assert decode_cursor(encode_cursor(cursor)) == cursor
    assert decode_cursor_end(encode_cursor_end("orders", "g")) == ("orders", "g")
    lease = LeaseRecord(7, "jobs", "g", 12, 1_700_000_600_000)
    assert decode_lease(encode_lease(lease)) == lease
    assert decode_lease_mark(encode_lease_mark(7, 5, 99)) == (7, 5, 99)
    assert decode_lease_end(encode_lease_end(7, LeaseState.EXPIRED)) == (7, LeaseState.EXPIRED)
    snapshot = LeaseSnapshot(
        next_id=9,
        cursors=[cursor],
        groups=[GroupRecord("jobs", "g", 12, {10: (5, LeaseState.ACKNOWLEDGED)})],
        leases=[lease],
    )
    assert decode_lease_snapshot(encode_lease_snapshot(snapshot)) == snapshot


def test_a_damaged_payload_is_a_record_error() -> None:
    with pytest.raises(DecodeError):
        decode_lease_end(encode_lease_mark(1, 2, 3))
    with pytest.raises(DecodeError):
        decode_lease_end(b"\x01\x00\x00\x00\x00\x00\x00\x00\x09")  # state 9 does not exist


def test_recovery_state_follows_the_records_in_order() -> None:
    recovered = RecoveredLeases()
    lease = LeaseRecord(3, "jobs", "g", 4, 100)
    replay_lease_record(recovered, RecordType.CURSOR, encode_cursor(CursorRecord("t", "c", 10)))
    replay_lease_record(recovered, RecordType.LEASE, encode_lease(lease))
    recovered.marked(1000, 3)
    recovered.marked(1001, 3)
    assert (recovered.next_id, recovered.open) == (4, {3: lease})
    replay_lease_record(
        recovered, RecordType.LEASE_END, encode_lease_end(3, LeaseState.ACKNOWLEDGED)
    )
    replay_lease_record(recovered, RecordType.CURSOR_END, encode_cursor_end("t", "c"))
    assert recovered.open == {}
    assert recovered.cursors == {}
    assert recovered.groups["jobs", "g"].finished == {4: (3, LeaseState.ACKNOWLEDGED)}
    recovered.keep_live(lambda add: add == 1001)
    assert recovered.holders == {1001: 3}
    # A snapshot restates the state whatever came before, but not the marks (messages).
    replay_lease_record(
        recovered,
        RecordType.LEASE_SNAPSHOT,
        encode_lease_snapshot(LeaseSnapshot(2, [CursorRecord("t", "d", 1)], [], [])),
    )
    assert (recovered.next_id, recovered.cursors, recovered.groups) == (4, {("t", "d"): 1}, {})
    assert recovered.holders == {1001: 3}


# -- a broker on a journal, restarted -------------------------------------------------------------


class Restartable:
    """A broker core on a real journal in `path`, restarted at will on a fake clock."""

    def __init__(self, path: Path, clock: FakeClock, **properties: str) -> None:
        self.path, self.clock, self.properties = path, clock, properties
        self.broker = self._open()

    def _open(self) -> Broker:
        journal = Journal(self.path, sync=SyncPolicy.OS, segment_size=1 << 30)
        broker, _ = journal_broker(build_config(self.properties), journal, clock=self.clock)
        return broker

    def restart(self) -> Broker:
        self.broker.store.flush()
        self.broker.store.close()
        self.broker = self._open()
        return self.broker

    def queue(self) -> Queue:
        found = self.broker.registry.get(QUEUE)
        assert isinstance(found, Queue)
        return found

    def topic(self) -> Topic:
        found = self.broker.registry.get(TOPIC)
        assert isinstance(found, Topic)
        return found


def read_lease(client: Client, group: str, number: int, **sizes: Any) -> list[Delivery]:
    sub_id = f"lease-{group}-{number}"
    client.connection.subscribe(
        sub_id,
        QUEUE,
        AckMode.AUTO,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        lease=LeaseRead(group, number, **sizes),
    )
    taken = client.take()
    client.connection.unsubscribe(sub_id)
    return taken[:-1]


def open_cursor(client: Client, group: str) -> None:
    client.connection.subscribe(
        f"cursor-{group}",
        TOPIC,
        AckMode.AUTO,
        requested_limit=1000,
        threshold=50,
        prefetch=True,
        browser=True,
        cursor=CursorRead(group, CursorStart.LATEST),
    )
    client.take()
    client.connection.unsubscribe(f"cursor-{group}")


def leased(broker: Broker, group: str, number: int) -> list[tuple[bytes, int]]:
    """(body, delivery count) of what reading lease GROUP/number returns now."""
    return [(d.message.body, d.delivery_count) for d in read_lease(Client(broker), group, number)]


@pytest.fixture
def node(tmp_path: Path) -> Restartable:
    return Restartable(tmp_path, FakeClock())


def scenario(node: Restartable) -> None:
    """Leases in every state and a committed cursor, with persistent and other messages."""
    broker = node.broker
    producer, reader = Client(broker), Client(broker)
    for i in range(8):
        producer.send(Q, b"q%d" % i, persistent=True, priority=9 if i == 6 else 4)
    producer.send(Q, b"transient")
    read_lease(reader, "g", 1, max_messages=2)  # q6 (priority 9), q0
    broker.leases.acknowledge(QUEUE, "g", 1)
    read_lease(reader, "g", 2, max_messages=2)  # q1, q2
    broker.leases.release(QUEUE, "g", 2)
    read_lease(reader, "g", 3, max_messages=4)  # q1, q2 again, then q3, q4
    open_cursor(reader, "c")
    for i in range(5):
        producer.send(T, b"t%d" % i, persistent=True)
    broker.cursors.commit(TOPIC, "c", broker.cursors.get(TOPIC, "c").position + 2)


def check(node: Restartable, *, restarted: bool) -> None:
    broker = node.broker
    waiting = [b"q5", b"q7"] if restarted else [b"q5", b"q7", b"transient"]
    assert leased(broker, "g", 3) == [(b"q1", 2), (b"q2", 2), (b"q3", 1), (b"q4", 1)]
    assert leased(broker, "g", 1) == []  # acknowledged, and remembered as such
    assert broker.leases.acknowledge(QUEUE, "g", 1) is LeaseState.ACKNOWLEDGED
    assert broker.leases.release(QUEUE, "g", 2) is LeaseState.EXPIRED
    assert [m.body for m in node.queue().pending] == waiting  # a restart loses the transient one
    assert node.queue().fullness().count == len(waiting) + 4  # the leased ones still count
    assert broker.cursors.get(TOPIC, "c").position == 3
    assert [m.body for m in node.topic().log.read(0, 100)] == [b"t2", b"t3", b"t4"]


def test_cursors_and_leases_come_back_after_a_restart(node: Restartable) -> None:
    scenario(node)
    check(node, restarted=False)
    node.restart()
    check(node, restarted=True)
    node.broker.leases.acknowledge(QUEUE, "g", 3)
    node.restart()
    assert leased(node.broker, "g", 3) == []
    assert node.queue().fullness().count == 2


def test_they_come_back_from_the_snapshot_once_older_records_are_gone(
    node: Restartable,
) -> None:
    scenario(node)
    store = node.broker.store
    assert isinstance(store, JournalStore)
    store.compact()  # rotates: the new segment starts with the snapshot; old state records die
    node.restart()
    check(node, restarted=True)
    store = node.broker.store
    assert isinstance(store, JournalStore)
    store.compact()
    node.restart()
    check(node, restarted=True)


def test_lease_ids_survive_a_rotation_so_old_marks_never_join_a_new_lease(
    node: Restartable,
) -> None:
    broker = node.broker
    producer, reader = Client(broker), Client(broker)
    for i in range(3):
        producer.send(Q, b"%d" % i, persistent=True)
    read_lease(reader, "g", 1)
    broker.leases.release(QUEUE, "g", 1)  # the messages keep their marks, naming lease 1
    store = broker.store
    assert isinstance(store, JournalStore)
    store.compact()
    broker = node.restart()
    assert read_lease(Client(broker), "h", 1, max_messages=1)[0].message.body == b"0"
    broker = node.restart()
    assert [m.body for m in node.queue().pending] == [b"1", b"2"]
    assert leased(broker, "h", 1) == [(b"0", 2)]


def test_an_acknowledgement_cut_short_by_a_crash_completes_at_restart(
    node: Restartable,
) -> None:
    broker = node.broker
    producer = Client(broker)
    for i in range(3):
        producer.send(Q, b"%d" % i, persistent=True)
    read_lease(Client(broker), "g", 1)
    lease = broker.leases.read(node.queue(), LeaseRead("g", 1)).lease
    assert lease is not None
    # The broker wrote the lease's end and died before the REMOVE of each message.
    broker.leases.recorder.lease_ended(lease.lease_id, LeaseState.ACKNOWLEDGED)
    broker = node.restart()
    assert node.queue().fullness().count == 0
    assert broker.leases.acknowledge(QUEUE, "g", 1) is LeaseState.ACKNOWLEDGED
    broker = node.restart()
    assert node.queue().fullness().count == 0  # the REMOVEs were written this time


def test_an_expired_lease_comes_back_open_and_expires_on_the_first_tick(
    node: Restartable,
) -> None:
    broker = node.broker
    Client(broker).send(Q, b"x", persistent=True)
    read_lease(Client(broker), "g", 1, ttl_ms=1000)
    node.clock.advance(5)
    broker = node.restart()
    assert node.queue().pending_count == 0
    broker.tick()
    assert [(m.body, m.delivery_count) for m in node.queue().pending] == [(b"x", 1)]
    assert leased(broker, "g", 1) == []
    assert bodies(read_lease(Client(broker), "g", 2)) == [b"x"]
