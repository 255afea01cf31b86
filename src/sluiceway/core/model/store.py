"""The seam between the broker's state and where persistent state is kept: the store port.

Destinations and subscriptions tell the store what must survive a restart: persistent messages
added and removed, deliveries (so a message delivered before a crash comes back marked
redelivered), durable subscriptions and their acknowledgements, and sequence numbers spoken
for. Features that keep state of their own beside the messages (topic cursors and queue leases,
stages) plug in as StoreExtensions, writing their records through the store's ExtensionLog. At
start-up the store hands back what it holds (`recover`, into a `Restore`, and each extension's
records to it); from then on it may ask the broker (`set_snapshot` of the journal store) and
the extensions for the state they restate when it starts afresh (a journal's new segment).

A store is built at the edge (app.storage) and given to the Broker, which never looks at what
kind it is: persist.journal_store.JournalStore keeps everything in the journal; `MemoryStore`
keeps nothing that outlives the process, for a broker that needs no durability. Another store
(a database) implements MessageStore and ExtensionLog, calls Restore and the extensions back,
and nothing in core changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_codec import EncodedMessage
from sluiceway.errors import SluicewayError
from sluiceway.naming import DestinationName


class StoreError(SluicewayError):
    """The store cannot do what was asked (its medium failed, or holds what it cannot read);
    the message says why and what to do."""


class StoreWriteError(StoreError):
    """A write the store's medium refused (a full disk): its records wait, and what was asked
    needs them kept first. Free space; the store's upkeep writes them again."""


class Restore(Protocol):
    """Where a store's recovery hands back what it held, at start-up, before any client.

    The store calls `message` (or `encoded`) for each persistent message in the order it was
    added, then `finish` once, then `sequence` and `durable` for the state it held; last, each
    extension's `recovered` (StoreExtension).
    """

    def message(self, message: Message) -> None:
        """A persistent message, back into its destination."""
        ...

    def encoded(self, message: EncodedMessage) -> bool:
        """A persistent message still in its encoding (core.values.message_codec): taken as
        those bytes (True: a queue spilling it to the swap area), or left to be decoded and
        given to `message` (False). A store that holds no such bytes never calls it."""
        ...

    def sequence(self, destination: DestinationName, seq: int) -> None:
        """Sequence numbers of `destination` up to `seq` were spoken for."""
        ...

    def durable(self, record: DurableRecord, acked: set[int], delivered: dict[int, int]) -> None:
        """A durable subscription, the sequence numbers it acknowledged that its topic still
        holds, and how often each of its unacknowledged messages was delivered."""
        ...

    def finish(self) -> None:
        """Every message is back: file what is still being gathered."""
        ...


# The broker's own state, restated when a store starts afresh: the sequence numbers spoken for
# per destination, and the durable subscriptions (Broker.snapshot).
BrokerSnapshot = tuple[list[tuple[DestinationName, int]], list[DurableRecord]]


class StoredPosition(Protocol):
    """Where a store keeps one record."""

    @property
    def lsn(self) -> int:
        """The record's number: records are numbered in the order they were written."""
        ...

    @property
    def offset(self) -> int:
        """Where to find it again, with its number (`ExtensionLog.read`); the store's own."""
        ...


class StoredRecord(Protocol):
    """One record an extension wrote, as its store hands it back at recovery."""

    @property
    def position(self) -> StoredPosition: ...

    @property
    def type(self) -> int:
        """Its kind: one of its extension's `record_types`."""
        ...

    @property
    def payload(self) -> bytes: ...


