"""`sluiceway cmd` on the broker, its connections, durable subscriptions and metrics, end to end
against a real broker process."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluiceway.testing import BrokerProcess
from tests.cli.support import get, pairs, run_cmd, table_rows, wait_until
from tests.e2e.rawclient import RawClient


@pytest.fixture(scope="module")
def traffic(broker: BrokerProcess) -> Iterator[RawClient]:
    """A connection (client-id `watcher`) that sent 3 messages of 10 bytes to /queue/measured
    and consumes /topic/watched."""
    client = RawClient(broker.port)
    client.connect(client_id="watcher")
    client.subscribe("/topic/watched", "w1")
    for _ in range(3):
        client.request("SEND", {"destination": "/queue/measured"}, b"0123456789")
    yield client
    client.close()


def test_query_bkr(broker: BrokerProcess, traffic: RawClient) -> None:
    result = run_cmd("query", "bkr", admin_port=broker.admin_port)
    assert result.status == 0, result.err
    shown = pairs(result.out)
    snapshot = get(broker.admin_port, "/broker")
    assert shown["Version"] == snapshot["version"]
    assert shown["Current Number of Connections"] == str(snapshot["connections"])
    assert shown["Current Number of Messages in System"] == str(snapshot["msgs"])
    assert shown["imq.system.max_count"] == "-1"
    assert shown["Disk State"] == "OK"
    assert shown["Disk Free Limit (bytes)"] == str(50 * 1024 * 1024)
    assert "Disk State Reason" not in shown  # only while it is not ok
    assert (
        json.loads(run_cmd("query", "bkr", "--json", admin_port=broker.admin_port).out)[
            "properties"
        ]
        == snapshot["properties"]
    )


def test_update_bkr(broker: BrokerProcess) -> None:
    port = broker.admin_port
    result = run_cmd("update", "bkr", "-o", "imq.system.max_count=10", admin_port=port)
    assert result.status == 0, result.err
    assert result.out == "Updated the broker: imq.system.max_count=10.\n"
    assert get(port, "/broker")["properties"]["imq.system.max_count"] == "10"
    restored = run_cmd("update", "bkr", "-o", "imq.system.max_count=-1", "--json", admin_port=port)
    assert restored.json()["properties"]["imq.system.max_count"] == "-1"


def test_list_cxn(broker: BrokerProcess, traffic: RawClient) -> None:
    result = run_cmd("list", "cxn", admin_port=broker.admin_port)
    assert result.status == 0, result.err
    header = result.out.splitlines()[1]
    for title in ("Connection ID", "User", "Service", "Producers", "Consumers", "Host"):
        assert title in header
    connections = get(broker.admin_port, "/connections")
    watcher = next(c for c in connections if c["client_id"] == "watcher")
    row = next(r for r in table_rows(result.out) if r[-1] == "watcher")
    assert row[:5] == [str(watcher["id"]), "-", "stomp", "1", "1"]
    listed = run_cmd("list", "cxn", "--json", admin_port=broker.admin_port).json()
    assert {c["id"] for c in listed} == {c["id"] for c in connections}


def test_list_and_destroy_dur(broker: BrokerProcess) -> None:
    port = broker.admin_port
    subscriber = RawClient(broker.port)
    subscriber.connect(client_id="keeper")
    subscriber.subscribe("/topic/kept", "k1", durable_subscription_name="nightly")
    busy = run_cmd("destroy", "dur", "-n", "nightly", "-c", "keeper", "-f", admin_port=port)
    assert busy.status == 1
    assert "unsubscribe it first" in busy.error_line
    subscriber.close()  # the subscription stays, inactive
    wait_until(
        lambda: (
            [d["state"] for d in get(port, "/durables") if d["name"] == "nightly"] == ["INACTIVE"]
        ),
        what="durable subscription inactive",
    )

    listed = run_cmd("list", "dur", admin_port=port)
    assert listed.status == 0, listed.err
    assert "Durable Sub State" in listed.out
    assert ["nightly", "keeper", "/topic/kept", "0", "0", "INACTIVE"] in table_rows(listed.out)
    assert run_cmd("list", "dur", "--json", admin_port=port).json() == get(port, "/durables")

    destroyed = run_cmd("destroy", "dur", "-n", "nightly", "-c", "keeper", "-f", admin_port=port)
    assert destroyed.status == 0, destroyed.err
    assert destroyed.out == "Destroyed durable subscription nightly of client keeper.\n"
    assert [d for d in get(port, "/durables") if d["name"] == "nightly"] == []
    assert run_cmd("list", "dur", admin_port=port).out == "No durable subscriptions.\n"
    again = run_cmd("destroy", "dur", "-n", "nightly", "-c", "keeper", "-f", admin_port=port)
    assert again.status == 1
    assert "no such durable subscription" in again.error_line


def _metrics(broker: BrokerProcess, *args: str) -> list[list[str]]:
    result = run_cmd("metrics", *args, admin_port=broker.admin_port)
    assert result.status == 0, result.err
    return table_rows(result.out)


def test_metrics_dst(broker: BrokerProcess, traffic: RawClient) -> None:
    dst = ("dst", "-t", "q", "-n", "measured")
    # Msgs In/Out, Msg Bytes In/Out, Msg Count (Current, Peak, Avg), Total Msg Bytes (same),
    # Largest Msg.
    (ttl,) = _metrics(broker, *dst)
    assert ttl[:4] == ["3", "0", "30", "0"]
    assert ttl[4] == "3"  # current count
    assert ttl[7] == "30"  # current bytes
    assert ttl[10] == "10"  # largest message
    (rts,) = _metrics(broker, *dst, "-m", "rts")
    assert len(rts) == 11
    (con,) = _metrics(broker, *dst, "-m", "con")
    assert con[:3] == ["0", "0", "0"]  # active consumers (current, peak), backups
    (topic,) = _metrics(broker, "dst", "-t", "t", "-n", "watched", "-m", "con")
    assert topic[0] == "1"
    result = run_cmd("metrics", *dst, "-m", "con", admin_port=broker.admin_port)
    assert "Active Consumers" in result.out
    assert "Backup Consumers" in result.out


def test_metrics_bkr(broker: BrokerProcess, traffic: RawClient) -> None:
    (ttl,) = _metrics(broker, "bkr")
    totals = get(broker.admin_port, "/metrics/broker")["totals"]
    assert ttl[:4] == [str(totals[k]) for k in ("msgs_in", "msgs_out", "bytes_in", "bytes_out")]
    (rts,) = _metrics(broker, "bkr", "-m", "rts")
    assert len(rts) == 4
    (cxn,) = _metrics(broker, "bkr", "-m", "cxn")
    assert cxn[0] == str(get(broker.admin_port, "/metrics/broker")["connections"])
    assert cxn[1] == "GREEN"
    (dsk,) = _metrics(broker, "bkr", "-m", "dsk")
    assert int(dsk[0]) > 0
    assert dsk[1] == "ok"
    assert int(dsk[2]) > 0  # free bytes where the journal is


def test_metrics_svc(broker: BrokerProcess, traffic: RawClient) -> None:
    rows = _metrics(broker, "svc")
    assert [row[0] for row in rows] == ["stomp"]
    assert int(rows[0][1]) >= 3  # Msgs In
    assert _metrics(broker, "svc", "-n", "stomp", "-m", "cxn")[0][0] == "stomp"
    assert len(_metrics(broker, "svc", "-m", "rts")[0]) == 7
    unknown = run_cmd("metrics", "svc", "-n", "carrier-pigeon", admin_port=broker.admin_port)
    assert unknown.status == 1
    assert "carrier-pigeon" in unknown.error_line


def test_metrics_samples_every_interval(broker: BrokerProcess, traffic: RawClient) -> None:
    port = broker.admin_port
    result = run_cmd("metrics", "bkr", "-int", "1", "-msp", "2", admin_port=port)
    assert result.status == 0, result.err
    assert len(table_rows(result.out)) == 2  # one header, a row per sample
    streamed = run_cmd(
        "metrics", "dst", "-t", "q", "-n", "measured", "-int", "1", "-msp", "2", "--json",
        admin_port=port,
    )  # fmt: skip
    samples = [json.loads(line) for line in streamed.out.splitlines()]
    assert len(samples) == 2
    assert all(s["totals"]["msgs_in"] == 3 for s in samples)


def test_metric_types_that_do_not_apply(broker: BrokerProcess) -> None:
    port = broker.admin_port
    disk = run_cmd("metrics", "dst", "-t", "q", "-n", "measured", "-m", "dsk", admin_port=port)
    assert disk.status == 2
    assert "metrics bkr -m dsk" in disk.error_line
    consumers = run_cmd("metrics", "bkr", "-m", "con", admin_port=port)
    assert consumers.status == 2
    assert "use one of" in consumers.error_line
