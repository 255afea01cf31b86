"""Failure detection and takeover claims on a real PostgreSQL, without a broker: who is
declared failed and when, one winner when two members claim together, how a takeover ends, and
which claims are never made."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import psycopg
import pytest

from sluiceway.cluster.membership import Membership
from sluiceway.cluster.monitor import Claim, Monitor, TakenOver
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from tests.cluster.members import events, expire, member_config, row, set_lease


class RecordingTakeover:
    """Records each takeover it is asked for; fails while `failing` is set."""

    def __init__(self, messages: int = 3, durables: int = 1) -> None:
        self.calls: list[tuple[str, int]] = []
        self.moved = TakenOver(messages, durables)
        self.failing = False

    def take_over(self, broker_id: str, epoch: int) -> TakenOver:
        self.calls.append((broker_id, epoch))
        if self.failing:
            raise RuntimeError("the journal of the failed broker could not be read")
        return self.moved


class Members:
    """Joined memberships and their monitors on one database, all closed after the test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connections: list[psycopg.Connection[tuple[object, ...]]] = []
        self.monitors: list[Monitor] = []

    def join(self, broker_id: str) -> Membership:
        member = Membership(Database(self.url), member_config(self.url, broker_id))
        member.join()
        set_lease(self.url, broker_id, 60)  # live for the test, without a heartbeat thread
        return member

    def monitor(
        self,
        member: Membership,
        takeover: RecordingTakeover | None = None,
        properties: dict[str, str] | None = None,
    ) -> Monitor:
        config = member_config(self.url, member.broker_id, **(properties or {}))
        monitor = Monitor(Database(self.url), config, member.lease, takeover)
        self.monitors.append(monitor)
        return monitor

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        connection = Database(self.url).connect(autocommit=True)
        self.connections.append(connection)
        return connection


@pytest.fixture
def members(pg_url: str) -> Iterator[Members]:
    ensure_schema(Database(pg_url))
    found = Members(pg_url)
    yield found
    for connection in found.connections:
        connection.close()
    for monitor in found.monitors:
        monitor.stop()


