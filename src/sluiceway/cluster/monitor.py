"""Failure detection and takeover claims: every imq.cluster.monitor.interval each member looks
for members whose lease ran out more than the monitor margin ago, declares them FAILED, and
claims the takeover of one failed member's store.

A member is declared failed when it is OPERATING and its lease_until + imq.cluster.monitor.interval
x imq.cluster.monitor.threshold is before the database's now(): by then the member's own view of
its lease has run out for the margin at least, so it has stopped serving (lease.Lease). The
declaration is one UPDATE, so only one member logs and records it.

The claim is one UPDATE too (state TAKEOVER_STARTED, taken_over_by, a new epoch), so one member
wins; the bumped epoch fences the failed broker's store at once (lease.StoreFence). A member
claims only while its own lease is live, never its own row, and may claim again a
TAKEOVER_STARTED whose taker's lease has run out. The winner runs the `Takeover` port (reading
the failed broker's store into its own), then marks the row TAKEOVER_COMPLETE; when the port
fails, the row goes back to FAILED so another member (or this one, next round) tries again.

Without a Takeover the monitor declares failures but claims nothing: a failed broker's store
then waits for the broker to come back.

Each round also reads the cluster's snapshot (table.ClusterSnapshot) for the admin API, `cmd
list bkr` and /metrics, so that they never wait for the database on the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from sluiceway.cluster import table
from sluiceway.cluster.lease import Lease, MemberState
from sluiceway.persist.database import Database

if TYPE_CHECKING:
    import psycopg

    from sluiceway.config.cluster import ClusterConfig

    Connection = psycopg.Connection[tuple[object, ...]]

log = logging.getLogger(__name__)

_OPERATING: Final = MemberState.OPERATING.value
_FAILED: Final = MemberState.FAILED.value
_STARTED: Final = MemberState.TAKEOVER_STARTED.value
_COMPLETE: Final = MemberState.TAKEOVER_COMPLETE.value
# A member whose lease ran out more than the margin ago: declared failed.
_EXPIRED: Final = """
    b.cluster_id = %(cluster)s AND b.broker_id <> %(me)s AND b.state = %(operating)s
    AND b.lease_until + make_interval(secs => %(margin)s) < now()
"""
# A row another member may claim: failed, or being taken over by a member whose lease ran out
# more than the margin ago (or that is no longer OPERATING).
_CLAIMABLE: Final = """
    b.cluster_id = %(cluster)s AND b.broker_id <> %(me)s
    AND (b.state = %(failed)s OR (b.state = %(started)s AND NOT EXISTS (
        SELECT 1 FROM sluiceway_broker t
        WHERE t.cluster_id = b.cluster_id AND t.broker_id = b.taken_over_by
        AND t.state = %(operating)s AND t.lease_until + make_interval(secs => %(margin)s) >= now()
    )))
"""


@dataclass(frozen=True, slots=True)
class TakenOver:
    """What a takeover moved into this broker."""

    messages: int
    durables: int


class Takeover(Protocol):
    """Takes a failed broker's store over into this broker. `epoch` is the failed broker's row's
    epoch after the claim; the port may check it to be sure the claim is still this broker's.
    Called on the monitor's thread; it may take as long as it needs (the row stays
    TAKEOVER_STARTED while this broker's lease holds)."""

    def take_over(self, broker_id: str, epoch: int) -> TakenOver: ...


@dataclass(frozen=True, slots=True)
class Declared:
    """A member this monitor declared failed."""

    broker_id: str
    heartbeat_at: object
    silent: float  # seconds since its last heartbeat, by the database's clock


@dataclass(frozen=True, slots=True)
class Claim:
    """A takeover this monitor won."""

    broker_id: str
    epoch: int


