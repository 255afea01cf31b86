"""This broker's membership of its cluster: joining at start-up, renewing its lease with a
heartbeat, and leaving at a clean stop (imq.cluster.ha, Open MQ's enhanced broker cluster).

Joining writes this broker's row in sluiceway_broker: state OPERATING, a new epoch (the previous
one + 1), its addresses, and a lease of imq.cluster.heartbeat.interval x .threshold seconds from
the database's now(). It is refused while the row says another process holds this broker id
(OPERATING with a live lease), and waits (bounded) while a live member is taking this broker's
store over. The epoch tells this run of the broker from an earlier one that may still be alive
(paused, cut off): every renewal and every store commit names it, so the earlier one's fail.

The heartbeat runs on a thread of its own with its own connection, so the event loop never
waits for the database. Each renewal sets heartbeat_at and lease_until from the database's clock
and the number of messages in the store. A renewal that finds no row to renew (this broker was
declared failed, or taken over) loses the lease at once; a database that cannot be reached loses
it when it runs out (lease.Lease). Losing it stops the broker (the app's wiring).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sluiceway import __version__
from sluiceway.cluster import table
from sluiceway.cluster.lease import Lease, MemberState, StoreFence, lease_clock
from sluiceway.errors import SluicewayError
from sluiceway.persist.database import Database, DatabaseError

if TYPE_CHECKING:
    import psycopg

    from sluiceway.config.cluster import ClusterConfig

log = logging.getLogger(__name__)

# How long a starting broker waits for another member to finish taking its store over before it
# gives up (a takeover reads the whole journal of the failed broker).
TAKEOVER_WAIT_S: Final = 120.0


class JoinRefused(SluicewayError):
    """This broker may not join its cluster now; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Joined:
    """What a join found and did: the epoch it took, and the row's state before it."""

    epoch: int
    before: str | None  # None: the broker's first join
    taken_over_by: str | None
    takeover_ended_at: object


