"""Recovery of the broker's persistent state from its journal (for persist.journal_store).

Recovery reads the journal twice. The first pass replays only the bookkeeping: which ADDs are
still live, how often each was delivered, the durable subscriptions; the extensions' records
(cursors and leases, stages) go to their extensions (core.model.store.StoreExtension); and it
notes where each ADD is. The second pass reads again only the ADDs still live, in order, and
hands their messages to their destinations, which spill to the swap area as needed, so a
backlog larger than memory can be recovered. A message bound for the swap area is handed over
as its record holds it, never decoded (persist.restoring): a large backlog is mostly that.

A transaction's records count only once all of them have been read: a transaction cut by a
crash changes nothing, and recovery writes a TX_CUT naming it, so that records appended later
are not taken for its missing ones. A record that says what no journal this broker wrote can
say (a reference forward, a type that cannot stand where it is) stops recovery with
CorruptJournal: that is damage, never a torn write, and guessing would lose messages.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final, NoReturn

from sluiceway.core.model.store import StoreExtension
from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import EncodedMessage, peek_message
from sluiceway.naming import DestinationName
from sluiceway.persist.format import (
    RESTATED_BY,
    RecordType,
    decode_durable,
    decode_lsn,
    decode_lsns,
    decode_mark,
    decode_position,
    decode_snapshot,
    decode_sub,
    decode_sub_mark,
    decode_tx,
    encode_lsn,
)
from sluiceway.persist.journal import Journal
from sluiceway.persist.liveness import Liveness
from sluiceway.persist.segments import CorruptJournal, Record

# Read for every record recovered: a Final name is a C static when compiled (setup.py says why).
_ADD: Final = int(RecordType.ADD)
_TX: Final = int(RecordType.TX)
_TX_CUT: Final = int(RecordType.TX_CUT)


@dataclass
class RecoveredDurable:
    record: DurableRecord
    acked: set[int] = field(default_factory=set)  # seqs acknowledged (still retained)
    delivered: dict[int, int] = field(default_factory=dict)  # seq -> deliveries


class _Counts:
    """Messages recovered per destination, kept by path: a string keeps its hash, where
    DestinationName's __hash__ is Python code run at every call."""

    __slots__ = ("_counts", "_names")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._names: dict[str, DestinationName] = {}

    def add(self, name: DestinationName) -> None:
        path = name.path
        if path in self._counts:
            self._counts[path] += 1
        else:
            self._counts[path], self._names[path] = 1, name

    def by_name(self) -> dict[DestinationName, int]:
        return {self._names[path]: count for path, count in self._counts.items()}


@dataclass
class Recovery:
    """What the journal held: sequence high waters, durable subscriptions, counts."""

    seqs: dict[DestinationName, int] = field(default_factory=dict)
    durables: dict[int, RecoveredDurable] = field(default_factory=dict)
    messages: dict[DestinationName, int] = field(default_factory=dict)
    discarded_tx: int = 0
    # References to messages of deleted segments: REMOVEs, delivery and acknowledgement marks
    # that outlived the segment of the message they name. That message is gone, so are they.
    outlived: int = 0


