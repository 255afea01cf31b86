"""The metrics history: one row per object per interval, as JSON lines a Spark job can read.

Every `imq.metrics.interval` seconds the broker appends one row for itself, one per service,
destination, connection, consumer and pipeline reader (a topic's cursor group, a queue's lease
group, with its lag), and one per connection whose SENDs are held, to `metrics/YYYYMMDD-HH.jsonl`
(UTC hours) in its data directory. Each row is flat: `ts` (ms since the epoch), `kind` (broker,
service, destination, connection, consumer, reader, held_producer) and that kind's fields, so
`spark.read.json("metrics/")` gives one table (`sluiceway analyze` reads it).
Files older than `imq.metrics.history.retention` hours are deleted, and the oldest go first
whenever the directory exceeds `imq.metrics.history.max_size`. Kept only with the file store.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from sluiceway.admin import model, readers
from sluiceway.admin.statistics import traffic_of
from sluiceway.config.properties import flow_limit_parser
from sluiceway.core.model.destination import Destination

if TYPE_CHECKING:
    from sluiceway.admin.view import BrokerView

log = logging.getLogger(__name__)

SUFFIX: Final = ".jsonl"


class HistoryWriter:
    """Appends rows each interval and enforces retention; called from the broker's tick."""

    def __init__(self, services: BrokerView, directory: Path) -> None:
        config = services.config
        self.services = services
        self.directory = directory
        self.interval = config.metrics_interval_s
        self.retention_s = config.metrics_retention_h * 3600
        self.max_size = config.metrics_max_size
        self._next = 0.0
        self._file: IO[str] | None = None
        self._file_hour = ""

    def tick(self) -> None:
        now = time.time()
        if now < self._next:
            return
        self._next = now + self.interval
        try:
            self.write(now)
            self.prune(now)
        except OSError as exc:
            log.warning("metrics history not written to %s: %s", self.directory, exc)

    def write(self, now: float) -> int:
        """Append this interval's rows; return how many."""
        rows = self.rows(int(now * 1000))
        handle = self._open(now)
        for row in rows:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")
        handle.flush()
        return len(rows)

    def _open(self, now: float) -> IO[str]:
        hour = time.strftime("%Y%m%d-%H", time.gmtime(now))
        if self._file is None or hour != self._file_hour:
            if self._file is not None:
                self._file.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = (self.directory / f"{hour}{SUFFIX}").open("a", encoding="utf-8")
            self._file_hour = hour
        return self._file

    def prune(self, now: float) -> list[Path]:
        """Delete files past the retention, then the oldest while over max_size."""
        files = sorted(self.directory.glob(f"*{SUFFIX}"))
        current = self.directory / f"{self._file_hour}{SUFFIX}"
        removed = []
        sizes = {path: path.stat().st_size for path in files}
        total = sum(sizes.values())
        for path in files:
            if path == current:
                break
            too_old = now - path.stat().st_mtime > self.retention_s
            if too_old or total > self.max_size:
                path.unlink(missing_ok=True)
                total -= sizes[path]
                removed.append(path)
        return removed

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def rows(self, ts: int) -> list[dict[str, Any]]:
        services = self.services
        broker = services.broker
        sampler = services.metrics
        snapshot = model.broker_snapshot(broker, services, services.started)
        rates = sampler.broker_rates()
        rows: list[dict[str, Any]] = [
            {
                "ts": ts,
                "kind": "broker",
                # Tells one run of the broker from the next: counters and connection numbers
                # start again at a restart.
                "started": snapshot.started,
                "msgs": snapshot.msgs,
                "msg_bytes": snapshot.msg_bytes,
                **sampler.broker_traffic(),
                "msgs_in_rate": rates.msgs_in,
                "msgs_out_rate": rates.msgs_out,
                "connections": snapshot.connections,
                "memory_level": snapshot.memory.level,
                "memory_used": snapshot.memory.used,
                "memory_budget": snapshot.memory.budget,
                "held_producers": snapshot.held_producers,
                "throttled": len(snapshot.throttled),
                "disk_bytes": snapshot.disk_bytes,
                "disk_state": snapshot.disk.state,
                "disk_free": snapshot.disk.free,
            }
        ]
        for service in sampler.service_trends():
            rows.append(
                {
                    "ts": ts,
                    "kind": "service",
                    "service": service.name,
                    "connections": service.connections,
                    "msgs_in": service.msgs_in,
                    "msgs_out": service.msgs_out,
                    "bytes_in": service.bytes_in,
                    "bytes_out": service.bytes_out,
                    "frames_in": service.frames_in,
                    "frames_out": service.frames_out,
                }
            )
        destinations = model.list_destinations(broker)
        for destination in destinations:
            rows.append(self._destination_row(ts, destination))
        for connection in model.connections(broker, services):
            rows.append(
                {
                    "ts": ts,
                    "kind": "connection",
                    "connection": connection.id,
                    "service": connection.service,
                    "user": connection.user,
                    "subscriptions": connection.subscriptions,
                    "outstanding": connection.outstanding,
                    "held_sends": connection.held_sends,
                    "write_buffer": connection.write_buffer,
                }
            )
        for consumer in model.consumers(broker):
            rows.append(
                {
                    "ts": ts,
                    "kind": "consumer",
                    "destination": consumer.destination,
                    "connection": consumer.connection,
                    "subscription": consumer.id,
                    "ack": consumer.ack,
                    "backup": consumer.backup,
                    "window_limit": consumer.window_limit,
                    "window_threshold": consumer.window_threshold,
                    "window_auto": consumer.window_auto,
                    "window_max": consumer.window_max,
                    "pace_ms": consumer.pace_ms,
                    "round_trip_ms": consumer.round_trip_ms,
                    "pool_size": consumer.pool_size,
                    "outstanding": consumer.outstanding,
                    "unacked": consumer.unacked,
                    "delivered": consumer.delivered,
                    "flow_paused_for": consumer.flow_paused_for,
                }
            )
        for reader in readers.all_readers(broker, destinations):
            rows.append(
                {
                    "ts": ts,
                    "kind": "reader",
                    "destination": reader.destination,
                    "reader_kind": reader.kind,
                    "group": reader.group,
                    "lag_messages": reader.lag_messages,
                    "lag_seconds": reader.lag_seconds,
                    "position": reader.position,
                    "open_leases": reader.open_leases,
                    "leased_messages": reader.leased_messages,
                }
            )
        for held in model.held_producers(broker):
            rows.append(
                {
                    "ts": ts,
                    "kind": "held_producer",
                    "connection": held.connection,
                    "destination": held.destination,
                    "reason": held.reason,
                    "limit": held.limit,
                    "detail": held.detail,
                    "held_for": held.held_for,
                    "held_sends": held.held_sends,
                    "held_bytes": held.held_bytes,
                }
            )
        return rows

    def _destination_row(self, ts: int, destination: Destination) -> dict[str, Any]:
        summary = model.destination_summary(self.services.broker, destination)
        trend = self.services.metrics.destination_trend(destination.name)
        properties = model.destination_properties(destination)
        return {
            "ts": ts,
            "kind": "destination",
            "destination": summary.path,
            "type": summary.type,
            "state": summary.state,
            "msgs": summary.msgs,
            "msg_bytes": summary.msg_bytes,
            "pending": summary.pending,
            "unacked": summary.unacked,
            "producers": summary.producers,
            "consumers": summary.consumers,
            "pipeline_readers": summary.pipeline_readers,
            "held_sends": summary.held_sends,
            "throttled": summary.throttled,
            **traffic_of(destination.stats),
            "msgs_in_rate": trend.rates.msgs_in if trend is not None else 0.0,
            "msgs_out_rate": trend.rates.msgs_out if trend is not None else 0.0,
            "max_num_msgs": int(properties["maxNumMsgs"]),
            "consumer_flow_limit": flow_limit_parser(properties["consumerFlowLimit"]),
            "limit_behavior": properties["limitBehavior"],
            "dispatch_policy": properties.get("dispatchPolicy"),  # queues only
            "delivery_order": properties.get("deliveryOrder"),  # queues only
            "expired": destination.stats.expired,
            "consumed_late": destination.stats.late,
        }
