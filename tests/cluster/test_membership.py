"""Membership on a real PostgreSQL, without a broker: joining with a new epoch, refusing a
second process with the same broker id, waiting for a takeover of this broker's store, the
heartbeat that renews the lease (and loses it when the row is no longer this broker's), a clean
leave, and the member's own view of its lease."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from sluiceway.cluster.lease import Lease, MemberState, lease_clock
from sluiceway.cluster.member import ClusterMember
from sluiceway.cluster.membership import JoinRefused, Membership
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from tests.cluster.members import (
    CLUSTER,
    PROCESS,
    events,
    expire,
    member_config,
    row,
    set_lease,
)
from tests.e2e.support import wait_until


def membership(url: str, broker_id: str, **kwargs: object) -> Membership:
    return Membership(Database(url), member_config(url, broker_id), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def db(pg_url: str) -> str:
    ensure_schema(Database(pg_url))
    return pg_url


def set_state(url: str, broker_id: str, state: str, taken_over_by: str | None = None) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "UPDATE sluiceway_broker SET state = %s, taken_over_by = %s, "
            "takeover_started_at = now(), takeover_ended_at = now() "
            "WHERE cluster_id = %s AND broker_id = %s",
            (state, taken_over_by, CLUSTER, broker_id),
        )


def test_a_first_join_writes_an_operating_row_with_epoch_1(db: str) -> None:
    member = membership(db, "a")
    joined = member.join("127.0.0.1:61613", "127.0.0.1:61680")
    assert (joined.epoch, joined.before) == (1, None)
    found = row(db, "a")
    assert found["state"] == "OPERATING"
    assert found["epoch"] == 1
    assert found["stomp_address"] == "127.0.0.1:61613"
    assert found["admin_address"] == "127.0.0.1:61680"
    assert found["lease_until"] > found["heartbeat_at"]  # type: ignore[operator]
    assert events(db, "a") == ["joined"]
    assert member.lease.holds()
    assert member.store_fence.epoch == 1


def test_a_second_process_with_the_same_broker_id_is_refused(db: str) -> None:
    membership(db, "a").join()
    with pytest.raises(JoinRefused, match=r"broker id a is in use .* another imq.brokerid"):
        membership(db, "a").join()
    assert row(db, "a")["epoch"] == 1


def test_a_broker_whose_lease_ran_out_rejoins_with_a_new_epoch(db: str) -> None:
    membership(db, "a").join()
    expire(db, "a")  # it crashed: no heartbeat since
    assert membership(db, "a").join().epoch == 2
    assert events(db, "a") == ["joined", "rejoined"]


def test_a_clean_leave_then_a_restart_takes_a_higher_epoch(db: str) -> None:
    first = membership(db, "a")
    first.join()
    assert first.leave()
    assert row(db, "a")["state"] == "SHUTDOWN_COMPLETE"
    second = membership(db, "a")
    assert second.join().epoch == 2
    assert row(db, "a")["state"] == "OPERATING"
    assert events(db, "a") == ["joined", "shutdown", "rejoined"]


def test_rejoining_after_a_takeover_says_who_took_the_store_over(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    membership(db, "a").join()
    set_state(db, "a", "TAKEOVER_COMPLETE", "b")
    with caplog.at_level(logging.INFO, "sluiceway.cluster"):
        joined = membership(db, "a").join()
    assert joined.before == "TAKEOVER_COMPLETE"
    assert "rejoining after broker b took over its store at" in caplog.text
    found = row(db, "a")
    assert (found["state"], found["taken_over_by"]) == ("OPERATING", None)


def test_a_join_waits_while_a_live_member_takes_its_store_over(db: str) -> None:
    membership(db, "b").join()  # the taker, its lease live for the test
    set_lease(db, "b", 60)
    membership(db, "a").join()
    set_state(db, "a", "TAKEOVER_STARTED", "b")
    joined: list[int] = []
    joiner = threading.Thread(target=lambda: joined.append(membership(db, "a").join().epoch))
    joiner.start()
    time.sleep(0.5)  # the joiner polls meanwhile; it must not go on
    assert not joined
    assert row(db, "a")["state"] == "TAKEOVER_STARTED"
    set_state(db, "a", "TAKEOVER_COMPLETE", "b")
    joiner.join(10)
    assert joined == [2]


def test_a_join_gives_up_when_the_takeover_does_not_end(db: str) -> None:
    membership(db, "b").join()
    set_lease(db, "b", 60)
    membership(db, "a").join()
    set_state(db, "a", "TAKEOVER_STARTED", "b")
    with pytest.raises(JoinRefused, match="taking over its store for more than 1 s"):
        membership(db, "a", takeover_wait=1.0).join()


def test_a_takeover_by_a_member_whose_lease_ran_out_does_not_hold_the_join(db: str) -> None:
    membership(db, "b").join()
    membership(db, "a").join()
    set_state(db, "a", "TAKEOVER_STARTED", "b")
    expire(db, "b")
    assert membership(db, "a", takeover_wait=5.0).join().epoch == 2


def test_each_renewal_moves_the_lease_and_writes_the_message_count(db: str) -> None:
    member = membership(db, "a", messages=lambda: 42)
    member.join()
    before = row(db, "a")  # (a transaction of its own: the renewal's now() comes later)
    assert member.renew()
    member.stop_heartbeat()
    after = row(db, "a")
    assert after["lease_until"] > before["lease_until"]  # type: ignore[operator]
    assert after["messages"] == 42


def test_a_renewal_that_finds_the_broker_declared_failed_loses_the_lease_at_once(db: str) -> None:
    lost: list[str] = []
    member = membership(db, "a")
    member.lease.set_on_lost(lost.append)
    member.join()
    set_state(db, "a", "TAKEOVER_STARTED", "b")
    assert not member.renew()
    assert not member.lease.holds()
    assert lost == ["it was taken over by broker b (state TAKEOVER_STARTED, epoch 1)"]
    assert not member.leave()  # the row is not its own any more: left as it is
    assert row(db, "a")["state"] == "TAKEOVER_STARTED"


def test_a_renewal_after_another_process_joined_as_this_broker_loses_the_lease(db: str) -> None:
    first = membership(db, "a")
    first.join()
    expire(db, "a")
    membership(db, "a").join()
    assert not first.renew()
    first.stop_heartbeat()
    assert first.lease.reason == "another process joined as broker a (epoch 2)"


def test_the_heartbeat_thread_keeps_the_lease_live(db: str) -> None:
    member = Membership(Database(db), member_config(db, "a", **PROCESS))
    member.join()
    member.start_heartbeat()
    try:
        # Three lease lengths (2 s each): only renewals keep it.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert member.lease.holds(), member.lease.reason
            time.sleep(0.1)
    finally:
        assert member.leave()
    assert row(db, "a")["state"] == "SHUTDOWN_COMPLETE"


def test_an_unreachable_database_loses_the_lease_once_it_has_run_out(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[str] = []
    member = membership(db, "a")
    member.lease.set_on_lost(lost.append)
    member.join()
    member.database = Database(db.replace(db.rsplit("/", 1)[1], "no_such_database"))
    with caplog.at_level(logging.WARNING, "sluiceway.cluster"):
        assert not member.renew()
        assert lost == []  # not run out yet: the database may come back
        wait_until(lambda: member.lease.remaining <= 0)
        assert not member.renew()
    member.stop_heartbeat()
    assert len(lost) == 1
    assert "no_such_database has been unreachable since" in lost[0]
    assert "cannot renew this broker's lease" in caplog.text


def test_the_lease_runs_out_by_its_own_clock_and_is_lost_once() -> None:
    lost: list[str] = []
    lease = Lease(1.0, lost.append)
    assert not lease.holds()  # not joined: nothing to lose yet
    assert lost == []
    lease.renewed(lease_clock())
    assert lease.holds()
    wait_until(lambda: not lease.holds())
    assert not lease.holds()
    assert len(lost) == 1
    assert lost[0].startswith("its lease ran out: no renewal reached the database since")
    lease.renewed(lease_clock())  # too late: lost for good
    assert not lease.holds()


def test_a_renewal_counts_from_when_it_was_sent_not_when_it_came_back() -> None:
    lease = Lease(1.0)
    sent = lease_clock() - 0.9  # a renewal that took 0.9 s to come back
    lease.renewed(sent)
    assert lease.remaining <= 0.1


def test_a_member_creates_the_tables_joins_and_leaves(pg_url: str) -> None:
    member = ClusterMember(member_config(pg_url, "a", **PROCESS))
    member.join()
    member.start("127.0.0.1:1", "127.0.0.1:2")
    try:
        wait_until(lambda: member.snapshot is not None)
        snapshot = member.snapshot
        assert snapshot is not None
        assert [(m.broker_id, m.state, m.stomp_address) for m in snapshot.members] == [
            ("a", MemberState.OPERATING.value, "127.0.0.1:1")
        ]
    finally:
        member.stop()
    assert row(pg_url, "a")["state"] == "SHUTDOWN_COMPLETE"
