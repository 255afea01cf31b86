"""The pending list: priority then FIFO order, in memory and with messages spilled to swap.

Every list with a spill area here writes to a real SwapArea in a temporary directory. Bodies are
small, so spilled chunks are cut at CHUNK_MESSAGES messages unless a test says otherwise.
"""

from __future__ import annotations

import bisect
import itertools
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sluiceway.core.containers.pending import (
    CHUNK_BYTES,
    CHUNK_MESSAGES,
    PRIORITY_LEVELS,
    PackedChunk,
    PendingList,
    decode_chunk,
    encode_chunk,
)
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import encode_message
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.persist.swap import SwapArea
from tests.core.helpers import message_fields as fields
from tests.core.swapping import SEGMENT_SIZE, assert_swap_empty

QUEUE: Final = DestinationName(DestinationKind.QUEUE, "q")
BODY_SIZE: Final = 8  # the default body: the seq as 8 bytes, so every message costs COST
COST: Final = message_cost(BODY_SIZE)
START: Final = (PRIORITY_LEVELS, 0)  # browse cursor before the first message


def make(
    seq: int,
    priority: int = 4,
    body: bytes | None = None,
    *,
    expires: int = 0,
    location: int = 0,
    marks: list[int] | None = None,
) -> Message:
    return Message(
        id=f"m-{seq}",
        destination=QUEUE,
        body=seq.to_bytes(BODY_SIZE, "big") if body is None else body,
        headers=(("n", str(seq)),),
        priority=priority,
        expires=expires,
        persistent=False,
        timestamp=1_000 + seq,
        seq=seq,
        location=location,
        marks=marks,
    )


def order_key(message: Message) -> tuple[int, int]:
    """Delivery order: higher priority first, then lower seq."""
    return (-message.priority, message.seq)


def seqs(messages: Iterable[Message]) -> list[int]:
    return [m.seq for m in messages]


def head_threshold(count: int) -> int:
    """A threshold under which exactly `count` messages of COST stay in memory before spilling."""
    return count * COST + 1


def drain(pending: PendingList) -> list[Message]:
    taken: list[Message] = []
    for _ in range(len(pending) + 1):
        message = pending.pop()
        if message is None:
            return taken
        taken.append(message)
    raise AssertionError(f"pop() still returns messages after {len(taken)}, len was lower")


def drain_some(pending: PendingList, count: int) -> list[Message]:
    taken = [pending.pop() for _ in range(count)]
    assert None not in taken
    return [m for m in taken if m is not None]


def assert_consistent(pending: PendingList, ledger: MemoryLedger) -> None:
    """With bodies of BODY_SIZE, memory holds exactly the messages that are not spilled."""
    assert 0 <= pending.spilled <= len(pending)
    assert pending.bytes == BODY_SIZE * len(pending)
    assert ledger.used == COST * (len(pending) - pending.spilled)


# -- without a spill area ----------------------------------------------------------------------

PLAIN_PRIORITIES: Final = {1: 4, 2: 9, 3: 4, 4: 0, 5: 9, 6: 4, 7: 0, 8: 4}

# operation, message seq (for "pop": the one expected, None for nothing), delivery order after
PLAIN_STEPS: Final[list[tuple[str, int | None, list[int]]]] = [
    ("pop", None, []),
    ("append", 1, [1]),
    ("append", 2, [2, 1]),
    ("append", 3, [2, 1, 3]),
    ("append", 4, [2, 1, 3, 4]),
    ("pop", 2, [1, 3, 4]),
    ("append", 5, [5, 1, 3, 4]),
    ("pop", 5, [1, 3, 4]),
    ("pop", 1, [3, 4]),
    ("restore", 1, [1, 3, 4]),
    ("restore", 2, [2, 1, 3, 4]),
    ("append", 6, [2, 1, 3, 6, 4]),
    ("pop", 2, [1, 3, 6, 4]),
    ("pop", 1, [3, 6, 4]),
    ("pop", 3, [6, 4]),
    ("restore", 3, [3, 6, 4]),
    ("restore", 1, [1, 3, 6, 4]),
    ("append", 7, [1, 3, 6, 4, 7]),
    ("pop", 1, [3, 6, 4, 7]),
    ("pop", 3, [6, 4, 7]),
    ("pop", 6, [4, 7]),
    ("append", 8, [8, 4, 7]),
    ("pop", 8, [4, 7]),
    ("pop", 4, [7]),
    ("restore", 4, [4, 7]),
    ("pop", 4, [7]),
    ("pop", 7, []),
    ("pop", None, []),
]