class ExtensionLog(Protocol):
    """What a store offers the extensions that keep their records in it (StoreExtension).

    A record lives (and keeps the store from reclaiming its place) in one of three ways: a state
    record until the store next starts afresh and the extensions' snapshots restate it
    (`append_state`); a mark while the message it is about is in the broker (`append_mark`); or
    until it is killed (`append_live`). Each returns the record's number.
    """

    @property
    def oldest_lsn(self) -> int:
        """No record numbered below this is held any more."""
        ...

    @property
    def adoptions(self) -> int:
        """Grows each time `added` takes a message the store holds already (its record then
        stands as the message's own): compared around a publish, tells whether it was kept."""
        ...

    def append_state(self, record_type: int, payload: bytes) -> int: ...

    def append_mark(self, record_type: int, payload: bytes, message: Message) -> int: ...

    def append_live(self, record_type: int, payload: bytes) -> int: ...

    def kill(self, lsn: int) -> None:
        """The record `lsn` (one of `append_live`'s) is no longer needed."""
        ...

    def is_live(self, lsn: int) -> bool: ...

    def read(self, lsn: int, offset: int) -> StoredRecord:
        """The record `lsn` again, found where its position said."""
        ...

    def removed(self, message: Message) -> None:
        """As MessageStore.removed: a message an extension's record holds left the broker."""
        ...

    # -- recovery, while the store reads its records back -------------------------------------

    def replayed(self, lsn: int, *, live: bool) -> None:
        """First pass: a record read that lives until killed (or is dead already)."""
        ...

    def replayed_state(self, lsn: int, record_type: int) -> None:
        """First pass: a state record read."""
        ...

    def replayed_mark(self, record: StoredRecord, add: int, *, delivery: bool) -> bool:
        """First pass: a mark on the message recorded at `add`; False (and the mark dead)
        when that message is gone. With `delivery`, it counts as one delivery of it."""
        ...

    def forget_replayed(self, lsn: int) -> None:
        """First pass: the record `lsn`, read earlier, is dead, and so are its marks."""
        ...

    def replayed_message(self, lsn: int) -> tuple[list[int] | None, int]:
        """Second pass: the marks and delivery count found for the message recorded at `lsn`."""
        ...


class StoreExtension(Protocol):
    """A feature whose state a store keeps beside the messages, under record types of its own:
    topic cursors and queue leases, stages (persist.lease_extension, persist.stage_extension).
    The extension writes its records through the store's ExtensionLog as its feature changes;
    the store calls it back to restate its state and, at start-up, to read its records back, in
    the order written.
    """

    record_types: frozenset[int]  # the record types it writes; the store hands them to it
    restore_types: frozenset[int]  # those of them the second recovery pass reads again

    def snapshot(self) -> tuple[int, bytes]:
        """The one record that restates all of its state, which the store writes when it starts
        afresh (a journal's new segment): its type and payload."""
        ...

    def replay(self, record: StoredRecord) -> None:
        """First recovery pass: one of its records, in the order written (bookkeeping only)."""
        ...

    def restore(self, record: StoredRecord | None, deliver: Callable[[Message], None]) -> None:
        """Second pass: called with each record the pass reads (the live messages' records,
        and the live records of every extension's restore_types), in the order written, before
        the record is handled, then with None at the end; `deliver` hands messages back to
        their destinations (Restore.message)."""
        ...

    def recovered(self) -> None:
        """Recovery is over, the broker's messages and durable subscriptions are back: hand
        what was read to the feature."""
        ...