class Membership:
    """One broker's row in the shared database: joined, renewed, left.

    `messages()` is read by the heartbeat thread (a plain int: the broker's count of messages
    in its store); it defaults to 0.
    """

    def __init__(
        self,
        database: Database,
        config: ClusterConfig,
        *,
        messages: Callable[[], int] = lambda: 0,
        takeover_wait: float = TAKEOVER_WAIT_S,
    ) -> None:
        self.database = database
        self.cluster_id = config.cluster_id
        self.broker_id = config.broker_id
        self.heartbeat_interval = config.heartbeat_interval
        self.lease = Lease(config.lease_seconds)
        self.store_fence = StoreFence(self.cluster_id, self.broker_id)
        self.messages = messages
        self.takeover_wait = takeover_wait
        self.epoch = 0
        self._joined: Joined | None = None
        self._connection: psycopg.Connection[tuple[object, ...]] | None = None
        self._unreachable_since: float | None = None  # time.time() of the first failed renewal
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def _key(self) -> tuple[str, str]:
        return self.cluster_id, self.broker_id

    # -- joining ---------------------------------------------------------------------------------

    def join(self, stomp_address: str = "", admin_address: str = "") -> Joined:
        """Take this broker's place in the cluster with a new epoch; JoinRefused when another
        process holds it, or a takeover of its store does not end within takeover_wait."""
        deadline = time.monotonic() + self.takeover_wait
        while True:
            sent = lease_clock()  # before the transaction: its now() is later than this
            joined = self._try_join(stomp_address, admin_address)
            if joined is not None:
                break
            if time.monotonic() >= deadline:
                raise JoinRefused(
                    f"broker {self.broker_id}: another member has been taking over its store "
                    f"for more than {self.takeover_wait:.0f} s; start it again once "
                    "`sluiceway cmd list bkr` shows the takeover complete"
                )
            time.sleep(min(self.heartbeat_interval, max(deadline - time.monotonic(), 0)))
        self.epoch = self.store_fence.epoch = joined.epoch
        self.lease.renewed(sent)
        self._log_join(joined, stomp_address)
        return joined

    def _try_join(self, stomp_address: str, admin_address: str) -> Joined | None:
        """One attempt, in one transaction; None while a live member takes this store over."""
        with self.database.connect() as connection, connection.transaction():
            row = connection.execute(
                "SELECT b.state, b.epoch, b.lease_until > now(), b.host, b.pid, "
                "b.taken_over_by, b.takeover_ended_at, "
                "t.state = 'OPERATING' AND t.lease_until > now() "
                "FROM sluiceway_broker b LEFT JOIN sluiceway_broker t "
                "ON t.cluster_id = b.cluster_id AND t.broker_id = b.taken_over_by "
                "WHERE b.cluster_id = %s AND b.broker_id = %s FOR UPDATE OF b",
                self._key,
            ).fetchone()
            before: str | None = None
            epoch, taken_over_by, ended = 0, None, None
            if row is None:
                connection.execute(
                    "INSERT INTO sluiceway_broker (cluster_id, broker_id, state) "
                    "VALUES (%s, %s, %s)",
                    (*self._key, MemberState.OPERATING.value),
                )
            else:
                live, host, pid, taker_live = row[2], row[3], row[4], row[7]
                before, epoch = str(row[0]), int(row[1])  # type: ignore[call-overload]
                taken_over_by = str(row[5]) if row[5] is not None else None
                ended = row[6]
                if before == MemberState.OPERATING.value and live:
                    raise JoinRefused(
                        f"broker id {self.broker_id} is in use in cluster "
                        f"{self.cluster_id or '(no id)'}: the process {pid} on {host} holds it "
                        "with a live lease. Stop that broker, or give this one another "
                        "imq.brokerid"
                    )
                if before == MemberState.TAKEOVER_STARTED.value and taker_live:
                    log.info(
                        "broker %s is taking over this broker's store; waiting for it to finish",
                        taken_over_by,
                    )
                    return None
            epoch += 1
            connection.execute(
                "UPDATE sluiceway_broker SET state = %s, epoch = %s, stomp_address = %s, "
                "admin_address = %s, host = %s, pid = %s, version = %s, started_at = now(), "
                "heartbeat_at = now(), lease_until = now() + make_interval(secs => %s), "
                "taken_over_by = NULL, takeover_started_at = NULL, takeover_ended_at = NULL, "
                "messages = 0 WHERE cluster_id = %s AND broker_id = %s",
                (
                    MemberState.OPERATING.value,
                    epoch,
                    stomp_address,
                    admin_address,
                    socket.gethostname(),
                    os.getpid(),
                    __version__,
                    self.lease.lease_seconds,
                    *self._key,
                ),
            )
            kind = table.JOINED if before is None else table.REJOINED
            detail = f"epoch {epoch}, STOMP on {stomp_address or '(not yet bound)'}"
            if before is not None:
                detail += f", was {before}"
            table.record_event(connection, self.cluster_id, self.broker_id, kind, detail)
        return Joined(epoch, before, taken_over_by, ended)

    def _log_join(self, joined: Joined, address: str) -> None:
        if joined.before == MemberState.TAKEOVER_COMPLETE.value:
            log.warning(
                "rejoining after broker %s took over its store at %s",
                joined.taken_over_by,
                joined.takeover_ended_at,
            )
        elif joined.before == MemberState.TAKEOVER_STARTED.value:
            log.warning(
                "rejoining: broker %s began to take over its store and stopped (its lease ran "
                "out); this broker's store is its own again",
                joined.taken_over_by,
            )
        self._joined = joined
        if address:  # else set_addresses says it, once the listeners are bound
            self._log_joined(address)

    def _log_joined(self, address: str) -> None:
        joined = self._joined
        assert joined is not None
        log.info(
            "joined cluster %s as broker %s: epoch %d, STOMP on %s%s",
            self.cluster_id or "(no id)",
            self.broker_id,
            joined.epoch,
            address,
            f" (was {joined.before})" if joined.before else "",
        )

    def set_addresses(self, stomp_address: str, admin_address: str) -> None:
        """Record the addresses the listeners were bound to (known once bound, with port 0)."""
        with self.database.connect(autocommit=True) as connection:
            connection.execute(
                "UPDATE sluiceway_broker SET stomp_address = %s, admin_address = %s "
                "WHERE cluster_id = %s AND broker_id = %s AND epoch = %s",
                (stomp_address, admin_address, *self._key, self.epoch),
            )
        self._log_joined(stomp_address)

    # -- the heartbeat ---------------------------------------------------------------------------

    def start_heartbeat(self) -> None:
        """Renew the lease every imq.cluster.heartbeat.interval on a thread of its own."""
        self._thread = threading.Thread(
            target=self._beat, name=f"cluster-heartbeat-{self.broker_id}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        due = time.monotonic() + self.heartbeat_interval
        while not self._stopping.wait(max(due - time.monotonic(), 0)):
            due = time.monotonic() + self.heartbeat_interval
            try:
                self.renew()
            except Exception:  # the heartbeat must outlive a bug in one renewal
                log.exception("cluster heartbeat failed")
            if self.lease.reason is not None:
                break
        self._close_connection()

    def renew(self) -> bool:
        """One renewal: True when the database took it. No row to renew loses the lease; an
        unreachable database loses it once it has run out."""
        sent = lease_clock()
        try:
            connection = self._connect()
            renewed = connection.execute(
                "UPDATE sluiceway_broker SET heartbeat_at = now(), "
                "lease_until = now() + make_interval(secs => %s), messages = %s "
                "WHERE cluster_id = %s AND broker_id = %s AND epoch = %s AND state = %s",
                (
                    self.lease.lease_seconds,
                    self.messages(),
                    *self._key,
                    self.epoch,
                    MemberState.OPERATING.value,
                ),
            ).rowcount
            if renewed != 1:
                self.lease.lose(self._why_gone(connection))
                return False
        except Exception as error:  # psycopg's errors and DatabaseError alike
            self._unreachable(error)
            return False
        if self._unreachable_since is not None:
            log.info("cluster heartbeat: the database answers again; lease renewed")
            self._unreachable_since = None
        self.lease.renewed(sent)
        return True

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._connection is None or self._connection.closed:
            connection = self.database.connect(autocommit=True)
            # A renewal that waits longer than the lease is of no use: give it up, retry.
            milliseconds = max(1, round(self.lease.lease_seconds * 1000))
            connection.execute(f"SET statement_timeout = {milliseconds}")
            self._connection = connection
        return self._connection

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        table.close_quietly(connection)

    def _unreachable(self, error: Exception) -> None:
        self._close_connection()
        reason = " ".join(str(error).split()) or type(error).__name__
        if self._unreachable_since is None:
            self._unreachable_since = time.time()
            log.warning(
                "cluster heartbeat: cannot renew this broker's lease (%.1f s left): %s",
                self.lease.remaining,
                reason if isinstance(error, DatabaseError) else f"{self.database.shown}: {reason}",
            )
        if self.lease.remaining <= 0:
            since = time.strftime("%H:%M:%S", time.localtime(self._unreachable_since))
            shown = self.database.shown
            self.lease.lose(f"the database {shown} has been unreachable since {since}")

    def _why_gone(self, connection: psycopg.Connection[tuple[object, ...]]) -> str:
        row = connection.execute(
            "SELECT state, epoch, taken_over_by FROM sluiceway_broker "
            "WHERE cluster_id = %s AND broker_id = %s",
            self._key,
        ).fetchone()
        if row is None:
            return "its row was deleted from the database"
        state, epoch, by = row
        if by:
            return f"it was taken over by broker {by} (state {state}, epoch {epoch})"
        if epoch != self.epoch:
            return f"another process joined as broker {self.broker_id} (epoch {epoch})"
        return f"it was declared {state} by another member"

    # -- leaving ---------------------------------------------------------------------------------

    def stop_heartbeat(self, timeout: float = 5.0) -> None:
        """Stop renewing (the lease then runs out on its own) and close the connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._close_connection()

    def leave(self) -> bool:
        """A clean stop: SHUTDOWN_COMPLETE (the store stays this broker's: no takeover). False
        when the row was no longer this broker's (its lease had been lost)."""
        self.stop_heartbeat()
        if self.lease.reason is not None or not self.epoch:
            return False
        with self.database.connect() as connection, connection.transaction():
            left = connection.execute(
                "UPDATE sluiceway_broker SET state = %s, heartbeat_at = now(), "
                "lease_until = now(), messages = %s "
                "WHERE cluster_id = %s AND broker_id = %s AND epoch = %s AND state = %s",
                (
                    MemberState.SHUTDOWN_COMPLETE.value,
                    self.messages(),
                    *self._key,
                    self.epoch,
                    MemberState.OPERATING.value,
                ),
            ).rowcount
            if left:
                detail = f"epoch {self.epoch}"
                table.record_event(
                    connection, self.cluster_id, self.broker_id, table.SHUTDOWN, detail
                )
        if left:
            log.info("left cluster %s: broker %s shut down", self.cluster_id, self.broker_id)
        return bool(left)

    def record_fenced(self, reason: str) -> None:
        """Write the fencing into the event table when the database can still be reached (the
        log line is the record that always exists)."""
        try:
            with self.database.connect(autocommit=True) as connection:
                table.record_event(
                    connection,
                    self.cluster_id,
                    self.broker_id,
                    table.FENCED,
                    f"epoch {self.epoch}: {reason}",
                )
        except Exception as error:  # unreachable is the usual reason to be fenced
            log.debug("could not record the fencing: %s", error)