@pytest.mark.parametrize("ledger", [None, MemoryLedger(), MemoryLedger(threshold=1)])
def test_without_spill_area_a_plain_priority_fifo_list(ledger: MemoryLedger | None) -> None:
    """Over the threshold or not, nothing spills without a spill area."""
    pending = PendingList(ledger, None)
    messages = {seq: make(seq, priority) for seq, priority in PLAIN_PRIORITIES.items()}
    for step, (operation, seq, after) in enumerate(PLAIN_STEPS):
        if operation == "append":
            assert seq is not None
            pending.append(messages[seq])
        elif operation == "restore":
            assert seq is not None
            pending.restore(messages[seq])
        else:
            popped = pending.pop()
            assert (None if popped is None else popped.seq) == seq, step
            if popped is not None:
                assert popped is messages[popped.seq]  # in memory: the very object
        assert seqs(pending) == after, step
        assert seqs(pending.following(START, 100)) == after, step
        assert len(pending) == len(after)
        assert bool(pending) == bool(after)
        assert pending.bytes == BODY_SIZE * len(after)
        assert pending.spilled == 0
        if ledger is not None:
            assert ledger.used == COST * len(after)


# -- spilling ---------------------------------------------------------------------------------


def test_spilled_layout_counts_and_memory(swap: SwapArea, swap_dir: Path) -> None:
    """One level: 10 in memory, then three full chunks, then 40 in the chunk being filled."""
    ledger = MemoryLedger(threshold=head_threshold(10))
    pending = PendingList(ledger, swap)
    total = 10 + 3 * CHUNK_MESSAGES + 40
    for seq in range(1, total + 1):
        pending.append(make(seq))
    assert len(pending) == total
    assert pending.spilled == 3 * CHUNK_MESSAGES
    assert pending.bytes == BODY_SIZE * total
    assert ledger.used == COST * 50
    assert swap.bytes_on_disk > 0
    assert_consistent(pending, ledger)

    assert seqs(drain_some(pending, 10)) == list(range(1, 11))
    assert pending.spilled == 3 * CHUNK_MESSAGES  # the next chunk is read when it is needed
    assert ledger.used == COST * 40
    assert seqs(drain_some(pending, 1)) == [11]
    assert pending.spilled == 2 * CHUNK_MESSAGES
    assert ledger.used == COST * (CHUNK_MESSAGES - 1 + 40)
    assert_consistent(pending, ledger)

    rest = drain(pending)
    assert seqs(rest) == list(range(12, total + 1))
    assert len(pending) == 0
    assert pending.bytes == pending.spilled == ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def test_chunk_cut_by_bytes(swap: SwapArea, swap_dir: Path) -> None:
    """Large bodies make a chunk once CHUNK_BYTES of them wait, long before CHUNK_MESSAGES."""
    ledger = MemoryLedger(threshold=1)  # everything goes to the chunk being filled
    pending = PendingList(ledger, swap)
    size = CHUNK_BYTES // 3 + 1
    pending.append(make(1, body=b"a" * size))
    pending.append(make(2, body=b"b" * size))
    assert pending.spilled == 0
    assert ledger.used == 2 * message_cost(size)
    pending.append(make(3, body=b"c" * size))
    assert pending.spilled == 3
    assert ledger.used == 0
    assert pending.bytes == 3 * size
    pending.append(make(4, body=b""))
    assert pending.spilled == 3
    assert ledger.used == message_cost(0)
    assert [m.body for m in drain(pending)] == [b"a" * size, b"b" * size, b"c" * size, b""]
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def packed(messages: list[Message]) -> PackedChunk:
    chunk = PackedChunk()
    for m in messages:
        chunk.add(encode_message(m), m.seq, len(m.body), m.location, m.marks)
    return chunk


