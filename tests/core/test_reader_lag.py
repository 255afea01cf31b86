"""How far behind pipeline readers are, in the core on a fake clock: a topic's cursors and a
queue's lease groups (messages not taken, the age of the oldest), and the count over a topic
log spilled to the swap area, which reads at most the one chunk a position falls in."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from sluiceway.core.broker import Broker
from sluiceway.core.containers.pending import CHUNK_MESSAGES, SwapRef
from sluiceway.core.containers.seqlog import SeqLog
from sluiceway.core.features.cursors import CursorRead, CursorStart
from sluiceway.core.features.leases import LeaseRead
from sluiceway.core.features.reader_lag import ReaderKind, ReaderLag, readers_of, retained_from
from sluiceway.core.model.destination import Destination
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import DEFAULT_PRIORITY, Message
from sluiceway.naming import parse_destination
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.helpers import Client
from tests.core.swapping import SEGMENT_SIZE

T: Final = "/topic/t"
Q: Final = "/queue/q"
BODY: Final = b"12345678"


def destination(broker: Broker, path: str) -> Destination:
    found = broker.registry.get(parse_destination(path))
    assert found is not None
    return found


def publish(
    client: Client, clock: FakeClock, path: str, count: int, priority: int = DEFAULT_PRIORITY
) -> None:
    """`count` messages, one a second: message i is accepted at the start plus i seconds."""
    for i in range(count):
        client.send(path, b"%d" % i, priority=priority)
        clock.advance(1)


def only(broker: Broker, path: str) -> ReaderLag:
    (reader,) = readers_of(destination(broker, path), broker.leases)
    return reader


def only_group(broker: Broker, path: str, group: str) -> ReaderLag:
    (found,) = [r for r in readers_of(destination(broker, path), broker.leases) if r.group == group]
    return found


def test_a_cursor_lags_by_what_its_topic_retains_from_its_position(
    broker: Broker, clock: FakeClock
) -> None:
    client = Client(broker)
    client.send(T, b"before the cursor")
    topic = destination(broker, T)
    broker.cursors.open(topic, CursorRead("spark", CursorStart.LATEST), 100)
    start = clock.time_ms()
    publish(client, clock, T, 10)
    lag = only(broker, T)
    assert (lag.kind, lag.group, lag.messages, lag.position) == (
        ReaderKind.CURSOR_GROUP,
        "spark",
        10,
        2,
    )
    assert lag.seconds(clock.time_ms()) == 10.0  # the first message after it, 10 s ago
    assert (lag.open_leases, lag.leased_messages) == (None, None)

    broker.cursors.commit(topic.name, "spark", 6)  # took seq 2 to 5
    lag = only(broker, T)
    assert (lag.messages, lag.oldest_ms) == (6, start + 4000)
    broker.cursors.commit(topic.name, "spark", 12)  # took everything
    lag = only(broker, T)
    assert (lag.messages, lag.oldest_ms, lag.seconds(clock.time_ms())) == (0, None, 0.0)


def test_a_lease_group_lags_by_what_waits_and_what_its_open_leases_hold(
    broker: Broker, clock: FakeClock
) -> None:
    producer, consumer = Client(broker), Client(broker)
    start = clock.time_ms()
    publish(producer, clock, Q, 10)
    queue = destination(broker, Q)
    broker.leases.read(queue, LeaseRead("g", 1, max_messages=4))
    broker.leases.acknowledge(queue.name, "g", 1)  # messages 0-3 consumed
    broker.leases.read(queue, LeaseRead("g", 2, max_messages=3))  # 4-6 leased, not acknowledged
    lag = only(broker, Q)
    assert (lag.kind, lag.group, lag.position) == (ReaderKind.LEASE_GROUP, "g", None)
    assert (lag.messages, lag.open_leases, lag.leased_messages) == (6, 1, 3)
    assert lag.oldest_ms == start + 4000  # the first of its open lease
    assert lag.seconds(clock.time_ms()) == 6.0

    # A consumer's messages and another group's leases are not its to take.
    consumer.subscribe(Q, limit=1)
    broker.leases.read(queue, LeaseRead("other", 1, max_messages=1))
    by_group = {r.group: r for r in readers_of(queue, broker.leases)}
    assert list(by_group) == ["g", "other"]
    assert (by_group["g"].messages, by_group["other"].messages) == (4, 2)
    assert by_group["other"].oldest_ms == start + 8000

    # Released, its lease's messages wait again: still behind by as many, as old.
    broker.leases.release(queue.name, "g", 2)
    lag = only_group(broker, Q, "g")
    assert (lag.messages, lag.open_leases, lag.leased_messages) == (4, 0, 0)
    assert lag.oldest_ms == start + 4000


def test_the_oldest_waiting_message_is_found_whatever_its_priority(
    broker: Broker, clock: FakeClock
) -> None:
    producer = Client(broker)
    start = clock.time_ms()
    publish(producer, clock, Q, 2, priority=1)
    publish(producer, clock, Q, 2, priority=9)  # delivered first, but newer
    queue = destination(broker, Q)
    broker.leases.read(queue, LeaseRead("g", 1, max_messages=1))  # takes a priority-9 message
    lag = only(broker, Q)
    assert (lag.messages, lag.oldest_ms) == (4, start)


# -- the count over a spilled log ---------------------------------------------------------------

HEAD: Final = 10
FILLING: Final = 40
SEQS: Final = [2 * i + 1 for i in range(HEAD + 3 * CHUNK_MESSAGES + FILLING)]  # odd numbers


class CountingSpill:
    """A swap area that counts the chunks read back."""

    def __init__(self, area: SwapArea) -> None:
        self.area = area
        self.reads = 0

    def write(self, data: bytes) -> SwapRef:
        return self.area.write(data)

    def read(self, ref: SwapRef) -> bytes:
        self.reads += 1
        return self.area.read(ref)

    def free(self, ref: SwapRef) -> None:
        self.area.free(ref)


def message(seq: int) -> Message:
    return Message(
        id=f"m-{seq}",
        destination=parse_destination(T),
        body=BODY,
        headers=(),
        priority=4,
        expires=0,
        persistent=False,
        timestamp=1_000 + seq,
        seq=seq,
    )


@pytest.mark.parametrize(
    "position",
    [
        0,
        SEQS[3],  # in the head
        SEQS[HEAD] - 1,  # between the head and the first chunk
        SEQS[HEAD],  # the first spilled one
        SEQS[HEAD + CHUNK_MESSAGES + 7] + 1,  # inside the second chunk, between two messages
        SEQS[HEAD + 3 * CHUNK_MESSAGES],  # the first of the filling part
        SEQS[-1],
        SEQS[-1] + 1,
    ],
)
def test_the_count_reads_at_most_the_chunk_a_position_falls_in(
    position: int, tmp_path: Path
) -> None:
    area = SwapArea(tmp_path / "swap", segment_size=SEGMENT_SIZE)
    area.open()
    swap = CountingSpill(area)
    try:
        log = SeqLog(MemoryLedger(threshold=HEAD * message_cost(len(BODY)) + 1), swap)
        for seq in SEQS:
            log.append(message(seq))
        assert len(log.chunks) == 3
        expected = [seq for seq in SEQS if seq >= position]
        count, first = retained_from(log, position)
        assert count == len(expected)
        assert (first.seq if first is not None else None) == (expected[0] if expected else None)
        assert swap.reads <= 1
    finally:
        area.close()
