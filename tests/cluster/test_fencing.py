"""Fencing: a member that lost its lease serves nothing and writes nothing durable.

In process, on a real PostgreSQL: the store's check (StoreFence) inside a plain transaction, and
a broker whose lease is lost ending its clients' connections with an ERROR. With broker
processes: a broker paused (SIGSTOP) past the failure time and resumed, and a broker cut off
from the database, each stop serving and exit with a failure status, before (cut off) or
whatever (paused) the other member declares them failed.
"""

from __future__ import annotations

import contextlib
import functools
import time
from datetime import datetime

import psycopg
import pytest
import stomp

from sluiceway.cli.main import EXIT_FENCED
from sluiceway.cluster.lease import FencedError, StoreFence
from sluiceway.cluster.membership import Membership
from sluiceway.cluster.monitor import Monitor
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from sluiceway.testing import BrokerProcess, BrokerThread
from sluiceway.testing.postgres import PostgresServer
from tests.cluster.members import (
    CLUSTER,
    PROCESS,
    events,
    expire,
    member_config,
    member_properties,
    row,
    set_lease,
    start_member,
)
from tests.cluster.relay import Relay
from tests.conftest import BrokerFactory
from tests.e2e.stomppy import connect, with_receipt
from tests.e2e.support import wait_until

LEASE_LOST = "this broker lost its cluster lease; reconnect to another member"


@pytest.fixture
def db(pg_url: str) -> str:
    ensure_schema(Database(pg_url))
    return pg_url


def joined(url: str, broker_id: str) -> Membership:
    member = Membership(Database(url), member_config(url, broker_id))
    member.join()
    return member


def test_the_store_fence_passes_while_the_broker_holds_its_place(db: str) -> None:
    fence = joined(db, "a").store_fence
    with psycopg.connect(db) as connection, connection.transaction():
        fence.check(connection.cursor())
        fence.check(connection)  # on the commit's connection itself, as the store runs it


def test_the_store_fence_fails_once_a_takeover_was_claimed(db: str) -> None:
    a = joined(db, "a")
    b = joined(db, "b")
    set_lease(db, "b", 60)
    expire(db, "a")
    monitor = Monitor(Database(db), member_config(db, "b"), b.lease)
    with Database(db).connect(autocommit=True) as connection:
        monitor.declare_failed(connection)
        with connection.transaction():
            connection.execute(  # a claim, as a monitor with a takeover makes it
                "UPDATE sluiceway_broker SET state = 'TAKEOVER_STARTED', taken_over_by = 'b', "
                "epoch = epoch + 1 WHERE cluster_id = %s AND broker_id = 'a'",
                (CLUSTER,),
            )
    expected = r"joined with epoch 1 .* TAKEOVER_STARTED by b"
    with (
        psycopg.connect(db) as connection,
        connection.transaction(),
        pytest.raises(FencedError, match=expected),
    ):
        a.store_fence.check(connection.cursor())


def test_the_store_fence_fails_for_a_broker_that_never_joined(db: str) -> None:
    with (
        psycopg.connect(db) as connection,
        connection.transaction(),
        pytest.raises(FencedError, match="no row for it"),
    ):
        StoreFence(CLUSTER, "nobody", 1).check(connection.cursor())


def test_a_commit_under_way_holds_off_the_declaration_until_it_ends(db: str) -> None:
    a = joined(db, "a")
    expire(db, "a")
    with psycopg.connect(db) as store, psycopg.connect(db, autocommit=True) as other:
        with store.transaction():
            a.store_fence.check(store.cursor())  # the commit's check: the row is shared-locked
            other.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("UPDATE sluiceway_broker SET state = 'FAILED' WHERE broker_id = 'a'")
        other.execute("UPDATE sluiceway_broker SET state = 'FAILED' WHERE broker_id = 'a'")
    assert row(db, "a")["state"] == "FAILED"


