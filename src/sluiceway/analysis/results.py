"""What the Spark job hands back to the driver: small, typed values, one per collected row.

PySpark's `Row` gives untyped values; `value_of` and its siblings are the one place where they
become typed, and they fail loudly when a column has an unexpected type instead of letting a
wrong value reach a rule or a plot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final, Protocol

# Fewer messages consumed, or fewer intervals, while it held messages say nothing about a
# consumer's speed: one interval may be a stall.
MIN_BUSY_MESSAGES: Final = 5
MIN_BUSY_INTERVALS: Final = 2


class RowLike(Protocol):
    """What the conversion needs of a PySpark Row (also satisfied by a dict, in tests)."""

    def __getitem__(self, key: str, /) -> object: ...


def int_of(row: RowLike, key: str) -> int:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"column {key}: expected a whole number, got {value!r}")
    return value


def opt_int_of(row: RowLike, key: str) -> int | None:
    return None if row[key] is None else int_of(row, key)


def float_of(row: RowLike, key: str) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"column {key}: expected a number, got {value!r}")
    return float(value)


def opt_float_of(row: RowLike, key: str) -> float | None:
    return None if row[key] is None else float_of(row, key)


def str_of(row: RowLike, key: str, default: str = "") -> str:
    value = row[key]
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"column {key}: expected text, got {value!r}")
    return value


def bool_of(row: RowLike, key: str) -> bool:
    value = row[key]
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TypeError(f"column {key}: expected true or false, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Timeline:
    """The samples the analysis covers."""

    first_ms: int
    last_ms: int
    samples: int  # broker rows: one per interval
    interval_s: float  # median time between two samples
    runs: int  # broker runs (restarts start a new one)


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    """One time bucket of one destination: rates per second, counts averaged over the bucket."""

    destination: str
    ts_ms: int  # middle of the samples in the bucket
    in_rate: float | None  # messages per second; None where no rate could be measured
    out_rate: float | None
    msgs: float  # held: waiting, being delivered, unacknowledged
    pending: float  # waiting for a consumer
    unacked: float


@dataclass(frozen=True, slots=True)
class DestinationStats:
    destination: str
    type: str  # queue | topic
    msgs_in: int  # over the range analysed
    msgs_out: int
    mean_in_rate: float  # messages per second
    mean_out_rate: float
    peak_in_rate: float
    peak_out_rate: float
    peak_msgs: int
    peak_pending: int
    median_held: float  # messages held, over the samples where it held any
    pending_share: float  # fraction of samples with messages waiting for a consumer
    max_consumers: int
    consumer_flow_limit: int  # the destination's consumerFlowLimit, latest (<= 0: unlimited)
    dispatch_policy: str  # queues: openmq | fair; topics: ""
    limit_behavior: str
    stranded_s: float  # queues: time a consumer sat empty while another held 2+ unconsumed
    stranded_peak: int  # most unconsumed messages one consumer held while another sat empty
    paused_s: float  # total time its consumers spent paused by flow control
    held_s: float  # total time producers were held or throttled on it
    held_episodes: int
    # Its most pipeline readers at once (cursor groups, lease groups); 0 in history written
    # before they were recorded.
    max_readers: int = 0
    delivery_order: str = ""  # queues: fifo | deadline; "" for topics and older history
    # Deadline misses over the range (messages); None in history written before they were
    # recorded. Expired: removed unconsumed because their expiration time passed; consumed
    # late: delivered in time, acknowledged after it.
    expired: int | None = None
    consumed_late: int | None = None

    @property
    def deadline_misses(self) -> int | None:
        if self.expired is None or self.consumed_late is None:
            return None
        return self.expired + self.consumed_late

    @property
    def miss_share(self) -> float | None:
        """Deadline misses per message received over the range; None when either is unknown."""
        misses = self.deadline_misses
        return None if misses is None or self.msgs_in <= 0 else misses / self.msgs_in


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """One consumer (subscription) over the range: what it got, how long it was paused."""

    destination: str
    connection: int
    subscription: str
    run: int  # the broker run's start (ms since the epoch; 0 if the history predates it)
    ack: str
    backup: bool
    window_limit: int  # effective; -1: unlimited
    window_threshold: int | None  # percent; None in history written before it was recorded
    delivered: int  # messages written to it over the range
    share: float | None  # of its queue's deliveries, among the consumers compared (None: not)
    present_s: float
    paused_s: float
    pause_episodes: int
    longest_pause_s: float
    starved_s: float  # time it held nothing while its queue had messages waiting
    max_outstanding: int
    # Below: None (False) in history written before they were recorded.
    window_auto: bool = False  # the broker sizes its window (consumerFlowLimit=auto)
    window_cap: int | None = None  # auto: the most its window grows to (-1: no cap given)
    window_low: int | None = None  # its smallest and largest window over the range
    window_high: int | None = None
    pace_ms: float | None = None  # the broker's measure of its time per message (median)
    pace_low_ms: float | None = None
    pace_high_ms: float | None = None
    round_trip_ms: float | None = None  # auto: delivery to acknowledgement, less work (median)
    outstanding_p90: int | None = None  # unconsumed messages it held, 90th percentile
    # Messages it consumed over the intervals it held unconsumed messages at both ends of, and
    # their seconds: its speed while it had work (see `working_rate`).
    busy_consumed: int = 0
    busy_s: float = 0.0
    busy_intervals: int = 0

    @property
    def label(self) -> str:
        return f"{self.connection}/{self.subscription}"

    @property
    def rate(self) -> float:
        """Messages per second written to it while it was there."""
        return self.delivered / self.present_s if self.present_s > 0 else 0.0

    @property
    def working_rate(self) -> float | None:
        """Messages per second it consumed over the intervals it had work throughout (it held
        unconsumed messages at the samples that began and ended them); None from fewer than
        MIN_BUSY_MESSAGES or MIN_BUSY_INTERVALS. A consumer that empties its window and is
        refilled between two samples idled for part of such an interval: for it this is a lower
        bound."""
        if (
            self.busy_consumed < MIN_BUSY_MESSAGES
            or self.busy_intervals < MIN_BUSY_INTERVALS
            or self.busy_s <= 0
        ):
            return None
        return self.busy_consumed / self.busy_s


@dataclass(frozen=True, slots=True)
class ReaderStats:
    """One pipeline reader (a topic's cursor group, a queue's lease group) over the range: how
    far behind it was, in messages of its destination it had not taken and in the age of the
    oldest of them (admin.readers)."""

    destination: str
    kind: str  # cursor-group | lease-group
    group: str
    present_s: float  # samples that saw it, times the interval
    lag_messages: int  # at the last sample that saw it
    peak_lag_messages: int
    lag_seconds: float  # at the last sample that saw it
    peak_lag_seconds: float
    open_leases: int | None  # a lease group's, at the last sample; None for a cursor group
    last_seen_ms: int

    @property
    def label(self) -> str:
        return f"{self.kind} {self.group}"


@dataclass(frozen=True, slots=True)
class Distribution:
    """How a queue's messages were spread over the consumers that were there together."""

    destination: str
    consumers: int  # compared: active (not backup) and present at least half as long as the most
    delivered: int
    max_share: float
    min_share: float
    max_consumer: str  # connection/subscription
    min_consumer: str

    @property
    def ratio(self) -> float | None:
        """max/min share; None when a compared consumer got nothing."""
        return self.max_share / self.min_share if self.min_share > 0 else None


