"""The counters of a destination, named once for every place that shows them.

The admin API's totals (admin.model), the metrics sampler's rates (admin.metrics), the history
files (admin.history) and /metrics (admin.prometheus) all read the same `DestinationStats`; this
table says, for each counter, the name the API and the history give it, how it is read, and the
counter /metrics exposes it as (`sluiceway_destination_<metric>`, with its help text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sluiceway.core.model.destination import Destination, DestinationStats
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import Subscription
from sluiceway.core.model.topic import Topic


@dataclass(frozen=True, slots=True)
class Statistic:
    """One counter of a destination since it was created."""

    name: str  # the field of the API's totals and of a history row
    read: Callable[[DestinationStats], int]
    metric: str  # the Prometheus counter: sluiceway_destination_<metric>
    help: str
    # One of the four traffic totals that the sampler turns into rates and the history writes.
    traffic: bool = False


DESTINATION_STATISTICS: Final = (
    Statistic("msgs_in", lambda s: s.msgs_in, "messages_in",
              "Messages accepted from producers", traffic=True),
    Statistic("msgs_out", lambda s: s.msgs_out, "messages_out",
              "Messages written to consumers, redeliveries included", traffic=True),
    Statistic("bytes_in", lambda s: s.bytes_in, "message_bytes_in",
              "Body bytes accepted from producers", traffic=True),
    Statistic("bytes_out", lambda s: s.bytes_out, "message_bytes_out",
              "Body bytes written to consumers", traffic=True),
    Statistic("consumed", lambda s: s.consumed, "messages_consumed",
              "Messages acknowledged"),
    Statistic("redelivered", lambda s: s.redelivered, "messages_redelivered",
              "Messages given back for delivery again"),
    Statistic("expired", lambda s: s.expired, "messages_expired",
              "Messages that expired before delivery"),
    Statistic("late", lambda s: s.late, "messages_consumed_late",
              "Messages acknowledged after their expiration time (delivered before it)"),
    Statistic("deadline_misses", lambda s: s.expired + s.late, "deadline_misses",
              "Messages with a deadline that missed it: expired before delivery, or "
              "acknowledged after it"),
    Statistic("dead", lambda s: s.dead, "messages_dead",
              "Messages that became dead (expired, evicted, undeliverable)"),
    Statistic("dropped", lambda s: s.dropped, "messages_dropped",
              "Messages refused without telling the producer"),
    Statistic("discarded", lambda s: s.discarded, "messages_discarded",
              "Messages sent to a topic nobody subscribed to"),
)  # fmt: skip
# msgs in, msgs out, bytes in, bytes out: the order of `Rates` and of a listener's traffic.
TRAFFIC: Final = tuple(statistic for statistic in DESTINATION_STATISTICS if statistic.traffic)


def totals_of(stats: DestinationStats) -> dict[str, int]:
    """Every counter of `stats`, by its name, in the table's order."""
    return {statistic.name: statistic.read(stats) for statistic in DESTINATION_STATISTICS}


def traffic_of(stats: DestinationStats) -> dict[str, int]:
    """The four traffic totals of `stats`, by their names."""
    return {statistic.name: statistic.read(stats) for statistic in TRAFFIC}


def subscriptions_of(destination: Destination) -> list[Subscription]:
    """The consumers attached to `destination` (queue consumers and backups, topic subscribers
    and attached durable subscribers); browsers are not consumers."""
    if isinstance(destination, Queue):
        return [*destination.consumers, *destination.backups]
    assert isinstance(destination, Topic)
    attached = [s.active for s in destination.durables.values() if s.active is not None]
    return [*destination.subscribers, *attached]
