"""Physical destination properties (Open MQ's names), and the enums they take."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from sluiceway.config.properties import (
    PropertyInfo,
    dest_prop,
    enum_parser,
    flow_limit_parser,
    flow_limit_text,
    int_parser,
    parse_bool,
    size_parser,
)
from sluiceway.naming import DestinationKind


class DispatchPolicy(enum.Enum):
    """How a queue shares its pending messages among ready consumers.

    OPENMQ reproduces Open MQ: the first ready consumer takes up to its flow-control window from
    the shared pending list, so with a backlog smaller than the sum of the windows one consumer may
    get everything while the others idle (the trade-off the Open MQ tuning guide describes: fewer,
    larger batches; uneven spread). FAIR gives each message to the ready consumer with the fewest
    outstanding messages, so a small backlog is spread evenly, at the cost of one comparison per
    consumer per message.
    """

    OPENMQ = "openmq"
    FAIR = "fair"


class DeliveryOrder(enum.Enum):
    """The order in which a queue's pending messages go to its consumers.

    FIFO is JMS's: higher priority first, then the order of arrival. DEADLINE is earliest
    deadline first: messages with an expiration time before those without, the earliest first,
    ties by priority and then arrival (core.containers.deadlines).
    """

    FIFO = "fifo"
    DEADLINE = "deadline"


class LimitBehavior(enum.Enum):
    """What a full destination does with a new message (Open MQ's `limitBehavior`)."""

    REJECT_NEWEST = "REJECT_NEWEST"  # refuse the new message (414/423, naming the limit)
    FLOW_CONTROL = "FLOW_CONTROL"  # hold the producer until there is room
    REMOVE_OLDEST = "REMOVE_OLDEST"  # evict the oldest messages (to the DMQ with useDMQ)
    REMOVE_LOW_PRIORITY = "REMOVE_LOW_PRIORITY"  # evict the lowest priority, oldest first


QUEUE_ONLY = (DestinationKind.QUEUE,)


@dataclass(frozen=True, slots=True)
class DestinationSettings:
    """Physical destination properties (Open MQ names) of one queue or topic.

    For a topic, the message limits apply to each subscription's backlog (the slowest
    subscriber decides) and to what the topic keeps for its durable subscriptions.
    """

    max_num_msgs: int = dest_prop(
        "maxNumMsgs",
        int_parser(minimum=-1),
        -1,
        "Most unconsumed messages the destination holds (pending, being delivered, awaiting "
        "acknowledgement); -1: no limit. Under FLOW_CONTROL producers are held at the limit.",
        shared_autocreate=True,
        autocreate_default=100_000,
    )
    max_total_msg_bytes: int = dest_prop(
        "maxTotalMsgBytes",
        size_parser(allow_unlimited=True),
        -1,
        "Most bytes of message bodies the destination holds; -1: no limit. Sizes take b, k, m, "
        "g suffixes.",
        shared_autocreate=True,
        autocreate_default=10 * 1024**3,
    )
    max_bytes_per_msg: int = dest_prop(
        "maxBytesPerMsg",
        size_parser(allow_unlimited=True),
        -1,
        "Largest message body accepted, in bytes; -1: no limit. A larger one is refused with "
        "status 423, whatever the limit behavior.",
        shared_autocreate=True,
        autocreate_default=10 * 1024**2,
    )
    limit_behavior: LimitBehavior = dest_prop(
        "limitBehavior",
        enum_parser(LimitBehavior),
        LimitBehavior.REJECT_NEWEST,
        "What happens when maxNumMsgs or maxTotalMsgBytes is reached: REJECT_NEWEST (refuse the "
        "new message), FLOW_CONTROL (hold its producer until there is room), REMOVE_OLDEST or "
        "REMOVE_LOW_PRIORITY (evict, to the dead message queue when useDMQ).",
        shared_autocreate=True,
    )
    max_num_producers: int = dest_prop(
        "maxNumProducers",
        int_parser(minimum=-1),
        100,
        "Most connections that may send to the destination at a time (a connection becomes a "
        "producer of a destination with its first SEND to it); -1: no limit. Beyond it a SEND "
        "is refused with status 409.",
        shared_autocreate=True,
    )
    max_num_active_consumers: int = dest_prop(
        "maxNumActiveConsumers",
        int_parser(minimum=-1),
        -1,
        "Most consumers of a queue that receive messages; -1: no limit. Further consumers are "
        "backups that receive nothing until an active one leaves.",
        kinds=QUEUE_ONLY,
    )
    max_num_backup_consumers: int = dest_prop(
        "maxNumBackupConsumers",
        int_parser(minimum=-1),
        0,
        "Most backup consumers of a queue; -1: no limit. Beyond both limits a SUBSCRIBE is "
        "refused with status 409.",
        kinds=QUEUE_ONLY,
    )
    use_dmq: bool = dest_prop(
        "useDMQ",
        parse_bool,
        True,
        "Send dead messages (expired, evicted, delivered too often) to the dead message queue "
        "/queue/mq.sys.dmq; false: discard them.",
        shared_autocreate=True,
    )
    max_delivery_count: int = dest_prop(
        "maxDeliveryCount",
        int_parser(minimum=-1),
        -1,
        "Deliveries after which a message that is still not acknowledged is dead (to the dead "
        "message queue with useDMQ); -1: no limit.",
        shared_autocreate=True,
    )
    consumer_flow_limit: int = dest_prop(
        "consumerFlowLimit",
        flow_limit_parser,
        1000,
        "Cap on each consumer's flow limit, in messages; the smaller of this and the consumer's "
        "own limit wins. 0 or -1: no cap. auto: the broker sizes each consumer's window from "
        "its measured pace and round trip, within the consumer's own limit (docs/flow-control.md).",
        text=flow_limit_text,
    )
    delivery_order: DeliveryOrder = dest_prop(
        "deliveryOrder",
        enum_parser(DeliveryOrder),
        DeliveryOrder.FIFO,
        "The order in which pending messages go to consumers: fifo (priority, then arrival, as "
        "JMS orders them) or deadline (earliest deadline first: messages with an expiration "
        "time before those without, the earliest first, ties by priority then arrival; it "
        "relaxes JMS's order within a priority; docs/flow-control.md).",
        kinds=QUEUE_ONLY,
    )
    dispatch_policy: DispatchPolicy = dest_prop(
        "dispatchPolicy",
        enum_parser(DispatchPolicy),
        DispatchPolicy.OPENMQ,
        "How a queue shares pending messages among ready consumers: openmq (the first ready "
        "consumer takes up to its window, as Open MQ does) or fair (each message to the ready "
        "consumer that will be done soonest with what it holds, measured by its pace between "
        "acknowledgements; a slow consumer is given fewer messages, so that no consumer idles "
        "while another holds messages it has not started).",
        kinds=QUEUE_ONLY,
    )


def autocreate_defaults(kind: DestinationKind) -> dict[str, Any]:
    """Fields whose Open MQ default differs for destinations created on first use."""
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(DestinationSettings):
        info = f.metadata["property"]
        assert isinstance(info, PropertyInfo)
        if info.has_autocreate_default and kind in info.kinds:
            defaults[f.name] = info.autocreate_default
    return defaults


def autocreated_settings(kind: DestinationKind) -> DestinationSettings:
    """The settings of an auto-created destination when no `imq.autocreate.*` line is given."""
    return DestinationSettings(**autocreate_defaults(kind))


@dataclass(frozen=True, slots=True)
class DestinationDefinition:
    """A destination created at start-up from `imq.destination.<kind>.<NAME>.<prop>` lines."""

    kind: DestinationKind
    name: str
    settings: DestinationSettings