class Outcome(enum.Enum):
    """How a producer episode ended, as the sample after its last one tells (producers.py)."""

    ACCEPTED = "accepted"  # a connection's held SENDs: the destination took messages in
    REFUSED = "refused"  # a connection's held SENDs: it took none (refused, or dropped)
    LIFTED = "lifted"  # a whole destination's throttling or pause ended
    STOPPED = "broker stopped"  # the broker stopped (or restarted) while it lasted
    ONGOING = "ongoing"  # still going at the last sample analysed


ENDINGS: Final = {
    Outcome.ACCEPTED: "then accepted",
    Outcome.REFUSED: "then refused",
    Outcome.LIFTED: "then lifted",
    Outcome.STOPPED: "until the broker stopped",
    Outcome.ONGOING: "still going at the end of the range",
}


@dataclass(frozen=True, slots=True)
class ProducerEpisode:
    """A stretch of time during which producers were held (a connection) or throttled or paused
    (a whole destination); the start and end are estimates within half a sampling interval."""

    destination: str
    connection: int | None  # None: the destination as a whole
    reason: str
    limit: str
    detail: str  # the broker's explanation of why it held them
    start_ms: int
    end_ms: int
    outcome: Outcome
    max_held_sends: int

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end_ms - self.start_ms) / 1000)

    @property
    def ongoing(self) -> bool:
        return self.outcome is Outcome.ONGOING

    def describe(self) -> str:
        """How long it lasted and how it ended, e.g. "held 3.1 s, then accepted"."""
        lasted = "lasted" if self.connection is None else "held"
        return f"{lasted} {self.duration_s:,.1f} s, {ENDINGS[self.outcome]}"


@dataclass(frozen=True, slots=True)
class LoadSlice:
    """One destination over one of the equal periods the range is cut into (traffic.SLICES):
    the load a fixed window would have had to suit then."""

    destination: str
    start_ms: int  # its first and last sample
    end_ms: int
    samples: int
    median_held: float | None  # messages held, over its samples where any were; None: none
    consumers: float | None  # active consumers (not backups), median over its samples
    out_rate: float | None  # messages per second delivered; None where none was measured


@dataclass(frozen=True, slots=True)
class Collected:
    """Everything the report needs, gathered from Spark."""

    timeline: Timeline
    destinations: list[DestinationStats]
    destinations_left_off: int
    series: list[SeriesPoint]
    consumers: list[ConsumerStats]
    consumers_left_off: int
    distributions: list[Distribution]
    episodes: list[ProducerEpisode]
    episodes_left_off: int
    shuffle_partitions: int  # spark.sql.shuffle.partitions the job ran with
    readers: list[ReaderStats] = field(default_factory=list)
    readers_left_off: int = 0
    slices: list[LoadSlice] = field(default_factory=list)