class Monitor:
    """Watches the other members' leases from a thread of its own with its own connection."""

    def __init__(
        self,
        database: Database,
        config: ClusterConfig,
        lease: Lease,
        takeover: Takeover | None = None,
    ) -> None:
        self.database = database
        self.cluster_id = config.cluster_id
        self.broker_id = config.broker_id
        self.interval = config.monitor_interval
        self.margin = config.monitor_interval * config.monitor_threshold
        self.lease = lease
        self.takeover = takeover
        self.snapshot: table.ClusterSnapshot | None = None  # the last round's reading
        self.takeovers = 0  # takeovers this broker completed
        self._cut_off_refused = False  # (warned once)
        self._connection: Connection | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._watch, name=f"cluster-monitor-{self.broker_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop watching (a takeover under way is waited for, up to `timeout`); close."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._close()

    def _watch(self) -> None:
        failing = False  # the last round failed (logged once until one succeeds)
        while self.lease.holds():  # a fenced broker judges no one
            try:
                self.round()
                failing = False
            except Exception as error:  # the database's errors: the next round tries again
                self._close()
                if not failing:
                    failing = True
                    log.warning("cluster monitor: %s", " ".join(str(error).split()))
            if self._stopping.wait(self.interval):
                break
        self._close()

    def round(self) -> list[Claim]:
        """One look: declare, claim and take over, then read the snapshot. The claims won."""
        connection = self._connect()
        self.cut_off(connection)
        for declared in self.declare_failed(connection):
            log.warning(
                "declared broker %s failed: its last heartbeat was at %s, %.1f s ago",
                declared.broker_id,
                declared.heartbeat_at,
                declared.silent,
            )
        claims: list[Claim] = []
        if self.takeover is not None and self.lease.holds():
            claim = self.claim(connection)
            if claim is not None:
                claims.append(claim)
                self.run_takeover(connection, claim)
        self.snapshot = table.read_snapshot(connection, self.cluster_id)
        return claims

    def _connect(self) -> Connection:
        if self._connection is None or self._connection.closed:
            connection = self.database.connect(autocommit=True)
            # A statement stuck behind a lock or a slow database fails, and the next round
            # tries again, rather than the monitor stopping for good.
            milliseconds = max(1000, round(self.margin * 4000))
            connection.execute(f"SET statement_timeout = {milliseconds}")
            self._connection = connection
        return self._connection

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        table.close_quietly(connection)

    def cut_off(self, connection: Connection) -> int:
        """End the database sessions of every other member whose lease ran out more than the
        margin ago: such a member has fenced itself already (its own view of its lease ends
        first), so its sessions serve nothing, but a session held by a paused process keeps
        its locks: its row, locked by a commit that never ends, could never be declared failed
        nor claimed. The sessions are told by their application name
        (persist.database.member_application). Needs the right to end them (the same database
        user as the members, or pg_signal_backend); without it, a warning, once."""
        try:
            rows = connection.execute(
                "SELECT b.broker_id, pg_terminate_backend(a.pid) FROM sluiceway_broker b "
                "JOIN pg_stat_activity a ON a.application_name = "
                "'sluiceway ' || b.cluster_id || '/' || b.broker_id "
                "WHERE b.cluster_id = %(cluster)s AND b.broker_id <> %(me)s "
                "AND b.state <> %(complete)s AND b.lease_until + make_interval(secs => %(margin)s)"
                " < now() AND a.pid <> pg_backend_pid()",
                {
                    "cluster": self.cluster_id,
                    "me": self.broker_id,
                    "complete": _COMPLETE,
                    "margin": self.margin,
                },
            ).fetchall()
        except Exception as error:  # (no right to end them: the warning says what to do)
            if not self._cut_off_refused:
                self._cut_off_refused = True
                log.warning(
                    "cannot end the database sessions of failed members (%s): give the "
                    "members' database user pg_signal_backend, or a paused member that holds "
                    "a lock may keep its store from being taken over",
                    " ".join(str(error).split()),
                )
            return 0
        ended = [str(broker_id) for broker_id, done in rows if done]
        for broker_id in sorted(set(ended)):
            log.warning(
                "ended %d database sessions of broker %s, whose lease ran out",
                ended.count(broker_id),
                broker_id,
            )
        return len(ended)

    def declare_failed(self, connection: Connection) -> list[Declared]:
        """Mark FAILED every other member whose lease ran out more than the margin ago."""
        declared: list[Declared] = []
        with connection.transaction():
            # A row locked by a commit under way (the store's fence reads it FOR SHARE) is
            # skipped, not waited for: it is looked at again next round, after the commit.
            rows = connection.execute(
                f"UPDATE sluiceway_broker b SET state = %(failed)s WHERE {_EXPIRED} "  # noqa: S608
                "AND (b.cluster_id, b.broker_id) IN (SELECT cluster_id, broker_id "
                f"FROM sluiceway_broker b WHERE {_EXPIRED} FOR UPDATE SKIP LOCKED) "
                "RETURNING broker_id, heartbeat_at, extract(epoch FROM now() - heartbeat_at)",
                {
                    "failed": _FAILED,
                    "operating": _OPERATING,
                    "cluster": self.cluster_id,
                    "me": self.broker_id,
                    "margin": self.margin,
                },
            ).fetchall()
            for broker_id, heartbeat_at, silent in rows:
                seconds = float(silent) if silent is not None else 0.0  # type: ignore[arg-type]
                declared.append(Declared(str(broker_id), heartbeat_at, seconds))
                table.record_event(
                    connection,
                    self.cluster_id,
                    str(broker_id),
                    table.DECLARED_FAILED,
                    f"by {self.broker_id}: last heartbeat {seconds:.1f} s before",
                )
        return declared

    def claim(self, connection: Connection) -> Claim | None:
        """Claim one failed member's takeover (or one whose taker's lease ran out); None when
        there is none, another member won it, or this broker's own lease is not live in the
        database."""
        values = {
            "started": _STARTED,
            "failed": _FAILED,
            "operating": _OPERATING,
            "me": self.broker_id,
            "cluster": self.cluster_id,
            "margin": self.margin,
        }
        with connection.transaction():
            # First lock one candidate (members claiming together skip each other's), then
            # claim it in a statement of its own: it reads the row as it is now, locked, so a
            # candidate another member claimed meanwhile is seen claimed and left alone.
            candidate = connection.execute(
                # (a fixed text of this module, not an input)
                f"SELECT broker_id FROM sluiceway_broker b WHERE {_CLAIMABLE} "  # noqa: S608
                "ORDER BY broker_id LIMIT 1 FOR UPDATE SKIP LOCKED",
                values,
            ).fetchone()
            if candidate is None:
                return None
            row = connection.execute(
                "UPDATE sluiceway_broker b SET state = %(started)s, taken_over_by = %(me)s, "  # noqa: S608
                "takeover_started_at = now(), takeover_ended_at = NULL, epoch = b.epoch + 1 "
                f"WHERE {_CLAIMABLE} AND b.broker_id = %(candidate)s AND EXISTS ("
                "SELECT 1 FROM sluiceway_broker m WHERE m.cluster_id = %(cluster)s "
                "AND m.broker_id = %(me)s AND m.state = %(operating)s AND m.lease_until > now()) "
                "RETURNING b.broker_id, b.epoch",
                {**values, "candidate": candidate[0]},
            ).fetchone()
            if row is None:
                return None
            claim = Claim(str(row[0]), int(row[1]))  # type: ignore[call-overload]
            table.record_event(
                connection,
                self.cluster_id,
                claim.broker_id,
                table.TAKEOVER_STARTED,
                f"by {self.broker_id}, epoch {claim.epoch}",
            )
        log.warning("taking over broker %s's store (epoch %d)", claim.broker_id, claim.epoch)
        return claim

    def run_takeover(self, connection: Connection, claim: Claim) -> bool:
        """Run the port for `claim`, then record how it ended; True when it completed."""
        assert self.takeover is not None
        began = time.monotonic()
        try:
            moved = self.takeover.take_over(claim.broker_id, claim.epoch)
        except Exception as error:
            log.exception("taking over broker %s's store failed", claim.broker_id)
            self._end_takeover(connection, claim, _FAILED, table.TAKEOVER_FAILED, str(error))
            return False
        took = time.monotonic() - began
        self._end_takeover(
            connection,
            claim,
            _COMPLETE,
            table.TAKEOVER_COMPLETE,
            f"by {self.broker_id}: {moved.messages} messages, {moved.durables} durable "
            f"subscriptions in {took:.1f} s",
        )
        self.takeovers += 1
        log.info(
            "broker %s took over broker %s's store: %d messages, %d durable subscriptions "
            "in %.1f s",
            self.broker_id,
            claim.broker_id,
            moved.messages,
            moved.durables,
            took,
        )
        return True

    def _end_takeover(
        self, connection: Connection, claim: Claim, state: str, kind: str, detail: str
    ) -> None:
        with connection.transaction():
            ended = connection.execute(
                "UPDATE sluiceway_broker SET state = %s, takeover_ended_at = now() "
                "WHERE cluster_id = %s AND broker_id = %s AND epoch = %s AND state = %s "
                "AND taken_over_by = %s",
                (state, self.cluster_id, claim.broker_id, claim.epoch, _STARTED, self.broker_id),
            ).rowcount
            if ended:
                table.record_event(connection, self.cluster_id, claim.broker_id, kind, detail)
        if not ended:
            log.warning(
                "the takeover of broker %s ended after another member claimed it again",
                claim.broker_id,
            )
