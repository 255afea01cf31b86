"""The seam between the broker's state and where persistent state is kept: the store port.

Destinations and subscriptions tell the store what must survive a restart: persistent messages
added and removed, deliveries (so a message delivered before a crash comes back marked
redelivered), durable subscriptions and their acknowledgements, sequence numbers spoken for, and
topic cursors and queue leases. At start-up the store hands back what it holds (`recover`, into
a `Restore`), and from then on it may ask the broker for the state it restates when it starts
afresh (a journal's new segment).

A store is built at the edge (app.storage) and given to the Broker, which never looks at what
kind it is: persist.journal_store.JournalStore keeps everything in the journal; `MemoryStore`
keeps nothing that outlives the process, for a broker that needs no durability. Another store
(a database) implements this Protocol and `Restore`'s caller side, and nothing in core changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

from sluiceway.core.values.durable_record import DurableRecord
from sluiceway.core.values.leasing import CursorRecord, LeaseRecord, LeaseState
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

    The store calls `sequence` and `durable` for the state it held, `message` (or `encoded`)
    for each persistent message in the order it was added, then `finish` once.
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
        """Everything is back: file what is still being gathered."""
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

    def cursor_saved(self, record: CursorRecord) -> None:
        """A topic cursor was created or moved (core.cursors)."""
        ...

    def cursor_deleted(self, topic: str, group: str) -> None: ...

    def lease_opened(self, record: LeaseRecord) -> None:
        """A queue lease was created (core.leases); its messages' lease_marked follow."""
        ...

    def lease_marked(self, lease_id: int, message: Message) -> None:
        """A persistent message was taken by lease `lease_id`."""
        ...

    def lease_ended(self, lease_id: int, state: LeaseState) -> None:
        """The lease was acknowledged (its messages' removals follow) or expired."""
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

    def cursor_saved(self, record: CursorRecord) -> None:
        pass

    def cursor_deleted(self, topic: str, group: str) -> None:
        pass

    def lease_opened(self, record: LeaseRecord) -> None:
        pass

    def lease_marked(self, lease_id: int, message: Message) -> None:
        pass

    def lease_ended(self, lease_id: int, state: LeaseState) -> None:
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

    def recover(self, restore: Restore) -> None:
        restore.finish()  # nothing outlived the last process

    def close(self) -> None:
        self._messages.clear()

    def __len__(self) -> int:
        """Persistent messages held."""
        return len(self._messages)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._messages
