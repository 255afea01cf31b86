"""The record of where a cluster's pipeline positions live (cluster.positions): in the shared
database on a real PostgreSQL and its in-memory twin, held to the same rules; and the directory
the core asks, with the refusals it makes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sluiceway.cluster.peers import Peer
from sluiceway.cluster.positions import (
    LEASE_GROUP,
    SINK,
    DatabasePositions,
    Position,
    PositionDirectory,
    PositionRecords,
    SharedPositions,
)
from sluiceway.errors import Status
from sluiceway.naming import parse_destination
from tests.cluster.test_durables_record import record_views

pytestmark = pytest.mark.timeout(60)

Records = Callable[[str], PositionRecords]
Stop = Callable[[str], None]

GROUP: Position = (LEASE_GROUP, "/queue/orders", "etl.p0")
OTHER_GROUP: Position = (LEASE_GROUP, "/queue/orders", "etl.p1")
SINK_ROW: Position = (SINK, "", "spark-1234")


@pytest.fixture(params=["database", "memory"])
def record(request: pytest.FixtureRequest) -> Iterator[tuple[Records, Stop]]:
    """(a member's view of the record, stopping a member) for either kind of record."""
    shared = SharedPositions()
    yield from record_views(
        request,
        (shared.member, shared.gone.add),
        lambda database, broker: DatabasePositions(database, "c1", broker),
    )


def test_each_member_reads_where_the_others_positions_live(
    record: tuple[Records, Stop],
) -> None:
    view, _ = record
    a, b = view("a"), view("b")
    assert a.exchange([GROUP, SINK_ROW]) == {}
    assert b.exchange([OTHER_GROUP]) == {GROUP: "a", SINK_ROW: "a"}
    assert a.exchange([GROUP]) == {OTHER_GROUP: "b"}  # a forgot its sink
    assert b.exchange([OTHER_GROUP]) == {GROUP: "a"}


def test_a_position_on_an_operating_member_stays_its_and_moves_once_it_failed(
    record: tuple[Records, Stop],
) -> None:
    view, stop = record
    a, b, c = view("a"), view("b"), view("c")
    a.exchange([GROUP])
    # b started the same group before it knew: the record keeps a's, and tells b.
    assert b.exchange([GROUP]) == {GROUP: "a"}
    assert c.exchange([]) == {GROUP: "a"}
    stop("a")
    assert b.exchange([GROUP]) == {}  # a no longer operates: b's from now on
    assert c.exchange([]) == {GROUP: "b"}


def directory() -> PositionDirectory:
    made = PositionDirectory("b")
    made.follow([Peer("a", "127.0.0.1", 61613), Peer("b", "127.0.0.1", 61614)])
    made.update({GROUP: "a", SINK_ROW: "c"}, [OTHER_GROUP])
    return made


def test_the_directory_refuses_what_lives_on_another_member_naming_it() -> None:
    homes = directory()
    orders = parse_destination("/queue/orders")
    refusal = homes.lease_group(orders, "etl.p0")
    assert refusal is not None
    assert refusal.status is Status.UNAVAILABLE
    assert (refusal.member, refusal.member_address) == ("a", "127.0.0.1:61613")
    assert refusal.destination == "/queue/orders"
    assert "lease group 'etl.p0' of /queue/orders lives on cluster member a" in str(refusal)
    # Its own, and what the record does not know, are served here.
    assert homes.lease_group(orders, "etl.p1") is None
    assert homes.lease_group(orders, "new") is None
    assert homes.lease_group(parse_destination("/queue/other"), "etl.p0") is None
    assert homes.everywhere() == {GROUP: "a", SINK_ROW: "c", OTHER_GROUP: "b"}


def test_a_position_on_a_member_that_does_not_operate_is_refused_without_an_address() -> None:
    refusal = directory().sink("spark-1234")
    assert refusal is not None
    assert (refusal.member, refusal.member_address) == ("c", None)
    assert "does not operate now" in str(refusal)
    assert "try again" in str(refusal)
