"""Stages in the broker core (docs/pipelines-protocol.md, "Stages"), on a fake clock.

Staged messages are admitted like any SEND and counted against their destination, but nobody
sees them until a COMMIT publishes the listed tasks in order; ABORT, a later batch's COMMIT and
the time to live discard them and free their room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.core.features.stages import StagedMessages, StagedSend, StageState
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.memory import MESSAGE_OVERHEAD, MemoryLedger
from sluiceway.core.values.message import Message
from sluiceway.core.values.staging import StageName
from sluiceway.errors import BrokerError, Conflict, Forbidden, ResourceFull
from sluiceway.naming import parse_destination
from sluiceway.persist.swap import SwapArea
from sluiceway.testing import FakeClock
from tests.core.helpers import Client
from tests.core.swapping import assert_swap_empty

QUEUE = "/queue/results"
TOPIC = "/topic/results"
TTL_MS = 60_000

MakeBroker = Callable[[Mapping[str, str]], Broker]


def stage(
    client: Client,
    name: str,
    body: bytes = b"x",
    *,
    path: str = QUEUE,
    persistent: bool = True,
    ttl_ms: int = TTL_MS,
    priority: int = 4,
) -> str:
    """A SEND with `stage:name` (SINK/BATCH/TASK); held ones are recorded as Client.send does."""
    sink, batch, task = name.split("/", 2)
    sent = client.connection.send(
        parse_destination(path),
        body,
        (),
        priority=priority,
        expires=0,
        persistent=persistent,
        report=True,
        stage=StagedSend(StageName(sink, int(batch), task), ttl_ms),
    )
    message, held = sent.message, sent.held
    if held is not None:
        client.held.append(held)
        held.on_done = lambda error: client.outcomes.append((message.id, error))
    client.broker.settle()
    return message.id


def bodies(client: Client) -> list[bytes]:
    return [delivery.message.body for delivery in client.take()]


def destination(broker: Broker, path: str = QUEUE) -> Destination:
    found = broker.registry.get(parse_destination(path))
    assert found is not None
    return found


def test_staged_messages_are_invisible_until_the_commit_publishes_them_in_task_order(
    broker: Broker,
) -> None:
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    producer = Client(broker)
    producer.send(QUEUE, b"before", persistent=True)
    stage(producer, "sink/7/2.0", b"c1")
    stage(producer, "sink/7/0.0", b"a1")
    stage(producer, "sink/7/2.0", b"c2")
    stage(producer, "sink/7/1.0", b"b1")
    stage(producer, "sink/7/0.0", b"a2")
    producer.send(QUEUE, b"between", persistent=True)
    assert bodies(consumer) == [b"before", b"between"]
    queue = destination(broker)
    assert isinstance(queue, Queue)
    assert queue.pending_count == 0
    assert (queue.staged_count, queue.staged_bytes) == (5, 10)
    assert queue.fullness().count == 2 + 5  # unacknowledged plus staged
    assert broker.context.system.count == 7
    outcome = broker.stages.commit("sink", 7, ["0.0", "1.0", "2.0"])
    assert (outcome.state, outcome.count) == (StageState.COMMITTED, 5)
    published = consumer.take()
    assert [d.message.body for d in published] == [b"a1", b"a2", b"b1", b"c1", b"c2"]
    assert [d.message.seq for d in published] == [3, 4, 5, 6, 7]  # numbered at publish
    assert (queue.staged_count, queue.staged_bytes, len(broker.stages)) == (0, 0, 0)
    assert queue.fullness().count == 7
    producer.send(QUEUE, b"after", persistent=True)
    assert [(d.message.seq, d.message.body) for d in consumer.take()] == [(8, b"after")]


def test_only_the_listed_tasks_are_published_and_the_rest_freed(broker: Broker) -> None:
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    producer = Client(broker)
    stage(producer, "s/1/0.0", b"first attempt of task 0")
    stage(producer, "s/1/0.1", b"second attempt of task 0")
    stage(producer, "s/1/1.0", b"task 1")
    outcome = broker.stages.commit("s", 1, ["1.0", "0.1", "9.0"])  # 9.0 staged nothing
    assert outcome.count == 2
    assert bodies(consumer) == [b"task 1", b"second attempt of task 0"]
    assert destination(broker).fullness().count == 2  # the discarded attempt no longer counts
    assert broker.context.system.count == 2


def test_a_replayed_commit_publishes_nothing_and_late_sends_are_dropped(broker: Broker) -> None:
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    producer = Client(broker)
    stage(producer, "s/5/0.0", b"once")
    assert broker.stages.commit("s", 5, ["0.0"]).state is StageState.COMMITTED
    assert bodies(consumer) == [b"once"]
    # The batch is replayed (its writer ran again): accepted, dropped, and the COMMIT says so.
    stage(producer, "s/5/0.0", b"once")
    assert (len(broker.stages), broker.stages.late) == (0, 1)
    again = broker.stages.commit("s", 5, ["0.0"])
    assert (again.state, again.count) == (StageState.COMMITTED_BEFORE, 0)
    assert broker.stages.commit("s", 4, ["0.0"]).state is StageState.COMMITTED_BEFORE
    assert broker.stages.abort("s", 5, None).state is StageState.COMMITTED_BEFORE
    assert consumer.take() == []
    assert destination(broker).fullness().count == 1


def test_only_the_sinks_that_committed_last_are_remembered(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.stage.max_sinks": "2"})
    # "a" commits again after "b", so "b" is the one that committed longest ago.
    for sink, batch in (("a", 1), ("b", 1), ("a", 2), ("c", 1)):
        assert broker.stages.commit(sink, batch, []).state is StageState.COMMITTED
    assert broker.stages.committed == {"a": 2, "c": 1}
    # "b" is forgotten: its batch 1 counts as new again (the bound's documented cost).
    assert broker.stages.commit("b", 1, []).state is StageState.COMMITTED
    assert broker.stages.commit("c", 1, []).state is StageState.COMMITTED_BEFORE


def test_a_commit_discards_the_sinks_earlier_batches_but_not_later_ones_or_other_sinks(
    broker: Broker,
) -> None:
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    producer = Client(broker)
    stage(producer, "s/3/0.0", b"batch 3, never committed")
    stage(producer, "s/4/0.0", b"batch 4")
    stage(producer, "s/5/0.0", b"batch 5")
    stage(producer, "other/4/0.0", b"another sink")
    broker.stages.commit("s", 4, ["0.0"])
    assert bodies(consumer) == [b"batch 4"]
    remaining = sorted(str(s.name) for s in broker.stages)
    assert remaining == ["other/4/0.0", "s/5/0.0"]
    assert destination(broker).staged_count == 2
    broker.stages.commit("s", 5, ["0.0"])
    broker.stages.commit("other", 4, ["0.0"])
    assert bodies(consumer) == [b"batch 5", b"another sink"]


def test_abort_discards_the_batch_or_the_tasks_named(broker: Broker) -> None:
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    producer = Client(broker)
    for task in ("0.0", "1.0", "2.0"):
        stage(producer, f"s/1/{task}", task.encode())
        stage(producer, f"s/1/{task}", task.encode())
    outcome = broker.stages.abort("s", 1, ["1.0", "7.0"])
    assert (outcome.state, outcome.count) == (StageState.ABORTED, 2)
    assert destination(broker).staged_count == 4
    assert broker.stages.abort("s", 1, None).count == 4
    assert (len(broker.stages), destination(broker).staged_count) == (0, 0)
    assert broker.context.system.count == 0
    # Aborting does not commit: the batch may still be staged and committed.
    stage(producer, "s/1/0.0", b"retried")
    assert broker.stages.commit("s", 1, ["0.0"]).count == 1
    assert bodies(consumer) == [b"retried"]


def test_a_stage_expires_its_ttl_after_its_latest_send(broker: Broker, clock: FakeClock) -> None:
    producer = Client(broker)
    stage(producer, "s/1/0.0", ttl_ms=10_000)
    clock.advance(8)
    stage(producer, "s/1/0.0", ttl_ms=10_000)  # moves the deadline on
    stage(producer, "s/1/1.0", ttl_ms=3_000)
    clock.advance(5)
    broker.tick()
    assert [str(s.name) for s in broker.stages] == ["s/1/0.0"]
    clock.advance(4.9)
    broker.tick()
    assert len(broker.stages) == 1
    clock.advance(0.2)
    broker.tick()
    assert len(broker.stages) == 0
    assert destination(broker).staged_count == 0
    # What expired is not published by a later COMMIT: those tasks staged nothing now.
    assert broker.stages.commit("s", 1, ["0.0", "1.0"]).count == 0


def test_staged_sends_are_held_by_flow_control_and_go_on_when_a_consumer_makes_room(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.results.maxNumMsgs": "3",
            "imq.destination.queue.results.limitBehavior": "FLOW_CONTROL",
        }
    )
    producer = Client(broker)
    producer.send(QUEUE, b"plain", persistent=True)
    stage(producer, "s/1/0.0", b"a")
    stage(producer, "s/1/0.0", b"b")
    stage(producer, "s/1/0.0", b"c")  # the queue is full: held, in order
    stage(producer, "s/1/0.0", b"d")
    assert len(producer.held) == 2
    assert producer.outcomes == []
    assert destination(broker).staged_count == 2
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    (plain,) = consumer.take()
    consumer.ack(plain)  # consuming makes room for one
    assert [error for _, error in producer.outcomes] == [None]
    assert destination(broker).staged_count == 3
    broker.stages.commit("s", 1, ["0.0"])
    delivered = consumer.take()
    assert [d.message.body for d in delivered] == [b"a", b"b", b"c"]
    consumer.ack(delivered[0])
    assert [error for _, error in producer.outcomes] == [None, None]
    # Held into a batch that was committed meanwhile: accepted, and dropped.
    assert destination(broker).staged_count == 0
    assert broker.stages.late == 1


def test_discarding_a_stage_lets_held_producers_go(make_broker: MakeBroker) -> None:
    broker = make_broker(
        {
            "imq.destination.queue.results.maxNumMsgs": "2",
            "imq.destination.queue.results.limitBehavior": "FLOW_CONTROL",
        }
    )
    writer, other = Client(broker), Client(broker)
    stage(writer, "s/1/0.0")
    stage(writer, "s/1/0.0")
    other.send(QUEUE, b"waits", persistent=True)
    assert len(other.held) == 1
    broker.stages.abort("s", 1, None)
    broker.settle()  # as the I/O layer does after handling the ABORT frame
    assert [error for _, error in other.outcomes] == [None]
    assert destination(broker).fullness().count == 1


def test_staged_messages_count_against_reject_newest_and_system_limits(
    make_broker: MakeBroker,
) -> None:
    broker = make_broker(
        {"imq.destination.queue.results.maxNumMsgs": "2", "imq.system.max_count": "3"}
    )
    producer = Client(broker)
    stage(producer, "s/1/0.0")
    stage(producer, "s/1/0.0")
    with pytest.raises(ResourceFull) as refused:
        stage(producer, "s/1/1.0")
    assert refused.value.limit == "maxNumMsgs"
    with pytest.raises(ResourceFull):
        producer.send(QUEUE, b"plain", persistent=True)
    stage(producer, "s/1/0.0", path="/queue/other")
    with pytest.raises(ResourceFull) as system:
        stage(producer, "s/1/0.0", path="/queue/third")
    assert system.value.limit == "imq.system.max_count"


def test_a_message_too_large_is_refused_before_it_reaches_a_stage(make_broker: MakeBroker) -> None:
    broker = make_broker({"imq.destination.queue.results.maxBytesPerMsg": "4"})
    producer = Client(broker)
    with pytest.raises(BrokerError) as refused:
        stage(producer, "s/1/0.0", b"too large")
    assert refused.value.status == 423
    assert len(broker.stages) == 0


def test_staged_topic_messages_reach_only_the_subscribers_present_at_commit(
    broker: Broker,
) -> None:
    early = Client(broker)
    early.subscribe(TOPIC, ack=AckMode.AUTO)
    producer = Client(broker)
    stage(producer, "s/1/0.0", b"t1", path=TOPIC)
    stage(producer, "s/1/0.0", b"t2", path=TOPIC)
    topic = destination(broker, TOPIC)
    assert isinstance(topic, Topic)
    assert topic.fullness().count == 2
    assert early.take() == []
    late = Client(broker)
    late.subscribe(TOPIC, ack=AckMode.AUTO)
    broker.stages.commit("s", 1, ["0.0"])
    assert bodies(early) == bodies(late) == [b"t1", b"t2"]


def test_one_stage_may_send_to_several_destinations(broker: Broker) -> None:
    queue_consumer, topic_consumer = Client(broker), Client(broker)
    queue_consumer.subscribe(QUEUE)
    topic_consumer.subscribe(TOPIC, ack=AckMode.AUTO)
    producer = Client(broker)
    producer.send(TOPIC, b"t0")
    stage(producer, "s/1/0.0", b"q1")
    stage(producer, "s/1/0.0", b"t1", path=TOPIC)
    stage(producer, "s/1/1.0", b"q2")
    stage(producer, "s/1/0.0", b"q3")
    broker.stages.commit("s", 1, ["1.0", "0.0"])
    assert [(d.message.seq, d.message.body) for d in queue_consumer.take()] == [
        (1, b"q2"),
        (2, b"q1"),
        (3, b"q3"),
    ]
    assert [(d.message.seq, d.message.body) for d in topic_consumer.take()] == [
        (1, b"t0"),
        (2, b"t1"),
    ]


def test_the_dead_message_queue_takes_no_staged_message(broker: Broker) -> None:
    with pytest.raises(Forbidden):
        stage(Client(broker), "s/1/0.0", path="/queue/mq.sys.dmq")
    assert len(broker.stages) == 0


def test_a_destination_with_staged_messages_cannot_be_destroyed(broker: Broker) -> None:
    producer = Client(broker)
    stage(producer, "s/1/0.0")
    with pytest.raises(Conflict):
        broker.destroy_destination(parse_destination(QUEUE))
    broker.stages.abort("s", 1, None)
    broker.destroy_destination(parse_destination(QUEUE))


def test_a_large_stage_spills_to_the_swap_area_and_is_published_in_order(
    clock: FakeClock, swap: SwapArea, swap_dir: Path
) -> None:
    broker = Broker(build_config({"imq.swap.threshold": "64k"}), clock=clock, spill=swap)
    producer = Client(broker)
    body = b"y" * 1000
    count = 2000  # about 2.8 MB counted: far over the 64k swap point
    for i in range(count):
        stage(producer, "s/1/0.0", b"%05d" % i + body, persistent=False)
    (staged,) = broker.stages
    # In memory: what came before the swap point (about 60) and at most one chunk filling.
    assert staged.messages.spilled >= count - 60 - 256
    assert broker.ledger.peak < 64 * 1024 + 300 * (len(body) + MESSAGE_OVERHEAD)
    consumer = Client(broker)
    consumer.subscribe(QUEUE)
    broker.stages.commit("s", 1, ["0.0"])
    received: list[bytes] = []
    while batch := consumer.take():
        received.extend(d.message.body[:5] for d in batch)
        for delivery in batch:
            consumer.ack(delivery)
    assert received == [b"%05d" % i for i in range(count)]
    assert_swap_empty(swap, swap_dir)


def test_a_discarded_stage_frees_its_swap_without_reading_it(
    clock: FakeClock, swap: SwapArea, swap_dir: Path
) -> None:
    broker = Broker(build_config({"imq.swap.threshold": "16k"}), clock=clock, spill=swap)
    producer = Client(broker)
    for _ in range(600):
        stage(producer, "s/1/0.0", b"z" * 500)
    assert swap.segment_count > 0
    broker.stages.abort("s", 1, None)
    assert broker.ledger.used == 0
    assert_swap_empty(swap, swap_dir)


def test_staged_messages_drain_in_order_across_memory_chunks_and_filling(
    swap: SwapArea,
) -> None:
    ledger = MemoryLedger(threshold=5 * (3 + MESSAGE_OVERHEAD))
    staged = StagedMessages(ledger, swap)
    for seq in range(1, 601):
        staged.append(
            Message(
                id=f"m{seq}",
                destination=parse_destination(QUEUE),
                body=b"abc",
                headers=(),
                priority=4,
                expires=0,
                persistent=False,
                timestamp=0,
                seq=seq,
            )
        )
    assert staged.spilled == 512  # 4 in memory, two chunks of 256, the last 84 filling
    runs = list(staged.drain())
    assert [len(run) for run in runs] == [4, 256, 256, 84]
    assert [m.seq for run in runs for m in run] == list(range(1, 601))
    assert (len(staged), ledger.used) == (0, 0)
