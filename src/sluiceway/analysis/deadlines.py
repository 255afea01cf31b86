"""Deadline misses per destination, and when to deliver a queue earliest deadline first.

A message with an expiration time (`expires`, from a producer's time to live) misses its
deadline when it expires before it is delivered (`expired`) or is acknowledged after it
(`consumed_late`: delivered in time, processed too late). The history records both as counters;
their growth over the range is the destination's deadline misses, and their share of the
messages it received over the range is given when it received any (misses of messages received
before the range count too, so a short range can show more than one per message received).

`deadline-misses`: a queue delivered in `fifo` order (deliveryOrder) missed deadlines over the
range. `deliveryOrder=deadline` delivers the message due soonest first, which meets more
deadlines when they are mixed (different times to live, or messages with and without one);
when every message has the same time to live, FIFO order already is earliest deadline first,
and the misses say the consumers do not keep up. The reason says both, and what deadline order
costs (messages with an expiration time stay in memory; one producer's messages may arrive out
of order). Messages acknowledged late were delivered in time and waited in a consumer: fewer of
them wait where windows are small, which the reason says when the windows are not adaptive.
"""

from __future__ import annotations

from typing import Final

from sluiceway.analysis.findings import DELIVERY_ORDER, Finding
from sluiceway.analysis.results import DestinationStats

FIFO: Final = "fifo"
DEADLINE: Final = "deadline"


def describe_misses(stats: DestinationStats) -> str:
    """The destination's deadline misses in words; "" when it had none or they are unknown."""
    misses = stats.deadline_misses
    if not misses:
        return ""
    share = stats.miss_share
    received = (
        f", {share:.1%} of the {stats.msgs_in:,} messages received" if share is not None else ""
    )
    return (
        f"{misses:,} deadline misses: {stats.expired:,} expired before delivery and "
        f"{stats.consumed_late:,} acknowledged after their deadline{received}"
    )


def deadline_order(stats: DestinationStats, adaptive: bool) -> Finding | None:
    """`deadline-misses`; `adaptive`: its consumers' windows are already sized by the broker."""
    if stats.type != "queue" or stats.delivery_order != FIFO or not stats.deadline_misses:
        return None
    reason = (
        f"{stats.destination} had {describe_misses(stats)}, and it delivers in fifo order: a "
        "message due soon waits behind every earlier one, however much later theirs are due. "
        "Set deliveryOrder=deadline to deliver the earliest deadline first. It helps when the "
        "deadlines are mixed (different times to live, or messages with and without one); when "
        "every message has the same time to live, fifo order already is earliest deadline "
        "first, and the misses say the consumers do not keep up (add consumers or make them "
        "faster). Under deadline order, messages with an expiration time stay in memory rather "
        "than being swapped to disk, and one producer's messages may arrive out of order."
    )
    if stats.consumed_late and not adaptive:
        reason += (
            f" Those acknowledged late ({stats.consumed_late:,}) were delivered in time and "
            "waited in a consumer: smaller windows keep fewer messages waiting there "
            "(consumerFlowLimit=auto sizes them to what each consumer gets through)."
        )
    return Finding("deadline-misses", DELIVERY_ORDER, DEADLINE, reason)
