"""The record of a cluster's durable subscriptions (cluster.durables): in the shared database on
a real PostgreSQL, and its in-memory twin, held to the same rules; the queue a subscriber on
another member reads; and the directory the core asks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar, cast

import psycopg
import pytest

from sluiceway.cluster.durables import (
    DatabaseDurables,
    DurableDirectory,
    DurableRecords,
    SharedDurables,
    durable_queue,
    is_durable_queue,
)
from sluiceway.naming import parse_destination
from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema

pytestmark = pytest.mark.timeout(60)

R = TypeVar("R")
Records = Callable[[str], DurableRecords]
Stop = Callable[[str], None]


def member_row(url: str, broker: str, state: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO sluiceway_broker (cluster_id, broker_id, state) VALUES ('c1', %s, %s) "
            "ON CONFLICT (cluster_id, broker_id) DO UPDATE SET state = EXCLUDED.state",
            (broker, state),
        )


class Closing(Protocol):
    def close(self) -> None: ...


def record_views(
    request: pytest.FixtureRequest,
    shared: tuple[Callable[[str], R], Stop],
    in_database: Callable[[Database, str], Closing],
) -> Iterator[tuple[Callable[[str], R], Stop]]:
    """(a member's view of a record, stopping a member) for the in-memory record `shared` or,
    on a real PostgreSQL with members a, b and c operating, the one `in_database` makes."""
    if request.param == "memory":
        yield shared
        return
    url = request.getfixturevalue("pg_url")
    database = Database(url)
    ensure_schema(database)
    views: list[Closing] = []
    for broker in ("a", "b", "c"):
        member_row(url, broker, "OPERATING")

    def view(broker: str) -> R:
        views.append(in_database(database, broker))
        return cast("R", views[-1])

    yield view, lambda broker: member_row(url, broker, "FAILED")
    for made in views:
        made.close()


@pytest.fixture(params=["database", "memory"])
def record(request: pytest.FixtureRequest) -> Iterator[tuple[Records, Stop]]:
    """(a member's view of the record, stopping a member) for either kind of record."""
    shared = SharedDurables()
    yield from record_views(
        request,
        (shared.member, shared.gone.add),
        lambda database, broker: DatabaseDurables(database, "c1", broker),
    )


def test_each_member_reads_where_the_others_subscriptions_live(
    record: tuple[Records, Stop],
) -> None:
    view, _ = record
    a, b = view("a"), view("b")
    assert a.exchange([("c1", "audit", "/topic/t"), ("c2", "x", "/topic/u")]) == {}
    assert b.exchange([("c3", "y", "/topic/t")]) == {("c1", "audit"): "a", ("c2", "x"): "a"}
    assert a.exchange([("c1", "audit", "/topic/t")]) == {("c3", "y"): "b"}
    # a ended ("c2", "x"): gone from the record
    assert b.exchange([("c3", "y", "/topic/t")]) == {("c1", "audit"): "a"}


def test_a_subscription_living_on_an_operating_member_stays_its(
    record: tuple[Records, Stop],
) -> None:
    view, stop = record
    a, b = view("a"), view("b")
    a.exchange([("c1", "audit", "/topic/t")])
    # b made one of the same name (before it knew): the record keeps a's.
    assert b.exchange([("c1", "audit", "/topic/t")]) == {("c1", "audit"): "a"}
    assert a.exchange([("c1", "audit", "/topic/t")]) == {}
    # Once a no longer operates, b's is the one.
    stop("a")
    assert b.exchange([("c1", "audit", "/topic/t")]) == {}
    assert view("c").exchange([]) == {("c1", "audit"): "b"}


def test_the_queue_of_a_subscriber_elsewhere_is_a_valid_distinct_name() -> None:
    names = {
        durable_queue("auditor", "audit"),
        durable_queue("auditor", "audit2"),
        durable_queue("auditor.audit", ""),
        durable_queue("a/b c", "\u00e9t\u00e9"),
        durable_queue("a_b_c", "\u00e9t\u00e9"),
    }
    assert len(names) == 5
    for name in names:
        assert parse_destination(name.path) == name
        assert is_durable_queue(name)
    assert durable_queue("auditor", "audit").name.startswith("sluiceway.durable.auditor.audit.")
    assert not is_durable_queue(parse_destination("/queue/orders"))


def test_the_directory_serves_only_what_lives_elsewhere_and_forgets_what_ended() -> None:
    directory = DurableDirectory("b")
    topic = parse_destination("/topic/t")
    directory.update({("c1", "audit"): "a"}, own=[("c2", "mine")])
    assert directory.serve("c2", "mine", topic, "") is None  # lives here
    assert directory.serve("c9", "new", topic, "") is None  # new: made here
    queue = directory.serve("c1", "audit", topic, "x > 1")
    assert queue == durable_queue("c1", "audit")
    assert directory.home(("c1", "audit")) == "a"
    assert directory.attached([queue])[queue].selector == "x > 1"
    # Its home fails and this broker takes it over: the subscriber attached here keeps reading.
    directory.update({}, own=[("c1", "audit")])
    assert directory.home(("c1", "audit")) == "b"
    assert queue in directory.attachments
    directory.update({("c1", "audit"): "a"}, own=[])
    directory.remove("c1", "audit")
    assert directory.removals == {("c1", "audit"): "a"}
    assert directory.queue_of("c1", "audit") is None
    directory.update({("c1", "audit"): "a"}, own=[])  # its home has not ended it yet
    assert directory.serve("c1", "audit", topic, "") is None
    directory.removed(("c1", "audit"))
    directory.update({}, own=[])
    assert directory.removals == {}
