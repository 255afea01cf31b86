"""A broker core whose journal is on a simulated disk that fills up, fails and frees again.

The store's flushes are made here as the I/O layer makes them (after handling frames, before
writing any); `broker.tick()` is the broker's once-a-second tick, which retries the journal's
waiting writes and measures the free space. A "crash" is a killed process: the simulated disk
keeps what was written, and a new broker recovers from it.
"""

from __future__ import annotations

import contextlib
import errno
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.features.disk import DiskGuard, DiskLevel, DiskPressure
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.errors import InternalError, ResourceFull
from sluiceway.naming import parse_destination
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.segments import JournalError
from sluiceway.persist.simulated import SimulatedDisk
from sluiceway.testing import FakeClock
from tests.core.helpers import Client, bodies
from tests.core.test_stages import stage
from tests.persist.helpers import journal_broker

DIRECTORY = Path("/data/journal")
Q = "/queue/q"
FLOOR = 64 * 1024  # bytes: imq.persist.file.disk.free.limit in these tests


class Node:
    """A broker core on a journal on `disk`, opened again after a crash at will."""

    def __init__(self, disk: SimulatedDisk, clock: FakeClock, **properties: str) -> None:
        self.disk, self.clock = disk, clock
        self.properties = {"imq.persist.file.disk.free.limit": "0", **properties}
        self.broker = self._open()

    def _open(self) -> Broker:
        journal = Journal(DIRECTORY, sync=SyncPolicy.OS, segment_size=1 << 20, files=self.disk)
        config = build_config(self.properties)
        broker, _ = journal_broker(config, journal, clock=self.clock)
        return broker

    @property
    def store(self) -> JournalStore:
        store = self.broker.store
        assert isinstance(store, JournalStore)
        return store

    def flush(self) -> None:
        """What the I/O layer does after handling frames and before writing any."""
        self.store.flush()

    def crash(self) -> Broker:
        self.disk.crash(random.Random(0), power=False)
        self.broker = self._open()
        return self.broker

    def close(self) -> None:
        if self.store.journal.failure is None:
            self.store.close()
        else:  # a failed journal refuses to close (the test checked why); its files still go
            with contextlib.suppress(JournalError):
                self.store.close()


@pytest.fixture
def disk() -> SimulatedDisk:
    return SimulatedDisk()


@pytest.fixture
def node(disk: SimulatedDisk, clock: FakeClock) -> Iterator[Node]:
    opened = Node(disk, clock)
    yield opened
    disk.capacity, disk.fault = None, None
    opened.close()


def fill(node: Node) -> None:
    """The disk has no byte left for the journal."""
    node.disk.capacity = node.disk.used()


def level(broker: Broker) -> DiskLevel:
    """(Read through a call: mypy would take the level for the one asserted before.)"""
    return broker.disk.level


def queued(broker: Broker, path: str = Q) -> int:
    queue = broker.registry.get(parse_destination(path))
    assert isinstance(queue, Queue)
    return queue.held_count


def test_a_full_disk_holds_persistent_sends_and_lets_the_rest_go_on(node: Node) -> None:
    broker = node.broker
    producer, other, consumer = Client(broker), Client(broker), Client(broker)
    producer.send(Q, b"p1", persistent=True)
    node.flush()
    consumer.subscribe(Q, "c", ack=AckMode.CLIENT_INDIVIDUAL)
    (first,) = consumer.take()
    node.flush()
    fill(node)
    producer.send(Q, b"p2", persistent=True)  # admitted: the disk is not known full yet
    node.flush()  # the write fails: its records wait in memory
    assert level(broker) is DiskLevel.FULL
    synced = node.store.synced_lsn
    assert synced < node.store.last_lsn  # a RECEIPT for p2 would wait
    producer.send(Q, b"p3", persistent=True)
    (held,) = producer.held
    assert isinstance(held.reason, DiskPressure)
    assert "ENOSPC; 0 bytes free" in str(held.reason)
    assert str(DIRECTORY) in str(held.reason)
    # Non-persistent messages go on, even to the queue persistent ones wait for, and so do
    # consumers: their acknowledgements' records wait in memory with the rest.
    other.send(Q, b"n1")
    consumer.ack(first)
    assert bodies(consumer.take()) == [b"p2", b"n1"]
    node.flush()
    assert node.store.synced_lsn == synced
    assert broker.disk.backlog > 0
    # Space comes back: the next tick writes what waited, and the held SEND is accepted.
    node.disk.capacity = None
    broker.tick()
    assert level(broker) is DiskLevel.OK
    assert producer.outcomes == [(held.message.id, None)]
    node.flush()
    assert node.store.synced_lsn == node.store.last_lsn
    # Nothing was lost or reordered: p1 was consumed, p2 was delivered (not acknowledged), p3
    # waits; the non-persistent n1 does not outlive the process.
    broker = node.crash()
    restarted = Client(broker)
    restarted.subscribe(Q, "again")
    assert [(d.message.body, d.delivery_count) for d in restarted.take()] == [
        (b"p2", 2),  # its delivery mark waited with the rest, and was written
        (b"p3", 1),
    ]