def test_a_member_is_declared_failed_only_past_its_lease_and_the_margin(
    members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    a = members.join("a")
    members.join("b")
    # A margin of 10 x 3 = 30 s, so that the test does not race it.
    margin = {"imq.cluster.monitor.interval": "10", "imq.cluster.monitor.threshold": "3"}
    monitor = members.monitor(a, properties=margin)
    connection = members.connect()
    set_lease(members.url, "b", -5)  # ran out, but the margin has not passed
    assert monitor.declare_failed(connection) == []
    assert row(members.url, "b")["state"] == "OPERATING"
    set_lease(members.url, "b", -31)
    with caplog.at_level(logging.WARNING, "sluiceway.cluster"):
        monitor.round()
    assert row(members.url, "b")["state"] == "FAILED"
    assert events(members.url, "b") == ["joined", "declared-failed"]
    assert "declared broker b failed: its last heartbeat was at" in caplog.text
    assert "s ago" in caplog.text
    # Declared once: the next round finds nothing more to declare.
    assert monitor.declare_failed(connection) == []


def test_a_member_never_declares_itself_failed(members: Members) -> None:
    a = members.join("a")
    expire(members.url, "a")
    assert members.monitor(a).declare_failed(members.connect()) == []
    assert row(members.url, "a")["state"] == "OPERATING"


def test_without_a_takeover_failures_are_declared_but_never_claimed(members: Members) -> None:
    a = members.join("a")
    members.join("b")
    expire(members.url, "b")
    monitor = members.monitor(a)
    assert monitor.round() == []
    assert row(members.url, "b")["state"] == "FAILED"
    assert monitor.snapshot is not None
    assert {m.broker_id: m.state for m in monitor.snapshot.members} == {
        "a": "OPERATING",
        "b": "FAILED",
    }


def test_the_claimant_takes_over_and_marks_the_takeover_complete(
    members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    a = members.join("a")
    members.join("b")
    expire(members.url, "b")
    takeover = RecordingTakeover(messages=7, durables=2)
    monitor = members.monitor(a, takeover)
    with caplog.at_level(logging.INFO, "sluiceway.cluster"):
        assert monitor.round() == [Claim("b", 2)]
    assert takeover.calls == [("b", 2)]  # the claim bumped the epoch: b's writes are fenced
    found = row(members.url, "b")
    assert (found["state"], found["taken_over_by"], found["epoch"]) == ("TAKEOVER_COMPLETE", "a", 2)
    assert found["takeover_ended_at"] >= found["takeover_started_at"]  # type: ignore[operator]
    assert events(members.url, "b")[-3:] == [
        "declared-failed",
        "takeover-started",
        "takeover-complete",
    ]
    assert "broker a took over broker b's store: 7 messages, 2 durable subscriptions in" in (
        caplog.text
    )
    assert monitor.takeovers == 1
    assert monitor.round() == []  # nothing left to claim


def claim_together(members: Members, monitors: list[Monitor]) -> list[Claim | None]:
    """Every monitor claims at the same moment, each on its own connection."""
    start = threading.Barrier(len(monitors))
    found: list[Claim | None] = [None] * len(monitors)
    connections = [members.connect() for _ in monitors]

    def claim(index: int) -> None:
        start.wait(10)
        found[index] = monitors[index].claim(connections[index])

    threads = [threading.Thread(target=claim, args=(index,)) for index in range(len(monitors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return found


def test_two_members_claiming_one_failed_member_together_make_one_winner(
    members: Members,
) -> None:
    a, c = members.join("a"), members.join("c")
    monitors = [members.monitor(a, RecordingTakeover()), members.monitor(c, RecordingTakeover())]
    for attempt in range(6):
        failed = f"f{attempt}"
        members.join(failed)
        expire(members.url, failed)
        monitors[0].declare_failed(members.connect())
        claims = claim_together(members, monitors)
        winners = [index for index, claim in enumerate(claims) if claim is not None]
        assert len(winners) == 1, claims
        found = row(members.url, failed)
        assert found["state"] == "TAKEOVER_STARTED"
        assert found["taken_over_by"] == ("a", "c")[winners[0]]
        assert found["epoch"] == 2


def test_members_claiming_together_never_claim_the_same_member_twice(members: Members) -> None:
    claimants = [members.join(name) for name in ("a", "c", "d")]
    failed = [f"f{number}" for number in range(5)]
    for broker_id in failed:
        members.join(broker_id)
        expire(members.url, broker_id)
    monitors = [members.monitor(member, RecordingTakeover()) for member in claimants]
    monitors[0].declare_failed(members.connect())
    claimed: list[str] = []
    for _ in failed:
        claimed += [c.broker_id for c in claim_together(members, monitors) if c is not None]
    assert sorted(claimed) == failed  # each once
    assert all(row(members.url, broker_id)["epoch"] == 2 for broker_id in failed)


def test_a_failed_takeover_goes_back_to_failed_for_another_member(
    members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    a, c = members.join("a"), members.join("c")
    members.join("b")
    expire(members.url, "b")
    failing = RecordingTakeover()
    failing.failing = True
    with caplog.at_level(logging.ERROR, "sluiceway.cluster"):
        members.monitor(a, failing).round()
    assert "taking over broker b's store failed" in caplog.text
    assert row(members.url, "b")["state"] == "FAILED"
    assert events(members.url, "b")[-1] == "takeover-failed"
    working = RecordingTakeover()
    assert members.monitor(c, working).round() == [Claim("b", 3)]
    assert row(members.url, "b")["state"] == "TAKEOVER_COMPLETE"
    assert row(members.url, "b")["taken_over_by"] == "c"


def test_a_takeover_whose_taker_died_is_claimed_again(members: Members) -> None:
    a, c = members.join("a"), members.join("c")
    members.join("b")
    expire(members.url, "b")
    connection = members.connect()
    monitor_a = members.monitor(a, RecordingTakeover())
    monitor_a.declare_failed(connection)
    assert monitor_a.claim(connection) == Claim("b", 2)  # and then a stops beating
    monitor_c = members.monitor(c, RecordingTakeover())
    assert monitor_c.claim(connection) is None  # a's lease is live: its takeover goes on
    expire(members.url, "a")
    assert monitor_c.claim(connection) == Claim("b", 3)
    assert row(members.url, "b")["taken_over_by"] == "c"


def test_a_member_whose_own_lease_ran_out_claims_nothing(members: Members) -> None:
    a = members.join("a")
    members.join("b")
    expire(members.url, "b")
    monitor = members.monitor(a, RecordingTakeover())
    connection = members.connect()
    monitor.declare_failed(connection)
    set_lease(members.url, "a", -0.1)  # its own view may still hold; the database's does not
    assert monitor.claim(connection) is None
    assert row(members.url, "b")["state"] == "FAILED"