def test_the_monitor_skips_a_member_whose_commit_is_under_way_until_it_ends(db: str) -> None:
    a = joined(db, "a")
    b = joined(db, "b")
    set_lease(db, "b", 60)
    expire(db, "a")
    monitor = Monitor(Database(db), member_config(db, "b"), b.lease)
    with psycopg.connect(db) as store, Database(db).connect(autocommit=True) as watching:
        with store.transaction():
            a.store_fence.check(store.cursor())
            assert monitor.declare_failed(watching) == []  # not waited for: skipped
        assert [d.broker_id for d in monitor.declare_failed(watching)] == ["a"]


def test_a_broker_that_lost_its_lease_ends_every_connection_with_an_error(
    make_broker: object, db: str
) -> None:
    broker = BrokerThread(member_properties(db, "a", **PROCESS))
    broker.start()
    try:
        producer, recorder = connect(broker.port)
        consumer, received = connect(broker.port)
        consumer.subscribe("/queue/q", "1")
        services = broker.services
        assert services is not None
        assert services.cluster is not None
        lease = services.cluster.lease
        broker.call(lambda: lease.lose("taken over by broker b (a test)"))
        send_quietly(producer, "after", "r1")
        wait_until(lambda: bool(recorder.errors) or recorder.disconnected)
        wait_until(lambda: bool(received.errors) or received.disconnected)
        assert "r1" not in recorder.receipts
        assert not received.messages
        assert recorder.errors[0].headers["message"] == LEASE_LOST
        assert services.fenced == "taken over by broker b (a test)"
    finally:
        broker.stop()
    assert events(db, "a")[-1] == "fenced"
    assert row(db, "a")["state"] == "OPERATING"  # left as it was: the others decide


class Switch:
    """A fence a test turns off: nothing else happens (no stop), so only the listener's own
    checks can keep the broker from acting."""

    def __init__(self) -> None:
        self.on = True

    def holds(self) -> bool:
        return self.on