def test_records_made_after_the_failure_are_not_written_before_those_that_wait(
    node: Node,
) -> None:
    broker = node.broker
    producer = Client(broker)
    fill(node)
    for n in range(3):
        producer.send(Q, b"%d" % n, persistent=True)
    node.flush()
    assert level(broker) is DiskLevel.FULL
    producer.send(Q, b"held", persistent=True)
    node.disk.capacity = node.disk.used() + 30  # room for a part of what waits: still refused
    broker.tick()
    assert level(broker) is DiskLevel.FULL
    node.disk.capacity = None
    broker.tick()
    node.flush()
    broker = node.crash()
    assert queued(broker) == 4
    restarted = Client(broker)
    restarted.subscribe(Q)
    assert bodies(restarted.take()) == [b"0", b"1", b"2", b"held"]


def test_a_held_send_is_refused_after_the_hold_deadline_naming_the_disk(
    disk: SimulatedDisk, clock: FakeClock
) -> None:
    node = Node(disk, clock, **{"imq.producer.hold.timeout": "5000"})
    broker = node.broker
    producer = Client(broker)
    fill(node)
    producer.send(Q, b"a", persistent=True)
    node.flush()
    producer.send(Q, b"b", persistent=True)
    clock.advance(6)
    broker.tick()
    ((_, error),) = producer.outcomes
    assert isinstance(error, ResourceFull)
    assert "imq.producer.hold.timeout" in str(error)
    assert "disk holding /data/journal" in str(error)
    assert "ENOSPC" in str(error)
    disk.capacity = None
    node.close()


def test_below_the_free_space_floor_persistent_sends_wait_before_the_disk_is_full(
    disk: SimulatedDisk, clock: FakeClock
) -> None:
    node = Node(disk, clock, **{"imq.persist.file.disk.free.limit": str(FLOOR)})
    broker = node.broker
    producer, consumer = Client(broker), Client(broker)
    disk.capacity = disk.used() + FLOOR - 1
    broker.tick()
    assert level(broker) is DiskLevel.LOW
    producer.send(Q, b"p", persistent=True)
    (held,) = producer.held
    assert isinstance(held.reason, DiskPressure)
    assert held.reason.limit == "imq.persist.file.disk.free.limit"
    assert "has 64.0 KiB (65535 bytes) free" in str(held.reason)
    assert "below the 64.0 KiB (65536 bytes) of imq.persist.file.disk.free.limit" in str(
        held.reason
    )
    consumer.subscribe(Q, ack=AckMode.AUTO)
    producer2 = Client(broker)
    producer2.send(Q, b"n")
    assert bodies(consumer.take()) == [b"n"]
    # The alarm clears a tenth of the floor above it, not at the floor.
    disk.capacity = disk.used() + FLOOR + 1
    broker.tick()
    assert level(broker) is DiskLevel.LOW
    disk.capacity = disk.used() + FLOOR + FLOOR // 10
    broker.tick()
    assert level(broker) is DiskLevel.OK
    assert producer.outcomes == [(held.message.id, None)]
    assert bodies(consumer.take()) == [b"p"]
    node.close()


def test_between_ticks_the_journals_writes_count_against_the_floor(
    disk: SimulatedDisk, clock: FakeClock
) -> None:
    node = Node(disk, clock, **{"imq.persist.file.disk.free.limit": str(FLOOR)})
    broker = node.broker
    producer = Client(broker)
    disk.capacity = disk.used() + FLOOR + 4096
    broker.tick()
    assert level(broker) is DiskLevel.OK
    sent = 0
    while not producer.held:
        producer.send(Q, b"x" * 1000, persistent=True)
        node.flush()  # no tick: the estimate alone raises the alarm
        sent += 1
    assert level(broker) is DiskLevel.LOW
    assert sent <= 6  # about 4 KiB of room above the floor, a record of about 1.1 KiB each
    assert disk.used() < disk.capacity - FLOOR + 1200
    node.close()


def test_a_failed_fsync_refuses_persistent_sends_at_once(node: Node) -> None:
    broker = node.broker
    producer, consumer = Client(broker), Client(broker)
    producer.send(Q, b"kept", persistent=True)
    node.flush()
    store = node.store
    store.journal.fsync = _failing_fsync
    with pytest.raises(Exception, match="fsync"):
        store.journal.rotate()
    broker.tick()
    assert level(broker) is DiskLevel.FAILED
    with pytest.raises(InternalError, match=r"fsync .* failed"):
        producer.send(Q, b"refused", persistent=True)
    # A non-persistent message goes on (to a queue whose sequence numbers are spoken for: a
    # new block of them needs the journal, which refuses everything now).
    producer.send(Q, b"non-persistent")
    consumer.subscribe(Q, ack=AckMode.CLIENT_INDIVIDUAL)
    assert bodies(consumer.take()) == [b"kept", b"non-persistent"]


