"""Physical destination properties (Open MQ's names), and the enums they take."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sluiceway.config.properties import dest_prop, enum_parser, int_parser
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


@dataclass(frozen=True, slots=True)
class DestinationSettings:
    """Physical destination properties (Open MQ names) of one queue or topic."""

    consumer_flow_limit: int = dest_prop(
        "consumerFlowLimit",
        int_parser(minimum=-1),
        1000,
        "Cap on each consumer's flow limit, in messages; the smaller of this and the consumer's "
        "own limit wins. 0 or -1: no cap.",
    )
    dispatch_policy: DispatchPolicy = dest_prop(
        "dispatchPolicy",
        enum_parser(DispatchPolicy),
        DispatchPolicy.OPENMQ,
        "How a queue shares pending messages among ready consumers: openmq (the first ready "
        "consumer takes up to its window, as Open MQ does) or fair (each message to the ready "
        "consumer with the fewest outstanding messages).",
        kinds=(DestinationKind.QUEUE,),
    )


@dataclass(frozen=True, slots=True)
class DestinationDefinition:
    """A destination created at start-up from `imq.destination.<kind>.<NAME>.<prop>` lines."""

    kind: DestinationKind
    name: str
    settings: DestinationSettings
