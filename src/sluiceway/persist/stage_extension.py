"""Stages in the journal: the records written, how long each lives, and recovery.

The records are in persist.format's table, their payloads in persist.stage_payloads. Their
lifetimes:

- STAGE_OPEN, STAGE_COMMIT, STAGE_DISCARD and STAGE_SNAPSHOT describe state: they live until the
  journal's next rotation, which starts the new segment with a STAGE_SNAPSHOT restating it.
- A STAGE_ADD lives while its stage is open. When a COMMIT publishes it into a destination that
  keeps it (a persistent message in a queue, or retained by a topic), the STAGE_ADD becomes that
  message's ADD: the message keeps its LSN as its location, and its DELIVERED marks and its
  REMOVE name that LSN, as for any ADD. A published message that is not kept dies at once
  (a persistent one with a REMOVE, so that recovery does not bring it back; a non-persistent one
  silently, since recovery never brings those back).

A COMMIT is decided by one record: its STAGE_COMMIT, written before anything is published, says
which stages are published and which sequence number each one's messages start at per
destination. After a crash, recovery publishes exactly those stages again, whatever was cut
after the record, or none of them if the record itself was cut.

Recovery, first pass (`replay`, in journal order): a STAGE_ADD counts as live for now; a
STAGE_COMMIT or STAGE_DISCARD kills the records of the stages it discards; a STAGE_SNAPSHOT is
the whole state at its point, so records of stages it does not name were decided in records
since compacted away, and die; so do those of stages neither open nor published at the end of
the pass (in a compacted segment, a STAGE_ADD comes before the snapshot that restates its
stage). REMOVEs and marks of published messages are replayed by the store as for any ADD.
Second pass (`restore`, in journal order, over the live ADDs and STAGE_ADDs, the only records it
reads): a live STAGE_ADD of an open stage goes back into its stage; the live messages of each
published stage are read back by position and handed to their destinations just before the
first of those records that follows their COMMIT, so every destination gets its messages back
in sequence order.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from sluiceway.core.features.stages import Stage, StageArea
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.store import ExtensionLog, StoredRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.staging import (
    CommitRecord,
    OpenStage,
    PublishedStage,
    StagedHead,
    StageSnapshot,
)
from sluiceway.persist.format import RecordType
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

log = logging.getLogger(__name__)

RECORD_TYPES: Final = frozenset(
    {
        RecordType.STAGE_OPEN,
        RecordType.STAGE_ADD,
        RecordType.STAGE_COMMIT,
        RecordType.STAGE_DISCARD,
        RecordType.STAGE_SNAPSHOT,
    }
)


@dataclass
class _Records:
    """The STAGE_ADDs of one stage that are live so far in the first pass, in journal order."""

    lsns: array[int] = field(default_factory=lambda: array("Q"))
    offsets: array[int] = field(default_factory=lambda: array("Q"))  # in their segment files


@dataclass
class _Replay:
    """What recovery learns about stages, first pass then second."""

    next_id: int = 1
    sinks: dict[str, int] = field(default_factory=dict)  # highest committed batch per sink
    open: dict[int, OpenStage] = field(default_factory=dict)
    published: dict[int, PublishedStage] = field(default_factory=dict)  # in commit order
    records: dict[int, _Records] = field(default_factory=dict)
    # Second pass: published stages grouped by their COMMIT, oldest first, and how far
    # publishing has got.
    replayed: bool = False  # the first pass is over
    commits: list[list[PublishedStage]] = field(default_factory=list)
    next_commit: int = 0
    restored: int = 0  # messages put back in open stages
    republished: int = 0  # messages of published stages handed back to destinations


class StageExtension:
    """Keeps a StageArea in a store (the area's recorder, and a StoreExtension)."""

    record_types: frozenset[int] = RECORD_TYPES
    restore_types: frozenset[int] = frozenset({RecordType.STAGE_ADD})  # an open stage's messages

    def __init__(self, store: ExtensionLog, area: StageArea) -> None:
        self._store = store
        self._area = area
        # Published stages whose records may still be on disk, in commit order: each snapshot
        # restates them until their last STAGE_ADD is in a deleted segment.
        self._published: list[PublishedStage] = []
        self._replay: _Replay | None = None
        area.recorder = self

    # -- writing (StageRecorder) ---------------------------------------------------------------

    def opened(self, stage: Stage) -> None:
        self._store.append_state(RecordType.STAGE_OPEN, encode_open(stage.open_record))

    def added(self, stage: Stage, message: Message, index: int) -> None:
        head = StagedHead(stage.stage_id, index, stage.expires_ms)
        lsn = self._store.append_live(RecordType.STAGE_ADD, encode_add(head, message))
        message.location = lsn
        stage.lsns.append(lsn)
        stage.last_lsn = lsn

    def committed(
        self, sink: str, batch: int, published: Sequence[PublishedStage], discarded: Sequence[Stage]
    ) -> int:
        record = CommitRecord(sink, batch, tuple(published), tuple(s.stage_id for s in discarded))
        lsn = self._store.append_state(RecordType.STAGE_COMMIT, encode_commit(record))
        self._kill(discarded)
        return lsn

    def publish(self, message: Message, destination: Destination) -> bool:
        store = self._store
        adopted = store.adoptions
        destination.publish(message)
        if store.adoptions != adopted:
            return True  # the destination keeps it: its STAGE_ADD is now its ADD
        if message.location:
            if message.persistent:
                store.removed(message)
            else:
                store.kill(message.location)
                message.location = 0
        return False

    def published(self, stage: PublishedStage) -> None:
        self._published.append(stage)

    def discarded(self, stages: Sequence[Stage]) -> None:
        ids = tuple(stage.stage_id for stage in stages)
        self._store.append_state(RecordType.STAGE_DISCARD, encode_discard(ids))
        self._kill(stages)

    def _kill(self, stages: Sequence[Stage]) -> None:
        for stage in stages:
            for lsn in stage.lsns:
                self._store.kill(lsn)

    def snapshot(self) -> tuple[int, bytes]:
        """The STAGE_SNAPSHOT a new segment starts with."""
        oldest = self._store.oldest_lsn
        self._published = [stage for stage in self._published if stage.last_lsn >= oldest]
        area = self._area
        snapshot = StageSnapshot(
            next_id=area.next_id,
            sinks=tuple(area.committed.items()),
            open=tuple(stage.open_record for stage in area),
            published=tuple(self._published),
        )
        return RecordType.STAGE_SNAPSHOT, encode_snapshot(snapshot)

    # -- recovery, first pass ------------------------------------------------------------------

    def replay(self, record: StoredRecord) -> None:
        """One stage record, in journal order: bookkeeping only (messages are not decoded)."""
        if self._replay is None:
            self._replay = _Replay()
        state, store = self._replay, self._store
        lsn = record.position.lsn
        if record.type == RecordType.STAGE_ADD:
            # Live for now even if its stage is not known yet: in a compacted segment it comes
            # before the snapshot that restates its stage. The end of the pass decides.
            stage_id = decode_add_head(record.payload).stage_id
            store.replayed(lsn, live=True)
            records = state.records.setdefault(stage_id, _Records())
            records.lsns.append(lsn)
            records.offsets.append(record.position.offset)
            state.next_id = max(state.next_id, stage_id + 1)
            return
        store.replayed_state(lsn, RecordType(record.type))
        if record.type == RecordType.STAGE_OPEN:
            stage = decode_open(record.payload)
            state.open[stage.stage_id] = stage
            state.next_id = max(state.next_id, stage.stage_id + 1)
        elif record.type == RecordType.STAGE_COMMIT:
            self._replay_commit(state, decode_commit(record.payload), lsn)
        elif record.type == RecordType.STAGE_DISCARD:
            self._forget(state, decode_discard(record.payload))
        elif record.type == RecordType.STAGE_SNAPSHOT:
            self._replay_snapshot(state, decode_snapshot(record.payload))

    def _replay_commit(self, state: _Replay, commit: CommitRecord, lsn: int) -> None:
        state.sinks[commit.sink] = max(state.sinks.get(commit.sink, -1), commit.batch)
        for stage in commit.published:
            state.open.pop(stage.stage_id, None)
            state.published[stage.stage_id] = replace(stage, commit_lsn=lsn)
        self._forget(state, commit.discarded)

    def _replay_snapshot(self, state: _Replay, snapshot: StageSnapshot) -> None:
        state.next_id = max(state.next_id, snapshot.next_id)
        for sink, batch in snapshot.sinks:
            state.sinks[sink] = max(state.sinks.get(sink, -1), batch)
        state.open = {stage.stage_id: stage for stage in snapshot.open}
        state.published = {stage.stage_id: stage for stage in snapshot.published}
        self._forget(
            state, [i for i in state.records if i not in state.open and i not in state.published]
        )

    def _forget(self, state: _Replay, ids: Sequence[int]) -> None:
        """The stages `ids` are discarded: their records die."""
        for stage_id in ids:
            state.open.pop(stage_id, None)
            records = state.records.pop(stage_id, None)
            if records is not None:
                for lsn in records.lsns:
                    self._store.forget_replayed(lsn)

    def _replayed(self, state: _Replay) -> None:
        """The end of the first pass: a stage neither open nor published was decided by records
        compacted away since (the snapshots after them do not name it), so its records die."""
        self._forget(
            state, [i for i in state.records if i not in state.open and i not in state.published]
        )
        state.commits = _by_commit(state.published.values())

    # -- recovery, second pass -----------------------------------------------------------------

    def restore(self, record: StoredRecord | None, deliver: Callable[[Message], None]) -> None:
        """Called with each record the second pass reads (live ADDs and STAGE_ADDs) before it is
        handled, then with None. A published stage goes back just before the first of them
        after its COMMIT, so every destination gets its messages back in sequence order."""
        state = self._replay
        if state is None:
            state = self._replay = _Replay()
            state.replayed = True  # nothing of stages in the journal
        if not state.replayed:
            state.replayed = True
            self._replayed(state)
        lsn = record.position.lsn if record is not None else None
        while state.next_commit < len(state.commits):
            stages = state.commits[state.next_commit]
            if lsn is not None and stages[0].commit_lsn >= lsn:
                break
            state.next_commit += 1
            for stage in stages:
                self._republish(state, stage, deliver)
        if record is None:
            self._finish(state)
        elif record.type == RecordType.STAGE_ADD and self._store.is_live(record.position.lsn):
            opened = state.open.get(decode_add_head(record.payload).stage_id)
            if opened is not None:  # (a published stage's messages go back at its COMMIT)
                head, message = decode_add(record.payload)
                message.location = record.position.lsn
                self._area.restore(opened, head, message)
                state.restored += 1

    def recovered(self) -> None:
        pass  # the area took its stages back at the end of the second pass

    def _republish(
        self, state: _Replay, stage: PublishedStage, deliver: Callable[[Message], None]
    ) -> None:
        """Hand a published stage's live messages back to their destinations, in send order."""
        records = state.records.get(stage.stage_id)
        if records is None:
            return
        store = self._store
        for lsn, offset in zip(records.lsns, records.offsets, strict=True):
            if not store.is_live(lsn):
                continue  # consumed (or not kept) since
            head, message = decode_add(store.read(lsn, offset).payload)
            if not message.persistent:
                store.kill(lsn)  # published, and non-persistent: it does not outlive a restart
                continue
            first = stage.first_seq(message.destination)
            assert first is not None
            message.seq = first + head.index
            message.location = lsn
            message.marks, message.delivery_count = store.replayed_message(lsn)
            deliver(message)
            state.republished += 1

    def _finish(self, state: _Replay) -> None:
        """The end of recovery: the area takes over what the journal held."""
        self._area.restore_sinks(state.sinks, state.next_id)
        published = []
        for stage in state.published.values():
            records = state.records.get(stage.stage_id)
            last = max(stage.last_lsn, records.lsns[-1] if records and records.lsns else 0)
            published.append(replace(stage, last_lsn=last))
        self._published = published
        if state.restored or state.republished or state.open:
            log.info(
                "journal: recovered %d open stages (%d staged messages) and %d messages of "
                "committed stages",
                len(self._area),
                state.restored,
                state.republished,
            )
        self._replay = None


def _by_commit(stages: Iterable[PublishedStage]) -> list[list[PublishedStage]]:
    """Published stages grouped by the COMMIT that published them, oldest first (each group
    in its task order)."""
    groups: dict[int, list[PublishedStage]] = {}
    for stage in stages:
        groups.setdefault(stage.commit_lsn, []).append(stage)
    return [groups[lsn] for lsn in sorted(groups)]
