"""The sequence log of a topic: read anywhere without removing, trim in front, spill to swap.

Logs with a spill area write to a real SwapArea in a temporary directory. Most tests use the
same layout: odd sequence numbers (so that a read or trim can start between two messages), the
first 10 in memory, three full spilled chunks, then 40 in the chunk being filled.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pytest

from sluiceway.core.containers.pending import CHUNK_BYTES, CHUNK_MESSAGES
from sluiceway.core.containers.seqlog import SeqLog
from sluiceway.core.values.memory import MemoryLedger, message_cost
from sluiceway.core.values.message import Message
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.persist.swap import SwapArea
from tests.core.helpers import message_fields as fields
from tests.core.swapping import assert_swap_empty

TOPIC: Final = DestinationName(DestinationKind.TOPIC, "t")
BODY_SIZE: Final = 8
COST: Final = message_cost(BODY_SIZE)
EVERYTHING: Final = 1_000_000  # a read limit above any log's length here

# The layout: seq 2i+1 for message i.
HEAD: Final = 10
TOTAL: Final = HEAD + 3 * CHUNK_MESSAGES + 40
LAYOUT_SEQS: Final = [2 * i + 1 for i in range(TOTAL)]
IN_MEMORY: Final = frozenset(LAYOUT_SEQS[:HEAD] + LAYOUT_SEQS[HEAD + 3 * CHUNK_MESSAGES :])
FIRST_SPILLED: Final = LAYOUT_SEQS[HEAD]
CHUNK_STARTS: Final = [LAYOUT_SEQS[HEAD + k * CHUNK_MESSAGES] for k in range(3)]
FILLING_START: Final = LAYOUT_SEQS[HEAD + 3 * CHUNK_MESSAGES]
LAST: Final = LAYOUT_SEQS[-1]


def make(seq: int, body: bytes | None = None) -> Message:
    """A message with journal bookkeeping: location always, marks on every third."""
    return Message(
        id=f"t-{seq}",
        destination=TOPIC,
        body=seq.to_bytes(BODY_SIZE, "big") if body is None else body,
        headers=(("n", str(seq)), ("k", "v")),
        priority=seq % 10,
        expires=0 if seq % 4 else 9_000_000 + seq,
        persistent=seq % 2 == 1,
        timestamp=2_000 + seq,
        seq=seq,
        location=50_000 + seq,
        marks=[seq, 3 * seq] if seq % 3 == 0 else None,
    )


def all_fields(messages: Iterable[Message]) -> list[tuple[object, ...]]:
    return [fields(m) for m in messages]


def seqs(messages: Iterable[Message]) -> list[int]:
    return [m.seq for m in messages]


def first_seq(log: SeqLog) -> int | None:
    """The property, read afresh each time (the log changes between reads)."""
    return log.first_seq


def head_threshold(count: int) -> int:
    """A threshold under which exactly `count` messages of COST stay in memory before spilling."""
    return count * COST + 1


def layout(swap: SwapArea) -> tuple[SeqLog, MemoryLedger, list[Message]]:
    ledger = MemoryLedger(threshold=head_threshold(HEAD))
    log = SeqLog(ledger, swap)
    messages = [make(seq) for seq in LAYOUT_SEQS]
    for message in messages:
        log.append(message)
    return log, ledger, messages


def expected_read(
    model: list[Message], from_seq: int, limit: int, to_seq: int | None = None
) -> list[Message]:
    found = [m for m in model if m.seq >= from_seq and (to_seq is None or m.seq < to_seq)]
    return found[:limit]


# -- without a spill area ----------------------------------------------------------------------


def test_empty_log() -> None:
    log = SeqLog(MemoryLedger(), None)
    assert len(log) == 0
    assert first_seq(log) is None
    assert log.read(0, 10) == []
    assert log.trim(100) == []
    assert log.clear() == []


def test_in_memory_log_without_spill_area() -> None:
    ledger = MemoryLedger(threshold=1)  # over from the start: without a spill area, no matter
    log = SeqLog(ledger, None)
    messages = [make(seq) for seq in range(1, 51)]
    for message in messages:
        log.append(message)
    assert len(log) == 50
    assert first_seq(log) == 1
    assert ledger.used == 50 * COST

    everything = log.read(0, EVERYTHING)
    assert len(everything) == 50
    assert all(a is b for a, b in zip(everything, messages, strict=True))
    assert seqs(log.read(10, 5)) == [10, 11, 12, 13, 14]
    assert seqs(log.read(10, 100, to_seq=13)) == [10, 11, 12]
    assert seqs(log.read(48, 100)) == [48, 49, 50]
    assert log.read(51, 10) == []
    assert log.read(10, 10, to_seq=10) == []
    assert seqs(log.read(0, 1)) == [1]
    assert len(log) == 50  # reads remove nothing

    assert seqs(log.trim(5)) == [1, 2, 3, 4]
    assert log.trim(5) == []
    assert first_seq(log) == 5
    assert len(log) == 46
    assert ledger.used == 46 * COST
    assert seqs(log.read(0, 2)) == [5, 6]
    assert seqs(log.clear()) == list(range(5, 51))
    assert len(log) == 0
    assert first_seq(log) is None
    assert ledger.used == 0


# -- reading ------------------------------------------------------------------------------------


def test_spilled_layout(swap: SwapArea) -> None:
    log, ledger, messages = layout(swap)
    assert len(log) == TOTAL
    assert first_seq(log) == 1
    assert ledger.used == COST * len(IN_MEMORY)
    assert swap.segment_count >= 1
    assert all_fields(log.read(0, EVERYTHING)) == all_fields(messages)


FROM_SEQS: Final = sorted(
    {0, 1, 2, 19, FIRST_SPILLED - 1, FIRST_SPILLED, 300, 301, LAST + 1, LAST, 5_000}
    | {s + d for s in [*CHUNK_STARTS, FILLING_START] for d in (-2, -1, 0, 1)}
)


def test_read_from_any_seq_with_limit_and_end(swap: SwapArea) -> None:
    """From before the log, in memory, inside spilled chunks and between them, in the chunk
    being filled, at the end and beyond; limited in count and by to_seq."""
    log, ledger, model = layout(swap)
    before = (len(log), first_seq(log), ledger.used, swap.bytes_on_disk, swap.segment_count)
    for from_seq in FROM_SEQS:
        for limit in (1, 3, CHUNK_MESSAGES + 1, EVERYTHING):
            for to_seq in (None, from_seq, from_seq + 1, from_seq + 3, 700, FILLING_START):
                case = (from_seq, limit, to_seq)
                found = log.read(from_seq, limit, to_seq)
                assert seqs(found) == seqs(expected_read(model, from_seq, limit, to_seq)), case
    # Spilled messages come back whole, journal bookkeeping included.
    assert all_fields(log.read(FIRST_SPILLED, EVERYTHING)) == all_fields(model[HEAD:])
    assert (len(log), first_seq(log), ledger.used, swap.bytes_on_disk, swap.segment_count) == (
        before
    )
    assert all_fields(log.clear()) == all_fields(model)


def test_paging_through_the_log(swap: SwapArea) -> None:
    """A reader's cursor: each read from one past the last message seen."""
    log, _, model = layout(swap)
    seen: list[Message] = []
    cursor = 0
    while page := log.read(cursor, 37):
        assert 0 < len(page) <= 37
        seen.extend(page)
        cursor = page[-1].seq + 1
    assert all_fields(seen) == all_fields(model)
    assert len(log) == TOTAL


