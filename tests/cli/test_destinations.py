"""`sluiceway cmd` on destinations, end to end: a real broker process, the command as a process,
and the broker's state checked through the admin API and with a STOMP client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.client.pipeline import PipelineConnection, PipelineSettings
from sluiceway.testing import BrokerProcess
from tests.cli.support import api, get, pairs, run_cmd, run_on_terminal, table_rows, wait_until
from tests.e2e.rawclient import RawClient


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[RawClient]:
    connection = RawClient(broker.port)
    connection.connect()
    yield connection
    connection.close()


def send(client: RawClient, destination: str, count: int = 1) -> None:
    for number in range(count):
        client.request("SEND", {"destination": destination}, f"message {number}".encode())


def summary(broker: BrokerProcess, kind: str, name: str) -> dict[str, object]:
    detail = get(broker.admin_port, f"/destinations/{kind}/{name}")
    result: dict[str, object] = detail["summary"]
    return result


def test_create_query_update_destroy(broker: BrokerProcess) -> None:
    port = broker.admin_port
    created = run_cmd(
        "create", "dst", "-t", "q", "-n", "orders", "-o", "maxNumMsgs=5", admin_port=port
    )
    assert created.status == 0, created.err
    assert created.out == "Created queue orders (maxNumMsgs=5).\n"
    assert get(port, "/destinations/queue/orders")["properties"]["maxNumMsgs"] == "5"

    query = run_cmd("query", "dst", "-t", "q", "-n", "orders", admin_port=port)
    assert query.status == 0, query.err
    shown = pairs(query.out)
    assert shown["Destination Name"] == "orders"
    assert shown["Destination State"] == "RUNNING"
    assert shown["maxNumMsgs"] == "5"
    assert (shown["Consumed Late"], shown["Deadline Misses"]) == ("0", "0")
    assert shown["deliveryOrder"] == "fifo"
    assert shown["consumerFlowLimit"] == "1000"

    auto = run_cmd(
        "update", "dst", "-t", "q", "-n", "orders", "-o", "consumerFlowLimit=auto", "-o",
        "deliveryOrder=deadline", admin_port=port,
    )  # fmt: skip
    assert auto.status == 0, auto.err
    properties = get(port, "/destinations/queue/orders")["properties"]
    assert (properties["consumerFlowLimit"], properties["deliveryOrder"]) == ("auto", "deadline")
    refused = run_cmd(
        "update", "dst", "-t", "q", "-n", "orders", "-o", "deliveryOrder=soonest", admin_port=port
    )
    assert refused.status != 0
    assert "deliveryOrder" in refused.err

    updated = run_cmd(
        "update", "dst", "-t", "queue", "-n", "orders", "-o", "maxNumMsgs=7", "-o",
        "limitBehavior=REMOVE_OLDEST", admin_port=port,
    )  # fmt: skip
    assert updated.status == 0, updated.err
    assert updated.out == "Updated queue orders: maxNumMsgs=7, limitBehavior=REMOVE_OLDEST.\n"
    properties = get(port, "/destinations/queue/orders")["properties"]
    assert (properties["maxNumMsgs"], properties["limitBehavior"]) == ("7", "REMOVE_OLDEST")

    destroyed = run_cmd("destroy", "dst", "-t", "q", "-n", "orders", "-f", admin_port=port)
    assert destroyed.status == 0, destroyed.err
    assert destroyed.out == "Destroyed queue orders.\n"
    assert api(port, "GET", "/destinations/queue/orders")[0] == 404


def test_json_output_is_the_api_answer(broker: BrokerProcess) -> None:
    port = broker.admin_port
    created = run_cmd("create", "dst", "-t", "t", "-n", "news", "--json", admin_port=port)
    assert created.status == 0, created.err
    assert created.json()["summary"]["path"] == "/topic/news"
    query = run_cmd("query", "dst", "-t", "t", "-n", "news", "--json", admin_port=port)
    assert query.json()["properties"] == get(port, "/destinations/topic/news")["properties"]
    listed = run_cmd("list", "dst", "--json", admin_port=port).json()
    assert [d["path"] for d in listed] == [d["path"] for d in get(port, "/destinations")]
    destroyed = run_cmd("destroy", "dst", "-t", "t", "-n", "news", "-f", "--json", admin_port=port)
    assert destroyed.json() == {"destroyed": "/topic/news"}


def test_list_dst_shows_open_mq_columns_and_filters_by_type(
    broker: BrokerProcess, client: RawClient
) -> None:
    send(client, "/queue/listed", 3)
    result = run_cmd("list", "dst", admin_port=broker.admin_port)
    assert result.status == 0, result.err
    header = result.out.splitlines()[2]
    for title in ("Name", "Type", "State", "Producers", "Consumers", "Count", "UnAck", "Avg Size"):
        assert title in header
    assert "Msgs" in result.out.splitlines()[1]  # the group over Count, UnAck, Avg Size
    rows = {row[0]: row for row in table_rows(result.out)}
    assert rows["listed"][:7] == ["listed", "queue", "RUNNING", "1", "0", "3", "0"]
    assert "mq.sys.dmq" in rows  # Open MQ always lists the dead message queue

    topics = run_cmd("list", "dst", "-t", "t", admin_port=broker.admin_port)
    assert all(row[1] == "topic" for row in table_rows(topics.out))


def test_pause_producers_holds_sends_until_resume(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    send(client, "/queue/held")
    paused = run_cmd("pause", "dst", "-t", "q", "-n", "held", "-pst", "PRODUCERS", admin_port=port)
    assert paused.status == 0, paused.err
    assert paused.out == "Paused queue held: its state is now PRODUCERS_PAUSED.\n"
    assert summary(broker, "queue", "held")["state"] == "PRODUCERS_PAUSED"

    client.send("SEND", {"destination": "/queue/held", "receipt": "r-held"}, b"waits")
    wait_until(lambda: summary(broker, "queue", "held")["held_sends"] == 1, what="SEND held")
    assert not client.other  # no RECEIPT while it is held

    resumed = run_cmd("resume", "dst", "-t", "q", "-n", "held", admin_port=port)
    assert resumed.status == 0, resumed.err
    assert resumed.out == "Resumed queue held: its state is now RUNNING.\n"
    assert client.expect("RECEIPT").headers["receipt-id"] == "r-held"
    assert summary(broker, "queue", "held")["msgs"] == 2


def test_pause_consumers_stops_delivery(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    client.subscribe("/queue/stalled", "s-stalled")
    result = run_cmd(
        "pause", "dst", "-t", "q", "-n", "stalled", "-pst", "consumers", "--json", admin_port=port
    )
    assert result.status == 0, result.err
    assert result.json()["summary"]["state"] == "CONSUMERS_PAUSED"
    send(client, "/queue/stalled")
    client.sync()
    assert client.drain() == []
    assert run_cmd("resume", "dst", "-t", "q", "-n", "stalled", admin_port=port).status == 0
    assert client.receive(1)[0].body == b"message 0"


def test_pause_and_resume_all(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    send(client, "/queue/everywhere")
    paused = run_cmd("pause", "dst", admin_port=port)
    assert paused.status == 0, paused.err
    assert paused.out.startswith("Paused all ")
    states = {d["name"]: d["state"] for d in get(port, "/destinations")}
    assert states["everywhere"] == "PAUSED"
    assert states["mq.sys.dmq"] == "RUNNING"
    resumed = run_cmd("resume", "dst", admin_port=port)
    assert resumed.status == 0, resumed.err
    assert {d["state"] for d in get(port, "/destinations")} == {"RUNNING"}


def test_purge_removes_waiting_messages(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    send(client, "/queue/full", 4)
    result = run_cmd("purge", "dst", "-t", "q", "-n", "full", "-f", admin_port=port)
    assert result.status == 0, result.err
    assert result.out == "Purged queue full: 4 messages removed.\n"
    assert summary(broker, "queue", "full")["msgs"] == 0


def test_purge_and_destroy_ask_first_and_refuse_without_a_terminal(
    broker: BrokerProcess, client: RawClient
) -> None:
    port = broker.admin_port
    send(client, "/queue/kept", 2)
    for verb in ("purge", "destroy"):
        result = run_cmd(verb, "dst", "-t", "q", "-n", "kept", admin_port=port)
        assert result.status == 2
        assert "no terminal" in result.error_line
        assert "-f" in result.error_line
    assert summary(broker, "queue", "kept")["msgs"] == 2


def test_confirmation_on_a_terminal(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    send(client, "/queue/asked", 2)
    where = ["-b", f"127.0.0.1:{port}"]
    status, out, err = run_on_terminal(["destroy", "dst", "-t", "q", "-n", "asked", *where], "n")
    assert status == 0
    assert "Destroy queue asked and the 2 messages it holds? [y/N]" in err
    assert out == "Not destroyed: queue asked.\n"
    assert summary(broker, "queue", "asked")["msgs"] == 2

    status, out, err = run_on_terminal(["purge", "dst", "-t", "q", "-n", "asked", *where], "y")
    assert status == 0, err
    assert out == "Purged queue asked: 2 messages removed.\n"


def test_compact(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    client.request("SEND", {"destination": "/queue/compacted", "persistent": "true"}, b"kept")
    refused = run_cmd("compact", "dst", "-t", "q", "-n", "compacted", admin_port=port)
    assert refused.status == 1
    assert "paused first" in refused.error_line

    assert run_cmd("pause", "dst", "-t", "q", "-n", "compacted", admin_port=port).status == 0
    one = run_cmd("compact", "dst", "-t", "q", "-n", "compacted", admin_port=port)
    assert one.status == 0, one.err
    assert one.out.startswith("Compacted the journal")
    assert run_cmd("resume", "dst", "-t", "q", "-n", "compacted", admin_port=port).status == 0

    every = run_cmd("compact", "dst", "--json", admin_port=port)
    assert every.status == 0, every.err
    assert set(every.json()) == {"segments_deleted", "segments_compacted"}
    assert summary(broker, "queue", "compacted")["msgs"] == 1  # compaction loses nothing live


def test_pipeline_readers_show_in_list_and_query(broker: BrokerProcess, client: RawClient) -> None:
    port = broker.admin_port
    with PipelineConnection(PipelineSettings(port=broker.port)) as pipeline:
        pipeline.open_cursor("/topic/feed", "etl", "earliest")
    send(client, "/topic/feed", 4)
    listed = run_cmd("list", "dst", "-t", "t", admin_port=port)
    assert listed.status == 0, listed.err
    assert "Readers" in listed.out.splitlines()[2]
    rows = {row[0]: row for row in table_rows(listed.out)}
    assert rows["feed"][-1] == "1"
    query = run_cmd("query", "dst", "-t", "t", "-n", "feed", admin_port=port)
    assert query.status == 0, query.err
    shown = pairs(query.out)
    assert shown["Current Number of Pipeline Readers"] == "1"
    assert shown["cursor-group etl"].startswith("lag 4 messages, ")
