"""The parts of the links one at a time: the SEND made of a received MESSAGE, the ids a link
remembers, members' addresses, demand and budgets, and logging in where logins are required."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluiceway.cluster.demand import Demand, QueueDemand, link_client_id, read_demand
from sluiceway.cluster.forwarding import LINK_SELECTOR, Seen, forwarded
from sluiceway.cluster.links import (
    cluster_links,
    loopback_if_any,
    read_link_password,
    wanted_routes,
)
from sluiceway.cluster.peer_link import Budget, end_task
from sluiceway.cluster.peers import Peer, PeerAddressError, StaticPeers
from sluiceway.config import build_config
from sluiceway.core.values.selector import compile_selector
from sluiceway.errors import ConfigError
from sluiceway.naming import parse_destination
from sluiceway.protocol.frames import Frame
from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread
from tests.cluster.links_support import Member
from tests.cluster.test_links import QUEUE, bodies_of, consumer_at, produce_at
from tests.core.test_selector import message as selector_message
from tests.e2e.conftest import stomp_clients
from tests.e2e.stomppy import subscribe
from tests.e2e.support import wait_until

__all__ = ["stomp_clients"]  # a fixture

pytestmark = pytest.mark.timeout(60)

ORDERS = parse_destination(QUEUE)
PRICES = parse_destination("/topic/prices")
DELIVERY_WAIT = 20.0
PASSWORDS = {"link": "link-pw-R4v9", "app": "app-pw-J6c1"}


def message(**extra: str) -> Frame:
    headers = {
        "subscription": "link-1",
        "message-id": "ID:abc-7",
        "destination": QUEUE,
        "ack": "3/ID:abc-7",
        "redelivered": "true",
        "delivery-count": "2",
        "priority": "7",
        "persistent": "true",
        "expires": "1700000000000",
        "timestamp": "1600000000000",
        "sequence": "41",
        "content-type": "text/plain",
        "content-length": "5",
        **extra,
    }
    return Frame("MESSAGE", headers, b"hello")


def test_a_forwarded_message_keeps_what_the_producer_set_and_says_where_it_came_from() -> None:
    send = forwarded(message(region="EU"), "a")
    assert send.command == "SEND"
    assert send.body == b"hello"
    assert send.headers == {
        "destination": QUEUE,
        "persistent": "true",
        "priority": "7",
        "expires": "1700000000000",
        "content-type": "text/plain",
        "region": "EU",
        "sluiceway_via": "a",
        "sluiceway_origin_id": "ID:abc-7",
    }


def test_the_link_selector_takes_only_what_never_crossed() -> None:
    selector = compile_selector(LINK_SELECTOR)

    assert selector.matches(selector_message(()))
    assert selector.matches(selector_message((("region", "EU"),)))
    assert not selector.matches(selector_message((("sluiceway_via", "a"),)))


def test_the_ids_a_link_remembers_are_bounded_oldest_first() -> None:
    seen = Seen(capacity=3)
    for number in range(5):
        seen.add(f"id-{number}")
    seen.add("")  # a message without an id is never remembered
    assert len(seen) == 3
    assert "id-0" not in seen
    assert "id-1" not in seen
    assert "id-4" in seen
    seen.add("id-2")  # seen again: the newest now
    seen.add("id-5")
    assert "id-2" in seen
    assert "id-3" not in seen


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:61613", Peer("a", "127.0.0.1", 61613)),
        (" broker.example:7000 ", Peer("a", "broker.example", 7000)),
        ("[::1]:61613", Peer("a", "::1", 61613)),
    ],
)
def test_a_member_address_is_read(address: str, expected: Peer) -> None:
    assert Peer.parse("a", address) == expected


@pytest.mark.parametrize("address", ["", "host", ":61613", "host:port", "host:0", "host:65536"])
def test_a_member_address_that_is_not_host_and_port_is_refused(address: str) -> None:
    with pytest.raises(PeerAddressError, match="member a gives its STOMP address as"):
        Peer.parse("a", address)


def test_a_static_list_of_members_is_given_back_as_a_copy() -> None:
    peers = StaticPeers([Peer("a", "127.0.0.1", 1)])
    peers.current().clear()
    assert peers.current() == [Peer("a", "127.0.0.1", 1)]


def test_queues_are_wanted_while_their_consumers_have_room_topics_while_subscribed() -> None:
    demand = Demand(
        {
            ORDERS: QueueDemand(consumers=2, free=30, backlog=10),
            parse_destination("/queue/full"): QueueDemand(consumers=1, free=5, backlog=5),
            parse_destination("/queue/wide"): QueueDemand(consumers=1, free=5000, backlog=0),
        },
        frozenset({PRICES}),
    )
    assert wanted_routes(demand, 1000) == {
        ORDERS: 20,
        parse_destination("/queue/wide"): 1000,
        PRICES: 1000,
    }
    assert QueueDemand(consumers=0, free=0, backlog=3).room == 0


def test_a_budget_is_shared_by_every_link_until_refreshed() -> None:
    budget = Budget()
    budget.refresh({ORDERS: 2})
    assert [budget.take(ORDERS) for _ in range(3)] == [True, True, False]
    assert budget.take(parse_destination("/queue/other")) is False
    assert budget.take(PRICES) is True  # topics are not budgeted
    budget.refresh({ORDERS: 1})
    assert budget.take(ORDERS) is True


def test_a_listener_on_every_address_is_reached_over_loopback() -> None:
    assert loopback_if_any("0.0.0.0") == "127.0.0.1"  # noqa: S104  (an address, not a bind)
    assert loopback_if_any("::") == "127.0.0.1"
    assert loopback_if_any("") == "127.0.0.1"
    assert loopback_if_any("10.1.2.3") == "10.1.2.3"
    assert loopback_if_any("broker.example") == "broker.example"


def test_the_link_password_file_must_be_private(tmp_path: Path) -> None:
    path = tmp_path / "link-password"
    path.write_text("s3cret\nignored\n")
    os.chmod(path, 0o600)
    assert read_link_password(str(path)) == "s3cret"
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_link_password(str(path))
    with pytest.raises(ConfigError, match=r"imq\.cluster\.link\.password\.file"):
        read_link_password(str(tmp_path / "missing"))


def test_demand_counts_local_consumers_and_never_a_link(
    make_broker: Callable[..., BrokerThread], stomp_clients: Callable[..., Any]
) -> None:
    member = Member("b", make_broker())
    core = member.broker.broker
    assert core is not None
    local, got = stomp_clients(member.broker.port)
    subscribe(local, got, QUEUE, "s", ack="client-individual", consumer_flow_limit="40")
    subscribe(local, got, "/topic/prices", "t", ack="auto")
    subscribe(local, got, "/queue/seen", "b", ack="auto", browser="true")
    link, linked = stomp_clients(member.broker.port, **{"client-id": link_client_id("a")})
    subscribe(link, linked, "/queue/linked", "s", ack="client-individual")
    subscribe(link, linked, "/topic/linked", "t", ack="auto")

    demand = member.call(lambda: read_demand(core))
    assert demand.queues == {ORDERS: QueueDemand(consumers=1, free=40, backlog=0)}
    assert demand.topics == frozenset({PRICES})


def users_file(directory: Path, **users: str) -> Path:
    path = directory / "passwd"
    file = UserFile(path)
    for name, password in users.items():
        file.add(name, password, ())
    return path


def test_links_log_in_where_logins_are_required(
    make_broker: Callable[..., BrokerThread],
    stomp_clients: Callable[..., Any],
    tmp_path: Path,
) -> None:
    users = users_file(tmp_path, **PASSWORDS)
    secured = {
        "imq.authentication.enabled": "true",
        "imq.user_repository.file.filename": str(users),
    }
    a = Member("a", make_broker(secured))
    b = Member("b", make_broker(secured))
    app = {"login": "app", "passcode": PASSWORDS["app"]}

    def clients(port: int, **headers: str) -> Any:
        return stomp_clients(port, **app, **headers)

    try:
        links = b.link_to(StaticPeers([a.peer]), username="link", password=PASSWORDS["app"])
        wait_until(lambda: b.call(lambda: "a" in links.links))
        link = links.links["a"]
        # Refused: the link keeps trying (and logging why), and nothing crosses.
        wait_until(lambda: b.call(lambda: link.failures) >= 2, DELIVERY_WAIT)
        assert not b.call(link.connected.is_set)
        b.stop_links()

        b.link_to(StaticPeers([a.peer]), username="link", password=PASSWORDS["link"])
        _, got = consumer_at(clients, b, a)
        bodies = produce_at(clients, a, 20, persistent="true")
        got.wait_messages(len(bodies), DELIVERY_WAIT)
        assert bodies_of(got) == bodies
    finally:
        b.stop_links()


def test_a_member_without_a_plain_stomp_listener_is_refused() -> None:
    config = build_config(
        {
            "imq.cluster.ha": "true",
            "imq.persist.store": "jdbc",
            "imq.persist.jdbc.postgresql.property.url": "postgresql://127.0.0.1/sluiceway",
            "imq.brokerid": "b",
        }
    )
    with pytest.raises(ConfigError, match=r"needs the plain STOMP listener"):
        cluster_links(Demandless(), config, None)


class Demandless:
    connections: dict[int, Any] = {}  # noqa: RUF012  (never changed)
    durables: dict[tuple[str, str], Any] = {}  # noqa: RUF012
    registry: Any = None


def test_ending_a_link_task_passes_on_the_callers_cancellation_not_the_tasks() -> None:
    """The links stop while their watcher is stopping one link: the watcher, cancelled while it
    waits for that link's task to end, must end cancelled too, or the links never stop."""

    async def scenario() -> tuple[bool, bool]:
        ending, release = asyncio.Event(), asyncio.Event()

        async def slow_to_end() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                ending.set()
                await release.wait()  # closing its connections
                raise

        quiet = asyncio.create_task(slow_to_end())
        await asyncio.sleep(0)
        ended = asyncio.create_task(end_task(quiet))
        await ending.wait()
        release.set()
        await ended  # its task's cancellation stays there

        release.clear()
        ending.clear()
        stopped = asyncio.create_task(slow_to_end())
        await asyncio.sleep(0)
        stopper = asyncio.create_task(end_task(stopped))
        await ending.wait()
        stopper.cancel()  # the caller's own cancellation, while the task is still ending
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await stopper
        return quiet.cancelled() and stopped.cancelled(), stopper.cancelled()

    tasks_ended, caller_cancelled = asyncio.run(scenario())
    assert tasks_ended
    assert caller_cancelled
