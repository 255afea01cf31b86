"""Pipeline readers as operators see them: each cursor group of a topic and each lease group of
a queue, shown as a consumer of its destination, with its lag (core.features.reader_lag says
what the lag counts).

The API lists them apart from the STOMP consumers (`GET /api/v1/readers`, and `readers` in a
destination's detail) and counts them apart (`pipeline_readers` beside `consumers`): a reader has
no connection, window or acknowledgement mode, and the consumer counts stay Open MQ's. In a
cluster each member shows the readers it serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluiceway.core.broker import Broker
from sluiceway.core.features.reader_lag import ReaderLag, reader_count, readers_of
from sluiceway.core.model.destination import Destination


@dataclass(frozen=True, slots=True)
class ReaderSnapshot:
    """One pipeline reader: a topic's cursor group or a queue's lease group."""

    destination: str  # its path, e.g. /queue/orders
    kind: str  # cursor-group | lease-group
    group: str
    lag_messages: int  # messages of the destination it has not yet taken
    lag_seconds: float  # the age of the oldest of them (0: none)
    position: int | None  # a cursor group's committed position; null for a lease group
    open_leases: int | None  # a lease group's open leases; null for a cursor group
    leased_messages: int | None  # the messages they hold (counted in lag_messages)


def reader_snapshot(destination: Destination, lag: ReaderLag, now_ms: int) -> ReaderSnapshot:
    return ReaderSnapshot(
        destination=destination.name.path,
        kind=lag.kind.value,
        group=lag.group,
        lag_messages=lag.messages,
        lag_seconds=round(lag.seconds(now_ms), 3),
        position=lag.position,
        open_leases=lag.open_leases,
        leased_messages=lag.leased_messages,
    )


def destination_readers(broker: Broker, destination: Destination) -> list[ReaderSnapshot]:
    """The pipeline readers of `destination`, by group name."""
    now = broker.clock.time_ms()
    return [
        reader_snapshot(destination, lag, now) for lag in readers_of(destination, broker.leases)
    ]


def pipeline_readers(broker: Broker, destination: Destination) -> int:
    """How many pipeline readers `destination` has (cheap: no lag is measured)."""
    return reader_count(destination, broker.leases)


def all_readers(broker: Broker, destinations: list[Destination]) -> list[ReaderSnapshot]:
    """The pipeline readers of `destinations`, in their order, each by group name."""
    return [
        reader
        for destination in destinations
        if pipeline_readers(broker, destination)
        for reader in destination_readers(broker, destination)
    ]
