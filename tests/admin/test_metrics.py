"""Metrics: /metrics parsed by the Prometheus client's own parser, rates and peaks, the history."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sluiceway.admin.history import HistoryWriter
from sluiceway.app.services import Services
from sluiceway.core.broker import Broker
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient


def scrape(broker: BrokerThread) -> dict[str, list[Sample]]:
    status, body, headers = AdminHttp(broker.admin_port).raw("GET", "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    families = text_string_to_metric_families(body.decode())
    return {family.name: family.samples for family in families}


def value(samples: list[Sample], sample_name: str | None = None, **labels: str) -> float:
    found = [
        s.value
        for s in samples
        if all(s.labels.get(k) == v for k, v in labels.items())
        and (sample_name is None or s.name == sample_name)
    ]
    assert len(found) == 1, (labels, samples)
    return found[0]


def parts(broker: BrokerThread) -> tuple[Broker, Services]:
    assert broker.broker is not None
    assert broker.services is not None
    return broker.broker, broker.services


def test_prometheus_shows_the_brokers_state(make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.flow.limitBehavior": "FLOW_CONTROL",
            "imq.destination.queue.flow.maxNumMsgs": "2",
        }
    )
    producer = RawClient(broker.port)
    producer.connect()
    for i in range(3):
        producer.send("SEND", {"destination": "/queue/flow"}, b"x" * (10 + i))
    producer.sync()
    consumer = RawClient(broker.port)
    consumer.connect()
    consumer.subscribe("/queue/other", ack="client-individual", **{"consumer-flow-limit": "1"})
    consumer.request("SEND", {"destination": "/queue/other"}, b"y")  # not behind the held SEND
    consumer.receive(1)

    metrics = scrape(broker)
    flow = {"destination": "/queue/flow", "type": "queue"}
    assert value(metrics["sluiceway_destination_messages"], **flow) == 2
    assert value(metrics["sluiceway_destination_message_bytes"], **flow) == 21
    assert value(metrics["sluiceway_destination_held_sends"], **flow) == 1
    assert value(metrics["sluiceway_destination_messages_in"], **flow) == 2  # _total counter
    assert value(metrics["sluiceway_destination_limit"], limit="maxNumMsgs", **flow) == 2
    assert value(metrics["sluiceway_held_producers"]) == 1
    assert value(metrics["sluiceway_messages"]) == 3
    assert value(metrics["sluiceway_connections"], service="stomp") == 2
    assert value(metrics["sluiceway_memory_level"], level="GREEN") == 1
    assert value(metrics["sluiceway_disk_state"], state="ok") == 1
    assert value(metrics["sluiceway_disk_state"], state="full") == 0
    assert value(metrics["sluiceway_disk_free_limit_bytes"]) == 50 * 1024 * 1024
    assert value(metrics["sluiceway_disk_free_bytes"]) > 0
    core, _ = parts(broker)
    assert value(metrics["sluiceway_memory_bytes"], kind="messages") == broker.call(
        lambda: core.ledger.used
    )
    paused = value(
        metrics["sluiceway_consumer_flow_paused_seconds"],
        destination="/queue/other",
        subscription="s1",
    )
    assert paused >= 0
    assert value(metrics["sluiceway_consumer_unacked_messages"], subscription="s1") == 1

    producer.close()  # the held SEND is dropped with its connection: one hold observed
    metrics = scrape(broker)
    hold = metrics["sluiceway_producer_hold_seconds"]
    assert value(hold, "sluiceway_producer_hold_seconds_count") == 1
    assert value(hold, "sluiceway_producer_hold_seconds_bucket", le="+Inf") == 1
    consumer.close()


def test_rates_peaks_and_averages(make_broker: BrokerFactory) -> None:
    broker = make_broker()
    core, services = parts(broker)
    name = parse_destination("/queue/rated")
    producer = RawClient(broker.port)
    producer.connect()
    producer.request("SEND", {"destination": "/queue/rated"}, b"first")
    broker.call(services.metrics.sample)
    for _ in range(10):
        producer.send("SEND", {"destination": "/queue/rated"}, b"12345")
    producer.sync()
    broker.call(services.metrics.sample)
    trend = broker.call(lambda: services.metrics.destination_trend(name))
    assert trend is not None
    assert trend.msgs_current == trend.msgs_peak == 11
    assert trend.msgs_avg == (1 + 11) / 2
    assert trend.rates.msgs_in == 10.0  # ten more within one sample interval
    assert trend.largest_msg == 5
    consumer = RawClient(broker.port)
    consumer.connect()
    consumer.subscribe("/queue/rated", ack="auto")
    consumer.receive(11)
    consumer.sync()
    broker.call(services.metrics.sample)
    trend = broker.call(lambda: services.metrics.destination_trend(name))
    assert trend is not None
    assert (trend.msgs_current, trend.msgs_peak) == (0, 11)
    (stomp,) = broker.call(services.metrics.service_trends)
    assert stomp.msgs_in == 11
    assert stomp.msgs_out == 11
    assert broker.call(lambda: core.destination(name).stats.msgs_out) == 11
    producer.close()
    consumer.close()


def test_history_rows_one_per_object_and_interval(make_broker: BrokerFactory) -> None:
    broker = make_broker({"imq.metrics.interval": "1"})
    _, services = parts(broker)
    assert services.history is not None
    client = RawClient(broker.port)
    client.connect()
    client.subscribe("/queue/history", ack="client-individual")
    client.request("SEND", {"destination": "/queue/history"}, b"x")
    client.receive(1)
    written = broker.call(lambda: services.history.write(time.time()) if services.history else 0)
    files = sorted(services.history.directory.glob("*.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    last = [r for r in rows if r["ts"] == rows[-1]["ts"]]
    assert len(last) == written
    kinds = [r["kind"] for r in last]
    assert kinds.count("broker") == 1
    assert kinds.count("service") == 1
    assert kinds.count("connection") == 1
    assert kinds.count("consumer") == 1
    (queue,) = [
        r for r in last if r["kind"] == "destination" and r["destination"] == "/queue/history"
    ]
    assert (queue["msgs"], queue["unacked"], queue["consumers"]) == (1, 1, 1)
    (consumer,) = [r for r in last if r["kind"] == "consumer"]
    assert (consumer["window_limit"], consumer["unacked"]) == (1000, 1)
    assert (consumer["window_threshold"], consumer["ack"], consumer["backup"]) == (
        50,
        "client-individual",
        False,
    )
    (top,) = [r for r in last if r["kind"] == "broker"]
    assert top["started"] == int(services.started * 1000)
    assert queue["dispatch_policy"] == "openmq"
    assert "held_producer" not in kinds  # nobody is held
    client.close()


def test_history_rows_name_held_producers_and_why(make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.tight.limitBehavior": "FLOW_CONTROL",
            "imq.destination.queue.tight.maxNumMsgs": "1",
        }
    )
    _, services = parts(broker)
    history = services.history
    assert history is not None
    producer = RawClient(broker.port)
    producer.connect()
    producer.request("SEND", {"destination": "/queue/tight"}, b"first")
    producer.send("SEND", {"destination": "/queue/tight", "receipt": "held"}, b"second")
    producer.sync()  # the second SEND is held: its receipt has not come
    rows = broker.call(lambda: history.rows(int(time.time() * 1000)))
    (held,) = [r for r in rows if r["kind"] == "held_producer"]
    assert held["destination"] == "/queue/tight"
    assert (held["reason"], held["limit"], held["held_sends"]) == (
        "destination full",
        "maxNumMsgs",
        1,
    )
    assert "maxNumMsgs is 1" in held["detail"]
    assert 0 <= held["held_for"] < 10
    producer.close()


def test_history_retention_and_size_bound(tmp_path: Path, make_broker: BrokerFactory) -> None:
    broker = make_broker(
        {"imq.metrics.history.retention": "2", "imq.metrics.history.max_size": "1k"}
    )
    _, services = parts(broker)
    writer = HistoryWriter(services, tmp_path)
    now = time.time()
    old = tmp_path / "20000101-00.jsonl"
    recent = [tmp_path / f"20200101-0{h}.jsonl" for h in range(3)]  # recent by their mtime
    old.write_text("{}\n")
    os.utime(old, (now - 3 * 3600, now - 3 * 3600))  # older than 2 hours
    for path in recent:
        path.write_text("x" * 400)
    broker.call(lambda: writer.write(now))
    removed = writer.prune(now)
    # The old file goes for its age; then the oldest recent ones until the rest fit in 1 KiB.
    assert removed[0] == old
    remaining = list(tmp_path.glob("*.jsonl"))
    assert sum(p.stat().st_size for p in remaining) <= 1024 or len(remaining) == 1
    assert (tmp_path / f"{writer._file_hour}.jsonl") in remaining
    writer.close()
