"""The takeover port (cluster.monitor.Takeover): a failed member's journal, in the shared
database, adopted into this broker, then deleted.

The monitor has claimed the failed member (its row TAKEOVER_STARTED by this broker, its epoch
one more, so none of its commits can land any more). Then, on the monitor's thread:

1. its journal is opened from the database (persist.pg_files, without the store's lock: the
   failed process may still hold it on a session the monitor has not ended yet) and adopted into
   this broker (cluster.adoption), the consumers of each destination adopted into waiting;
2. this broker's journal is made durable up to its last record (its own group commit), so this
   broker's store holds everything adopted;
3. one transaction, only while the claim is still this broker's, deletes the failed member's
   journal and its report of queue counts;
4. the consumers go on.

A taker that dies before step 3 leaves the failed member's journal whole and nothing adopted
delivered: another member claims it again, and adopts it flagged redelivered (what the first taker
made durable comes back with it, so a message may then reach a consumer twice, flagged; never an
acknowledged one). The monitor marks the row TAKEOVER_COMPLETE when this returns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from sluiceway.cluster import table
from sluiceway.cluster.adoption import AdoptionReport, OnLoop, StoreAdopter
from sluiceway.cluster.monitor import TakenOver
from sluiceway.cluster.shared_counts import forget_member
from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.model.store import MessageStore, StoreError
from sluiceway.persist.database import Database
from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.pg_files import PgFiles

log = logging.getLogger(__name__)

SYNC_POLL: Final = 0.01  # seconds between two looks at this broker's synced position


# Whether a link brought member `broker_id`'s message `message_id` here (Links.forwarded_from).
Forwarded = Callable[[str, str], bool]


def _never(message_id: str) -> bool:
    return False


class TakeoverLost(StoreError):
    """Another member claimed the store again while this broker adopted it."""


class StoreTakeover:
    """Takes failed members' stores over into `broker` (a cluster.monitor.Takeover)."""

    def __init__(
        self,
        config: BrokerConfig,
        broker: Broker,
        root: Path,
        database: Database,
        on_loop: OnLoop,
        *,
        sync_timeout: float,
        forwarded: Forwarded | None = None,
    ) -> None:
        """`root`: this broker's data directory (the journal's names are
        relative to it, as every member's are); `sync_timeout`: seconds to wait for this
        broker's store to make the adopted messages durable; `forwarded(broker_id,
        message_id)`: whether a link brought that member's message here already (its
        acknowledgement lost with the member), so that it is not adopted twice."""
        self._config = config
        self._broker = broker
        self._store: MessageStore = broker.store
        self._root = root
        self._database = database
        self._on_loop = on_loop
        self._sync_timeout = sync_timeout
        self._forwarded = forwarded

    def take_over(self, broker_id: str, epoch: int) -> TakenOver:
        retried = self._tried_before(broker_id)
        files = PgFiles(
            self._database, self._config.cluster_id, broker_id, self._root, exclusive=False
        )
        forwarded = self._forwarded
        adopter = StoreAdopter(
            self._broker,
            self._config,
            self._on_loop,
            gate=True,
            redelivered=retried,
            here_already=(lambda mid: forwarded(broker_id, mid)) if forwarded else _never,
        )
        try:
            journal = Journal(
                self._root / "journal",
                segment_size=self._config.segment_size,
                sync=SyncPolicy.ALWAYS,
                files=files,
                sync_thread=False,
            )
            report = adopter.adopt(JournalStore(journal))
            self._make_durable()
            self._forget(broker_id, epoch)
        finally:
            files.abandon()  # what recovery wrote into the failed member's journal: not kept
            self._on_loop(adopter.open_gate)
        _log(broker_id, report, retried)
        return TakenOver(report.messages + report.durable_messages, report.durables)

    def _tried_before(self, broker_id: str) -> bool:
        """Whether another takeover of `broker_id`'s store began since it last joined."""
        with self._database.connect(autocommit=True) as connection:
            row = connection.execute(
                "SELECT count(*) FROM sluiceway_event WHERE cluster_id = %(c)s "
                "AND broker_id = %(b)s AND kind = %(started)s AND id > coalesce(("
                "SELECT max(id) FROM sluiceway_event WHERE cluster_id = %(c)s "
                "AND broker_id = %(b)s AND kind IN (%(joined)s, %(rejoined)s)), 0)",
                {
                    "c": self._config.cluster_id,
                    "b": broker_id,
                    "started": table.TAKEOVER_STARTED,
                    "joined": table.JOINED,
                    "rejoined": table.REJOINED,
                },
            ).fetchone()
        return row is not None and int(row[0]) > 1  # type: ignore[call-overload]

    def _make_durable(self) -> None:
        """Wait until this broker's store holds everything appended so far."""
        store = self._store

        def flush() -> int:
            store.flush()
            store.request_sync(store.last_lsn)
            return store.last_lsn

        target = self._on_loop(flush)
        deadline = time.monotonic() + self._sync_timeout
        while store.synced_lsn < target:
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"this broker's store did not make the adopted messages durable within "
                    f"{self._sync_timeout:.0f} s; the takeover is left for another try"
                )
            time.sleep(SYNC_POLL)

    def _forget(self, broker_id: str, epoch: int) -> None:
        """Delete the failed member's journal and counts, if the claim is still ours."""
        cluster_id = self._config.cluster_id
        with self._database.connect() as connection, connection.transaction():
            mine = connection.execute(
                "SELECT 1 FROM sluiceway_broker WHERE cluster_id = %s AND broker_id = %s "
                "AND epoch = %s AND taken_over_by = %s FOR UPDATE",
                (cluster_id, broker_id, epoch, self._config.broker_id),
            ).fetchone()
            if mine is None:
                raise TakeoverLost(
                    f"broker {broker_id}'s store was claimed again while this broker adopted it"
                )
            for rows in ("sluiceway_chunk", "sluiceway_file"):
                connection.execute(
                    f"DELETE FROM {rows} WHERE cluster_id = %s AND broker_id = %s",  # noqa: S608
                    (cluster_id, broker_id),
                )
            # Its durable subscriptions live here now (those replaced here are let go by this
            # broker's next exchange of its durables, cluster.durables).
            # So do its pipeline positions (cluster.positions), which the adopter brought here.
            for rows in ("sluiceway_durable", "sluiceway_position"):
                connection.execute(
                    f"UPDATE {rows} SET broker_id = %s, updated_at = now() "  # noqa: S608
                    "WHERE cluster_id = %s AND broker_id = %s",
                    (self._config.broker_id, cluster_id, broker_id),
                )
            forget_member(connection, cluster_id, broker_id)


def _log(broker_id: str, report: AdoptionReport, retried: bool) -> None:
    log.info(
        "took over broker %s's store: %s%s in %.1f s",
        broker_id,
        report.summary(),
        " (a takeover tried again: every message flagged redelivered)" if retried else "",
        report.seconds,
    )
    if report.dropped_durables:
        log.warning(
            "takeover of broker %s: durable subscriptions replaced here by their clients, "
            "their messages dropped: %s",
            broker_id,
            ", ".join(report.dropped_durables),
        )


def takeover_for(
    config: BrokerConfig,
    broker: Broker,
    root: Path,
    database: Database,
    on_loop: OnLoop,
    *,
    forwarded: Forwarded | None = None,
) -> StoreTakeover:
    """The takeover of a broker with this configuration: it waits for its own store as long as
    a lease lasts."""
    return StoreTakeover(
        config,
        broker,
        root,
        database,
        on_loop,
        sync_timeout=max(10.0, config.lease_seconds),
        forwarded=forwarded,
    )
