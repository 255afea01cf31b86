"""Opening the broker's storage: the data directory, its lock, the journal and the swap area.

`imq.persist.store=file` (the default) keeps persistent messages in the journal under the data
directory (`imq.persist.file.directory`, `sluiceway broker --data-dir`); `jdbc` keeps the same
journal in PostgreSQL (app.jdbc, persist.pg_files), the data directory holding only the lock and
the swap area; `memory` keeps nothing. The data directory is locked while a broker uses it, so a
second broker on the same directory stops at start-up instead of corrupting the first one's
journal (the jdbc store has a lock of its own in the database, for the same broker id started on
another directory or machine).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sluiceway.app.jdbc import open_store_files
from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.model.store import MemoryStore, MessageStore
from sluiceway.core.values.clock import Clock
from sluiceway.errors import SluicewayError
from sluiceway.persist.files import OS_FILES, Files
from sluiceway.persist.format import describe_damaged
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.pg_files import Fence, PgFiles
from sluiceway.persist.replay import Recovery
from sluiceway.persist.restoring import restore_broker
from sluiceway.persist.segments import (
    SEGMENT_HEADER_SIZE,
    CorruptJournal,
    JournalWriteError,
    RecoveryReport,
)
from sluiceway.persist.swap import SwapArea

log = logging.getLogger(__name__)


class StorageError(SluicewayError):
    """The data directory cannot be used (locked by another broker, not writable...)."""


class SyncNotifier:
    """Carries "synced up to LSN n" from the journal's fsync thread to the event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[], None] | None = None

    def attach(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        with self._lock:
            self._loop, self._callback = loop, callback

    def __call__(self, lsn: int) -> None:
        with self._lock:
            loop, callback = self._loop, self._callback
        if loop is not None and callback is not None and not loop.is_closed():
            loop.call_soon_threadsafe(callback)


class Storage:
    """The broker's store, swap area and directory lock, opened and closed together."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        files: Files = OS_FILES,
        sync_thread: bool = True,
        fence: Fence | None = None,
    ) -> None:
        """`files`: where the journal's files are (under `jdbc`, the database's unless given);
        `sync_thread` False: under the group policy the journal syncs only when told
        (Journal.sync_round). Tests give a simulated disk and decide when it syncs. `fence`:
        under `jdbc`, run in every commit to check the store is still this broker's (the
        cluster membership's; see persist.pg_files.Fence)."""
        self.config = config
        self.notifier = SyncNotifier()
        self.store: MessageStore
        # The same store, when it is the journal's: recovery runs into the broker through it.
        self.journal_store: JournalStore | None = None
        self.swap: SwapArea | None = None
        self._lock_file: IO[str] | None = None
        # The jdbc store's files, when this storage opened them (it closes them too).
        self.pg_files: PgFiles | None = None
        if config.persist_store == "memory":
            self.store = MemoryStore()
            self.directory: Path | None = None
            return
        self.directory = Path(config.data_directory).resolve()
        self._lock(self.directory)
        if config.persist_store == "jdbc" and files is OS_FILES:
            try:
                files = self.pg_files = open_store_files(config, self.directory, fence)
            except BaseException:
                self._unlock()
                raise
        journal = Journal(
            self.directory / "journal",
            segment_size=config.segment_size,
            sync=SyncPolicy(config.sync_policy),
            sync_delay=config.sync_delay_ms / 1000,
            on_synced=self.notifier,
            skip_corrupt=config.skip_corrupt,
            files=files,
            sync_thread=sync_thread,
        )
        self.store = self.journal_store = JournalStore(journal)
        if config.swap_threshold != 0:
            self.swap = SwapArea(self.directory / "swap")
            self.swap.open()

    def _lock(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_file = (directory / "lock").open("a+")
        except OSError as exc:
            raise StorageError(f"cannot use data directory {directory}: {exc}") from None
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "another process"
            lock_file.close()
            raise StorageError(
                f"data directory {directory} is in use by another broker ({holder}); stop it, "
                "or give this one its own --data-dir"
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"pid {os.getpid()}\n")
        lock_file.flush()
        self._lock_file = lock_file

    def open_broker(self, clock: Clock | None = None) -> tuple[Broker, Recovery | None]:
        """A broker on this storage, with whatever the journal held read back."""
        broker = Broker(self.config, clock=clock, store=self.store, spill=self.swap)
        if self.journal_store is None:
            return broker, None  # an in-memory store holds nothing from before
        try:
            recovery = restore_broker(self.journal_store, broker)
        except CorruptJournal as exc:
            if not exc.skippable:
                raise StorageError(
                    f"corrupt journal: {exc}. The broker will not start and guess what the "
                    "journal meant."
                ) from exc
            if exc.damaged is not None:
                lost = describe_damaged(exc.damaged.type, exc.damaged.payload)
                raise StorageError(
                    f"corrupt journal: {exc}. It held {lost}. The broker will not start and "
                    "silently lose it. To start anyway, losing only that record, set -D "
                    "imq.persist.file.skip_corrupt=true (its bytes are saved under "
                    "journal/discarded first)."
                ) from exc
            raise StorageError(
                f"corrupt journal: {exc.segment} is damaged at offset {exc.offset}. The broker "
                "will not start and silently lose what is after it. To start anyway, losing only "
                "the damaged records, set -D imq.persist.file.skip_corrupt=true (the damaged bytes "
                "are saved under journal/discarded first)."
            ) from exc
        _log_recovery(self.journal_store, recovery)
        return broker, recovery

    def close(self) -> None:
        try:
            self.store.close()
        except JournalWriteError as exc:
            # The disk still refuses the journal's last records: they are lost, and nothing a
            # client was told rests on them (RECEIPTs wait for their records).
            log.error("journal: %s", exc)  # noqa: TRY400  (the message says it all)
        finally:
            if self.swap is not None:
                self.swap.close()
            if self.pg_files is not None:
                self.pg_files.shutdown()
            self._unlock()

    def _unlock(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None


def _log_recovery(store: JournalStore, recovery: Recovery) -> None:
    report = store.journal.report
    counts = ", ".join(
        f"{name} {count}"
        for name, count in sorted(recovery.messages.items(), key=lambda item: str(item[0]))
    )
    log.info(
        "journal: %d segments, %d records read; recovered %d persistent messages%s",
        report.segments,
        report.records,
        sum(recovery.messages.values()),
        f" ({counts})" if counts else "",
    )
    if recovery.outlived:
        log.info(
            "journal: %d records named messages of segments deleted since (consumed; dead "
            "with them)",
            recovery.outlived,
        )
    _log_damage(report)
    if recovery.discarded_tx:
        log.info("journal: discarded a transaction whose commit was cut by a crash")
    if recovery.durables:
        log.info("journal: recovered %d durable subscriptions", len(recovery.durables))


def _log_damage(report: RecoveryReport) -> None:
    """What recovery cut or skipped, and what each cut means for what clients were told."""
    for segment, length in report.headers_cut:
        log.warning(
            "journal: segment %s ended inside its %d-byte header (%d bytes): a crash came while "
            "it was being created, before it held any record; removed",
            segment,
            SEGMENT_HEADER_SIZE,
            length,
        )
    for segment, offset, length in report.torn:
        log.warning(
            "journal: cut %d bytes at offset %d of %s: a record cut short by a crash while it "
            "was being written. It was never confirmed to any client (a RECEIPT waits until its "
            "records are on disk), unless the broker ran with imq.persist.file.sync.policy=os "
            "and the machine lost power. The bytes are saved under journal/discarded",
            length,
            offset,
            segment,
        )
    damaged = {(record.segment, record.offset) for record in report.damaged}
    for record in report.damaged:
        log.error(
            "journal: record %d at offset %d of %s was damaged on disk after it was written (its "
            "bytes are all there, its checksum fails), and it may have been confirmed to a "
            "client; lost: %s. Started anyway (imq.persist.file.skip_corrupt); the bytes are "
            "saved under journal/discarded",
            record.lsn,
            record.offset,
            record.segment,
            describe_damaged(record.type, record.payload),
        )
    for segment, offset, length in report.skipped:
        if (segment, offset) not in damaged:
            log.error(
                "journal: skipped %d corrupt bytes at offset %d of %s "
                "(imq.persist.file.skip_corrupt); the messages they held are lost",
                length,
                offset,
                segment,
            )
    for before, after in report.lsn_gaps:
        if after - before > 1:
            log.error(
                "journal: records %d to %d are missing (skipped as damaged, or in a lost "
                "segment); what they held is lost",
                before + 1,
                after - 1,
            )
