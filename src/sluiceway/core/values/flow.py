"""Consumer and connection flow control: Open MQ's windows, in messages.

Consumer flow control (`imqConsumerFlowLimit` L, default 1000; `imqConsumerFlowThreshold` T,
default 50 %; destination property `consumerFlowLimit`): after a subscription is created the broker
sends up to L messages; it then sends nothing more until the subscription's unconsumed messages
fall to floor(L*T/100) or below (capped at L-1); it then sends a batch of L minus the unconsumed.
The window is credit, not a time slot: if fewer than L messages exist, later arrivals keep flowing
until L have been sent since the last refill (Open MQ, reference section 1.2).

"Unconsumed" here counts every message the broker has given the subscription and not seen
consumed: staged for writing, written, or acknowledged inside a transaction not yet committed.

Connection flow limit (`imqConnectionFlowLimit`, default 1000, only when
`imqConnectionFlowLimitEnabled`): the unconsumed messages of all subscriptions of one connection
never exceed the limit. Flow metering (`imqConnectionFlowCount` N, default 100) is applied where
frames are written: at most N payload frames go out before the connection's pending control frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_CONSUMER_FLOW_LIMIT: Final = 1000  # imqConsumerFlowLimit
DEFAULT_CONSUMER_FLOW_THRESHOLD: Final = 50  # imqConsumerFlowThreshold, percent
DEFAULT_CONNECTION_FLOW_COUNT: Final = 100  # imqConnectionFlowCount, payload frames
DEFAULT_CONNECTION_FLOW_LIMIT: Final = 1000  # imqConnectionFlowLimit, messages
# With no window at all, Open MQ still moves pending messages to a consumer 1000 at a time; this
# bounds how many messages one unlimited subscription holds staged and not yet written.
UNLIMITED_STAGING: Final = 1000
UNLIMITED: Final = -1  # how an unlimited window is written on the wire (Open MQ's convention)


def effective_limit(client: int, destination: int) -> int:
    """The window L from the consumer's request and the destination's `consumerFlowLimit`.

    A value of 0 or -1 on either side means "no limit from this side"; otherwise the smaller wins.
    Unlike Open MQ, a consumer asking for an unlimited window still gets the destination's cap:
    a broker-side limit is never bypassed by the client. Returns UNLIMITED when neither side limits.
    """
    if destination <= 0:
        return client if client > 0 else UNLIMITED
    if client <= 0:
        return destination
    return min(client, destination)


def destination_window(destination_limit: int) -> int:
    """A destination's effective consumer flow limit: its `consumerFlowLimit`, or the default
    imqConsumerFlowLimit when it sets no cap (0 or -1). What range reads report and what a
    queue lease takes when its reader asks for no size."""
    return destination_limit if destination_limit > 0 else DEFAULT_CONSUMER_FLOW_LIMIT


def resume_count(limit: int, threshold: int) -> int:
    """Unconsumed count at or below which a paused window refills: floor(L*T/100), at most L-1."""
    count = limit * threshold // 100
    return min(count, limit - 1) if limit > 0 else 0


@dataclass(frozen=True, slots=True)
class ConsumerFlow:
    """The effective flow settings of one subscription, as returned on its RECEIPT."""

    limit: int  # messages; UNLIMITED for no window
    threshold: int  # percent
    prefetch: bool

    @classmethod
    def negotiate(
        cls, *, requested_limit: int, threshold: int, prefetch: bool, destination_limit: int
    ) -> ConsumerFlow:
        """Apply `imqConsumerFlowLimitPrefetch` and the destination cap to a consumer's request."""
        if not prefetch:
            # "messages are delivered to consumers one at a time and a new message is not sent
            # to a consumer until it consumes the message it has" (Admin Guide): L=1, T=0.
            return cls(limit=1, threshold=0, prefetch=False)
        return cls(effective_limit(requested_limit, destination_limit), threshold, True)

    @property
    def resume_at(self) -> int:
        return resume_count(self.limit, self.threshold)


class ConsumerWindow:
    """Credit for one subscription: how many more messages it may be given now."""

    __slots__ = ("credit", "limit", "outstanding", "resume_at")

    def __init__(self, flow: ConsumerFlow) -> None:
        self.limit = flow.limit
        self.resume_at = flow.resume_at
        self.credit = flow.limit  # ignored when unlimited
        self.outstanding = 0  # given to the subscription and not consumed

    @property
    def unlimited(self) -> bool:
        return self.limit <= 0

    @property
    def paused(self) -> bool:
        """True while the window is used up and waits for consumption to fall to the threshold."""
        return self.limit > 0 and self.credit == 0

    def has_credit(self) -> bool:
        return self.limit <= 0 or self.credit > 0

    def take(self) -> None:
        """One message was given to the subscription."""
        self.outstanding += 1
        if self.limit > 0:
            self.credit -= 1

    def release(self, count: int = 1) -> bool:
        """`count` messages were consumed or taken back; True when the window just refilled."""
        self.outstanding -= count
        if self.limit > 0 and self.credit == 0 and self.outstanding <= self.resume_at:
            self.credit = self.limit - self.outstanding
            return True
        return False


@dataclass(frozen=True, slots=True)
class ConnectionFlow:
    """Connection-level settings from the CONNECT frame (Open MQ connection-factory names)."""

    count: int = DEFAULT_CONNECTION_FLOW_COUNT  # imqConnectionFlowCount; 0: no metering
    limit: int = DEFAULT_CONNECTION_FLOW_LIMIT  # imqConnectionFlowLimit
    limit_enabled: bool = False  # imqConnectionFlowLimitEnabled
