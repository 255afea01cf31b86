"""Consumer and connection flow control: Open MQ's windows, in messages.

Consumer flow control (`imqConsumerFlowLimit` L, default 1000; `imqConsumerFlowThreshold` T,
default 50 %; destination property `consumerFlowLimit`): after a subscription is created the broker
sends up to L messages; it then sends nothing more until the subscription's unconsumed messages
fall to floor(L*T/100) or below (capped at L-1); it then sends a batch of L minus the unconsumed.
The window is credit, not a time slot: if fewer than L messages exist, later arrivals keep flowing
until L have been sent since the last refill (Open MQ, reference section 1.2).

"Unconsumed" here counts every message the broker has given the subscription and not seen
consumed: staged for writing, written, or acknowledged inside a transaction not yet committed.

Adaptive windows (`consumerFlowLimit=auto` on a destination, `consumer-flow-limit:auto` on
SUBSCRIBE, `imqConsumerFlowLimit=auto` in the client): the broker sizes the window L of each
consumer that acknowledges (ack:client or ack:client-individual) from what it measures, as
`AutoWindow.size` computes it:

    reserve = ceil((round_trip x (1 + AUTO_MARGIN) + AUTO_SLACK_S) / pace) + 1
    L       = ceil(reserve x 100 / T)          (T = 0: L = reserve)
    L       = min(cap, max(pool, 1, min(L, memory_cap)))

- pace: the consumer's seconds per message, a moving average of the time between its
  acknowledgements while it holds messages (the measure the `fair` dispatch policy uses);
- round_trip: delivery to acknowledgement of one message at a time (written while the consumer
  held nothing), less the consumer's pace, a moving average;
- reserve: what the consumer must still hold when the broker tops its window up for it to stay
  busy until the new messages arrive (T is the threshold at which the window refills, so L is
  reserve x 100 / T);
- cap: the numeric limit of the other side (the consumer's own when the destination says auto,
  the destination's when the consumer does), AUTO_MAX when neither names one;
- memory_cap: the messages of the consumer's mean size that fit in imq.memory.budget /
  AUTO_MEMORY_SHARE;
- pool: the handler pool size the consumer declared (`consumer-pool-size`), so that a pool of
  handlers is never starved by a window smaller than itself (within the cap, the most the
  consumer was told it may be sent).

Until its pace is measured a consumer has AUTO_INITIAL messages (at least its pool). The size is
computed again as acknowledgements arrive (at most every AUTO_EVALUATE_S) and on the broker's
tick, where a consumer that has held a message longer than its pace counts as that slow. A
smaller window takes effect at the next top-up (messages already sent stay with the consumer); a
larger one at once. With ack:auto the broker sees no consumption, so auto means the cap.

Connection flow limit (`imqConnectionFlowLimit`, default 1000, only when
`imqConnectionFlowLimitEnabled`): the unconsumed messages of all subscriptions of one connection
never exceed the limit. Flow metering (`imqConnectionFlowCount` N, default 100) is applied where
frames are written: at most N payload frames go out before the connection's pending control frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sluiceway.config.properties import AUTO_FLOW_LIMIT, AUTO_FLOW_TEXT
from sluiceway.core.values.message import Message

DEFAULT_CONSUMER_FLOW_LIMIT: Final = 1000  # imqConsumerFlowLimit
DEFAULT_CONSUMER_FLOW_THRESHOLD: Final = 50  # imqConsumerFlowThreshold, percent
DEFAULT_CONNECTION_FLOW_COUNT: Final = 100  # imqConnectionFlowCount, payload frames
DEFAULT_CONNECTION_FLOW_LIMIT: Final = 1000  # imqConnectionFlowLimit, messages
# With no window at all, Open MQ still moves pending messages to a consumer 1000 at a time; this
# bounds how many messages one unlimited subscription holds staged and not yet written.
UNLIMITED_STAGING: Final = 1000
UNLIMITED: Final = -1  # how an unlimited window is written on the wire (Open MQ's convention)
# consumerFlowLimit=auto (consumer-flow-limit:auto), where a limit is an int, and how it is written.
AUTO: Final = AUTO_FLOW_LIMIT
AUTO_TEXT: Final = AUTO_FLOW_TEXT
# Adaptive windows (the module's docstring has the formula).
AUTO_MAX: Final = DEFAULT_CONSUMER_FLOW_LIMIT  # the cap when neither side names a number
AUTO_INITIAL: Final = 16  # the window until the consumer's pace is measured
AUTO_MARGIN: Final = 0.5  # round trips vary: cover half as much again
# Time the window covers besides the round trip: the broker and the consumer's process are not
# always on a core the moment they have work (a few milliseconds on a busy machine).
AUTO_SLACK_S: Final = 0.005
AUTO_MEMORY_SHARE: Final = 64  # one consumer's window holds at most the budget / this
AUTO_EVALUATE_S: Final = 0.05  # on acknowledgements, the size is computed at most this often
AUTO_WEIGHT: Final = 0.25  # of each new round-trip sample in its moving average


def effective_limit(client: int, destination: int) -> int:
    """The window L from the consumer's request and the destination's `consumerFlowLimit`.

    A value of 0 or -1 on either side means "no limit from this side"; otherwise the smaller wins.
    Unlike Open MQ, a consumer asking for an unlimited window still gets the destination's cap:
    a broker-side limit is never bypassed by the client. Returns UNLIMITED when neither side limits.
    """
    if AUTO in (destination, client):
        return auto_cap(client, destination)
    if destination <= 0:
        return client if client > 0 else UNLIMITED
    if client <= 0:
        return destination
    return min(client, destination)


def auto_cap(client: int, destination: int) -> int:
    """The most an adaptive window may grow to: the smaller numeric limit of the two sides,
    AUTO_MAX when neither names one."""
    caps = [limit for limit in (client, destination) if limit > 0]
    return min(caps) if caps else AUTO_MAX


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

    limit: int  # messages; UNLIMITED for no window; adaptive: the most it grows to
    threshold: int  # percent
    prefetch: bool
    auto: bool = False  # the window adapts (consumerFlowLimit=auto), within `limit`
    pool: int = 0  # handlers the consumer declared (consumer-pool-size); 0: none declared

    @classmethod
    def negotiate(
        cls,
        *,
        requested_limit: int,
        threshold: int,
        prefetch: bool,
        destination_limit: int,
        pool: int = 0,
    ) -> ConsumerFlow:
        """Apply `imqConsumerFlowLimitPrefetch` and the destination cap to a consumer's request
        (either side may ask for an adaptive window: AUTO)."""
        if not prefetch:
            # "messages are delivered to consumers one at a time and a new message is not sent
            # to a consumer until it consumes the message it has" (Admin Guide): L=1, T=0.
            return cls(limit=1, threshold=0, prefetch=False, pool=pool)
        auto = AUTO in (requested_limit, destination_limit)
        limit = effective_limit(requested_limit, destination_limit)
        return cls(limit, threshold, True, auto=auto, pool=pool)

    def fixed(self) -> ConsumerFlow:
        """The same settings with the window fixed at its cap (an adaptive window that cannot
        measure anything: ack:auto, browsers, lease readers)."""
        return ConsumerFlow(self.limit, self.threshold, self.prefetch, pool=self.pool)

    @property
    def resume_at(self) -> int:
        return resume_count(self.limit, self.threshold)


class ConsumerWindow:
    """Credit for one subscription: how many more messages it may be given now."""

    __slots__ = ("credit", "limit", "outstanding", "resume_at")

    def __init__(self, flow: ConsumerFlow) -> None:
        limit = flow.limit
        if flow.auto:
            limit = min(limit, max(AUTO_INITIAL, flow.pool))
        self.limit = limit
        self.resume_at = resume_count(limit, flow.threshold)
        self.credit = limit  # ignored when unlimited
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

    def resize(self, limit: int, threshold: int) -> bool:
        """An adaptive window's new size; True when that gave a used-up window credit again.

        A smaller window takes what is left of its credit down with it (messages already given
        stay given); a larger one adds the difference at once, or refills a used-up window whose
        unconsumed count is now at or below the new threshold."""
        if limit == self.limit:
            return False
        was_paused = self.credit == 0
        self.limit = limit
        self.resume_at = resume_count(limit, threshold)
        if not was_paused or self.outstanding <= self.resume_at:
            self.credit = max(0, limit - self.outstanding)
        return was_paused and self.credit > 0


class AutoWindow:
    """What an adaptive window is sized from, for one subscription (the module's docstring).

    The round trip is measured on one message at a time (the probe): the time from its write to
    its consumption, less the consumer's work on it (`end_probe`)."""

    __slots__ = (
        "cap",
        "evaluated_at",
        "mean_size",
        "memory",
        "pool",
        "probe",
        "probe_ahead",
        "probe_at",
        "round_trip",
        "threshold",
    )

    def __init__(self, flow: ConsumerFlow, memory_budget: int) -> None:
        self.cap = flow.limit
        self.threshold = flow.threshold
        self.pool = flow.pool
        self.memory = memory_budget // AUTO_MEMORY_SHARE  # bytes; 0: no budget
        self.mean_size = 0.0  # bytes a message of this consumer's costs, a moving average
        self.round_trip: float | None = None  # seconds; None until measured
        self.probe: Message | None = None  # the message being timed
        self.probe_at = 0.0
        self.probe_ahead = 0
        self.evaluated_at = 0.0

    def staged(self, cost: int) -> None:
        """One message of `cost` bytes was given to the consumer."""
        mean = self.mean_size
        self.mean_size = cost if not mean else mean + AUTO_WEIGHT * (cost - mean)

    def start_probe(self, message: Message, now: float, ahead: int) -> None:
        """Time `message`, written at `now` while the consumer held `ahead` earlier ones."""
        self.probe = message
        self.probe_at = now
        self.probe_ahead = ahead

    def end_probe(self, now: float, pace: float | None) -> None:
        """The probe was consumed at `now`: a round-trip sample, less the consumer's work on it
        and on the messages it held before it.

        Only a probe written while the consumer held nothing gives a sample once there is an
        estimate: behind other messages, some of them already done and their acknowledgements
        on the way, how much of the time was work is not known. A consumer whose window is
        large enough never holds nothing, so its estimate stays as it was; one whose round trip
        grew runs dry, and is measured again then."""
        self.probe = None
        ahead = self.probe_ahead
        previous = self.round_trip
        if ahead and previous is not None:
            return
        sample = max(0.0, now - self.probe_at - (ahead + 1) * (pace or 0.0))
        self.round_trip = (
            sample if previous is None else previous + AUTO_WEIGHT * (sample - previous)
        )

    def drop_probe(self, messages: list[Message]) -> None:
        """`messages` went back unconsumed: a probe among them gives no sample."""
        probe = self.probe
        if probe is not None and any(message is probe for message in messages):
            self.probe = None

    def size(self, pace: float | None) -> int:
        """The window for a consumer taking `pace` seconds per message (None: not measured)."""
        if pace is None:
            limit = AUTO_INITIAL
        else:
            cover = (self.round_trip or 0.0) * (1 + AUTO_MARGIN) + AUTO_SLACK_S
            reserve = (math.ceil(cover / pace) if pace > 0 else self.cap) + 1
            threshold = self.threshold
            limit = math.ceil(reserve * 100 / threshold) if threshold > 0 else reserve
        if self.memory and self.mean_size:
            limit = min(limit, int(self.memory // self.mean_size))
        # The pool before the memory share, the cap before both: the cap is what the consumer
        # was told it may be sent (its buffer's bound).
        return min(max(limit, self.pool, 1), self.cap)


@dataclass(frozen=True, slots=True)
class ConnectionFlow:
    """Connection-level settings from the CONNECT frame (Open MQ connection-factory names)."""

    count: int = DEFAULT_CONNECTION_FLOW_COUNT  # imqConnectionFlowCount; 0: no metering
    limit: int = DEFAULT_CONNECTION_FLOW_LIMIT  # imqConnectionFlowLimit
    limit_enabled: bool = False  # imqConnectionFlowLimitEnabled