def _failing_fsync(fd: int) -> None:
    raise OSError(errno.EIO, "Input/output error")


def test_a_commit_with_persistent_sends_is_refused_while_the_disk_is_full(node: Node) -> None:
    broker = node.broker
    client = Client(broker)
    fill(node)
    client.send(Q, b"first", persistent=True)
    node.flush()
    client.connection.begin("t1")
    client.send(Q, b"in tx", persistent=True, transaction="t1")
    with pytest.raises(ResourceFull, match=r"rolled back .* cannot write to the disk") as refused:
        client.connection.commit("t1")
    assert isinstance(refused.value, DiskPressure)
    client.connection.begin("t2")
    client.send(Q, b"non-persistent", transaction="t2")
    client.connection.commit("t2")  # nothing for the journal: accepted
    assert queued(broker) == 2


def test_a_commit_that_consumes_only_goes_on_while_the_disk_is_full(node: Node) -> None:
    """Its REMOVEs wait with the other records, as plain acknowledgements do; one that would
    publish is refused (above), and one whose own write meets the full disk is taken back
    (tests/persist/test_commit_journal.py)."""
    broker = node.broker
    producer, consumer = Client(broker), Client(broker)
    for body in (b"a", b"b"):
        producer.send(Q, body, persistent=True)
    consumer.subscribe(Q, ack=AckMode.CLIENT_INDIVIDUAL)
    first, second = consumer.take()
    node.flush()
    fill(node)
    producer.send(Q, b"c", persistent=True)
    node.flush()
    assert level(broker) is DiskLevel.FULL
    consumer.connection.begin("t")
    consumer.ack(first, transaction="t")
    consumer.connection.commit("t")
    consumer.ack(second)
    node.disk.capacity = None
    broker.tick()
    node.flush()
    broker = node.crash()
    restarted = Client(broker)
    restarted.subscribe(Q)
    assert bodies(restarted.take()) == [b"c"]


def test_a_staged_send_waits_for_the_disk_whatever_its_persistence(node: Node) -> None:
    broker = node.broker
    client = Client(broker)
    fill(node)
    client.send(Q, b"first", persistent=True)
    node.flush()
    stage(client, "sink/1/task", b"staged", persistent=False)
    (held,) = client.held
    assert isinstance(held.reason, DiskPressure)
    node.disk.capacity = None
    broker.tick()
    assert client.outcomes == [(held.message.id, None)]


def test_the_records_waiting_for_the_disk_are_bounded(
    disk: SimulatedDisk, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    node = Node(disk, clock, **{"imq.persist.file.disk.backlog.max_size": "2k"})
    broker = node.broker
    producer, consumer = Client(broker), Client(broker)
    for n in range(100):
        producer.send(Q, b"%d" % n, persistent=True)
    node.flush()
    consumer.subscribe(Q, ack=AckMode.CLIENT_INDIVIDUAL)
    deliveries = consumer.take()
    node.flush()
    fill(node)
    for delivery in deliveries:
        consumer.ack(delivery)
        node.flush()
        if broker.disk.reading_stopped:
            break
    assert broker.disk.reading_stopped  # the I/O layer reads no client from here on
    assert "the most imq.persist.file.disk.backlog.max_size (2.0 KiB (2048 bytes))" in caplog.text
    assert 2048 <= broker.disk.backlog < 2048 + 200  # one ACK's records past the bound, at most
    disk.capacity = None
    broker.tick()
    status = broker.disk.status()
    assert (status.reading_stopped, status.backlog) == (False, 0)
    node.close()


def test_the_guard_logs_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    guard = DiskGuard(clock, floor=1000)
    guard.path = "/data/journal"
    caplog.set_level("INFO", logger="sluiceway.core.features.disk")
    guard.observe(0, space=(5000, 10_000))
    guard.observe(4500)  # estimated: 500 bytes free
    guard.observe(4600)
    full = OSError(errno.ENOSPC, "No space left on device")
    guard.observe(4600, write_error=full, backlog=10)
    guard.observe(4600, write_error=full, backlog=20)
    clock.advance(3)
    guard.observe(4600, space=(9000, 10_000))
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in logged] == ["WARNING", "ERROR", "INFO"]
    assert logged[0][1].startswith("disk low: the disk holding /data/journal has 500 bytes free")
    assert logged[1][1].startswith("disk full: the journal cannot write to the disk holding")
    assert logged[2][1].startswith("disk ok again after 3.0 s full")
    assert guard.since_ms == clock.wall_ms