class MessageStore(Protocol):
    """Where persistent state is recorded."""

    def added(self, message: Message) -> None:
        """A persistent message is now held by a destination."""
        ...

    def removed(self, message: Message) -> None:
        """A persistent message left the broker (consumed, expired, no longer retained)."""
        ...

    def delivered(self, message: Message) -> None:
        """A persistent queue message was written to a consumer."""
        ...

    def durable_created(self, record: DurableRecord) -> None: ...

    def durable_ended(self, sub_id: int) -> None: ...

    def durable_delivered(self, sub_id: int, message: Message) -> None: ...

    def durable_acked(self, sub_id: int, message: Message) -> None: ...

    def seq_reserved(self, destination: DestinationName, seq: int) -> None:
        """Sequence numbers of `destination` up to `seq` may be handed out."""
        ...

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """Records made inside are kept all together or not at all (a dead copy and the removal
        of its original, evictions and the message they make room for)."""
        ...

    def write_transaction(self, adds: Sequence[Message], removes: Sequence[Message]) -> None:
        """Record a COMMIT before any of it takes effect: persistent messages it will publish
        (numbered; `added` then adopts them) and persistent messages it consumes (`removed`
        then records nothing more). All or, raising, nothing."""
        ...

    @property
    def last_lsn(self) -> int:
        """How far the records go: a RECEIPT is durable once the store has synced this far."""
        ...

    @property
    def synced_lsn(self) -> int:
        """How far the records are durable (per the sync policy)."""
        ...

    @property
    def buffered(self) -> bool:
        """Records appended and not yet handed to the operating system."""
        ...

    @property
    def changes(self) -> int:
        """Grows with every record appended (or gathered to be written as part of one): a
        caller compares it around an operation to learn whether that wrote anything."""
        ...

    def request_sync(self, lsn: int) -> None:
        """A frame waits until the records up to `lsn` are durable: sync them soon."""
        ...

    def flush(self) -> None:
        """Hand appended records to the operating system (before any frame depends on them)."""
        ...

    def maintain(self) -> tuple[int, int]:
        """Periodic upkeep; returns (segments deleted, segments compacted)."""
        ...

    def compact(self) -> tuple[int, int]:
        """Reclaim every byte of disk held by dead records now (`compact dst`)."""
        ...

    def disk_bytes(self) -> int: ...

    def set_snapshot(self, snapshot: Callable[[], BrokerSnapshot]) -> None:
        """Where to get the broker's state whenever the store starts afresh and restates what
        it holds (a journal's new segment)."""
        ...

    def extend(self, extension: StoreExtension) -> None:
        """Keep `extension`'s records from now on, and replay them at recovery."""
        ...

    def recover(self, restore: Restore) -> object:
        """Hand back what the store holds into `restore`; call once, before anything else is
        recorded. Returns the store's own report of it (for its log)."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps persistent messages in memory only: nothing survives the process."""

    def __init__(self) -> None:
        self._messages: dict[str, Message] = {}

    def added(self, message: Message) -> None:
        self._messages[message.id] = message

    def removed(self, message: Message) -> None:
        self._messages.pop(message.id, None)

    def delivered(self, message: Message) -> None:
        pass  # nothing outlives the process, so no delivery needs remembering

    def durable_created(self, record: DurableRecord) -> None:
        pass

    def durable_ended(self, sub_id: int) -> None:
        pass

    def durable_delivered(self, sub_id: int, message: Message) -> None:
        pass

    def durable_acked(self, sub_id: int, message: Message) -> None:
        pass

    def seq_reserved(self, destination: DestinationName, seq: int) -> None:
        pass

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        yield

    def write_transaction(self, adds: Sequence[Message], removes: Sequence[Message]) -> None:
        pass  # `added` and `removed` keep the messages as the COMMIT takes effect

    @property
    def last_lsn(self) -> int:
        return 0  # nothing to wait for

    @property
    def synced_lsn(self) -> int:
        return 0

    @property
    def buffered(self) -> bool:
        return False

    @property
    def changes(self) -> int:
        return 0

    def request_sync(self, lsn: int) -> None:
        pass  # nothing is ever waited for

    def flush(self) -> None:
        pass

    def maintain(self) -> tuple[int, int]:
        return 0, 0

    def compact(self) -> tuple[int, int]:
        return 0, 0

    def disk_bytes(self) -> int:
        return 0

    def set_snapshot(self, snapshot: Callable[[], BrokerSnapshot]) -> None:
        pass  # nothing is ever restated

    def extend(self, extension: StoreExtension) -> None:
        pass  # nothing outlives the process: features keep their state in memory only

    def recover(self, restore: Restore) -> None:
        restore.finish()  # nothing outlived the last process

    def close(self) -> None:
        self._messages.clear()

    def __len__(self) -> int:
        """Persistent messages held."""
        return len(self._messages)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._messages
