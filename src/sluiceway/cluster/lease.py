"""A member's lease on its place in the cluster, as the member itself sees it, and the checks
that keep a member whose lease is gone from serving or writing anything.

The database holds each member's lease (sluiceway_broker.lease_until, by the database's clock).
A member cannot read that clock for every client frame, so it keeps its own view: the lease is
valid until `lease_seconds` after the instant (on a clock that never goes back, `lease_clock`)
at which the last renewal that succeeded was SENT. The database computes lease_until when the
renewal runs, after it was sent, so the member's own view always runs out first; the other
members wait a further margin (imq.cluster.monitor.interval x imq.cluster.monitor.threshold)
past lease_until before they declare it failed. A member whose view has run out has stopped
serving before any other member may take its store over, whatever its clock and however long
it was paused.

`StoreFence` is the second line: the store checks, inside every commit's transaction, that the
database still names this broker OPERATING with the epoch it joined with. A takeover bumps the
epoch first, so a write of a broker that was taken over can never become durable.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from sluiceway.persist.pg_files import Fenced

if TYPE_CHECKING:
    import psycopg

# The clock of the lease: CLOCK_BOOTTIME where there is one (Linux), which keeps counting while
# the machine is suspended, as the other members' time does; the monotonic clock elsewhere.
_BOOTTIME: Final = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on a clock that never goes back and counts every second that passes."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()


class MemberState(enum.Enum):
    """A member's state in sluiceway_broker.state (docs/cluster-membership.md draws the
    transitions)."""

    OPERATING = "OPERATING"  # joined, renewing its lease
    FAILED = "FAILED"  # its lease ran out and the margin after it: declared failed
    TAKEOVER_STARTED = "TAKEOVER_STARTED"  # another member is taking its store over
    TAKEOVER_COMPLETE = "TAKEOVER_COMPLETE"  # its store was taken over; it may rejoin
    SHUTDOWN_COMPLETE = "SHUTDOWN_COMPLETE"  # stopped cleanly: its store is its own


class FencedError(Fenced):
    """This broker is no longer the cluster member it joined as (its lease ran out, or another
    member took its store over): it may make nothing durable and serve nothing."""


class Lease:
    """This member's own view of its lease: renewed by the heartbeat, read by the server on
    every client read and write, lost once for good.

    `on_lost(reason)` is called once, from whichever thread notices first (the heartbeat, the
    monitor, or the event loop's check), so it must be safe to call from any thread.
    """

    def __init__(self, lease_seconds: float, on_lost: Callable[[str], None] | None = None) -> None:
        self.lease_seconds = lease_seconds
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._until = float("-inf")  # lease_clock(); -inf until joined
        self._joined = False
        self._renewed_wall = 0.0  # time.time() of the last renewal, for the message only
        self.reason: str | None = None  # why it was lost; None while it holds

    def set_on_lost(self, on_lost: Callable[[str], None]) -> None:
        """Call `on_lost(reason)` when the lease is lost (at once if it was lost already)."""
        with self._lock:
            self._on_lost = on_lost
            reason = self.reason
        if reason is not None:
            on_lost(reason)

    def renewed(self, sent_at: float) -> None:
        """A renewal sent at `sent_at` (lease_clock) succeeded: the lease holds until
        `sent_at + lease_seconds`, unless already lost."""
        with self._lock:
            if self.reason is not None:
                return
            self._joined = True
            self._until = max(self._until, sent_at + self.lease_seconds)
            self._renewed_wall = time.time() - (lease_clock() - sent_at)

    def holds(self) -> bool:
        """Whether this broker may still serve: one clock reading and compare while it holds. The
        first call that finds it run out loses it (and calls on_lost)."""
        if lease_clock() < self._until and self.reason is None:
            return True
        if not self._joined:
            return False  # before the join nothing serves; nothing to lose yet
        if self.reason is None:
            since = time.strftime("%H:%M:%S", time.localtime(self._renewed_wall))
            self.lose(f"its lease ran out: no renewal reached the database since {since}")
        return False

    @property
    def remaining(self) -> float:
        """Seconds the lease still holds (negative: run out)."""
        return self._until - lease_clock()

    def lose(self, reason: str) -> None:
        """The lease is gone for good (run out, taken over): the broker stops serving."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
            self._until = float("-inf")
            on_lost = self._on_lost
        if on_lost is not None:
            on_lost(reason)


class StoreFence:
    """The check a store runs inside each commit: the database must still name this broker
    OPERATING with the epoch it joined with.

    The row is read FOR SHARE, so a member declaring this broker failed or claiming its store
    (an UPDATE of the same row) waits for the commit to end, and every commit that ends after
    the claim sees the claim and fails.
    """

    def __init__(self, cluster_id: str, broker_id: str, epoch: int = 0) -> None:
        self.cluster_id = cluster_id
        self.broker_id = broker_id
        self.epoch = epoch  # set when the membership joins

    def check(
        self, on: psycopg.Connection[tuple[object, ...]] | psycopg.Cursor[tuple[object, ...]]
    ) -> None:
        """Raise FencedError unless this broker still holds its place; run it inside the
        commit's transaction (`on`: its connection or a cursor of it), before the commit."""
        row = on.execute(
            "SELECT state, epoch, taken_over_by FROM sluiceway_broker "
            "WHERE cluster_id = %s AND broker_id = %s FOR SHARE",
            (self.cluster_id, self.broker_id),
        ).fetchone()
        if row is not None and row[0] == MemberState.OPERATING.value and row[1] == self.epoch:
            return
        if row is None:
            found = "no row for it"
        else:
            by = f" by {row[2]}" if row[2] else ""
            found = f"state {row[0]}{by}, epoch {row[1]}"
        raise FencedError(
            f"broker {self.broker_id} of cluster {self.cluster_id or '(no id)'} may write "
            f"nothing more: it joined with epoch {self.epoch} and the database now says "
            f"{found}. Its lease was lost; it stops serving and, restarted, rejoins"
        )
