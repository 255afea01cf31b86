"""Persistent messages in the journal: what the broker writes, what is still live, recovery.

The broker appends a record for each event that must survive a crash (persist.format's table):
a persistent message accepted (ADD), delivered (DELIVERED_RUN: the deliveries that one write to
consumers carries, as one record), consumed (REMOVE, or REMOVE_RUN: the consumptions one read
brings, of messages added in the same segment, as one record), a durable
subscription's life and acknowledgements, and sequence numbers spoken for. Records reach the OS
before the broker writes any frame that depends on them (the I/O layer flushes first), so a
killed broker loses nothing it acted on; RECEIPTs that promise durability wait until the records
are fsynced (per the sync policy).

Disk is reclaimed by tracking which records are still live: one byte per record per segment.
An ADD is live while its message is in the broker; DELIVERED and DURABLE_* marks while their
message is (a DELIVERED_RUN while any of its messages is: a count per run); a REMOVE while the
segment holding its ADD still exists (else the message would come back on recovery), which a
REMOVE_RUN never outlives (it is only written in the segment of all its ADDs); SEQ,
DURABLE and SNAPSHOT records only until the next rotation, which starts the new segment with a
SNAPSHOT of that state. The features that keep records of their own here (StoreExtensions:
topic cursors and queue leases, stages) follow the same lifetimes through the ExtensionLog
calls below: their state records are restated by their snapshots after the SNAPSHOT, and their
marks (a LEASE_MARK) live as long as their message. A segment with no live record is deleted;
one that is mostly dead is rewritten with its live records only.

A write the disk refuses is survived: its records wait in memory, in order, and the upkeep
retries it (persist.journal); what that means for producers is core.features.disk's, which the
store tells what the journal finds (a failed write at once, the free space on each upkeep).

Recovery is persist.replay's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from sluiceway.core.features.disk import DiskGuard, DiskLevel
from sluiceway.core.model.store import BrokerSnapshot, Restore, StoredRecord, StoreExtension
from sluiceway.core.values.clock import SystemClock
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import encode_message
from sluiceway.naming import DestinationName
from sluiceway.persist.format import (
    RESTATED_BY,
    RecordType,
    encode_durable,
    encode_lsns,
    encode_mark,
    encode_position,
    encode_snapshot,
    encode_sub,
    encode_sub_mark,
    encode_tx,
)
from sluiceway.persist.journal import Journal
from sluiceway.persist.liveness import Liveness
from sluiceway.persist.replay import Recovery, Replay
from sluiceway.persist.segments import (
    JournalError,
    JournalWriteError,
    Position,
    Record,
)

log = logging.getLogger(__name__)

COMPACT_BELOW: Final = 0.25  # rewrite a segment when fewer than this share of its records live
COMPACT_MIN_BYTES: Final = 1024 * 1024  # ...and it is at least this big (small ones: not worth it)
SEQ_BLOCK: Final = 1000  # sequence numbers reserved per SEQ record
RUN_MAX: Final = 1024  # deliveries (or removals) gathered for one *_RUN record, at most


def observe_journal(guard: DiskGuard, journal: Journal, *, measure: bool) -> None:
    """Tell `guard` what `journal` found; with `measure`, and at a write's first failure, the
    free space too (statvfs)."""
    space = None
    if measure or (journal.write_error is not None and guard.level < DiskLevel.FULL):
        try:
            space = journal.free_space()
        except OSError:
            space = (-1, -1)  # not measurable (the directory vanished?): write errors still tell
    guard.observe(
        journal.bytes_written,
        write_error=journal.write_error,
        backlog=journal.waiting_bytes,
        failure=journal.failure,
        space=space,
    )


class JournalStore:
    """The broker's persistent state, kept in a Journal."""

    def __init__(
        self, journal: Journal, snapshot: Callable[[], BrokerSnapshot] | None = None
    ) -> None:
        self.journal = journal
        self._snapshot = snapshot
        self._live = Liveness()
        # State records (SEQ, DURABLE, CURSOR, STAGE_OPEN...) since the last rotation, by the
        # snapshot record that restates them at the start of the next segment.
        self._meta: dict[RecordType, list[int]] = {}
        # State records the last rotation's snapshots restate: they die once the snapshots are
        # on disk (LSN _restated), and not before, so the upkeep cannot reclaim them sooner.
        self._superseded: list[int] = []
        self._restated = 0
        self._tx: list[tuple[RecordType, bytes, Message]] | None = None
        # The features that keep their records here, each with the record restating its state
        # after the SNAPSHOT at the start of every segment (in the order they were added).
        self._extensions: list[StoreExtension] = []
        # Deliveries not yet in the journal: written as one DELIVERED_RUN before any other record
        # and by every flush (so before the MESSAGE frames that carry them leave).
        self._run: list[Message] = []
        # DELIVERED_RUN LSN -> how many of its deliveries' messages are still in the broker.
        self._run_refs: dict[int, int] = {}
        # Messages that left the broker, whose REMOVE_RUN is not written yet: their ADD's LSN
        # (in the active segment) and marks. Written like _run; `last_lsn` writes it too.
        self._removes: list[tuple[int, list[int] | None]] = []
        # Messages `added` that were in the journal already (a published stage's, whose
        # STAGE_ADD stands as its ADD): persist.stage_extension compares the count around a publish.
        self.adoptions = 0
        self.changes = 0  # grows with every record appended or gathered into a run
        self._disk = DiskGuard(SystemClock())  # the broker's, once it watches this store

    def watch_disk(self, guard: DiskGuard) -> None:
        """Tell `guard` what the journal finds of its disk, from now on (core.features.disk)."""
        self._disk = guard
        guard.path = str(self.journal.directory)
        observe_journal(self._disk, self.journal, measure=True)

    def set_snapshot(self, snapshot: Callable[[], BrokerSnapshot]) -> None:
        self._snapshot = snapshot

    def extend(self, extension: StoreExtension) -> None:
        self._extensions.append(extension)

    # -- appending --------------------------------------------------------------------------------

    def _append(self, record_type: RecordType, payload: bytes) -> int:
        if self._run or self._removes:
            self._write_pending()
        self.changes += 1
        return self.journal.add(record_type, payload)

    def _write_pending(self) -> None:
        """Write the runs being gathered, before any other record (the order of events)."""
        if self._run:
            self._write_run()
        if self._removes:
            self._write_removes()

    def _write_removes(self) -> None:
        removes, self._removes = self._removes, []
        lsn = self.journal.add(RecordType.REMOVE_RUN, encode_lsns([add for add, _ in removes]))
        live = self._live
        live.born(lsn, live=False)  # in the segment of its ADDs: needed only while they are
        for add, marks in removes:
            live.kill(add)
            for mark in marks or ():
                self._drop_mark(mark)

    def _write_run(self) -> None:
        run, self._run = self._run, []
        lsn = self.journal.add(RecordType.DELIVERED_RUN, encode_lsns([m.location for m in run]))
        self._live.born(lsn)
        self._run_refs[lsn] = len(run)
        for message in run:
            if message.marks is None:
                message.marks = [lsn]
            else:
                message.marks.append(lsn)

    def _drop_mark(self, lsn: int) -> None:
        """A message a mark is about left the broker: the mark dies (a run, with its last)."""
        refs = self._run_refs
        left = refs.get(lsn)
        if left is None:
            self._live.kill(lsn)
        elif left > 1:
            refs[lsn] = left - 1
        else:
            del refs[lsn]
            self._live.kill(lsn)

    def added(self, message: Message) -> None:
        """A persistent message is now held by a destination."""
        if message.location:
            self.adoptions += 1  # already in the journal: its record stands as its ADD
            return
        if self._tx is not None:
            self._tx.append((RecordType.ADD, encode_message(message), message))
            return
        message.location = self._append(RecordType.ADD, encode_message(message))
        self._live.born(message.location)

    def removed(self, message: Message) -> None:
        """The message left the broker (consumed, expired, trimmed)."""
        location = message.location
        if not location:
            if self._tx is not None:  # added in this same transaction: neither record is needed
                self._tx = [entry for entry in self._tx if entry[2] is not message]
            return
        if self._tx is None and location >= self._live.bases[-1]:
            # Added in the active segment: its REMOVE joins the run the next record, flush or
            # last_lsn writes (in this segment: rotate writes it first).
            if self._run:
                self._write_run()  # it may mark this message, by the location cleared below
            self._removes.append((location, message.marks))
            self.changes += 1
            message.location = 0
            message.marks = None
            if len(self._removes) >= RUN_MAX:
                self._write_removes()
            return
        payload = encode_mark(message.destination, message.seq, location)
        if self._tx is not None:
            self._tx.append((RecordType.REMOVE, payload, message))
            return
        self._removal(self._append(RecordType.REMOVE, payload), message)

    def _removal(self, lsn: int, message: Message) -> None:
        self._live.removal(lsn, message.location)
        for mark in message.marks or ():
            self._drop_mark(mark)
        message.location = 0
        message.marks = None

    def delivered(self, message: Message) -> None:
        """A persistent queue message is being written to a consumer (its mark joins the run
        that the next record or flush writes)."""
        if message.location:
            self._run.append(message)
            self.changes += 1
            if len(self._run) >= RUN_MAX:
                self._write_run()

    def durable_delivered(self, sub_id: int, message: Message) -> None:
        if message.location:
            payload = encode_sub_mark(sub_id, message.seq, message.location)
            self._mark(message, self._append(RecordType.DURABLE_DELIVERED, payload))

    def durable_acked(self, sub_id: int, message: Message) -> None:
        if message.location:
            payload = encode_sub_mark(sub_id, message.seq, message.location)
            self._mark(message, self._append(RecordType.DURABLE_ACK, payload))

    def _mark(self, message: Message, lsn: int) -> None:
        self._live.born(lsn)
        if message.marks is None:
            message.marks = [lsn]
        else:
            message.marks.append(lsn)

    def seq_reserved(self, destination: DestinationName, seq: int) -> None:
        self._meta_record(RecordType.SEQ, encode_position(destination, seq))

    def durable_created(self, record: DurableRecord) -> None:
        self._meta_record(RecordType.DURABLE, encode_durable(record))

    def durable_ended(self, sub_id: int) -> None:
        self._meta_record(RecordType.DURABLE_END, encode_sub(sub_id))

    def _meta_record(self, record_type: RecordType, payload: bytes) -> None:
        lsn = self._append(record_type, payload)
        self._live.born(lsn)
        self._meta.setdefault(RESTATED_BY[record_type], []).append(lsn)

    def _state_read(self, lsn: int, record_type: RecordType) -> None:
        """Recovery: a state record read. A snapshot supersedes the earlier state records of
        its own kind, and only those: a rotation cut short by a crash may have written some of
        its snapshots and not the others, whose earlier records must then stay live."""
        snapshot = RESTATED_BY[record_type]
        if record_type is snapshot:
            for old in self._meta.pop(snapshot, ()):
                self._live.kill(old)
        self._live.born(lsn)
        self._meta.setdefault(snapshot, []).append(lsn)

    # -- for extensions (core.model.store.ExtensionLog): the same lifetimes as the above -------

    def append_live(self, record_type: int, payload: bytes) -> int:
        """Append a record that lives until `kill` (or a REMOVE naming it); return its LSN."""
        lsn = self._append(RecordType(record_type), payload)
        self._live.born(lsn)
        return lsn

    def append_state(self, record_type: int, payload: bytes) -> int:
        """Append a state record, live until the next rotation restates it; return its LSN."""
        self._meta_record(RecordType(record_type), payload)
        return self.last_lsn

    def append_mark(self, record_type: int, payload: bytes, message: Message) -> int:
        """Append a mark on `message` (in the journal), live while the message is."""
        lsn = self._append(RecordType(record_type), payload)
        self._mark(message, lsn)
        return lsn

    def kill(self, lsn: int) -> None:
        self._live.kill(lsn)

    def is_live(self, lsn: int) -> bool:
        return self._live.is_live(lsn)

    @property
    def oldest_lsn(self) -> int:
        """The base LSN of the oldest segment on disk: no record below it is left."""
        return self._live.bases[0] if self._live.bases else self.journal.next_lsn

    def read(self, lsn: int, offset: int) -> Record:
        """The record `lsn`, at byte `offset` of its segment (valid until it is compacted)."""
        base = self._live.segment_of(lsn)
        if base is None:
            raise JournalError(f"record {lsn} was in a segment deleted since: it is not live")
        return self.journal.read(Position(lsn, base, offset))

    def replayed(self, lsn: int, *, live: bool) -> None:
        """Recovery, first pass: an extension's record read (`kill` it later if it dies)."""
        self._live.born(lsn, live=live)

    def replayed_state(self, lsn: int, record_type: int) -> None:
        """Recovery, first pass: an extension's state record read."""
        self._state_read(lsn, RecordType(record_type))

    def replayed_mark(self, record: StoredRecord, add: int, *, delivery: bool) -> bool:
        """Recovery, first pass: an extension's mark on the message added at `add`: live
        (True) while that message is; with `delivery`, one delivery of it."""
        assert isinstance(record, Record)  # the journal hands its extensions its own records
        return self._replay.mark(record, add, delivery=delivery)

    def forget_replayed(self, lsn: int) -> None:
        """Recovery, first pass: the record `lsn` read earlier is dead, and so are its marks."""
        self._replay.forget(lsn)

    def replayed_message(self, lsn: int) -> tuple[list[int] | None, int]:
        """Recovery, second pass: the marks and delivery count replayed for the record `lsn`
        that holds a message."""
        return self._replay.message(lsn)

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """Everything added or removed inside is written as one transaction, or not at all."""
        if self._tx is not None:
            yield
            return
        self._tx = []
        try:
            yield
        finally:
            entries, self._tx = self._tx, None
        if entries:
            self._settle_tx(self._buffer_tx(entries), entries)

    def write_transaction(self, adds: Sequence[Message], removes: Sequence[Message]) -> None:
        """A COMMIT's own records, written before any of it takes effect: the ADDs of `adds`
        (numbered already) and the REMOVEs of `removes`, as one transaction handed to the OS.

        Raises with nothing written when one cannot be (Unstorable names the field) or the
        journal refuses them. Afterwards `added` of one of `adds` writes nothing (its ADD
        stands), and neither does `removed` of one of `removes` (it is out of the journal).
        """
        assert self._tx is None, "a COMMIT's records are not part of an enclosing atomic()"
        entries = [(RecordType.ADD, encode_message(m), m) for m in adds]
        entries += [
            (RecordType.REMOVE, encode_mark(m.destination, m.seq, m.location), m) for m in removes
        ]
        if not entries:
            return
        tx_lsn = self._buffer_tx(entries)
        # Written now, before anything is published: a disk that refuses the write refuses the
        # COMMIT, rather than frames sent after its messages reached consumers.
        journal = self.journal
        journal.flush()
        if adds and journal.write_error is not None:
            # The journal keeps a failed write's records to write them later: not these, the
            # COMMIT is refused. (One that only consumes goes on, its records waiting with the
            # others, as acknowledgements outside a transaction do while the disk is full.)
            journal.take_back(tx_lsn)
            observe_journal(self._disk, journal, measure=False)
            raise journal.waiting_error("write a COMMIT's records")
        self._settle_tx(tx_lsn, entries)

    def _buffer_tx(self, entries: list[tuple[RecordType, bytes, Message]]) -> int:
        """Buffer the TX record and its records as one unit (all, or none and raise); return
        the TX record's LSN."""
        self._write_pending()  # (records of what happened before: they stand either way)
        records = [(RecordType.TX, encode_tx(len(entries)))]
        records += [(record_type, payload) for record_type, payload, _ in entries]
        self.changes += 1
        return self.journal.add_all(records)

    def _settle_tx(self, tx_lsn: int, entries: list[tuple[RecordType, bytes, Message]]) -> None:
        """Bookkeeping of a transaction buffered at `tx_lsn`: its messages' locations, liveness."""
        self._live.born(tx_lsn, live=False)  # only recovery reads it
        for lsn, (record_type, _, message) in enumerate(entries, start=tx_lsn + 1):
            if record_type is RecordType.ADD:
                message.location = lsn
                self._live.born(lsn)
            else:
                self._removal(lsn, message)

    # -- durability -------------------------------------------------------------------------------

    @property
    def last_lsn(self) -> int:
        """The LSN of the last record appended: durable once synced up to it. The runs being
        gathered are written first, so that a RECEIPT waiting for it waits for them."""
        if self._run or self._removes:
            self._write_pending()
        return self.journal.next_lsn - 1

    @property
    def synced_lsn(self) -> int:
        return self.journal.synced_lsn

    @property
    def buffered(self) -> bool:
        return self.journal.buffered or bool(self._run) or bool(self._removes)

    def request_sync(self, lsn: int) -> None:
        self.journal.request_sync(lsn)

    def flush(self) -> None:
        # A full segment is rotated here, between frames (never inside a transaction), so
        # segments stay near their size whatever the write rate.
        self._write_pending()
        journal = self.journal
        if journal.should_rotate and self._tx is None and journal.write_error is None:
            self._rotate_if_possible()
        journal.flush()
        # The disk guard hears of a failed write at once, and of the free space passing the
        # floor as the journal's writes estimate it: persistent SENDs are held from the next one.
        if journal.write_error is not None or journal.bytes_written >= self._disk.low_mark:
            observe_journal(self._disk, journal, measure=False)

    def _rotate_if_possible(self) -> None:
        # A refused new segment leaves the journal on the active one, its next records waiting
        # as after a failed write: the caller's flush tells the disk guard.
        with contextlib.suppress(JournalWriteError):
            self.rotate()

    # -- reclaiming disk --------------------------------------------------------------------------

    def maintain(self) -> tuple[int, int]:
        """Write again what waits for the disk; rotate a full segment; delete dead segments;
        compact mostly dead ones (not under disk pressure: a copy needs room); measure the disk.

        Returns (segments deleted, segments compacted).
        """
        journal = self.journal
        result = (0, 0)
        if journal.failure is None:
            journal.retry_write()
            if journal.should_rotate and journal.write_error is None:
                self._rotate_if_possible()
            result = self._reclaim(force=False)
            if result[0] and journal.write_error is not None:
                journal.retry_write()  # the segments just deleted may have made the room
        observe_journal(self._disk, self.journal, measure=True)
        return result

    def compact(self) -> tuple[int, int]:
        """Rotate, then delete or rewrite every older segment that holds dead records."""
        self.rotate()
        return self._reclaim(force=True)

    def rotate(self) -> None:
        self._write_pending()  # in the segment of the messages they are about
        base = self.journal.rotate()
        self._live.add_segment(base)
        for lsns in self._meta.values():
            self._superseded += lsns  # restated by the snapshots that start the new segment
        self._meta = {}
        if self._snapshot is not None:
            seqs, durables = self._snapshot()
            self._meta_record(RecordType.SNAPSHOT, encode_snapshot(seqs, durables))
        for extension in self._extensions:
            record_type, payload = extension.snapshot()
            self._meta_record(RecordType(record_type), payload)
        self._restated = self.last_lsn
        # On disk now, whatever the sync policy: the upkeep may delete or compact the old
        # segments once the state records the snapshots restate die, and a power cut must not
        # find them gone and the snapshots not yet written.
        self.journal.sync_active()
        self._bury()

    def _bury(self) -> None:
        """The state records the last snapshots restate die, once those are on disk (a write
        the disk refused leaves them waiting: the older records stay live meanwhile)."""
        if self._superseded and self.journal.synced_lsn >= self._restated:
            for lsn in self._superseded:
                self._live.kill(lsn)
            self._superseded = []

    def _reclaim(self, *, force: bool) -> tuple[int, int]:
        self._bury()
        # Under disk pressure only what needs no room goes. Emptying a later segment, or
        # compacting one, writes a copy, which a full disk may refuse: the upkeep tries again
        # next time (`compact dst`, forced, reports it).
        roomy = force or self._disk.level is DiskLevel.OK
        deleted = compacted = 0
        synced = False
        for info in self.journal.segments():
            base = info.base_lsn
            counts = None if info.active else self._live.counts(base)
            if counts is None:
                continue
            live, total = counts
            worth = live == 0 or (force and live < total)
            worth = worth or (live < total * COMPACT_BELOW and info.size >= COMPACT_MIN_BYTES)
            if worth and not synced:
                # What killed these records (a REMOVE, a cursor's commit that released a topic's
                # messages, a snapshot) goes to disk before they go: a power cut must not find
                # them gone and what made them dead not written. (While the disk refuses writes,
                # what waits stays in memory: see docs/persistence.md, A full disk.)
                self.journal.sync_active()
                synced = True
            if live == 0:
                try:
                    self.journal.delete_segment(base)
                except JournalError:
                    if force or self.journal.failure is not None:
                        raise
                    continue
                # Deleting the oldest segment also removes later ones emptied before: forget
                # them all, so this loop does not try to delete them again.
                remaining = {segment.base_lsn for segment in self.journal.segments()}
                for gone in [b for b in self._live.bases if b not in remaining]:
                    self._live.drop_segment(gone)
                deleted += 1
            elif (force and live < total) or (
                roomy and live < total * COMPACT_BELOW and info.size >= COMPACT_MIN_BYTES
            ):
                try:
                    self.journal.rewrite_segment(base, lambda r: self._live.is_live(r.position.lsn))
                except JournalError:
                    if force or self.journal.failure is not None:
                        raise
                    continue
                self._live.compacted(base)
                compacted += 1
        if deleted or compacted:
            log.info("journal: %d segments deleted, %d compacted", deleted, compacted)
        return deleted, compacted

    def disk_bytes(self) -> int:
        return sum(info.size for info in self.journal.segments())

    def close(self) -> None:
        try:
            self._write_pending()
        finally:
            self.journal.close()

    # -- recovery ---------------------------------------------------------------------------------

    def recover(self, restore: Restore) -> Recovery:
        """Replay the journal (persist.replay) into `restore`: each live message in order (an
        ADD's offered undecoded first), then the sequence numbers and durable subscriptions.
        Returns what recovery found, cursors and leases included."""
        self._replay = Replay(
            self.journal,
            self._live,
            extensions=self._extensions,
            run_refs=self._run_refs,
            state_read=self._state_read,
            drop_mark=self._drop_mark,
            append=self._append,
        )
        recovery = self._replay.run(restore.message, restore.encoded)
        restore.finish()
        for name, seq in recovery.seqs.items():
            restore.sequence(name, seq)
        for durable in recovery.durables.values():
            restore.durable(durable.record, durable.acked, durable.delivered)
        for extension in self._extensions:
            extension.recovered()
        return recovery
