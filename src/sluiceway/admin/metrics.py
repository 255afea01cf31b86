"""Metrics that need history: rates, peaks and averages, sampled once a tick (every second).

Totals (messages and bytes in and out) are counted where they happen (destination statistics,
each connection's traffic). The sampler keeps the last RATE_WINDOW seconds of totals, so a rate
is the change over that window, and per destination the peak and the running average of its
message count and bytes since the broker started (Open MQ's `metrics dst` Current/Peak/Avg).
Everything it keeps is bounded by the number of destinations and services.

The counts clients make grow (open transactions and what they hold, cursors, lease groups:
core.values.counts) are read when asked: the highest of each now, and how often its limit refused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sluiceway.admin.statistics import TRAFFIC, subscriptions_of
from sluiceway.config import BROKER_PROPERTIES
from sluiceway.core.broker import Broker
from sluiceway.core.model.destination import Destination, DestinationStats
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.counts import CountLimit
from sluiceway.naming import DestinationName

if TYPE_CHECKING:
    from sluiceway.admin.listeners import ListenersView

RATE_WINDOW: Final = 5  # seconds over which rates are measured


@dataclass(frozen=True, slots=True)
class Rates:
    """Per second, over the last RATE_WINDOW seconds."""

    msgs_in: float
    msgs_out: float
    bytes_in: float
    bytes_out: float


@dataclass(frozen=True, slots=True)
class DestinationTrend:
    """`metrics dst`: current, peak and average counts; largest message; rates."""

    msgs_current: int
    msgs_peak: int
    msgs_avg: float
    bytes_current: int
    bytes_peak: int
    bytes_avg: float
    largest_msg: int
    active_consumers_peak: int
    rates: Rates
    cursors: int  # a topic's cursors (imq.cursor.max_groups); 0 for a queue
    lease_groups: int  # a queue's lease groups (imq.lease.max_groups); 0 for a topic


@dataclass(frozen=True, slots=True)
class ServiceTrend:
    """`metrics svc`: what one service (stomp, stomp-tls, ws) carried, totals and rates; and
    what bounds its input and connections."""

    name: str
    connections: int
    connections_closed: int
    # Connections this service refused when they opened, or ended for their input, by the
    # limit's property (imq.stomp.max_connections, ..._per_address, imq.stomp.input.*, ...).
    refused: dict[str, int]
    # The most connections one client address has open, over all STOMP services together
    # (what imq.stomp.max_connections_per_address bounds).
    per_address_max: int
    input_bytes: int  # bytes of frames being received its connections hold
    msgs_in: int
    msgs_out: int
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    rates: Rates
    frames_in_rate: float
    frames_out_rate: float


@dataclass(frozen=True, slots=True)
class CountTrend:
    """One count clients make grow, bounded by a property (core.values.counts)."""

    limit: str  # the property, e.g. imq.stomp.max_transactions
    value: int  # the limit in force
    per: str  # what it bounds each of: connection, transaction, topic or queue
    highest: int  # the highest count now, on any one connection, transaction or destination
    refused: int  # requests it refused since the broker started


_PER: Final = {
    CountLimit.TRANSACTIONS: "connection",
    CountLimit.TRANSACTION_SENDS: "transaction",
    CountLimit.TRANSACTION_MESSAGES: "connection",
    CountLimit.TRANSACTION_BYTES: "connection",
    CountLimit.CURSORS: "topic",
    CountLimit.LEASE_GROUPS: "queue",
}

_Totals = tuple[int, ...]  # msgs in, msgs out, bytes in, bytes out (statistics.TRAFFIC)


class _Track:
    """Totals over the rate window, and running peak/average of a current value pair."""

    __slots__ = (
        "bytes_peak",
        "bytes_sum",
        "consumers_peak",
        "msgs_peak",
        "msgs_sum",
        "samples",
        "window",
    )

    def __init__(self) -> None:
        self.window: deque[_Totals] = deque(maxlen=RATE_WINDOW + 1)
        self.samples = 0
        self.msgs_peak = self.bytes_peak = self.consumers_peak = 0
        self.msgs_sum = self.bytes_sum = 0

    def add(self, totals: _Totals, msgs: int = 0, size: int = 0, consumers: int = 0) -> None:
        self.window.append(totals)
        self.samples += 1
        self.msgs_peak = max(self.msgs_peak, msgs)
        self.bytes_peak = max(self.bytes_peak, size)
        self.consumers_peak = max(self.consumers_peak, consumers)
        self.msgs_sum += msgs
        self.bytes_sum += size

    def rates(self, now: _Totals) -> Rates:
        if not self.window:
            return Rates(0.0, 0.0, 0.0, 0.0)
        first = self.window[0]
        seconds = max(1, len(self.window) - 1)
        change = [round((b - a) / seconds, 1) for a, b in zip(first, now, strict=True)]
        return Rates(*change)


class MetricsSampler:
    """Samples the broker once a tick; answers rates, peaks and averages."""

    def __init__(self, broker: Broker, services: ListenersView) -> None:
        self.broker = broker
        self.services = services
        self._destinations: dict[DestinationName, _Track] = {}
        self._services: dict[str, _Track] = {}
        self._frames: dict[str, deque[tuple[int, int]]] = {}
        self._broker = _Track()

    def sample(self) -> None:
        """Record the totals and current values of now (called every second)."""
        seen = set()
        for destination in self.broker.registry:
            name = destination.name
            seen.add(name)
            track = self._destinations.setdefault(name, _Track())
            track.add(
                _destination_totals(destination.stats),
                destination.held_count,
                destination.held_bytes,
                len(subscriptions_of(destination)),
            )
        for gone in set(self._destinations) - seen:
            del self._destinations[gone]
        system = self.broker.context.system
        self._broker.add(self.broker_totals(), system.count, system.bytes)
        for listener in self.services.listeners:
            traffic = listener.traffic()
            track = self._services.setdefault(listener.name, _Track())
            track.add((traffic.msgs_in, traffic.msgs_out, traffic.bytes_in, traffic.bytes_out))
            frames = self._frames.setdefault(listener.name, deque(maxlen=RATE_WINDOW + 1))
            frames.append((traffic.frames_in, traffic.frames_out))

    def broker_totals(self) -> _Totals:
        totals = [0] * len(TRAFFIC)
        for destination in self.broker.registry:
            for column, value in enumerate(_destination_totals(destination.stats)):
                totals[column] += value
        return tuple(totals)

    def broker_traffic(self) -> dict[str, int]:
        """The broker's traffic totals (all destinations), by their names."""
        return {s.name: total for s, total in zip(TRAFFIC, self.broker_totals(), strict=True)}

    def broker_rates(self) -> Rates:
        return self._broker.rates(self.broker_totals())

    def destination_trend(self, name: DestinationName) -> DestinationTrend | None:
        destination = self.broker.registry.get(name)
        if destination is None:
            return None
        track = self._destinations.get(name) or _Track()
        samples = track.samples or 1
        return DestinationTrend(
            msgs_current=destination.held_count,
            msgs_peak=max(track.msgs_peak, destination.held_count),
            msgs_avg=round(track.msgs_sum / samples, 1),
            bytes_current=destination.held_bytes,
            bytes_peak=max(track.bytes_peak, destination.held_bytes),
            bytes_avg=round(track.bytes_sum / samples, 1),
            largest_msg=destination.stats.largest,
            active_consumers_peak=max(track.consumers_peak, len(subscriptions_of(destination))),
            rates=track.rates(_destination_totals(destination.stats)),
            cursors=cursor_count(destination),
            lease_groups=self.broker.leases.group_count(name),
        )

    def counts(self) -> list[CountTrend]:
        """Each bounded count: its limit, the highest count now, and its refusals."""
        highest = _highest_counts(self.broker)
        config = self.broker.config
        return [
            CountTrend(
                limit=limit.value,
                value=getattr(config, BROKER_PROPERTIES[limit.value][0]),
                per=_PER[limit],
                highest=highest[limit],
                refused=self.broker.refusals[limit],
            )
            for limit in CountLimit
        ]

    def service_trends(self) -> list[ServiceTrend]:
        trends = []
        for listener in self.services.listeners:
            traffic = listener.traffic()
            track = self._services.get(listener.name) or _Track()
            frames = self._frames.get(listener.name) or deque([(0, 0)])
            seconds = max(1, len(frames) - 1)
            closed = getattr(listener, "connections_closed", 0)
            trends.append(
                ServiceTrend(
                    name=listener.name,
                    connections=len(listener.connections()),
                    connections_closed=int(closed),
                    refused=dict(getattr(listener, "refusals", {})),
                    per_address_max=self.broker.connection_counts.most_per_address,
                    input_bytes=int(getattr(listener, "input_buffered", 0)),
                    msgs_in=traffic.msgs_in,
                    msgs_out=traffic.msgs_out,
                    bytes_in=traffic.bytes_in,
                    bytes_out=traffic.bytes_out,
                    frames_in=traffic.frames_in,
                    frames_out=traffic.frames_out,
                    rates=track.rates(
                        (traffic.msgs_in, traffic.msgs_out, traffic.bytes_in, traffic.bytes_out)
                    ),
                    frames_in_rate=round((traffic.frames_in - frames[0][0]) / seconds, 1),
                    frames_out_rate=round((traffic.frames_out - frames[0][1]) / seconds, 1),
                )
            )
        return trends


def cursor_count(destination: Destination) -> int:
    return len(destination.cursors) if isinstance(destination, Topic) else 0


def _highest_counts(broker: Broker) -> dict[CountLimit, int]:
    """The highest of each bounded count now (connections, transactions, destinations)."""
    highest = dict.fromkeys(CountLimit, 0)
    for connection in broker.connections.values():
        transactions = connection.transactions
        for limit, count in (
            (CountLimit.TRANSACTIONS, len(transactions)),
            (CountLimit.TRANSACTION_MESSAGES, transactions.messages),
            (CountLimit.TRANSACTION_BYTES, transactions.bytes),
            *((CountLimit.TRANSACTION_SENDS, len(tx.sends)) for tx in transactions.values()),
        ):
            highest[limit] = max(highest[limit], count)
    cursors = (cursor_count(destination) for destination in broker.registry)
    highest[CountLimit.CURSORS] = max(cursors, default=0)
    highest[CountLimit.LEASE_GROUPS] = broker.leases.most_groups()
    return highest


def _destination_totals(stats: DestinationStats) -> _Totals:
    return tuple(statistic.read(stats) for statistic in TRAFFIC)