def test_packed_messages_go_behind_every_message_of_their_level(
    swap: SwapArea, swap_dir: Path
) -> None:
    """Recovery files a backlog beyond the swap point as packed chunks (persist.restoring)."""
    ledger = MemoryLedger(threshold=head_threshold(5))
    pending = PendingList(ledger, swap)
    for seq in range(1, 6):
        pending.append(make(seq, location=100 + seq, marks=[seq]))
    assert not pending.spills(4)
    for seq in range(6, 9):  # memory is over: into the chunk being filled
        pending.append(make(seq, location=100 + seq, marks=[seq]))
    assert pending.spills(4)
    pending.append(make(9, priority=7))
    later = [make(seq, location=100 + seq) for seq in range(10, 14)]
    chunk = packed(later)
    assert (chunk.count, chunk.body_bytes, chunk.first_seq, chunk.last_seq) == (4, 32, 10, 13)
    assert not chunk.full
    pending.append_packed(4, chunk)
    assert (len(pending), pending.bytes, pending.spilled) == (13, 13 * BODY_SIZE, 7)
    assert ledger.used == COST * 6
    pending.append(make(14))  # a level that has spilled keeps spilling
    expected = [make(9, priority=7)] + [make(s, location=100 + s, marks=[s]) for s in range(1, 9)]
    expected += [*later, make(14)]
    assert [fields(m) for m in drain(pending)] == [fields(m) for m in expected]
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_interleaved_appends_and_pops_keep_priority_then_seq_order(
    seed: int, swap: SwapArea, swap_dir: Path
) -> None:
    """Thousands of messages over several levels, appends and pops interleaved: every pop is the
    model's first message, wherever the level keeps it (memory, spilled chunk, chunk being
    filled)."""
    rng = random.Random(seed)
    ledger = MemoryLedger(threshold=head_threshold(40))
    pending = PendingList(ledger, swap)
    model: list[Message] = []
    popped: list[Message] = []
    next_seq = itertools.count(1)
    most_spilled = 0
    for step in range(8_000):
        roll = rng.random()
        if roll < 0.55 or not model:
            for _ in range(rng.choice([1, 1, 1, 5, 40])):
                message = make(next(next_seq), rng.choice([0, 3, 4, 4, 7, 9]))
                pending.append(message)
                bisect.insort(model, message, key=order_key)
        elif roll < 0.95:
            for _ in range(min(len(model), rng.choice([1, 1, 1, 5, 40]))):
                got = pending.pop()
                assert got is not None
                assert fields(got) == fields(model.pop(0)), step
                popped.append(got)
        elif popped:
            message = popped.pop(rng.randrange(len(popped)))
            pending.restore(message)
            bisect.insort(model, message, key=order_key)
        assert len(pending) == len(model)
        assert_consistent(pending, ledger)
        most_spilled = max(most_spilled, pending.spilled)
        if step % 1_000 == 0:
            assert seqs(pending) == seqs(model)
    assert most_spilled >= 4 * CHUNK_MESSAGES  # the run did spill, to several chunks
    assert seqs(pending) == seqs(model)
    assert seqs(drain(pending)) == seqs(model)
    assert pending.pop() is None
    assert len(pending) == pending.bytes == pending.spilled == 0
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def chunk_cost(body_size: int) -> int:
    """The most memory one level's chunk being filled takes, just before it is written."""
    count = CHUNK_MESSAGES
    if body_size:
        count = min(count, -(-CHUNK_BYTES // body_size))
    return count * message_cost(body_size)


@pytest.mark.parametrize(("body_size", "count"), [(16, 30_000), (8_192, 1_500)])
def test_memory_bounded_by_threshold_plus_a_chunk_per_level(
    body_size: int, count: int, swap: SwapArea, swap_dir: Path
) -> None:
    threshold = 64 * 1024
    levels = [1, 4, 6, 9]
    ledger = MemoryLedger(threshold=threshold)
    pending = PendingList(ledger, swap)
    for seq in range(1, count + 1):
        pending.append(make(seq, levels[seq % len(levels)], bytes(body_size)))
    bound = threshold + len(levels) * chunk_cost(body_size)
    assert count * message_cost(body_size) > 10 * bound  # far more than memory may hold
    assert ledger.peak < bound
    assert ledger.used < bound
    assert pending.spilled > count - bound // message_cost(body_size)
    assert len(pending) == count
    assert pending.bytes == count * body_size
    taken = drain(pending)
    assert seqs(taken) == sorted(range(1, count + 1), key=lambda s: (-levels[s % len(levels)], s))
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


# -- restore ------------------------------------------------------------------------------------


def test_restore_puts_popped_messages_back_in_place(swap: SwapArea, swap_dir: Path) -> None:
    """Given back, a message comes out before the rest of its level, spilled ones included."""
    ledger = MemoryLedger(threshold=head_threshold(5))
    pending = PendingList(ledger, swap)
    total = 5 + CHUNK_MESSAGES + 44  # memory, one chunk, the chunk being filled
    for seq in range(1, total + 1):
        pending.append(make(seq))
    assert pending.spilled == CHUNK_MESSAGES

    first = drain_some(pending, 3)
    pending.restore(first[1])
    assert seqs(pending.following(START, 4)) == [2, 4, 5, 6]
    assert_consistent(pending, ledger)
    assert seqs(drain_some(pending, 3)) == [2, 4, 5]

    # The level's memory is empty now, its spilled messages wait behind.
    assert pending.spilled == CHUNK_MESSAGES
    pending.restore(first[2])
    pending.restore(first[0])
    assert len(pending) == total - 3
    assert_consistent(pending, ledger)
    assert seqs(drain_some(pending, 3)) == [1, 3, 6]  # 6 read back from the chunk
    assert pending.spilled == 0

    # Given back after its chunk was read back.
    assert seqs(pending.following(START, 1)) == [7]
    seven = drain_some(pending, 1)[0]
    pending.restore(seven)
    assert seqs(drain_some(pending, 2)) == [7, 8]

    # A restored message of another level goes by its own priority.
    urgent = make(10_000, priority=9)
    pending.append(urgent)
    assert drain_some(pending, 1)[0] is urgent
    pending.restore(urgent)
    assert seqs(drain_some(pending, 2)) == [10_000, 9]

    assert seqs(drain(pending)) == list(range(10, total + 1))
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


SPILL_START: Final = 6  # the restore tests keep 5 messages in memory, then spill
SPILL_END: Final = 5 + 3 * CHUNK_MESSAGES  # three full chunks, then 44 in the chunk being filled


@pytest.mark.parametrize(
    "taken_seqs",
    [
        pytest.param([100], id="middle-of-first-chunk"),
        pytest.param([SPILL_START], id="first-spilled"),
        pytest.param([5 + CHUNK_MESSAGES + 1], id="start-of-second-chunk"),
        pytest.param([SPILL_END], id="end-of-last-chunk"),
        pytest.param([SPILL_END + 10], id="chunk-being-filled"),
        pytest.param([SPILL_END + 44], id="newest"),
        pytest.param([3, 200, 600, SPILL_END + 1], id="several"),
    ],
)
def test_restore_of_messages_taken_by_extract_comes_back_in_place(
    taken_seqs: list[int], swap: SwapArea, swap_dir: Path
) -> None:
    """A consumer with a selector gets its messages through extract(), from anywhere in the list;
    when it gives one back (NACK, disconnect), restore() puts it back at its place, among the
    spilled messages of its level when that is where it was."""
    ledger = MemoryLedger(threshold=head_threshold(5))
    pending = PendingList(ledger, swap)
    total = SPILL_END + 44
    for number in range(1, total + 1):
        pending.append(make(number))
    assert pending.spilled == 3 * CHUNK_MESSAGES
    taken: list[Message] = []

    def choose(message: Message) -> bool:
        if message.seq in taken_seqs:
            taken.append(message)
            return True
        return False

    assert pending.extract(choose, lambda: False) == len(taken_seqs)
    assert seqs(taken) == taken_seqs
    for message in reversed(taken):
        pending.restore(message)
        assert_consistent(pending, ledger)
    assert len(pending) == total
    # Next to a chunk's edge a message may go back to memory instead; its place in order is fixed.
    assert 3 * CHUNK_MESSAGES - len(taken_seqs) <= pending.spilled <= 3 * CHUNK_MESSAGES
    assert [fields(m) for m in pending] == [fields(make(n)) for n in range(1, total + 1)]
    assert seqs(drain(pending)) == list(range(1, total + 1))
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


# -- following ----------------------------------------------------------------------------------


def spilled_list(
    swap: SwapArea, *, levels: tuple[int, ...] = (9, 4, 0), per_level: int = 700, head: int = 20
) -> tuple[PendingList, MemoryLedger, list[Message]]:
    """Messages over `levels`, interleaved in arrival; `head` of them stay in memory and each
    level spills full chunks plus a chunk being filled."""
    ledger = MemoryLedger(threshold=head_threshold(head))
    pending = PendingList(ledger, swap)
    messages = [
        make(seq, levels[seq % len(levels)]) for seq in range(1, per_level * len(levels) + 1)
    ]
    for message in messages:
        pending.append(message)
    assert pending.spilled >= len(levels) * 2 * CHUNK_MESSAGES
    return pending, ledger, sorted(messages, key=order_key)


def test_following_browses_in_delivery_order_without_removing(
    swap: SwapArea, swap_dir: Path
) -> None:
    pending, ledger, model = spilled_list(swap)
    before = (len(pending), pending.bytes, pending.spilled, ledger.used, swap.bytes_on_disk)

    assert seqs(pending.following(START, 100_000)) == seqs(model)
    assert seqs(pending.following(START, 7)) == seqs(model[:7])

    # Page by page, each from the cursor of the last message seen.
    pages: list[list[Message]] = []
    cursor = START
    while page := pending.following(cursor, 97):
        assert len(page) <= 97
        pages.append(page)
        cursor = (page[-1].priority, page[-1].seq)
    assert [len(p) for p in pages[:-1]] == [97] * (len(pages) - 1)
    assert seqs(itertools.chain.from_iterable(pages)) == seqs(model)

    # From cursors anywhere: in memory, in a spilled chunk, in the chunk being filled, the last.
    for index in [0, 5, 19, 300, 700, 1_000, 1_500, len(model) - 30, len(model) - 1]:
        at = model[index]
        found = pending.following((at.priority, at.seq), 50)
        assert seqs(found) == seqs(model[index + 1 : index + 51]), index
    # A cursor on an empty level goes on with the lower levels.
    assert seqs(pending.following((8, 0), 3)) == seqs([m for m in model if m.priority < 8][:3])

    # Spilled messages come back whole.
    assert [fields(m) for m in pending.following(START, len(model))] == [fields(m) for m in model]
    assert (len(pending), pending.bytes, pending.spilled, ledger.used, swap.bytes_on_disk) == (
        before
    )
    assert seqs(drain(pending)) == seqs(model)
    assert_swap_empty(swap, swap_dir)


# -- extract ------------------------------------------------------------------------------------


def test_extract_removes_only_chosen_messages(swap: SwapArea, swap_dir: Path) -> None:
    pending, ledger, model = spilled_list(swap)
    spilled_before = pending.spilled
    taken: list[Message] = []

    def choose(message: Message) -> bool:
        if message.seq % 3 == 0:
            taken.append(message)
            return True
        return False

    count = pending.extract(choose, lambda: False)
    chosen = [m for m in model if m.seq % 3 == 0]
    rest = [m for m in model if m.seq % 3 != 0]
    assert count == len(chosen)
    assert seqs(taken) == seqs(chosen)  # offered in delivery order
    assert [fields(m) for m in taken] == [fields(m) for m in chosen]
    assert len(pending) == len(rest)
    assert pending.spilled < spilled_before  # spilled ones were taken too
    assert_consistent(pending, ledger)
    assert seqs(pending) == seqs(rest)

    # Nothing chosen: nothing changes.
    assert pending.extract(lambda _: False, lambda: False) == 0
    assert seqs(pending) == seqs(rest)
    assert seqs(drain(pending)) == seqs(rest)
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def test_extract_can_empty_a_level_with_spilled_chunks(swap: SwapArea, swap_dir: Path) -> None:
    pending, ledger, model = spilled_list(swap)
    assert pending.extract(lambda m: m.priority == 4, lambda: False) == 700
    rest = [m for m in model if m.priority != 4]
    assert len(pending) == len(rest)
    assert_consistent(pending, ledger)
    assert seqs(pending) == seqs(rest)
    # The emptied level is skipped: the next after level 9 is level 0.
    assert seqs(drain(pending)) == seqs(rest)
    assert pending.pop() is None
    assert_swap_empty(swap, swap_dir)


@pytest.mark.parametrize("limit", [1, 3, 15, 200, 300, 352, 360, 1_000, 1_050])
def test_extract_stop_ends_the_scan_early(limit: int, swap: SwapArea, swap_dir: Path) -> None:
    """Stopping after `limit` taken, in memory, inside a spilled chunk, in the chunk being filled
    or in a lower level: the rest is left as it was."""
    pending, ledger, model = spilled_list(swap)
    taken: list[Message] = []
    offered: list[int] = []

    def choose(message: Message) -> bool:
        offered.append(message.seq)
        if message.seq % 2 == 1:
            taken.append(message)
            return True
        return False

    count = pending.extract(choose, lambda: len(taken) >= limit)
    chosen = [m for m in model if m.seq % 2 == 1][:limit]
    assert count == limit
    assert seqs(taken) == seqs(chosen)
    assert offered[-1] == chosen[-1].seq  # nothing looked at after the last one taken
    rest = [m for m in model if m not in chosen]
    assert len(pending) == len(model) - limit
    assert_consistent(pending, ledger)
    assert seqs(pending) == seqs(rest)
    assert seqs(drain(pending)) == seqs(rest)
    assert_swap_empty(swap, swap_dir)


def test_extract_with_stop_already_true_touches_nothing(swap: SwapArea) -> None:
    pending, ledger, model = spilled_list(swap)
    before = (len(pending), pending.bytes, pending.spilled, ledger.used, swap.bytes_on_disk)
    offered: list[Message] = []

    def choose(message: Message) -> bool:
        offered.append(message)
        return True

    assert pending.extract(choose, lambda: True) == 0
    assert offered == []
    assert (len(pending), pending.bytes, pending.spilled, ledger.used, swap.bytes_on_disk) == (
        before
    )
    assert seqs(pending) == seqs(model)


# -- remove_expired -----------------------------------------------------------------------------


def test_remove_expired_in_memory_only(swap: SwapArea, swap_dir: Path) -> None:
    """Designed behaviour: remove_expired() looks only at messages in memory. Expired messages
    in a spilled chunk stay (and are counted) until their chunk is read back into memory; the
    next sweep after that removes them."""
    now = 50_000
    ledger = MemoryLedger(threshold=head_threshold(10))
    pending = PendingList(ledger, swap)
    in_head = range(1, 11)
    in_chunk = range(11, 11 + CHUNK_MESSAGES)
    filling = range(11 + CHUNK_MESSAGES, 11 + CHUNK_MESSAGES + 30)

    def expiry(seq: int) -> int:
        if seq in in_chunk:
            return 0 if seq == in_chunk[0] else now  # all but the chunk's first have expired
        if seq % 2 == 0:
            return now if seq in in_head else now - 1  # expired, at the limit or before
        return now + 1 if seq % 3 == 0 else 0  # not yet, or never

    for seq in itertools.chain(in_head, in_chunk, filling):
        pending.append(make(seq, expires=expiry(seq)))
    total = len(in_head) + len(in_chunk) + len(filling)
    assert pending.spilled == CHUNK_MESSAGES

    assert pending.remove_expired(now - 2) == []  # nothing expired yet
    removed = pending.remove_expired(now)
    expected = [s for s in itertools.chain(in_head, filling) if s % 2 == 0]
    assert sorted(seqs(removed)) == expected
    assert len(pending) == total - len(expected)
    assert pending.spilled == CHUNK_MESSAGES  # the expired spilled ones are still there
    assert_consistent(pending, ledger)
    assert pending.remove_expired(now) == []

    # The head's survivors, then the chunk's first message, which reads the chunk back.
    assert seqs(drain_some(pending, 6)) == [1, 3, 5, 7, 9, in_chunk[0]]
    assert pending.spilled == 0
    removed = pending.remove_expired(now)
    assert seqs(removed) == list(in_chunk[1:])
    assert_consistent(pending, ledger)
    assert seqs(drain(pending)) == [s for s in filling if s % 2 == 1]
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def test_remove_expired_across_levels_without_spill_area() -> None:
    """Level 9 expires entirely and is skipped afterwards; other levels lose some messages."""
    ledger = MemoryLedger(threshold=1)
    pending = PendingList(ledger, None)
    messages = [
        make(seq, seq % 10, expires=100 if seq % 10 == 9 else 100 * (seq % 4))
        for seq in range(1, 41)
    ]
    for message in messages:
        pending.append(message)
    gone = [m for m in messages if m.expires in (100, 200)]
    removed = pending.remove_expired(200)
    assert {m.seq for m in removed} == {m.seq for m in gone}
    assert len(removed) == len(gone)
    assert all(any(r is m for m in gone) for r in removed)
    kept = sorted((m for m in messages if m not in gone), key=order_key)
    assert kept[0].priority < 9
    assert len(pending) == len(kept)
    assert seqs(pending) == seqs(kept)
    assert ledger.used == COST * len(kept)
    assert seqs(drain(pending)) == seqs(kept)


def test_remove_expired_finds_messages_read_back_from_swap(swap: SwapArea) -> None:
    """Expiring messages are found once their chunk is back in memory, even when nothing that
    stayed in memory could expire."""
    ledger = MemoryLedger(threshold=1)
    pending = PendingList(ledger, swap)
    for seq in range(1, CHUNK_MESSAGES + 5):
        pending.append(make(seq, expires=0 if seq == 1 or seq > CHUNK_MESSAGES else 500))
    assert pending.spilled == CHUNK_MESSAGES
    assert pending.remove_expired(1_000) == []
    assert seqs(drain_some(pending, 1)) == [1]
    assert seqs(pending.remove_expired(1_000)) == list(range(2, CHUNK_MESSAGES + 1))
    assert_consistent(pending, ledger)
    assert seqs(drain(pending)) == list(range(CHUNK_MESSAGES + 1, CHUNK_MESSAGES + 5))


def test_expiry_tracking_after_extract_from_swap(swap: SwapArea) -> None:
    """Taking a spilled message that can expire does not hide the expiring ones in memory."""
    ledger = MemoryLedger(threshold=head_threshold(1))
    pending = PendingList(ledger, swap)
    for seq in range(1, CHUNK_MESSAGES + 2):
        pending.append(make(seq, expires=500 if seq <= 2 else 0))
    assert pending.spilled == CHUNK_MESSAGES  # 1 in memory, 2.. spilled
    assert pending.extract(lambda m: m.seq == 2, lambda: False) == 1
    assert seqs(pending.remove_expired(1_000)) == [1]
    assert seqs(drain(pending)) == list(range(3, CHUNK_MESSAGES + 2))


@pytest.mark.parametrize("how", ["extract", "remove_expired"])
def test_chunk_being_filled_counts_bytes_of_what_it_still_holds(swap: SwapArea, how: str) -> None:
    """Once a message left the chunk being filled, its bytes no longer count towards CHUNK_BYTES."""
    ledger = MemoryLedger(threshold=1)
    pending = PendingList(ledger, swap)
    size = CHUNK_BYTES // 3 + 1
    pending.append(make(1, body=b"a" * size, expires=500))
    pending.append(make(2, body=b"b" * size))
    if how == "extract":
        assert pending.extract(lambda m: m.seq == 1, lambda: False) == 1
    else:
        assert seqs(pending.remove_expired(1_000)) == [1]
    pending.append(make(3, body=b"c" * size))
    assert pending.spilled == 0  # two bodies are below CHUNK_BYTES
    assert pending.bytes == 2 * size
    pending.append(make(4, body=b"d" * size))
    assert pending.spilled == 3
    assert seqs(drain(pending)) == [2, 3, 4]


# -- clear --------------------------------------------------------------------------------------


def test_clear_frees_everything(swap: SwapArea, swap_dir: Path) -> None:
    pending, ledger, model = spilled_list(swap)
    assert swap.segment_count > 1  # the spilled chunks take several segments
    assert pending.clear() == len(model)
    assert len(pending) == pending.bytes == pending.spilled == 0
    assert not pending
    assert ledger.used == 0
    assert list(pending) == []
    assert pending.following(START, 10) == []
    assert pending.pop() is None
    assert_swap_empty(swap, swap_dir)

    # Usable again afterwards, memory first.
    for seq in (5, 6, 7):
        pending.append(make(seq, priority=seq))
    assert pending.spilled == 0
    assert seqs(drain(pending)) == [7, 6, 5]
    assert pending.clear() == 0


def test_clear_without_spill_area() -> None:
    ledger = MemoryLedger(threshold=1)
    pending = PendingList(ledger, None)
    for seq in range(1, 101):
        pending.append(make(seq, seq % 10))
    assert pending.clear() == 100
    assert len(pending) == pending.bytes == ledger.used == 0
    assert pending.pop() is None


# -- chunk encoding -----------------------------------------------------------------------------

ROUND_TRIP: Final = [
    Message(
        id="",
        destination=DestinationName(DestinationKind.TOPIC, "t.x"),
        body=b"",
        headers=(),
        priority=0,
        expires=0,
        persistent=False,
        timestamp=0,
        seq=0,
        delivery_count=0,
        location=0,
        marks=None,
    ),
    Message(
        id="ID:é-2",
        destination=QUEUE,
        body=bytes(range(256)) * 3,
        headers=(("content-type", "text/plain"), ("x", ""), ("x", "again"), ("ключ", "a:b\n")),
        priority=9,
        expires=1_700_000_000_123,
        persistent=True,
        timestamp=1_699_999_999_999,
        seq=2**64 - 1,
        delivery_count=2**32 - 1,
        location=2**64 - 1,
        marks=[7, 0, 2**63],
    ),
    Message(
        id="3",
        destination=QUEUE,
        body=b"\0",
        headers=(("", ""),),
        priority=4,
        expires=-1,
        persistent=True,
        timestamp=-5,
        seq=3,
        delivery_count=1,
        location=12_345,
        marks=[1],
    ),
]


def test_chunk_encoding_round_trips_every_field() -> None:
    decoded = decode_chunk(encode_chunk(ROUND_TRIP))
    assert [fields(m) for m in decoded] == [fields(m) for m in ROUND_TRIP]
    assert decoded[0].marks is None
    assert decoded[1].marks == [7, 0, 2**63]
    assert decode_chunk(encode_chunk([])) == []
    for message in ROUND_TRIP:
        assert [fields(m) for m in decode_chunk(encode_chunk([message]))] == [fields(message)]


def test_spilled_messages_keep_journal_bookkeeping(swap: SwapArea, swap_dir: Path) -> None:
    ledger = MemoryLedger(threshold=1)
    pending = PendingList(ledger, swap)
    messages = [
        make(seq, location=10_000 + seq, marks=None if seq % 2 else [seq, seq + 1])
        for seq in range(1, CHUNK_MESSAGES + 2)
    ]
    for message in messages:
        pending.append(message)
    assert pending.spilled == CHUNK_MESSAGES
    assert [fields(m) for m in drain(pending)] == [fields(m) for m in messages]
    assert_swap_empty(swap, swap_dir)


TEXT: Final = st.text(st.characters(codec="utf-8"), max_size=12)
MESSAGES: Final = st.builds(
    Message,
    id=TEXT,
    destination=st.builds(
        DestinationName, st.sampled_from(DestinationKind), st.sampled_from(["q", "a.b", "x$:-_"])
    ),
    body=st.binary(max_size=64),
    headers=st.lists(st.tuples(TEXT, TEXT), max_size=4).map(tuple),
    priority=st.integers(0, 9),
    expires=st.integers(-(2**63), 2**63 - 1),
    persistent=st.booleans(),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    seq=st.integers(0, 2**64 - 1),
    delivery_count=st.integers(0, 2**32 - 1),
    location=st.integers(0, 2**64 - 1),
    marks=st.none() | st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(MESSAGES, max_size=6))
def test_chunk_encoding_round_trips_generated_messages(messages: list[Message]) -> None:
    assert [fields(m) for m in decode_chunk(encode_chunk(messages))] == [
        fields(m) for m in messages
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(MESSAGES, min_size=1, max_size=6))
def test_a_packed_chunk_holds_the_bytes_encode_chunk_writes(messages: list[Message]) -> None:
    chunk = packed(messages)
    assert chunk.data() == encode_chunk(messages)
    assert (chunk.count, chunk.body_bytes) == (len(messages), sum(len(m.body) for m in messages))
    assert (chunk.first_seq, chunk.last_seq) == (messages[0].seq, messages[-1].seq)
    full = packed([make(seq) for seq in range(CHUNK_MESSAGES)])
    assert full.full
    assert packed([make(1, body=bytes(CHUNK_BYTES))]).full


# -- against a model ----------------------------------------------------------------------------


# Any priority, but often one of a few, so that levels fill up and spill.
PRIORITIES: Final = st.sampled_from([0, 4, 9]) | st.integers(0, 9)


class PendingMachine(RuleBasedStateMachine):
    """A pending list with a spill area against a list sorted by (-priority, seq)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.swap = SwapArea(directory, segment_size=SEGMENT_SIZE)
        self.swap.open()
        self.ledger = MemoryLedger()
        self.pending = PendingList(self.ledger, self.swap)
        self.model: list[Message] = []
        self.taken: list[Message] = []  # by pop() or extract(), may be given back
        self.next_seq = 1

    @initialize(
        threshold=st.sampled_from([1, 4_000, 40_000, 150_000]),
        priorities=st.lists(PRIORITIES, min_size=1, max_size=4),
        backlog=st.sampled_from([0, 100, 700, 1_500]),
    )
    def start(self, threshold: int, priorities: list[int], backlog: int) -> None:
        """A backlog spread over a few levels, so that most runs start with spilled chunks."""
        self.ledger.threshold = threshold
        for index in range(backlog):
            self.add(priorities[index % len(priorities)], index % 30)

    def add(self, priority: int, size: int) -> None:
        seq = self.next_seq
        self.next_seq += 1
        message = make(seq, priority, bytes([seq % 251]) * size)
        self.pending.append(message)
        bisect.insort(self.model, message, key=order_key)

    @rule(priority=PRIORITIES, size=st.integers(0, 40), count=st.sampled_from([1, 5, 300]))
    def append(self, priority: int, size: int, count: int) -> None:
        for _ in range(count):
            self.add(priority, size)

    @precondition(lambda self: bool(self.model))
    @rule(count=st.sampled_from([1, 3, 200, 300]))
    def pop(self, count: int) -> None:
        for _ in range(count):
            message = self.pending.pop()
            if not self.model:
                assert message is None
                return
            expected = self.model.pop(0)
            assert message is not None
            assert fields(message) == fields(expected)
            self.taken.append(message)

    @precondition(lambda self: bool(self.taken))
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        """Give back one of the messages taken, wherever it was taken from."""
        index = data.draw(st.integers(0, len(self.taken) - 1))
        message = self.taken.pop(index)
        self.pending.restore(message)
        bisect.insort(self.model, message, key=order_key)

    @precondition(lambda self: bool(self.model))
    @rule(
        modulus=st.integers(1, 5),
        remainder=st.integers(0, 4),
        limit=st.none() | st.integers(0, 400),
    )
    def extract(self, modulus: int, remainder: int, limit: int | None) -> None:
        def wanted(message: Message) -> bool:
            return message.seq % modulus == remainder % modulus

        taken: list[Message] = []

        def choose(message: Message) -> bool:
            if wanted(message):
                taken.append(message)
                return True
            return False

        count = self.pending.extract(choose, lambda: limit is not None and len(taken) >= limit)
        expected = [m for m in self.model if wanted(m)]
        if limit is not None:
            expected = expected[:limit]
        assert count == len(expected)
        assert [fields(m) for m in taken] == [fields(m) for m in expected]
        chosen = {m.seq for m in expected}
        self.model = [m for m in self.model if m.seq not in chosen]
        self.taken.extend(taken)

    @rule(data=st.data(), limit=st.integers(1, 400))
    def browse(self, data: st.DataObject, limit: int) -> None:
        index = data.draw(st.integers(-1, len(self.model) - 1))
        at = self.model[index] if index >= 0 else None
        cursor = START if at is None else (at.priority, at.seq)
        found = self.pending.following(cursor, limit)
        assert seqs(found) == seqs(self.model[index + 1 : index + 1 + limit])

    @invariant()
    def counts_and_order(self) -> None:
        assert len(self.pending) == len(self.model)
        assert bool(self.pending) == bool(self.model)
        assert self.pending.bytes == sum(len(m.body) for m in self.model)
        assert 0 <= self.pending.spilled <= len(self.model)
        assert self.ledger.used >= 0
        assert seqs(self.pending) == seqs(self.model)

    def teardown(self) -> None:
        try:
            assert seqs(drain(self.pending)) == seqs(self.model)
            assert self.pending.bytes == self.pending.spilled == 0
            assert self.ledger.used == 0
            assert_swap_empty(self.swap, self.directory)
        finally:
            self.swap.close()
            shutil.rmtree(self.directory, ignore_errors=True)


@pytest.mark.timeout(240)  # about 11 s on a quiet machine; it passed 60 s at a load of 18
def test_pending_list_against_model(tmp_path: Path) -> None:
    examples = itertools.count()

    class InTmpPath(PendingMachine):
        def __init__(self) -> None:
            super().__init__(tmp_path / str(next(examples)))  # a fresh swap area per example

    # No shrinking: every run handles thousands of messages, and shrinking one would outlast the
    # test's time limit. A failure prints its steps, which are few.
    run_state_machine_as_test(
        InTmpPath,
        settings=settings(
            max_examples=80,
            stateful_step_count=30,
            deadline=None,
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
        ),
    )


def test_a_message_shared_by_several_lists_is_counted_once() -> None:
    # A topic's message sits in each subscriber's list with one body: the ledger (which decides
    # when to swap) counts its memory once, until the last list lets it go.
    ledger = MemoryLedger()
    lists = [PendingList(ledger) for _ in range(4)]
    messages = [make(seq) for seq in range(1, 11)]
    for message in messages:
        for pending in lists:
            pending.append(message)
    cost = sum(message_cost(len(m.body)) for m in messages)
    assert ledger.used == cost
    for pending in lists[:3]:
        assert seqs(drain(pending)) == list(range(1, 11))
        assert ledger.used == cost
    lists[3].pop()
    assert ledger.used == cost - message_cost(len(messages[0].body))
    lists[3].clear()
    assert ledger.used == 0
