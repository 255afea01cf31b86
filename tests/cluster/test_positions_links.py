"""Pipeline positions across members: a lease group or a sink that lives on one member is
refused by the others with 503, naming the member and its address, so a reader cannot start it
anew there with other messages. Real brokers on real sockets, linked by the test with a static
list of members and records shared in memory; the pipeline client."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.client.retry import RetryPolicy
from sluiceway.cluster.positions import LEASE_GROUP, SINK
from sluiceway.errors import Unavailable
from tests.cluster.links_support import Member, cluster
from tests.e2e.support import wait_until

__all__ = ["cluster"]  # fixtures

pytestmark = pytest.mark.timeout(120)

QUEUE = "/queue/positions"
KNOW_WAIT = 30.0  # seconds for a member to read the record, on a loaded machine


def client(member: Member) -> PipelineConnection:
    """A client that gives up on a refused send at once (a refusal here is the point)."""
    retry = RetryPolicy(pause=0.05, deadline=0.01)
    return PipelineConnection(PipelineSettings(port=member.broker.port, timeout=30.0, retry=retry))


def homes(member: Member) -> dict[tuple[str, str, str], str]:
    links = member.links
    assert links is not None
    assert links.positions is not None
    directory = links.positions.directory
    return member.call(lambda: dict(directory.homes))


def send(connection: PipelineConnection, count: int, stage: str | None = None) -> int:
    messages = (OutgoingMessage(QUEUE, f"m{i}".encode()) for i in range(count))
    return connection.send_many(messages, stage=stage)


def test_a_lease_group_living_on_one_member_is_refused_by_the_others(
    cluster: Callable[..., list[Member]],
) -> None:
    a, b = cluster(2)
    with client(a) as at_a, client(b) as at_b:
        send(at_a, 5)
        send(at_b, 3)
        read = at_a.read_lease(QUEUE, "etl/1", max_messages=3)
        assert [m.body for m in read] == [b"m0", b"m1", b"m2"]
        position = (LEASE_GROUP, QUEUE, "etl")
        wait_until(lambda: homes(b).get(position) == "a", KNOW_WAIT)

        for attempt in (
            lambda: at_b.read_lease(QUEUE, "etl/2").drain(),
            lambda: at_b.read_lease(QUEUE, "etl/1").drain(),
            lambda: at_b.ack_lease(QUEUE, "etl/1"),
            lambda: at_b.release_lease(QUEUE, "etl/1"),
        ):
            with pytest.raises(Unavailable) as refused:
                attempt()
            assert refused.value.member == "a"
            assert refused.value.member_address == f"127.0.0.1:{a.broker.port}"
            assert "lease group 'etl' of /queue/positions lives on cluster member a" in str(
                refused.value
            )
        # Nothing changed at b: its messages wait for a group of its own.
        assert [m.body for m in at_b.read_lease(QUEUE, "own/1")] == [b"m0", b"m1", b"m2"]
        # At a, the group goes on.
        assert [m.body for m in at_a.read_lease(QUEUE, "etl/2", max_messages=5)] == [b"m3", b"m4"]
        at_a.ack_lease(QUEUE, "etl/1")
        # b's own group is b's: a refuses it.
        wait_until(lambda: homes(a).get((LEASE_GROUP, QUEUE, "own")) == "b", KNOW_WAIT)
        with pytest.raises(Unavailable, match="lives on cluster member b"):
            at_a.read_lease(QUEUE, "own/2").drain()


def test_a_sink_living_on_one_member_is_refused_by_the_others(
    cluster: Callable[..., list[Member]],
) -> None:
    a, b = cluster(2)
    with client(a) as at_a, client(b) as at_b:
        assert send(at_a, 4, stage="orders-sink/0/t1") == 4
        wait_until(lambda: homes(b).get((SINK, "", "orders-sink")) == "a", KNOW_WAIT)
        for attempt in (
            lambda: send(at_b, 2, stage="orders-sink/0/t2"),
            lambda: at_b.commit_stage("orders-sink", 0, ["t1"], [4]),
            lambda: at_b.abort_stage("orders-sink", 0),
        ):
            with pytest.raises(Unavailable) as refused:
                attempt()
            assert refused.value.member_address == f"127.0.0.1:{a.broker.port}"
        assert at_a.commit_stage("orders-sink", 0, ["t1"], [4]).count == 4
        # Nothing was staged or published at b.
        assert at_b.head(QUEUE).message_count == 0
        assert at_a.head(QUEUE).message_count == 4
