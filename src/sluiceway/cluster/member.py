"""A broker as a cluster member: its membership (join, heartbeat, leave) and its monitor of
the others, started and stopped together, and what the admin endpoint reads of them.

The app builds one when imq.cluster.ha is true, joins before any listener serves, hands the
lease to the listeners as their fence, and stops it after the broker's store is closed (a clean
stop leaves the cluster: SHUTDOWN_COMPLETE) or once the lease is lost (the broker is fenced).
"""

from __future__ import annotations

from collections.abc import Callable

from sluiceway.cluster.lease import Lease, StoreFence
from sluiceway.cluster.membership import Membership
from sluiceway.cluster.monitor import Monitor, Takeover
from sluiceway.cluster.table import ClusterSnapshot
from sluiceway.config.cluster import ClusterConfig
from sluiceway.persist.database import Database, member_database
from sluiceway.persist.schema import ensure_schema


class ClusterMember:
    """This broker's place in its cluster."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        messages: Callable[[], int] = lambda: 0,
        takeover: Takeover | None = None,
        database: Database | None = None,
    ) -> None:
        """`messages()`: the broker's count of messages in its store (read by the heartbeat's
        thread); `takeover`: what takes a failed member's store over (None: failures are
        declared, never claimed)."""
        self.config = config
        self.database = database or member_database(config)
        self.membership = Membership(self.database, config, messages=messages)
        self.monitor = Monitor(self.database, config, self.membership.lease, takeover)

    @property
    def lease(self) -> Lease:
        return self.membership.lease

    @property
    def store_fence(self) -> StoreFence:
        return self.membership.store_fence

    @property
    def broker_id(self) -> str:
        return self.config.broker_id

    @property
    def snapshot(self) -> ClusterSnapshot | None:
        """The members as the monitor last read them (None before its first round)."""
        return self.monitor.snapshot

    def count_messages(self, messages: Callable[[], int]) -> None:
        """What the heartbeat writes as this broker's messages (read on its thread)."""
        self.membership.messages = messages

    def join(self) -> None:
        """Create the tables if the database has none, join, and start renewing the lease at
        once: opening the store may take longer than a lease (blocks: run it off the event
        loop)."""
        ensure_schema(self.database)
        self.membership.join()
        self.membership.start_heartbeat()

    def start(self, stomp_address: str, admin_address: str) -> None:
        """The listeners are bound: record where, and start watching the other members."""
        self.membership.set_addresses(stomp_address, admin_address)
        self.monitor.start()

    def stop(self) -> None:
        """Stop watching and renewing; leave cleanly unless the lease was lost (blocks)."""
        self.monitor.stop()
        reason = self.lease.reason
        if reason is None:
            self.membership.leave()
        else:
            self.membership.stop_heartbeat()
            self.membership.record_fenced(reason)
