"""Topic cursors and queue leases kept in a store: the records written, and their recovery.

The records and their payloads are in persist.lease_payloads (the table of every type is
persist.format's). Their lifetimes: CURSOR, CURSOR_END, LEASE, LEASE_END and LEASE_SNAPSHOT
describe state, live until the store next starts afresh and the LEASE_SNAPSHOT restates it; a
LEASE_MARK is a mark on its message, live while the message is, and it counts as one delivery
of it.

Recovery, first pass (`replay`): the state records rebuild a RecoveredLeases, and each mark
notes the lease that last took its message. After the pass, holders of messages consumed since
are dropped. Once the broker's messages and durable subscriptions are back (`recovered`), the
cursors go back to their topics, then the leases to their queues (core.features.cursors,
core.features.leases).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sluiceway.core.features.cursors import Cursors
from sluiceway.core.features.leases import Leases
from sluiceway.core.model.store import ExtensionLog, StoredRecord
from sluiceway.core.values.leasing import (
    CursorRecord,
    LeaseRecord,
    LeaseState,
    RecoveredLeases,
)
from sluiceway.core.values.message import Message
from sluiceway.persist.format import RecordType
from sluiceway.persist.lease_payloads import (
    STATE_RECORDS,
    decode_lease_mark,
    encode_cursor,
    encode_cursor_end,
    encode_lease,
    encode_lease_end,
    encode_lease_mark,
    encode_lease_snapshot,
    replay_lease_record,
)

RECORD_TYPES: Final = frozenset({*STATE_RECORDS, RecordType.LEASE_MARK})


class LeaseExtension:
    """Keeps the broker's cursors and leases in a store (their recorder, and a StoreExtension)."""

    record_types: frozenset[int] = RECORD_TYPES
    restore_types: frozenset[int] = frozenset()  # nothing is read again: state and marks only

    def __init__(
        self, log: ExtensionLog, cursors: Cursors, leases: Leases, *, cursor_max_groups: int
    ) -> None:
        self._log = log
        self._cursors = cursors
        self._leases = leases
        self._cursor_max_groups = cursor_max_groups  # imq.cursor.max_groups
        self._recovered = RecoveredLeases()
        self._replayed = False  # the first recovery pass is over
        cursors.recorder = self
        leases.recorder = self

    # -- writing (LeaseRecorder) ---------------------------------------------------------------

    def cursor_saved(self, record: CursorRecord) -> None:
        self._log.append_state(RecordType.CURSOR, encode_cursor(record))

    def cursor_deleted(self, topic: str, group: str) -> None:
        self._log.append_state(RecordType.CURSOR_END, encode_cursor_end(topic, group))

    def lease_opened(self, record: LeaseRecord) -> None:
        self._log.append_state(RecordType.LEASE, encode_lease(record))

    def lease_marked(self, lease_id: int, message: Message) -> None:
        if message.location:
            payload = encode_lease_mark(lease_id, message.seq, message.location)
            self._log.append_mark(RecordType.LEASE_MARK, payload, message)

    def lease_ended(self, lease_id: int, state: LeaseState) -> None:
        self._log.append_state(RecordType.LEASE_END, encode_lease_end(lease_id, state))

    def snapshot(self) -> tuple[int, bytes]:
        """The LEASE_SNAPSHOT a new segment starts with, after the broker's SNAPSHOT."""
        snapshot = self._leases.snapshot(self._cursors.records())
        return RecordType.LEASE_SNAPSHOT, encode_lease_snapshot(snapshot)

    # -- recovery ------------------------------------------------------------------------------

    def replay(self, record: StoredRecord) -> None:
        """First pass: a state record, or a LEASE_MARK (a lease took the message: a delivery)."""
        if record.type == RecordType.LEASE_MARK:
            lease_id, _, add = decode_lease_mark(record.payload)
            if self._log.replayed_mark(record, add, delivery=True):
                self._recovered.marked(add, lease_id)
            return
        kind = RecordType(record.type)
        replay_lease_record(self._recovered, kind, record.payload)
        self._log.replayed_state(record.position.lsn, kind)

    def restore(self, record: StoredRecord | None, deliver: Callable[[Message], None]) -> None:
        """Second pass: before its first record, forget the holders of messages consumed since
        their mark (the first pass is over, so liveness is final)."""
        if not self._replayed:
            self._replayed = True
            self._recovered.keep_live(self._log.is_live)

    def recovered(self) -> None:
        recovered, self._recovered = self._recovered, RecoveredLeases()
        self._cursors.restore(recovered.cursors, self._cursor_max_groups)
        self._leases.restore(recovered)