class Replay:
    """One recovery of a journal. The store it rebuilds lends what the replay keeps up to
    date: the liveness of every record, the extensions' record types, the count of live
    messages per DELIVERED_RUN, and calls for a state record read, a mark dropped and a record
    appended."""

    def __init__(
        self,
        journal: Journal,
        live: Liveness,
        *,
        extensions: list[StoreExtension],
        run_refs: dict[int, int],
        state_read: Callable[[int, RecordType], None],
        drop_mark: Callable[[int], None],
        append: Callable[[RecordType, bytes], int],
    ) -> None:
        self._journal = journal
        self._live = live
        self._extensions = extensions
        self._extension_of = {t: e for e in extensions for t in e.record_types}
        self._run_refs = run_refs
        self._state_read = state_read
        self._drop_mark = drop_mark
        self._append = append
        self.recovery = Recovery()
        self._marks: dict[int, list[int]] = {}  # ADD LSN -> its mark LSNs
        self._deliveries: dict[int, int] = {}  # ADD LSN -> DELIVERED count
        self._open_tx: int | None = None  # LSN of a transaction whose records are being read
        self._tx_size = 0
        self._tx_records: list[Record] = []
        # Per durable subscription id, whatever its definition: a compacted segment may hold
        # its acknowledgements while its definition survives only in a later snapshot.
        self._acked: dict[int, set[int]] = {}
        self._delivered: dict[int, dict[int, int]] = {}
        # What the second pass reads again, by segment: the LSNs and offsets of the ADDs and of
        # the extensions' restore_types. It reads those still live, and nothing else.
        self._notes: dict[int, tuple[array[int], array[int]]] = {}

    def run(
        self,
        deliver: Callable[[Message], None],
        take_encoded: Callable[[EncodedMessage], bool] | None = None,
    ) -> Recovery:
        """Replay the journal: `deliver` gets each live message, in order; returns the rest.
        `take_encoded`, when given, is offered each live ADD's message first, undecoded; one it
        takes (True) is not decoded, nor given to `deliver`."""
        self._first_pass(self._journal.recover())
        self._first_pass_done()
        self._second_pass(deliver, take_encoded)
        return self.recovery

    def forget(self, lsn: int) -> None:
        """First pass: the record `lsn` read earlier is dead, and so are its marks."""
        self._live.kill(lsn)
        for mark in self._marks.pop(lsn, []):
            self._drop_mark(mark)
        self._deliveries.pop(lsn, None)

    def message(self, lsn: int) -> tuple[list[int] | None, int]:
        """Second pass: the marks and delivery count replayed for the record `lsn` that holds
        a message."""
        return self._marks.get(lsn), self._deliveries.get(lsn, 0)

    def _first_pass_done(self) -> None:
        recovery = self.recovery
        for sub_id, durable in recovery.durables.items():
            durable.acked = self._acked.get(sub_id, set())
            durable.delivered = self._delivered.get(sub_id, {})
        for segment in self._journal.segments():
            self._live.add_segment(segment.base_lsn)  # the active one may hold no record yet
        if self._open_tx is not None:
            # The journal ends inside a transaction: it never committed. Say so in the journal,
            # so that records appended from now on are not taken for its missing ones.
            recovery.discarded_tx += 1
            cut_lsn = self._append(RecordType.TX_CUT, encode_lsn(self._open_tx))
            self._live.removal(cut_lsn, self._open_tx)

    def _second_pass(
        self,
        deliver: Callable[[Message], None],
        take_encoded: Callable[[EncodedMessage], bool] | None,
    ) -> None:
        """Hand the live messages back in journal order. Only the records the first pass noted
        for it are read again (reread), and of those only the ones still live."""
        live, counts = self._live, _Counts()

        def restored(message: Message) -> None:
            counts.add(message.destination)
            deliver(message)

        for base in list(self._notes):
            for record in self._reread(base):
                lsn = record.position.lsn
                for extension in self._extensions:
                    extension.restore(record, restored)
                if record.type != _ADD or not live.is_live(lsn):
                    continue
                message = peek_message(record.payload)
                message.location, message.marks = lsn, self._marks.get(lsn)
                message.delivery_count = self._deliveries.get(lsn, 0)
                if take_encoded is not None and take_encoded(message):
                    counts.add(message.destination)
                else:
                    restored(message.decode())
        for extension in self._extensions:
            extension.restore(None, restored)
        self.recovery.messages = counts.by_name()

    def _reread(self, base: int) -> Iterator[Record]:
        """The records noted in segment `base` that are live now: nothing comes back to life,
        and an ADD is checked again when handled. Their notes go once they are read."""
        lsns, offsets = self._notes.pop(base)
        keep = self._live.live_among(base, lsns)
        return self._journal.read_many(base, [lsns[i] for i in keep], [offsets[i] for i in keep])

    def _first_pass(self, records: Iterable[Record]) -> None:
        """Rebuild liveness and bookkeeping, and note what the second pass reads. A
        transaction's records are replayed only once all of them have been read: a transaction
        cut by a crash must change nothing."""
        live = self._live
        restore_types = frozenset(t for e in self._extensions for t in e.restore_types)
        segment = 0
        lsns: array[int] = array("Q")
        offsets: array[int] = array("Q")
        for record in records:
            position = record.position
            lsn, kind = position.lsn, record.type
            if position.segment != segment:
                if position.segment < segment:
                    self._impossible(record, f"it follows records of segment {segment}")
                segment = position.segment
                live.add_segment(segment)
                lsns, offsets = self._notes[segment] = (array("Q"), array("Q"))
            if kind == _ADD or kind in restore_types:
                lsns.append(lsn)
                offsets.append(position.offset)
            if self._open_tx is not None:
                self._tx_member(record)
            elif kind == _ADD:
                live.born(lsn)  # most records: nothing more to it
            elif kind == _TX:
                live.born(lsn, live=False)  # only recovery reads it
                self._tx_size = decode_tx(record.payload)
                self._open_tx = lsn if self._tx_size else None
            elif kind == _TX_CUT:
                self._refers(record, decode_lsn(record.payload))
                live.born(lsn, live=False)  # its transaction was compacted away
            elif kind in self._extension_of:  # (never inside a transaction)
                self._extension_of[kind].replay(record)
            else:
                self._replay(record)
        if self._open_tx is not None:
            for member in self._tx_records:
                live.born(member.position.lsn, live=False)

    def _tx_member(self, record: Record) -> None:
        """A record after a TX: one of its records, or the TX_CUT that voids it."""
        if record.type == RecordType.TX_CUT and decode_lsn(record.payload) == self._open_tx:
            for member in self._tx_records:
                self._live.born(member.position.lsn, live=False)
            self._live.born(record.position.lsn, live=False)
            self._open_tx, self._tx_records = None, []
            return
        self._tx_records.append(record)
        if len(self._tx_records) == self._tx_size:
            for member in self._tx_records:
                self._replay(member)
            self._open_tx, self._tx_records = None, []

    def _impossible(self, record: Record, why: str) -> NoReturn:
        """Stop recovery: the record says something no journal this broker wrote can say."""
        position = record.position
        raise CorruptJournal(
            self._journal.segment_path(position.segment),
            position.offset,
            f"record {position.lsn} (type {record.type}) cannot be right: {why}",
            skippable=False,
        )

    def _refers(self, record: Record, lsn: int) -> bool:
        """Check a reference from `record` to the record `lsn`, which must come before it;
        False when `lsn` was in a segment deleted since (counted: it is dead)."""
        if not 0 < lsn < record.position.lsn:
            self._impossible(record, f"it names record {lsn}, which does not come before it")
        if self._live.gone(lsn):
            self.recovery.outlived += 1
            return False
        return True

    def _replay(self, record: Record) -> None:
        lsn = record.position.lsn
        try:
            kind = RecordType(record.type)
        except ValueError:
            self._impossible(record, "no version of this broker writes that type")
        if kind is RecordType.ADD:
            self._live.born(lsn)
        elif kind is RecordType.REMOVE or kind is RecordType.REMOVE_RUN:
            self._replay_removal(record, kind)
        elif kind is RecordType.DELIVERED_RUN:
            self._replay_run(record, decode_lsns(record.payload))
        elif kind is RecordType.DELIVERED:  # one delivery a record: journals of earlier versions
            self._replay_run(record, (decode_mark(record.payload)[2],))
        elif kind in (RecordType.DURABLE_ACK, RecordType.DURABLE_DELIVERED):
            sub_id, seq, add = decode_sub_mark(record.payload)
            if self._replay_mark(record, add):
                if kind is RecordType.DURABLE_ACK:
                    self._acked.setdefault(sub_id, set()).add(seq)
                else:
                    counts = self._delivered.setdefault(sub_id, {})
                    counts[seq] = counts.get(seq, 0) + 1
        else:
            self._replay_meta(record, kind)

    def _replay_removal(self, record: Record, kind: RecordType) -> None:
        lsn = record.position.lsn
        if kind is RecordType.REMOVE:
            adds: tuple[int, ...] = (decode_mark(record.payload)[2],)
            self._refers(record, adds[0])
            self._live.removal(lsn, adds[0])
        else:
            adds = decode_lsns(record.payload)
            base = record.position.segment
            for add in adds:
                if not base <= add < lsn:
                    self._impossible(record, f"it names record {add}, outside its own segment")
            self._live.born(lsn, live=False)  # written in the segment of all its ADDs
            for add in adds:
                self._live.kill(add)
        marks, deliveries = self._marks, self._deliveries
        for add in adds:
            dropped = marks.pop(add, None)
            if dropped is not None:
                for mark in dropped:
                    self._drop_mark(mark)
            deliveries.pop(add, None)

    def _replay_run(self, record: Record, adds: tuple[int, ...]) -> None:
        """A DELIVERED_RUN: a delivery of each message still live, and live while one is."""
        marks, deliveries, liveness = self._marks, self._deliveries, self._live
        lsn = record.position.lsn
        live = 0
        for add in adds:
            if self._refers(record, add) and liveness.is_live(add):
                live += 1
                held = marks.get(add)
                if held is None:
                    marks[add] = [lsn]
                else:
                    held.append(lsn)
                deliveries[add] = deliveries.get(add, 0) + 1
        self._live.born(lsn, live=live > 0)
        if live:
            self._run_refs[lsn] = live

    def mark(self, record: Record, add: int, *, delivery: bool) -> bool:
        """First pass: an extension's mark on the message added at `add` (_replay_mark); with
        `delivery`, one delivery of it."""
        if not self._replay_mark(record, add):
            return False
        if delivery:
            self._deliveries[add] = self._deliveries.get(add, 0) + 1
        return True

    def _replay_mark(self, record: Record, add: int) -> bool:
        """A record about the message added at `add`: live (True) while that message is."""
        lsn = record.position.lsn
        if self._refers(record, add) and self._live.is_live(add):
            self._live.born(lsn)
            self._marks.setdefault(add, []).append(lsn)
            return True
        self._live.born(lsn, live=False)
        return False

    def _replay_meta(self, record: Record, kind: RecordType) -> None:
        if kind not in RESTATED_BY:
            self._impossible(record, "a record of that type cannot stand here")
        recovery = self.recovery
        durables = recovery.durables
        lsn = record.position.lsn
        if kind is RecordType.SNAPSHOT:
            seqs, records = decode_snapshot(record.payload)
            recovery.seqs = dict(seqs)
            keep = {r.sub_id for r in records}
            for sub_id in list(durables):
                if sub_id not in keep:
                    del durables[sub_id]
            for durable in records:
                durables.setdefault(durable.sub_id, RecoveredDurable(durable))
        elif kind is RecordType.SEQ:
            destination, seq = decode_position(record.payload)
            recovery.seqs[destination] = max(recovery.seqs.get(destination, 0), seq)
        elif kind is RecordType.DURABLE:
            durable = decode_durable(record.payload)
            durables[durable.sub_id] = RecoveredDurable(durable)
        elif kind is RecordType.DURABLE_END:
            durables.pop(decode_sub(record.payload), None)
        self._state_read(lsn, kind)