# -- trimming -----------------------------------------------------------------------------------


# From nothing to everything: memory, into the first chunk, the same again, to a chunk's first
# message, into the last chunk, to the chunk being filled, into it, to the end and beyond.
STEP_BY_STEP: Final = [0, 1, 2, 15, 20, FIRST_SPILLED + 1, 301, 301, CHUNK_STARTS[1], 1_100]
STEP_BY_STEP.extend([FILLING_START, FILLING_START + 40, LAST + 1, 5_000])


@pytest.mark.parametrize(
    "belows",
    [
        pytest.param(STEP_BY_STEP, id="step-by-step"),
        pytest.param([1_100, LAST], id="across-memory-and-chunks"),
        pytest.param([FILLING_START + 1], id="to-the-chunk-being-filled"),
        pytest.param([CHUNK_STARTS[2]], id="to-a-chunk-boundary"),
        pytest.param([2**62], id="everything"),
    ],
)
def test_trim_removes_exactly_the_older_messages(
    belows: list[int], swap: SwapArea, swap_dir: Path
) -> None:
    log, ledger, model = layout(swap)
    for below in belows:
        trimmed = log.trim(below)
        expected = [m for m in model if m.seq < below]
        model = [m for m in model if m.seq >= below]
        assert all_fields(trimmed) == all_fields(expected), below
        assert len(log) == len(model)
        assert first_seq(log) == (model[0].seq if model else None)
        assert ledger.used == COST * sum(1 for m in model if m.seq in IN_MEMORY), below
        assert all_fields(log.read(0, EVERYTHING)) == all_fields(model), below
        assert seqs(log.read(below, 5)) == seqs(model[:5])
        if below >= FILLING_START:  # no spilled chunk left
            assert_swap_empty(swap, swap_dir)
    assert all_fields(log.clear()) == all_fields(model)
    assert len(log) == 0
    assert first_seq(log) is None
    assert log.read(0, EVERYTHING) == []
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def test_clear_returns_everything_and_frees_swap(swap: SwapArea, swap_dir: Path) -> None:
    log, ledger, model = layout(swap)
    assert all_fields(log.clear()) == all_fields(model)
    assert len(log) == 0
    assert first_seq(log) is None
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)
    assert log.clear() == []

    # Usable again: memory first, as the ledger is back to 0.
    for seq in range(10_000, 10_005):
        log.append(make(seq))
    assert ledger.used == 5 * COST
    assert seqs(log.read(0, EVERYTHING)) == list(range(10_000, 10_005))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_appends_trims_and_reads_interleaved(seed: int, swap: SwapArea, swap_dir: Path) -> None:
    """Random appends, trims and reads against a list; the log spills and is trimmed into its
    spilled part many times over."""
    rng = random.Random(seed)
    ledger = MemoryLedger(threshold=head_threshold(30))
    log = SeqLog(ledger, swap)
    model: list[Message] = []
    next_seq = 1
    for step in range(3_000):
        roll = rng.random()
        if roll < 0.5:
            for _ in range(rng.choice([1, 1, 10, 100])):
                next_seq += rng.choice([1, 1, 2, 5])
                message = make(next_seq)
                log.append(message)
                model.append(message)
        elif roll < 0.7 and model:
            below = rng.choice(model).seq + rng.choice([0, 0, 1])
            trimmed = log.trim(below)
            index = bisect.bisect_left(model, below, key=lambda m: m.seq)
            assert seqs(trimmed) == seqs(model[:index]), step
            del model[:index]
        else:
            from_seq = rng.randrange(next_seq + 2)
            limit = rng.choice([1, 5, 300])
            to_seq = rng.choice([None, from_seq + rng.randrange(400)])
            found = log.read(from_seq, limit, to_seq)
            assert seqs(found) == seqs(expected_read(model, from_seq, limit, to_seq)), step
        assert len(log) == len(model)
        assert first_seq(log) == (model[0].seq if model else None)
        assert 0 <= ledger.used <= ledger.peak
    assert swap.segment_count > 0 or not model
    assert all_fields(log.read(0, EVERYTHING)) == all_fields(model)
    assert seqs(log.clear()) == seqs(model)
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)


