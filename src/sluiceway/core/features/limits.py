"""Admission of a new message: destination limits, system limits, and what a full one does.

Checked in this order for every new message (Open MQ, reference sections 1.5-1.8):

1. `imq.message.max_size` and the destination's `maxBytesPerMsg`: a larger body is refused with
   status 423, whatever the limit behavior.
2. `imq.system.max_count` / `imq.system.max_size`: refused with 414 when the broker already holds
   that many messages or bytes, whatever the destination's limit behavior.
3. The destination's `maxNumMsgs` / `maxTotalMsgBytes` (for a topic, the fullest subscription
   backlog, or its log), by `limitBehavior`:
   - REJECT_NEWEST: refused with 414, naming the destination, the limit and its value;
   - FLOW_CONTROL: the producer is held until there is room (core.model.holding);
   - REMOVE_OLDEST / REMOVE_LOW_PRIORITY: room is made by evicting (to the dead message queue
     when `useDMQ`), and the new message is accepted.

A refusal of a non-persistent message whose SEND asked for no receipt is not reported: the
message is dropped and counted, as Open MQ does (the producer asked to hear nothing).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sluiceway.config import BrokerConfig, LimitBehavior
from sluiceway.core.model.destination import Destination
from sluiceway.core.values.fullness import Fullness
from sluiceway.core.values.memory import SystemCounts
from sluiceway.core.values.message import Message
from sluiceway.errors import BrokerError, EntityTooLarge, ResourceFull


class Verdict(enum.Enum):
    ACCEPT = "accept"
    EVICT = "evict"  # accept after evicting to make room
    HOLD = "hold"  # keep the SEND until there is room
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Admission:
    verdict: Verdict
    error: BrokerError | None = None  # REJECT: what to tell the producer; HOLD: why it waits


ACCEPT = Admission(Verdict.ACCEPT)


def check_size(destination: str, size: int, config: BrokerConfig, max_per_msg: int) -> None:
    """Refuse (423) a body larger than imq.message.max_size or the destination's maxBytesPerMsg."""
    if not (0 <= config.message_max_size < size or 0 <= max_per_msg < size):
        return  # (checked first: every message passes here)
    for limit, value in (
        ("imq.message.max_size", config.message_max_size),
        ("maxBytesPerMsg", max_per_msg),
    ):
        if 0 <= value < size:
            raise EntityTooLarge(
                "message too large",
                f"a message of {size} bytes for {destination} exceeds {limit} ({value} bytes); "
                "send smaller messages or raise the limit",
                destination=destination,
                limit=limit,
                limit_value=str(value),
            )


def check_system(destination: str, size: int, config: BrokerConfig, system: SystemCounts) -> None:
    """Refuse (414) when the broker already holds imq.system.max_count messages or max_size."""
    if 0 <= config.system_max_count <= system.count:
        raise _full(destination, "imq.system.max_count", config.system_max_count, "messages")
    if 0 <= config.system_max_size < system.bytes + size:
        raise _full(destination, "imq.system.max_size", config.system_max_size, "bytes")


def destination_verdict(
    destination: str,
    size: int,
    fullness: Fullness,
    *,
    max_count: int,
    max_bytes: int,
    behavior: LimitBehavior,
) -> Admission:
    """What the destination's limits say about one more message of `size` bytes."""
    if 0 <= max_count <= fullness.count:
        limit, value, unit = "maxNumMsgs", max_count, "messages"
    elif 0 <= max_bytes < fullness.bytes + size:
        limit, value, unit = "maxTotalMsgBytes", max_bytes, "bytes"
    else:
        return ACCEPT
    error = _full(destination, limit, value, unit)
    if behavior is LimitBehavior.REJECT_NEWEST:
        return Admission(Verdict.REJECT, error)
    if behavior is LimitBehavior.FLOW_CONTROL:
        return Admission(Verdict.HOLD, error)
    return Admission(Verdict.EVICT)


def _full(destination: str, limit: str, value: int, unit: str) -> ResourceFull:
    return ResourceFull(
        "destination full" if not limit.startswith("imq.system") else "broker full",
        f"{destination} cannot take the message: {limit} is {value} {unit} and "
        + ("the destination" if not limit.startswith("imq.system") else "the broker")
        + " is at it. Retry later, consume faster, or raise the limit",
        destination=destination,
        limit=limit,
        limit_value=str(value),
    )


def make_room(destination: Destination, message: Message) -> BrokerError | None:
    """REMOVE_OLDEST / REMOVE_LOW_PRIORITY: evict from `destination` until `message` fits;
    the error to give when it cannot (the caller holds the store's atomic block)."""
    settings = destination.settings
    lowest = settings.limit_behavior is LimitBehavior.REMOVE_LOW_PRIORITY
    alone = destination_verdict(
        destination.name.path,
        message.size,
        Fullness(0, 0),
        max_count=settings.max_num_msgs,
        max_bytes=settings.max_total_msg_bytes,
        behavior=LimitBehavior.REJECT_NEWEST,
    )
    if alone.error is not None:
        return alone.error  # it would not fit in the empty destination: evict nothing
    while True:
        verdict = destination_verdict(
            destination.name.path,
            message.size,
            destination.fullness(),
            max_count=settings.max_num_msgs,
            max_bytes=settings.max_total_msg_bytes,
            behavior=LimitBehavior.REJECT_NEWEST,
        )
        if verdict.verdict is Verdict.ACCEPT:
            return None
        if not destination.evict_one(lowest_priority=lowest):
            return verdict.error  # what fills it cannot be evicted (being delivered)
