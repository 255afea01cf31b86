"""A lease's messages: kept in order, spilled to the swap area over the threshold, read back."""

from __future__ import annotations

from pathlib import Path

from sluiceway.core.containers.pending import CHUNK_MESSAGES
from sluiceway.core.features.leased import LeasedMessages
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import Message
from sluiceway.naming import parse_destination
from sluiceway.persist.swap import SwapArea
from tests.core.swapping import assert_swap_empty

QUEUE = parse_destination("/queue/q")


def message(seq: int) -> Message:
    return Message(
        id=f"m{seq}",
        destination=QUEUE,
        body=b"%d" % seq,
        headers=(("k", "v"),),
        priority=4,
        expires=0,
        persistent=True,
        timestamp=1,
        seq=seq,
        delivery_count=1,
        location=1000 + seq,
        marks=[2000 + seq],
    )


def test_messages_read_in_order_from_any_position_without_a_swap_area() -> None:
    ledger = MemoryLedger()
    leased = LeasedMessages(ledger, None)
    for seq in range(1, 11):
        leased.append(message(seq))
    assert (len(leased), leased.bytes) == (10, 11)
    assert ledger.used == sum(message_cost(m.size) for m in leased.read_at(0, 100))
    assert [m.seq for m in leased.read_at(3, 4)] == [4, 5, 6, 7]
    assert [m.seq for m in leased.read_at(8, 100)] == [9, 10]
    assert leased.read_at(10, 5) == []
    drained = [m.seq for batch in leased.drain() for m in batch]
    assert drained == list(range(1, 11))
    assert (len(leased), ledger.used) == (0, 0)


def test_over_the_threshold_messages_spill_and_read_back_with_their_bookkeeping(
    swap: SwapArea, swap_dir: Path
) -> None:
    ledger = MemoryLedger(threshold=message_cost(1) * 5)
    leased = LeasedMessages(ledger, swap)
    count = 3 * CHUNK_MESSAGES + 7
    for seq in range(1, count + 1):
        leased.append(message(seq))
    assert swap.segment_count >= 1
    assert ledger.used < message_cost(1) * (CHUNK_MESSAGES + 6)  # only the head and one chunk
    window = leased.read_at(CHUNK_MESSAGES - 2, 5)  # across the head and the first chunk
    assert [m.seq for m in window] == list(range(CHUNK_MESSAGES - 1, CHUNK_MESSAGES + 4))
    everything = leased.read_at(0, count)
    assert [m.seq for m in everything] == list(range(1, count + 1))
    last = everything[-1]
    assert (last.location, last.marks, last.delivery_count) == (1000 + count, [2000 + count], 1)
    drained = [m for batch in leased.drain() for m in batch]
    assert [m.seq for m in drained] == list(range(1, count + 1))
    assert drained[CHUNK_MESSAGES].location == 1000 + CHUNK_MESSAGES + 1
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)
