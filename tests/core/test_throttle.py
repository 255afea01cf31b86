"""JMS IQ Manager producer throttling: the worked example of spec-docs 003 replayed in the core.

Table 1-6 ("Publisher Throttling Example") follows Topic_A, with one publisher (Pub1) and two
subscribers, minute by minute while the whole server holds around 100,000 messages. Each row gives
the server's total, the messages read from Pub1 (the topic's highest sequence number), and the
messages sent to each subscriber; the comment says whether Pub1 is throttled. The replay builds
exactly those counts on a fake clock, runs the broker's periodic tick, and checks the state.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.message import Message
from sluiceway.core.values.throttle import Throttle
from sluiceway.naming import parse_destination
from sluiceway.testing import FakeClock
from tests.core.helpers import Client


class Row(NamedTuple):
    time: str
    server_total: int
    read_from_pub1: int
    sent_to_sub1: int
    sent_to_sub2: int
    throttled: bool


TABLE: Final = [
    Row("11:37", 98604, 500, 200, 75, False),  # server not yet over its limit
    Row("11:38", 100307, 800, 500, 150, False),  # over, but Topic_A's subscribers keep up
    Row("11:39", 101283, 1100, 800, 225, False),  # only 875 undelivered
    Row("11:40", 103429, 1350, 1050, 300, True),  # 1050 undelivered: throttled
    Row("11:41", 104031, 1350, 1300, 375, True),  # Sub2 still 975 behind
    Row("11:42", 103204, 1350, 1350, 449, True),  # 901: still too many
    Row("11:43", 102762, 1350, 1350, 451, False),  # 899 < 1000 - 100: released
    Row("11:44", 101095, 1375, 1370, 525, False),  # 850 undelivered
    Row("11:45", 100028, 1575, 1500, 600, False),  # 975: under the threshold, not throttled
    Row("11:46", 99248, 1900, 1700, 675, False),  # server under its limit: 1225 is allowed
]


class Replay:
    """Topic_A with Pub1, Sub1 and Sub2, plus a filler queue making up the server's total."""

    def __init__(self, broker: Broker, clock: FakeClock) -> None:
        self.broker, self.clock = broker, clock
        self.pub1 = Client(broker)
        self.subs = [Client(broker), Client(broker)]
        for sub in self.subs:
            # One message at a time: "sent to" is exactly what was written to the subscriber.
            sub.subscribe("/topic/Topic_A", ack=AckMode.AUTO, prefetch=False)
        topic = broker.destination(parse_destination("/topic/Topic_A"))
        filler = broker.destination(parse_destination("/queue/filler"))
        assert isinstance(topic, Topic)
        assert isinstance(filler, Queue)
        self.topic, self.filler = topic, filler
        self.sent = [0, 0]

    def play(self, row: Row) -> None:
        self.clock.advance(60)
        while self.topic.last_seq < row.read_from_pub1:
            self.pub1.send("/topic/Topic_A")
            assert not self.broker.producers.held(), f"{row.time}: Pub1 held before the reading"
        for index, target in enumerate((row.sent_to_sub1, row.sent_to_sub2)):
            taken = self.subs[index].take(target - self.sent[index])
            self.sent[index] += len(taken)
            assert self.sent[index] == target
        self.set_server_total(row.server_total)

    def set_server_total(self, total: int) -> None:
        """Messages on other destinations (no producer of them is throttled here)."""
        system = self.broker.context.system
        while system.count < total:
            self.filler.publish(_filler_message(self.filler))
        while system.count > total:
            message = self.filler.pending.pop()
            assert message is not None
            self.filler.finished(message)


def _filler_message(queue: Queue) -> Message:
    return Message(
        id=f"f{queue.last_seq}",
        destination=queue.name,
        body=b"",
        headers=(),
        priority=4,
        expires=0,
        persistent=False,
        timestamp=0,
    )


def test_defaults_are_the_documented_ones() -> None:
    config = build_config({})
    assert (
        config.throttling_server_threshold,
        config.throttling_destination_threshold,
        config.throttling_lag,
    ) == (100_000, 1000, 100)


def test_the_worked_example_table_row_by_row(clock: FakeClock) -> None:
    config = build_config(
        {
            "imq.destination.queue.filler.maxNumMsgs": "-1",
            "imq.producer.hold.timeout": "600000",  # the table spans minutes
        }
    )
    broker = Broker(config, clock=clock)
    replay = Replay(broker, clock)
    held_since_41 = 0  # the message Pub1 sends at 11:41, while throttled
    for row in TABLE:
        replay.play(row)
        read = row.read_from_pub1 + (1 if row.time == "11:43" else 0)
        assert replay.topic.last_seq == read, row.time
        assert replay.topic.undelivered() == read - min(row.sent_to_sub1, row.sent_to_sub2)
        assert broker.context.system.count == row.server_total, row.time
        broker.tick()  # the periodic review decides
        assert replay.topic.throttled is row.throttled, f"{row.time}: {row}"
        if row.time == "11:41":
            # What Pub1 sends while throttled waits, with the throttling as its reason.
            replay.pub1.send("/topic/Topic_A")
            (held,) = broker.producers.held()
            assert held.reason == "producer throttled"
            assert held.limit == "imq.throttling.destination.threshold"
            held_since_41 = len(replay.pub1.held)
        if row.time == "11:42":
            assert len(broker.producers.held()) == 1
        if row.time == "11:43":
            # Released as soon as Sub2's 451st message left 899 undelivered (below 1000 - 100):
            # the held message went out then, before this row's tick.
            assert held_since_41 == 1
            assert broker.producers.held() == []
            assert [error for _, error in replay.pub1.outcomes] == [None]


@pytest.mark.parametrize(
    ("throttled", "server", "undelivered", "expected"),
    [
        (False, 100_000, 5000, False),  # the server must be over its threshold, not at it
        (False, 100_001, 1000, False),  # and the destination over its own
        (False, 100_001, 1001, True),
        (True, 100_001, 900, True),  # released only below threshold - lag
        (True, 100_001, 899, False),
        (True, 100_000, 5000, False),  # or when the server is no longer over
    ],
)
def test_decide_at_the_edges(
    throttled: bool, server: int, undelivered: int, expected: bool
) -> None:
    assert Throttle().decide(throttled, server, undelivered) is expected


@pytest.mark.parametrize("zeroed", ["server_threshold", "destination_threshold"])
def test_a_zero_threshold_turns_throttling_off(zeroed: str) -> None:
    throttle = Throttle(**{zeroed: 0})
    assert not throttle.enabled
    assert throttle.decide(True, 10**9, 10**9) is False
