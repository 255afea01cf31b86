"""The journal-backed store: records, liveness, reclaiming segments, recovery (real journal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import Unstorable, encode_message
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.persist.format import (
    RecordType,
    decode_lsns,
    encode_mark,
    encode_tx,
)
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import RUN_MAX, JournalStore
from sluiceway.persist.replay import Recovery
from sluiceway.persist.restoring import Delivering
from sluiceway.persist.segments import CorruptJournal, JournalError

QUEUE = DestinationName(DestinationKind.QUEUE, "q")
TOPIC = DestinationName(DestinationKind.TOPIC, "t")


def message(seq: int, destination: DestinationName = QUEUE) -> Message:
    return Message(
        id=f"m{seq}",
        destination=destination,
        body=b"body %d" % seq,
        headers=(("k", "v"),),
        priority=4,
        expires=0,
        persistent=True,
        timestamp=1,
        seq=seq,
    )


def open_store(path: Path) -> tuple[JournalStore, list[Message], Recovery]:
    store = JournalStore(Journal(path, sync=SyncPolicy.OS, segment_size=1 << 30))
    recovered: list[Message] = []
    recovery = store.recover(Delivering(recovered.append))
    return store, recovered, recovery


def reopen(store: JournalStore, path: Path) -> tuple[JournalStore, list[Message], Recovery]:
    store.flush()
    store.close()
    return open_store(path)


def test_messages_and_their_deliveries_come_back(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    first, second, third = message(1), message(2), message(3)
    for m in (first, second, third):
        store.added(m)
    store.delivered(second)
    store.delivered(second)
    store.removed(first)
    store.seq_reserved(QUEUE, 1000)
    store, recovered, recovery = reopen(store, tmp_path)
    assert [(m.seq, m.delivery_count) for m in recovered] == [(2, 2), (3, 0)]
    assert recovered[0].body == b"body 2"
    assert recovered[0].headers == (("k", "v"),)
    assert recovery.seqs[QUEUE] == 1000
    assert recovery.messages == {QUEUE: 2}
    store.close()


def added(store: JournalStore, count: int) -> list[Message]:
    """Messages 1 to `count`, added to `store`."""
    messages = [message(seq) for seq in range(1, count + 1)]
    for m in messages:
        store.added(m)
    return messages


def kinds(store: JournalStore) -> list[tuple[RecordType, int]]:
    """(type, LSN) of every record on disk."""
    store.flush()
    return [(RecordType(r.type), r.position.lsn) for r in store.journal.scan()]


def runs(store: JournalStore) -> list[tuple[int, tuple[int, ...]]]:
    """(LSN, the ADD LSNs it marks) of every DELIVERED_RUN on disk."""
    store.flush()
    return [
        (r.position.lsn, decode_lsns(r.payload))
        for r in store.journal.scan()
        if r.type == RecordType.DELIVERED_RUN
    ]


def test_the_deliveries_of_one_write_are_one_record_written_before_anything_else(
    tmp_path: Path,
) -> None:
    store, _, _ = open_store(tmp_path)
    first, second, third = message(1), message(2), message(3)
    for m in (first, second):
        store.added(m)
    store.flush()
    store.delivered(first)
    store.delivered(second)
    assert store.buffered  # the I/O layer flushes it before the MESSAGE frames go
    store.added(third)  # a later record: the run goes first, to keep the order of events
    assert kinds(store) == [
        (RecordType.ADD, 1),
        (RecordType.ADD, 2),
        (RecordType.DELIVERED_RUN, 3),
        (RecordType.ADD, 4),
    ]
    assert runs(store) == [(3, (1, 2))]
    assert first.marks == second.marks == [3]
    store.close()


def test_a_run_is_live_while_any_of_its_messages_is_across_a_restart(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    messages = added(store, 4)
    for m in messages:
        store.delivered(m)
    [(run, _)] = runs(store)
    store.removed(messages[0])
    store.flush()  # (liveness follows the records written)
    assert store.is_live(run)
    store, recovered, _ = reopen(store, tmp_path)
    assert [(m.seq, m.delivery_count) for m in recovered] == [(2, 1), (3, 1), (4, 1)]
    assert store.is_live(run)
    for m in recovered[:2]:
        store.removed(m)
        store.flush()
        assert store.is_live(run)
    store.removed(recovered[2])  # the last message it marked
    store.flush()
    assert not store.is_live(run)
    store.close()


def test_a_run_is_bounded(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    messages = added(store, RUN_MAX + 1)
    for m in messages:
        store.delivered(m)
    written = runs(store)
    assert [len(adds) for _, adds in written] == [RUN_MAX, 1]
    store.close()


def test_the_consumptions_of_one_read_are_one_record_in_the_segment_of_their_messages(
    tmp_path: Path,
) -> None:
    store, _, _ = open_store(tmp_path)
    first, second, third = added(store, 3)
    store.flush()
    store.delivered(first)  # and consumed in the same turn (ack:auto): the mark goes first
    store.removed(first)
    store.removed(second)
    assert store.buffered  # the I/O layer flushes it before the frames that follow go
    assert store.last_lsn == 5  # a RECEIPT for these consumptions waits for their record
    store.removed(third)
    store.rotate()  # the third's REMOVE is written in the segment of its ADD, not after it
    assert kinds(store)[:6] == [
        (RecordType.ADD, 1),
        (RecordType.ADD, 2),
        (RecordType.ADD, 3),
        (RecordType.DELIVERED_RUN, 4),
        (RecordType.REMOVE_RUN, 5),
        (RecordType.REMOVE_RUN, 6),
    ]
    assert runs(store) == [(4, (1,))]
    assert store.journal.segments()[-1].base_lsn == 7
    assert not any(store.is_live(lsn) for lsn in range(1, 7))
    store, recovered, _ = reopen(store, tmp_path)
    assert recovered == []
    store.close()


def test_single_delivery_records_of_earlier_journals_still_count(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    kept = message(1)
    store.added(kept)
    store.journal.append(RecordType.DELIVERED, encode_mark(QUEUE, 1, kept.location))
    store, recovered, _ = reopen(store, tmp_path)
    assert [(m.seq, m.delivery_count) for m in recovered] == [(1, 1)]
    store.close()


def test_a_transaction_counts_whole_or_not_at_all(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    kept = message(1)
    store.added(kept)
    with store.atomic():
        store.added(message(2))
        store.removed(kept)
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [2]  # committed: both effects
    # A transaction cut by a crash: its TX record announces 3 records, 1 made it to disk.
    victim = recovered[0]
    journal = store.journal
    journal.append(RecordType.TX, encode_tx(3))
    journal.append(RecordType.ADD, encode_message(message(9)))
    store, recovered, recovery = reopen(store, tmp_path)
    assert recovery.discarded_tx == 1
    assert [m.seq for m in recovered] == [victim.seq]
    # Records appended after the restart are not taken for the cut transaction's missing ones.
    store.added(message(10))
    store.added(message(11))
    store, recovered, recovery = reopen(store, tmp_path)
    assert recovery.discarded_tx == 0
    assert [m.seq for m in recovered] == [2, 10, 11]
    store.close()


def added_together(store: JournalStore, *messages: Message) -> None:
    with store.atomic():
        for m in messages:
            store.added(m)


def test_a_commits_records_are_written_first_and_then_adopted(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    consumed = message(1)
    store.added(consumed)
    published = [message(2), message(3)]
    store.write_transaction(published, [consumed])
    assert not store.journal.buffered  # handed to the OS before anything takes effect
    assert consumed.location == 0
    for m in published:
        store.added(m)  # what publishing does: the ADD written stands, nothing more is written
    store.removed(consumed)  # what consuming does: its REMOVE is written already
    assert kinds(store) == [
        (RecordType.ADD, 1),
        (RecordType.TX, 2),
        (RecordType.ADD, 3),
        (RecordType.ADD, 4),
        (RecordType.REMOVE, 5),
    ]
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [2, 3]
    store.close()


def test_an_unstorable_message_is_refused_naming_its_field_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    store, _, _ = open_store(tmp_path)
    good, big, late = message(1), message(2), message(3)
    big.headers = (("x-big", "v" * 70000),)
    late.expires = 2**63
    for bad, words in (
        (big, ("header 'x-big'", "70000 bytes", "65535")),
        (late, ("expires", str(2**63), "9223372036854775807")),
    ):
        with pytest.raises(Unstorable) as refused:
            store.write_transaction([good, bad], [])
        assert refused.value.status == 400
        for word in words:
            assert word in str(refused.value)
        with pytest.raises(Unstorable):
            added_together(store, good, bad)
        with pytest.raises(Unstorable):
            store.added(bad)
    assert good.location == 0
    assert kinds(store) == []
    store.close()


def test_a_transaction_the_journal_refuses_leaves_no_record_behind(tmp_path: Path) -> None:
    """Its TX record alone would take the next records for its own on recovery."""
    store = JournalStore(Journal(tmp_path, sync=SyncPolicy.OS, max_record_size=300))
    store.recover(Delivering(lambda m: None))
    small, large = message(1), message(2)
    large.body = b"x" * 400
    with pytest.raises(JournalError, match="max_record_size"):
        added_together(store, small, large)
    store.added(message(3))
    store, recovered, recovery = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [3]
    assert recovery.discarded_tx == 0
    store.close()


def test_a_remove_outlives_the_segment_of_its_add(tmp_path: Path) -> None:
    """Deleting the REMOVE's segment first would bring the message back on recovery."""
    store, _, _ = open_store(tmp_path)
    old, keeper = message(1), message(2)
    store.added(old)
    store.added(keeper)  # keeps the first segment alive
    store.rotate()
    store.removed(old)  # a REMOVE in the second segment for an ADD in the first
    transient = message(3)
    store.added(transient)
    store.removed(transient)
    store.rotate()
    deleted, _ = store.compact()
    assert deleted == 0  # the first segment holds `keeper`; the second holds a needed REMOVE
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [2]
    store.close()


