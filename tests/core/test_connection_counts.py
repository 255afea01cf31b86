"""Connection counts: in all and per address, against imq.stomp.max_connections[_per_address]."""

from __future__ import annotations

from sluiceway.core.values.connection_counts import ConnectionCounts
from sluiceway.errors import ResourceFull, Status


def test_the_total_bounds_every_address_together() -> None:
    counts = ConnectionCounts(max_total=3, max_per_address=10)
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.2"):
        assert counts.admit(address) is None
    refused = counts.admit("10.0.0.3")
    assert isinstance(refused, ResourceFull)
    assert refused.status is Status.RESOURCE_FULL
    assert (refused.limit, refused.limit_value) == ("imq.stomp.max_connections", "3")
    assert refused.summary == "too many connections (imq.stomp.max_connections)"
    assert "3 STOMP connections open" in str(refused)
    assert "raise imq.stomp.max_connections" in str(refused)
    assert (counts.total, counts.from_address("10.0.0.3")) == (3, 0)  # not counted
    counts.release("10.0.0.2")
    assert counts.admit("10.0.0.3") is None


def test_one_address_is_bounded_alone() -> None:
    counts = ConnectionCounts(max_total=100, max_per_address=2)
    assert counts.admit("10.0.0.1") is None
    assert counts.admit("10.0.0.1") is None
    refused = counts.admit("10.0.0.1")
    assert refused is not None
    assert refused.limit == "imq.stomp.max_connections_per_address"
    assert refused.limit_value == "2"
    assert "10.0.0.1 has 2 STOMP connections open" in str(refused)
    assert counts.admit("10.0.0.2") is None  # another address is not affected
    assert (counts.total, counts.most_per_address) == (3, 2)


def test_release_forgets_an_address_with_no_connection() -> None:
    counts = ConnectionCounts(max_total=10, max_per_address=10)
    counts.admit("::1")
    counts.admit("::1")
    counts.release("::1")
    assert (counts.total, counts.from_address("::1"), counts.most_per_address) == (1, 1, 1)
    counts.release("::1")
    assert (counts.total, counts.most_per_address) == (0, 0)
    counts.release("::1")  # never admitted (any more): nothing to give back
    assert counts.total == 0
