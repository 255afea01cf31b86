"""`/metrics` in the Prometheus text format, with the Prometheus project's own client library.

A custom collector reads the broker when Prometheus scrapes, so nothing is counted twice and no
metric object lives between scrapes. Names follow Prometheus's conventions: base units (bytes,
seconds), `_total` for counters. Labels: `destination` (its path, e.g. /queue/orders) and `type`;
`service` (stomp, stomp-tls, ws); `connection` (its number) and `subscription` for consumers;
`kind` (cursor-group, lease-group) and `group` for pipeline readers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from sluiceway import __version__
from sluiceway.admin import cluster, model, readers
from sluiceway.admin.statistics import DESTINATION_STATISTICS
from sluiceway.core.features.disk import DiskLevel, DiskStatus
from sluiceway.core.model.holding import HOLD_BUCKETS
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.memory import MemoryLevel

if TYPE_CHECKING:
    from sluiceway.admin.view import BrokerView
    from sluiceway.core.broker import Broker

_LIMITS = ("maxNumMsgs", "maxTotalMsgBytes", "maxBytesPerMsg", "maxNumProducers")


class BrokerCollector(Collector):
    """Everything /metrics shows, read at scrape time."""

    def __init__(self, services: BrokerView) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        yield from self._broker()
        yield from self._counts()
        yield from self._services()
        yield from self._destinations()
        yield from self._consumers()
        yield from self._readers()
        yield from self._connections()
        yield from cluster.metrics(self.services)

    def _broker(self) -> Iterator[Metric]:
        broker = self.services.broker
        info = GaugeMetricFamily(
            "sluiceway_broker_info",
            "The broker's version and instance",
            labels=["version", "instance"],
        )
        info.add_metric([__version__, broker.instance_id], 1)
        yield info
        system = broker.context.system
        yield GaugeMetricFamily(
            "sluiceway_messages", "Messages held in all destinations", value=system.count
        )
        yield GaugeMetricFamily(
            "sluiceway_message_bytes", "Body bytes held in all destinations", value=system.bytes
        )
        ledger = broker.ledger
        memory = GaugeMetricFamily(
            "sluiceway_memory_bytes", "Memory counted by the broker's ledger", labels=["kind"]
        )
        memory.add_metric(["messages"], ledger.used)
        memory.add_metric(["buffers"], ledger.external)
        memory.add_metric(["input"], ledger.input)
        yield memory
        yield from _input(broker)
        yield GaugeMetricFamily(
            "sluiceway_memory_budget_bytes", "imq.memory.budget", value=ledger.policy.budget
        )
        yield GaugeMetricFamily(
            "sluiceway_memory_peak_bytes", "Highest message memory so far", value=ledger.peak
        )
        level = GaugeMetricFamily(
            "sluiceway_memory_level", "1 for the current memory level", labels=["level"]
        )
        for candidate in MemoryLevel:
            level.add_metric([candidate.name], 1 if ledger.level is candidate else 0)
        yield level
        yield GaugeMetricFamily(
            "sluiceway_disk_bytes", "Bytes of the journal on disk", value=broker.store.disk_bytes()
        )
        yield from _disk(broker.disk.status())
        held = broker.producers.held()
        yield GaugeMetricFamily(
            "sluiceway_held_producers", "Connections with SENDs held", value=len(held)
        )
        times = broker.producers.hold_times
        cumulative, buckets = 0, []
        for bound, count in zip((*HOLD_BUCKETS, float("inf")), times.buckets, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(bound), cumulative))
        yield HistogramMetricFamily(
            "sluiceway_producer_hold_seconds",
            "How long held SENDs waited before they were accepted or refused",
            buckets=buckets,
            sum_value=times.total,
        )

    def _counts(self) -> Iterator[Metric]:
        """The counts clients make grow (core.values.counts), labelled by the property bounding
        each."""
        labels = ["limit"]
        value = GaugeMetricFamily("sluiceway_count_limit", "The limit in force", labels=labels)
        highest = GaugeMetricFamily(
            "sluiceway_count_highest",
            "The highest count now, on one connection, transaction or destination",
            labels=labels,
        )
        refusals = CounterMetricFamily(
            "sluiceway_count_refusals", "Requests the limit refused", labels=labels
        )
        for count in self.services.metrics.counts():
            value.add_metric([count.limit], count.value)
            highest.add_metric([count.limit], count.highest)
            refusals.add_metric([count.limit], count.refused)
        yield from (value, highest, refusals)

    def _services(self) -> Iterator[Metric]:
        connections = GaugeMetricFamily(
            "sluiceway_connections", "Open connections per service", labels=["service"]
        )
        traffic = {
            name: CounterMetricFamily(f"sluiceway_service_{name}", text, labels=["service"])
            for name, text in (
                ("bytes_in", "Bytes read from clients"),
                ("bytes_out", "Bytes written to clients"),
                ("frames_in", "STOMP frames read"),
                ("frames_out", "STOMP frames written"),
            )
        }
        refused = CounterMetricFamily(
            "sluiceway_connections_refused",
            "Connections refused when they opened, or ended for their input, by limit",
            labels=["service", "limit"],
        )
        for listener in self.services.listeners:
            connections.add_metric([listener.name], len(listener.connections()))
            carried = listener.traffic()
            for name, family in traffic.items():
                family.add_metric([listener.name], getattr(carried, name))
            for limit, count in getattr(listener, "refusals", {}).items():
                refused.add_metric([listener.name, limit], count)
        yield connections
        yield from traffic.values()
        yield refused

    def _destinations(self) -> Iterator[Metric]:
        broker = self.services.broker
        labels = ["destination", "type"]
        gauges = {
            name: GaugeMetricFamily(f"sluiceway_destination_{name}", text, labels=labels)
            for name, text in (
                ("messages", "Messages held: waiting, being delivered, unacknowledged"),
                ("message_bytes", "Body bytes held"),
                ("pending_messages", "Messages waiting for a consumer"),
                ("unacked_messages", "Messages delivered and not acknowledged"),
                ("producers", "Connections producing to it"),
                ("consumers", "Consumers attached (backups included)"),
                ("held_sends", "SENDs held for its producers"),
                ("throttled", "1 while its producers are throttled"),
                ("messages_peak", "Highest message count sampled"),
            )
        }
        paused = GaugeMetricFamily(
            "sluiceway_destination_paused", "1 while paused", labels=[*labels, "what"]
        )
        limits = GaugeMetricFamily(
            "sluiceway_destination_limit", "A limit property (-1: none)", labels=[*labels, "limit"]
        )
        cursors = GaugeMetricFamily(
            "sluiceway_destination_cursors", "A topic's cursors", labels=labels
        )
        groups = GaugeMetricFamily(
            "sluiceway_destination_lease_groups", "A queue's lease groups", labels=labels
        )
        counters = {
            statistic: CounterMetricFamily(
                f"sluiceway_destination_{statistic.metric}", statistic.help, labels=labels
            )
            for statistic in DESTINATION_STATISTICS
        }
        sampler = self.services.metrics
        for destination in model.list_destinations(broker):
            key = [destination.name.path, destination.name.kind.value]
            summary = model.destination_summary(broker, destination)
            trend = sampler.destination_trend(destination.name)
            values = {
                "messages": summary.msgs,
                "message_bytes": summary.msg_bytes,
                "pending_messages": summary.pending,
                "unacked_messages": summary.unacked,
                "producers": summary.producers,
                "consumers": summary.consumers,
                "held_sends": summary.held_sends,
                "throttled": int(summary.throttled),
                "messages_peak": trend.msgs_peak if trend is not None else summary.msgs,
            }
            for name, family in gauges.items():
                family.add_metric(key, values[name])
            paused.add_metric([*key, "producers"], int(destination.paused_producers))
            paused.add_metric([*key, "consumers"], int(destination.paused_consumers))
            properties = model.destination_properties(destination)
            for limit in _LIMITS:
                limits.add_metric([*key, limit], float(properties[limit]))
            if isinstance(destination, Topic):
                cursors.add_metric(key, len(destination.cursors))
            else:
                groups.add_metric(key, broker.leases.group_count(destination.name))
            for statistic, counter in counters.items():
                counter.add_metric(key, statistic.read(destination.stats))
        yield from gauges.values()
        yield paused
        yield limits
        yield cursors
        yield groups
        yield from counters.values()

    def _consumers(self) -> Iterator[Metric]:
        labels = ["destination", "connection", "subscription"]
        gauges = {
            name: GaugeMetricFamily(f"sluiceway_consumer_{name}", text, labels=labels)
            for name, text in (
                ("unacked_messages", "Messages delivered to it and not acknowledged"),
                ("outstanding_messages", "Messages given to it and not consumed (its window)"),
                ("window_messages", "Its flow limit now (-1: unlimited; adaptive: as sized)"),
                ("window_max_messages", "The most its window grows to (adaptive windows)"),
                ("window_auto", "1 when the broker sizes its window (consumerFlowLimit=auto)"),
                ("pace_seconds", "Measured time per message (0: not measured)"),
                ("round_trip_seconds", "Measured delivery-to-acknowledgement round trip (0: none)"),
                ("flow_paused_seconds", "How long its window has been used up (0: not paused)"),
            )
        }
        delivered = CounterMetricFamily(
            "sluiceway_consumer_delivered", "Messages written to it", labels=labels
        )
        for consumer in model.consumers(self.services.broker):
            key = [consumer.destination, str(consumer.connection), consumer.id]
            gauges["unacked_messages"].add_metric(key, consumer.unacked)
            gauges["outstanding_messages"].add_metric(key, consumer.outstanding)
            gauges["window_messages"].add_metric(key, consumer.window_limit)
            gauges["window_max_messages"].add_metric(key, consumer.window_max)
            gauges["window_auto"].add_metric(key, int(consumer.window_auto))
            gauges["pace_seconds"].add_metric(key, (consumer.pace_ms or 0.0) / 1000)
            gauges["round_trip_seconds"].add_metric(key, (consumer.round_trip_ms or 0.0) / 1000)
            gauges["flow_paused_seconds"].add_metric(key, consumer.flow_paused_for or 0.0)
            delivered.add_metric(key, consumer.delivered)
        yield from gauges.values()
        yield delivered

    def _readers(self) -> Iterator[Metric]:
        """Each pipeline reader's lag (admin.readers); a lease group's open leases too."""
        labels = ["destination", "kind", "group"]
        gauges = {
            name: GaugeMetricFamily(f"sluiceway_reader_{name}", text, labels=labels)
            for name, text in (
                ("lag_messages", "Messages of its destination it has not yet taken"),
                ("lag_seconds", "Age of the oldest message it has not yet taken (0: none)"),
                ("open_leases", "A lease group's open leases"),
                ("leased_messages", "Messages in a lease group's open leases"),
            )
        }
        broker = self.services.broker
        for reader in readers.all_readers(broker, model.list_destinations(broker)):
            key = [reader.destination, reader.kind, reader.group]
            gauges["lag_messages"].add_metric(key, reader.lag_messages)
            gauges["lag_seconds"].add_metric(key, reader.lag_seconds)
            if reader.open_leases is not None:
                gauges["open_leases"].add_metric(key, reader.open_leases)
                gauges["leased_messages"].add_metric(key, reader.leased_messages or 0)
        yield from gauges.values()

    def _connections(self) -> Iterator[Metric]:
        labels = ["connection", "service"]
        gauges = {
            name: GaugeMetricFamily(f"sluiceway_connection_{name}", text, labels=labels)
            for name, text in (
                ("held_sends", "Its SENDs held until their destination can take them"),
                ("write_buffer_bytes", "Bytes waiting to be written to it"),
                ("outstanding_messages", "Messages given to its consumers, not consumed"),
            )
        }
        for info in self.services.connections():
            key = [str(info.number), info.service]
            gauges["held_sends"].add_metric(key, info.held_sends)
            gauges["write_buffer_bytes"].add_metric(key, info.write_buffer)
            gauges["outstanding_messages"].add_metric(key, info.outstanding)
        yield from gauges.values()


def _input(broker: Broker) -> Iterator[Metric]:
    """Connections and the input they hold, against the limits of both (session.input_budget,
    core.values.connection_counts)."""
    counts, ledger = broker.connection_counts, broker.ledger
    for name, text, value in (
        (
            "connections_open",
            "STOMP connections open, all services (imq.stomp.max_connections)",
            counts.total,
        ),
        (
            "connections_per_address_max",
            "The most STOMP connections one client address has open "
            "(imq.stomp.max_connections_per_address)",
            counts.most_per_address,
        ),
        (
            "input_buffered_bytes",
            "Bytes of frames being received, all connections (imq.stomp.input.total.max_bytes)",
            ledger.input,
        ),
        (
            "input_limit_bytes",
            "imq.stomp.input.total.max_bytes in force (0: no limit)",
            ledger.policy.input_max,
        ),
    ):
        yield GaugeMetricFamily(f"sluiceway_{name}", text, value=value)


def _disk(status: DiskStatus) -> Iterator[Metric]:
    """The disk holding the journal: its state (an alert rule on state!="ok" sees a low disk
    before it is full), free space against the floor, and the records waiting for it."""
    state = GaugeMetricFamily(
        "sluiceway_disk_state",
        "1 for the current state of the journal's disk (ok, low, full, failed)",
        labels=["state"],
    )
    for level in DiskLevel:
        state.add_metric([level.name.lower()], 1 if status.level is level else 0)
    yield state
    for name, text, value in (
        ("free_bytes", "Bytes free on the journal's file system (-1: not measured)", status.free),
        ("free_limit_bytes", "imq.persist.file.disk.free.limit (0: no floor)", status.floor),
        ("backlog_bytes", "Journal records waiting in memory for the disk", status.backlog),
    ):
        yield GaugeMetricFamily(f"sluiceway_disk_{name}", text, value=value)


def register(app: web.Application, services: BrokerView) -> None:
    """Serve /metrics on the admin endpoint (`app`), read from `services`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(services))

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/metrics", metrics)
