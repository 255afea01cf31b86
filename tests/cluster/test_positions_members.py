"""A pipeline reader's lease group and a sink's stages on a member that is killed: broker
processes on a real PostgreSQL, the pipeline client. Before the failure the other member refuses
them, naming the member; once it took the store over it serves the same leases with the same
messages and the staged rows, so the reader goes on exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.client.retry import RetryPolicy
from sluiceway.errors import Unavailable
from sluiceway.testing import BrokerProcess
from tests.cli.support import get, wait_until
from tests.cluster.members import start_member

pytestmark = pytest.mark.timeout(180)

T = TypeVar("T")
QUEUE = "/queue/positions"
WAIT = 40.0  # seconds for a member to read the record, or a takeover to end, on a loaded machine


def client(member: BrokerProcess) -> PipelineConnection:
    retry = RetryPolicy(pause=0.05, deadline=0.01)  # a refusal is answered, not waited out
    return PipelineConnection(PipelineSettings(port=member.port, timeout=30.0, retry=retry))


def positions(member: BrokerProcess) -> dict[tuple[str, str, str], str]:
    view = get(member.admin_port, "/cluster")
    return {(p["kind"], p["destination"], p["name"]): p["broker_id"] for p in view["positions"]}


def once_served(attempt: Callable[[], T]) -> T:
    """`attempt`, tried again while it is refused for now (a lease being adopted)."""
    answer: list[T] = []

    def served() -> bool:
        try:
            answer.append(attempt())
        except Unavailable:
            return False
        return True

    wait_until(served, timeout=WAIT, what="served")
    return answer[0]


def test_lease_groups_and_sinks_stay_where_they_live_and_move_with_a_takeover(
    pg_url: str,
) -> None:
    group, sink = ("lease", QUEUE, "etl"), ("sink", "", "orders-sink")
    with start_member(pg_url, "a") as a, start_member(pg_url, "b") as b:
        with client(a) as at_a:
            sent = at_a.send_many(OutgoingMessage(QUEUE, f"m{i}".encode()) for i in range(20))
            assert sent == 20
            first = [m.body for m in at_a.read_lease(QUEUE, "etl/1", max_messages=8)]
            staged = (OutgoingMessage("/queue/out", f"s{i}".encode()) for i in range(5))
            assert at_a.send_many(staged, stage="orders-sink/0/t1") == 5
        assert first == [f"m{i}".encode() for i in range(8)]
        wait_until(lambda: positions(b) == {group: "a", sink: "a"}, timeout=WAIT, what="b knows")

        with client(b) as at_b:
            with pytest.raises(Unavailable) as refused:
                at_b.read_lease(QUEUE, "etl/1").drain()
            assert refused.value.member_address == f"127.0.0.1:{a.port}"

            a.kill()  # kill -9: b takes the store over, with the group and the sink
            wait_until(lambda: positions(b) == {group: "b", sink: "b"}, timeout=WAIT, what="moved")
            again = once_served(lambda: [m.body for m in at_b.read_lease(QUEUE, "etl/1")])
            assert again == first  # the same lease: the same messages, in the same order
            at_b.ack_lease(QUEUE, "etl/1")
            rest = [m.body for m in at_b.read_lease(QUEUE, "etl/2", max_messages=50)]
            assert rest == [f"m{i}".encode() for i in range(8, 20)]
            at_b.ack_lease(QUEUE, "etl/2")
            assert at_b.commit_stage("orders-sink", 0, ["t1"], [5]).count == 5
            assert at_b.head(QUEUE).message_count == 0
            assert at_b.head("/queue/out").message_count == 5