# -- memory -------------------------------------------------------------------------------------


def chunk_cost(body_size: int) -> int:
    """The most memory the chunk being filled takes, just before it is written."""
    count = CHUNK_MESSAGES
    if body_size:
        count = min(count, -(-CHUNK_BYTES // body_size))
    return count * message_cost(body_size)


def test_chunk_cut_by_bytes(swap: SwapArea, swap_dir: Path) -> None:
    """Large bodies make a chunk once CHUNK_BYTES of them wait; trimmed ones no longer count."""
    ledger = MemoryLedger(threshold=1)  # everything goes to the chunk being filled
    log = SeqLog(ledger, swap)
    size = CHUNK_BYTES // 3 + 1
    log.append(make(1, b"a" * size))
    log.append(make(2, b"b" * size))
    assert seqs(log.trim(2)) == [1]
    log.append(make(3, b"c" * size))
    assert ledger.used == 2 * message_cost(size)  # two bodies wait: below CHUNK_BYTES
    assert swap.segment_count == 0
    log.append(make(4, b"d" * size))
    assert ledger.used == 0  # written as one chunk
    assert swap.segment_count == 1
    assert [m.body for m in log.read(0, EVERYTHING)] == [b"b" * size, b"c" * size, b"d" * size]
    assert seqs(log.clear()) == [2, 3, 4]
    assert_swap_empty(swap, swap_dir)


@pytest.mark.parametrize(("body_size", "count"), [(16, 20_000), (8_192, 600)])
def test_memory_bounded_by_threshold_plus_a_chunk(
    body_size: int, count: int, swap: SwapArea, swap_dir: Path
) -> None:
    threshold = 64 * 1024
    ledger = MemoryLedger(threshold=threshold)
    log = SeqLog(ledger, swap)
    for seq in range(1, count + 1):
        log.append(make(seq, bytes(body_size)))
    bound = threshold + chunk_cost(body_size)
    assert count * message_cost(body_size) > 10 * bound  # far more than memory may hold
    assert ledger.peak < bound
    assert len(log) == count
    middle = count // 2
    used = ledger.used
    assert seqs(log.read(middle, 3)) == [middle, middle + 1, middle + 2]
    assert ledger.used == used  # a read keeps nothing in memory
    assert seqs(log.trim(middle)) == list(range(1, middle))
    assert ledger.peak < bound
    assert seqs(log.clear()) == list(range(middle, count + 1))
    assert ledger.used == 0
    assert_swap_empty(swap, swap_dir)
