"""The admin API over real HTTP against an in-process broker, checked against the core's state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import pytest

from sluiceway.admin.openapi import document
from sluiceway.core.broker import Broker
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient


@pytest.fixture
def admin_broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker(
        {
            "imq.destination.queue.flow.limitBehavior": "FLOW_CONTROL",
            "imq.destination.queue.flow.maxNumMsgs": "2",
        }
    )


@pytest.fixture
def api(admin_broker: BrokerThread) -> AdminHttp:
    return AdminHttp(admin_broker.admin_port)


@pytest.fixture
def client(admin_broker: BrokerThread) -> Iterator[RawClient]:
    raw = RawClient(admin_broker.port)
    raw.connect()
    yield raw
    raw.close()


def core(broker: BrokerThread) -> Broker:
    assert broker.broker is not None
    return broker.broker


def test_destination_lifecycle_matches_the_core(admin_broker: BrokerThread, api: AdminHttp) -> None:
    created = api.ok(
        "POST",
        "/destinations",
        {"type": "queue", "name": "orders", "properties": {"maxNumMsgs": 5}},
    )
    assert created["summary"]["path"] == "/queue/orders"
    assert created["properties"]["maxNumMsgs"] == "5"
    name = parse_destination("/queue/orders")
    assert (
        admin_broker.call(lambda: core(admin_broker).destination(name).settings.max_num_msgs) == 5
    )

    listed = api.ok("GET", "/destinations?type=queue")
    assert [row["path"] for row in listed] == ["/queue/flow", "/queue/mq.sys.dmq", "/queue/orders"]

    updated = api.ok(
        "PATCH", "/destinations/queue/orders", {"properties": {"limitBehavior": "remove_oldest"}}
    )
    assert updated["properties"]["limitBehavior"] == "REMOVE_OLDEST"

    paused = api.ok("POST", "/destinations/q/orders/pause", {"target": "PRODUCERS"})
    assert paused["summary"]["state"] == "PRODUCERS_PAUSED"
    assert admin_broker.call(lambda: core(admin_broker).destination(name).paused_producers)
    assert api.ok("POST", "/destinations/q/orders/resume", {})["summary"]["state"] == "RUNNING"

    api.ok("DELETE", "/destinations/queue/orders", {})
    assert admin_broker.call(lambda: core(admin_broker).registry.get(name)) is None


def test_counts_and_flow_state_are_the_brokers(
    admin_broker: BrokerThread, api: AdminHttp, client: RawClient
) -> None:
    for i in range(3):
        client.send("SEND", {"destination": "/queue/flow"}, b"%d" % i)  # the third is held
    client.sync()
    detail = api.ok("GET", "/destinations/queue/flow")
    assert detail["summary"]["msgs"] == 2
    assert detail["summary"]["held_sends"] == 1
    (held,) = detail["held_producers"]
    assert (held["reason"], held["limit"]) == ("destination full", "maxNumMsgs")
    assert api.ok("GET", "/producers")[0]["destination"] == "/queue/flow"
    (connection,) = api.ok("GET", "/connections")
    assert (connection["held_sends"], connection["service"]) == (1, "stomp")
    assert (connection["msgs_in"], connection["msgs_out"]) == (3, 0)
    assert connection["bytes_in"] > 3 * len("SEND\ndestination:/queue/flow\n\n0\0")
    consumer = RawClient(admin_broker.port)
    consumer.connect()
    consumer.subscribe("/queue/flow", ack="client-individual", **{"consumer-flow-limit": "1"})
    consumer.receive(1)
    (paused,) = api.ok("GET", "/destinations/queue/flow")["paused_consumers"]
    assert paused["window_limit"] == 1
    assert paused["flow_paused_for"] >= 0
    consumer.close()
    broker = api.ok("GET", "/broker")
    assert broker["msgs"] == admin_broker.call(lambda: core(admin_broker).context.system.count)
    assert broker["memory"]["level"] == "GREEN"
    assert set(broker["services"]) == {"stomp", "admin"}


def test_purge_empties_the_queue(
    admin_broker: BrokerThread, api: AdminHttp, client: RawClient
) -> None:
    for i in range(2):
        client.send("SEND", {"destination": "/queue/flow"}, b"%d" % i)
    client.sync()
    assert api.ok("POST", "/destinations/queue/flow/purge", {}) == {
        "purged": 2,
        "destination": "/queue/flow",
    }
    assert api.ok("GET", "/destinations/queue/flow")["summary"]["msgs"] == 0


def test_update_bkr_changes_run_time_properties_only(
    admin_broker: BrokerThread, api: AdminHttp
) -> None:
    api.ok("PATCH", "/broker", {"properties": {"imq.system.max_count": "7"}})
    assert admin_broker.call(lambda: core(admin_broker).config.system_max_count) == 7
    shown = api.ok("PATCH", "/broker", {"properties": {"imq.persist.file.disk.free.limit": "10m"}})
    assert shown["disk"]["free_limit"] == 10 * 1024 * 1024  # the disk guard took it at once
    status, error = api.call("PATCH", "/broker", {"properties": {"imq.stomp.tcp.port": "1"}})
    assert status == 400
    assert "cannot be changed while the broker runs" in error["detail"]
    status, error = api.call("PATCH", "/broker", {"properties": {"imq.system.max_cnt": "1"}})
    assert (status, error["status"]) == (400, 400)
    assert "imq.system.max_count" in error["detail"]  # the close match is suggested


class Refusal(NamedTuple):
    method: str
    path: str
    body: object
    status: int
    fragment: str


REFUSALS = [
    Refusal("GET", "/destinations/queue/missing", None, 404, "does not exist"),
    Refusal("GET", "/destinations/bucket/x", None, 400, "use queue (q) or topic (t)"),
    Refusal("POST", "/destinations", {"type": "queue", "name": "mq.x"}, 403, "reserved"),
    Refusal("POST", "/destinations", {"type": "queue", "name": "flow"}, 409, "already exists"),
    Refusal(
        "PATCH", "/destinations/queue/flow", {"properties": {"maxNumMsgs": "many"}}, 400, "maxNum"
    ),
    Refusal("DELETE", "/destinations/queue/mq.sys.dmq", {}, 403, "cannot be destroyed"),
    Refusal("POST", "/destinations/queue/flow/pause", {"target": "SOME"}, 400, "PRODUCERS"),
    Refusal("POST", "/destinations/queue/flow/compact", {}, 400, "paused first"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{c.method} {c.path}" for c in REFUSALS])
def test_refusals_are_json_with_the_cause(api: AdminHttp, case: Refusal) -> None:
    got, error = api.call(case.method, case.path, case.body)
    assert got == case.status, error
    assert case.fragment in error["detail"] + error["error"]


def test_a_change_must_be_json(api: AdminHttp) -> None:
    status, data, _ = api.raw("POST", "/api/v1/destinations/queue/flow/purge", {}, "text/plain")
    assert status == 400
    assert b"application/json" in data


def test_openapi_documents_every_route_and_nothing_else(admin_broker: BrokerThread) -> None:
    assert admin_broker.services is not None
    admin = admin_broker.services.admin
    assert admin is not None
    served = set()
    for route in admin.app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "HEAD" and path and path.startswith("/api/"):
            served.add((route.method.lower(), path))
    spec = document()
    documented = {(method, path) for path, ops in spec["paths"].items() for method in ops}
    assert served == documented
    schemas = spec["components"]["schemas"]
    assert schemas["DestinationSummary"]["properties"]["msgs"] == {"type": "integer"}
    assert schemas["DestinationDetail"]["properties"]["trend"] == {
        "anyOf": [{"$ref": "#/components/schemas/DestinationTrend"}, {"type": "null"}]
    }
    assert AdminHttp(admin_broker.admin_port).ok("GET", "/openapi.json") == spec
