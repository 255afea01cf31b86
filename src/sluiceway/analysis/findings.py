"""What a recommendation rule reports, and the measures several rules share.

A rule that fires gives a `Finding`: its name, the setting it is about, the value it proposes
(a number of messages or a percentage; `auto` for consumerFlowLimit=auto; `deadline` for
deliveryOrder) and the reason, with the numbers that made it fire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sluiceway.analysis.results import ConsumerStats
from sluiceway.config.properties import AUTO_FLOW_LIMIT, AUTO_FLOW_TEXT
from sluiceway.core.values.flow import DEFAULT_CONSUMER_FLOW_LIMIT

LIMIT: Final = "consumerFlowLimit"
THRESHOLD: Final = "consumerFlowThreshold"
DELIVERY_ORDER: Final = "deliveryOrder"
# Not a destination property: the SUBSCRIBE header that declares the handlers of one consumer
# (an MDB pool), which an adaptive window never goes below.
POOL_SIZE: Final = "consumer-pool-size"
AUTO: Final = AUTO_FLOW_TEXT  # the value of consumerFlowLimit=auto, as it is written
# Refills per second per consumer. Open MQ gives no number; these are our judgement: a refill is
# a scheduling round in the broker and, for clients that ask for more explicitly, a round trip,
# and beyond a few per second their cost dominates a slow batch's. Aim at two.
MAX_REFILLS_PER_S: Final = 4.0
TARGET_REFILLS_PER_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    setting: str  # LIMIT, THRESHOLD, DELIVERY_ORDER or POOL_SIZE
    value: int | str  # the value this rule proposes: a number, AUTO, or a delivery order
    reason: str


def limit_text(value: int | None) -> str:
    """A consumerFlowLimit as the report writes it: a number, unlimited, auto, or -."""
    if value is None:
        return "-"
    if value == AUTO_FLOW_LIMIT:
        return AUTO
    return "unlimited" if value <= 0 else str(value)


def prefetching(consumers: list[ConsumerStats]) -> list[ConsumerStats]:
    """Consumers whose window the flow limit governs: with ack:auto a message is consumed as it
    is written, so the connection's write buffer bounds it instead."""
    return [c for c in consumers if c.ack != "auto"]


def paced_limit(rate: float, threshold: int) -> int:
    """The limit that tops up a consumer consuming `rate` messages per second about
    TARGET_REFILLS_PER_S times a second at `threshold` percent, at most Open MQ's default."""
    wanted = math.ceil(rate / TARGET_REFILLS_PER_S * 100 / (100 - threshold))
    return min(DEFAULT_CONSUMER_FLOW_LIMIT, wanted)