def test_a_read_after_the_fence_fell_is_never_acted_on(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    assert broker.server is not None
    fence = broker.server.fence = Switch()
    producer, sent = connect(broker.port)
    consumer, received = connect(broker.port)
    consumer.subscribe("/queue/q", "1")
    with_receipt(sent, lambda receipt: producer.send("/queue/q", "before", receipt=receipt))
    received.wait_messages(1)
    fence.on = False
    producer.send("/queue/q", "after", receipt="r-after")
    sent.wait_for(lambda: bool(sent.errors))
    assert sent.errors[0].headers["message"] == LEASE_LOST
    assert "r-after" not in sent.receipts
    assert broker.call(lambda: core_messages(broker)) == 0  # the SEND was never taken
    assert [frame.body for frame in received.messages] == ["before"]


def core_messages(broker: BrokerThread) -> int:
    assert broker.broker is not None
    return broker.broker.context.system.count


def send_kept(connection: stomp.Connection, body: str, receipt: str) -> None:
    connection.send("/queue/q", body, receipt=receipt, headers={"persistent": "true"})


def send_quietly(connection: stomp.Connection, body: str, receipt: str) -> None:
    """Send, when the connection is still open (a fenced broker may have closed it)."""
    with contextlib.suppress(stomp.exception.NotConnectedException):
        connection.send("/queue/q", body, receipt=receipt)


def wait_exit(process: BrokerProcess, timeout: float) -> int:
    status = process.process.wait(timeout)
    process.kill()  # (reaps it and reads the rest of its log)
    return status


def declared_at(url: str, broker_id: str) -> datetime:
    with psycopg.connect(url, autocommit=True) as connection:
        found = connection.execute(
            "SELECT at FROM sluiceway_event WHERE cluster_id = %s AND broker_id = %s "
            "AND kind = 'declared-failed'",
            (CLUSTER, broker_id),
        ).fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def fenced_at(log: str) -> datetime:
    """When the broker logged that it lost its lease (its log's local time)."""
    line = next(line for line in log.splitlines() if "lost its cluster lease" in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").astimezone()


@pytest.mark.timeout(120)
def test_a_broker_paused_past_the_failure_time_serves_nothing_when_it_resumes(
    db: str,
) -> None:
    with start_member(db, "a") as a, start_member(db, "b") as b:
        producer, sent = connect(b.port)
        for n in range(3):  # receipted by b before the pause: a takes them over
            with_receipt(
                sent,
                functools.partial(send_kept, producer, f"kept {n}"),
            )
        consumer, received = connect(b.port)
        consumer.subscribe("/queue/other", "1")
        watcher, watched = connect(a.port)
        b.freeze()
        try:
            wait_until(lambda: row(db, "b")["state"] != "OPERATING", timeout=30)
        finally:
            b.thaw()
        send_quietly(producer, "after the pause", "r1")
        status = wait_exit(b, 30)
        assert status == EXIT_FENCED, b.log
        assert "r1" not in sent.receipts
        assert sent.errors or sent.disconnected
        for frame in sent.errors + received.errors:
            assert frame.headers["message"] == LEASE_LOST
        assert not received.messages
        assert "stopping: this broker lost its cluster lease" in b.log
        wait_until(lambda: row(db, "b")["state"] == "TAKEOVER_COMPLETE", timeout=30)
        assert row(db, "b")["taken_over_by"] == "a"
        assert row(db, "a")["state"] == "OPERATING"
        # What b receipted before the pause is a's now, each message once.
        watcher.subscribe("/queue/q", "kept", ack="client-individual")
        kept = watched.wait_messages(3)
        assert sorted(frame.body for frame in kept) == ["kept 0", "kept 1", "kept 2"]
        assert "took over broker b's store: 3 queue messages" in a.log
        watcher.disconnect()
        for connection in (producer, consumer):
            connection.disconnect()


@pytest.mark.timeout(120)
def test_a_broker_cut_off_from_the_database_fences_itself_before_it_is_declared_failed(
    postgres: PostgresServer, db: str
) -> None:
    with Relay(postgres.port) as relay:
        cut_off = db.replace(f":{postgres.port}/", f":{relay.port}/")
        with start_member(db, "a") as a, start_member(cut_off, "b") as b:
            _client, recorder = connect(b.port)
            relay.cut()
            cut = time.monotonic()
            status = wait_exit(b, 30)
            took = time.monotonic() - cut
            assert status == EXIT_FENCED, b.log
            assert "has been unreachable since" in b.log or "lease ran out" in b.log
            wait_until(lambda: bool(recorder.errors) or recorder.disconnected)
            if recorder.errors:
                assert recorder.errors[0].headers["message"] == LEASE_LOST
            wait_until(lambda: row(db, "b")["state"] == "TAKEOVER_COMPLETE", timeout=30)
            assert fenced_at(b.log) < declared_at(db, "b")
            assert took < 30
            a.stop()
    # Its fencing could not be recorded (no database): declared failed, then taken over.
    assert events(db, "b")[-3:] == ["declared-failed", "takeover-started", "takeover-complete"]


@pytest.mark.timeout(120)
def test_a_restart_after_a_clean_stop_rejoins_with_a_higher_epoch(db: str) -> None:
    with start_member(db, "a") as first:
        status, log = first.stop()
    assert status == 0, log
    assert (row(db, "a")["state"], row(db, "a")["epoch"]) == ("SHUTDOWN_COMPLETE", 1)
    with start_member(db, "a") as second:
        assert (row(db, "a")["state"], row(db, "a")["epoch"]) == ("OPERATING", 2)
        assert "joined cluster c1 as broker a: epoch 2, STOMP on 127.0.0.1:" in second.log
        assert "(was SHUTDOWN_COMPLETE)" in second.log
        second.stop()


@pytest.mark.timeout(120)
def test_a_second_broker_with_the_same_id_does_not_start(db: str) -> None:
    with start_member(db, "a") as first:
        with pytest.raises(RuntimeError, match="broker id a is in use in cluster c1"):
            start_member(db, "a")
        assert row(db, "a")["pid"] == first.process.pid
        first.stop()