def test_dead_segments_are_deleted_and_mostly_dead_ones_compacted(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    messages = added(store, 100)
    store.rotate()
    for m in messages[:99]:
        store.removed(m)  # one of the first segment's 100 records stays live
    store.rotate()
    before = store.disk_bytes()
    deleted, compacted = store.compact()
    assert compacted >= 1
    assert store.disk_bytes() < before / 2
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [100]
    store.removed(recovered[0])
    store.rotate()
    deleted, _ = store.compact()
    assert deleted >= 1
    store, recovered, _ = reopen(store, tmp_path)
    assert recovered == []
    store.close()


def test_durable_subscriptions_and_their_acknowledgements_come_back(tmp_path: Path) -> None:
    record = DurableRecord(7, "t", "app", "reader", "", 1)
    later = DurableRecord(8, "t", "app", "late", "", 4)
    durables = [record]
    store = JournalStore(Journal(tmp_path, sync=SyncPolicy.OS))
    store.recover(Delivering(lambda m: None))
    store.set_snapshot(lambda: ([(TOPIC, 1000)], list(durables)))
    store.durable_created(record)
    retained = [message(seq, TOPIC) for seq in (1, 2, 3)]
    for m in retained:
        store.added(m)
    store.durable_delivered(7, retained[0])
    store.durable_acked(7, retained[1])
    store.rotate()
    store.durable_created(later)  # recorded only in the second segment...
    durables.append(later)
    store.rotate()  # ...which the third segment's snapshot supersedes
    deleted, _ = store.compact()  # rotates once more, then reclaims
    # The second and third segments held only superseded metadata: deleted, and with them the
    # only DURABLE record of `later`. What is left: the first (live messages) and the active one.
    # (A deleted segment in the middle stays as an empty 24-byte stub until it is the oldest.)
    assert deleted == 2
    assert len([s for s in store.journal.segments() if s.size > 24]) == 2
    store, recovered, recovery = reopen(store, tmp_path)
    assert set(recovery.durables) == {7, 8}  # both come back from the snapshot
    durable = recovery.durables[7]
    assert durable.record == record
    assert durable.acked == {2}
    assert durable.delivered == {1: 1}
    assert recovery.seqs[TOPIC] == 1000
    assert [m.seq for m in recovered] == [1, 2, 3]
    store.close()


def test_a_segment_emptied_before_an_older_one_is_reclaimed_after_a_restart(
    tmp_path: Path,
) -> None:
    store, _, _ = open_store(tmp_path)
    store.added(message(1))  # keeps the first segment
    store.compact()
    short_lived = message(2)
    store.added(short_lived)
    store.removed(short_lived)
    store.compact()  # the second segment is all dead but not the oldest: emptied, kept
    store.added(message(3))  # in the third
    # The second holds no record now, so recovery learns of it last: it must still sort in
    # order among the segments, or records are counted in the wrong one.
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [1, 3]
    store.added(message(4))
    store.removed(recovered[0])
    # The first segment dies: deleting it removes the emptied one too, which the same pass
    # must not try to delete again.
    store.compact()
    store.compact()
    store, recovered, _ = reopen(store, tmp_path)
    assert [m.seq for m in recovered] == [3, 4]
    store.close()


def test_records_naming_messages_of_a_deleted_segment_are_dead_after_a_restart(
    tmp_path: Path,
) -> None:
    """A REMOVE and a delivery mark outlive the segment of the message they name; recovery
    must take them for what they are (about a message that is gone), never for a record of
    another segment."""
    store, _, _ = open_store(tmp_path)
    consumed = added(store, 20)  # the first segment: all of them consumed below
    store.rotate()
    kept = [message(seq, TOPIC) for seq in range(1, 31)]  # the second: never consumed
    for m in kept:
        store.added(m)
    for m in consumed:
        store.delivered(m)  # one DELIVERED_RUN in the second segment, naming the first's
    for m in consumed:
        store.removed(m)  # REMOVEs in the second segment too (their ADDs are older)
    store.flush()
    store.rotate()
    # The once-a-second upkeep: the first segment goes; the second, small and mostly live, stays.
    assert store.maintain() == (1, 0)
    store, recovered, recovery = reopen(store, tmp_path)
    assert [(m.destination, m.seq) for m in recovered] == [(TOPIC, m.seq) for m in kept]
    assert recovery.outlived == len(consumed) * 2  # each REMOVE, and each in the run
    store, recovered, recovery = reopen(store, tmp_path)
    assert len(recovered) == len(kept)
    store.close()


def test_a_record_naming_a_later_record_stops_recovery_at_its_file_and_offset(
    tmp_path: Path,
) -> None:
    store, _, _ = open_store(tmp_path)
    store.added(message(1))
    position = store.journal.append(RecordType.REMOVE, encode_mark(QUEUE, 1, 99))
    store.flush()
    store.close()
    with pytest.raises(CorruptJournal) as caught:
        open_store(tmp_path)
    assert caught.value.segment == tmp_path / f"{position.segment:020d}.log"
    assert caught.value.offset == position.offset
    assert not caught.value.skippable
    assert "names record 99, which does not come before it" in str(caught.value)


def test_a_record_of_an_unknown_type_stops_recovery(tmp_path: Path) -> None:
    store, _, _ = open_store(tmp_path)
    position = store.journal.append(200, b"from the future")
    store.close()
    with pytest.raises(CorruptJournal, match=f"offset {position.offset}: record 1 .type 200."):
        open_store(tmp_path)
