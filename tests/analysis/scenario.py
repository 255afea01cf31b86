"""A scripted broker run whose metrics history the analysis must explain.

With the history sampled every second, seven things happen one after the other:

1. Hoarding: on /queue/hoard a slow consumer (window of 200) subscribes before two fast ones
   (windows of 10). 300 messages arrive at once; the slow consumer, first in line, takes 200 and
   acknowledges them one by one over several seconds while the fast ones, done with their share,
   sit empty.
2. Pauses: on /queue/paused one consumer with a window of 10 and a threshold of 0 gets 20
   messages. It holds the first 10 for PAUSE_S seconds without acknowledging (its window used up:
   paused by flow control), acknowledges them, gets the next 10 at once and holds those for
   PAUSE_S more.
3. Holding: /queue/full takes at most 5 messages (FLOW_CONTROL); a producer sends 8, so 3 wait
   for HOLD_S seconds until a consumer arrives: held, then accepted.
4. Refusing: /queue/refuse takes 1 message (FLOW_CONTROL); a producer sends 2 and nobody
   consumes, so the broker refuses the second once it has waited imq.producer.hold.timeout
   (HOLD_TIMEOUT_S): held, then refused.
5. Pipeline readers: the pipeline client opens cursor group `spark` on /topic/clicks and reads
   lease group `etl` of /queue/etl; READER_SENT messages go to each, and each reader takes
   READER_TAKEN of them (the cursor commits past them, the group acknowledges a lease of them)
   and stays behind by the rest, with no STOMP consumer on either.
6. Adaptive windows: /queue/adaptive has consumerFlowLimit=auto; one consumer takes
   ADAPTIVE_MESSAGES, ADAPTIVE_WORK_S each, while the broker measures its pace and sizes its
   window, and stays until a sample has seen the window sized.
7. Deadline misses: on /queue/quotes (fifo) a consumer waits while QUOTES_EXPIRED messages
   arrive already past their deadline (they expire unconsumed) and one arrives due in
   QUOTES_TTL_S, which the consumer receives in time and acknowledges after its deadline.

`run` returns what was measured on the client side, for the tests to compare with the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sluiceway.admin import model
from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.naming import parse_destination
from sluiceway.testing import BrokerThread
from tests.e2e.rawclient import RawClient
from tests.e2e.stomppy import connect, sync
from tests.e2e.support import wait_until

HOARD: Final = "/queue/hoard"
PAUSED: Final = "/queue/paused"
FULL: Final = "/queue/full"
REFUSE: Final = "/queue/refuse"
HOARD_MESSAGES: Final = 300
SLOW_WINDOW: Final = 200
FAST_WINDOW: Final = 10
SLOW_ACK_EVERY_S: Final = 0.03  # 200 acknowledgements over 6 s
PAUSE_WINDOW: Final = 10
PAUSE_S: Final = 3.0
HOLD_S: Final = 3.0
# imq.producer.hold.timeout: well above HOLD_S, so that phase 3's hold ends in acceptance.
HOLD_TIMEOUT_S: Final = 6.0
FULL_LIMIT: Final = 5
FULL_SENT: Final = 8
CLICKS: Final = "/topic/clicks"
ETL: Final = "/queue/etl"
READER_SENT: Final = 12
READER_TAKEN: Final = 5
ADAPTIVE: Final = "/queue/adaptive"
ADAPTIVE_MESSAGES: Final = 40
ADAPTIVE_WORK_S: Final = 0.01
QUOTES: Final = "/queue/quotes"
QUOTES_EXPIRED: Final = 3
QUOTES_TTL_S: Final = 1.0
WAIT_S: Final = 30.0  # generous: a loaded machine slows the clients, never what is counted


@dataclass(frozen=True)
class Measured:
    data_dir: Path
    fast_received: tuple[int, int]
    paused_s: float  # from the paused consumer's window filling to its last acknowledgement
    held_s: float  # from the held SENDs to the consumer that released them
    refused_s: float  # from the held SEND to the broker's refusal


def properties(data_dir: Path) -> dict[str, str]:
    return {
        "imq.persist.file.directory": str(data_dir),
        "imq.metrics.interval": "1",
        f"imq.destination.queue.{FULL[7:]}.maxNumMsgs": str(FULL_LIMIT),
        f"imq.destination.queue.{FULL[7:]}.limitBehavior": "FLOW_CONTROL",
        f"imq.destination.queue.{REFUSE[7:]}.maxNumMsgs": "1",
        f"imq.destination.queue.{REFUSE[7:]}.limitBehavior": "FLOW_CONTROL",
        "imq.producer.hold.timeout": str(round(HOLD_TIMEOUT_S * 1000)),
        f"imq.destination.queue.{ADAPTIVE[7:]}.consumerFlowLimit": "auto",
    }


def _client(port: int) -> RawClient:
    client = RawClient(port)
    client.connect()
    return client


def hoard(port: int) -> tuple[int, int]:
    """Phase 1; returns how many messages each fast consumer received."""
    slow = _client(port)
    slow.subscribe(HOARD, "slow", consumer_flow_limit=str(SLOW_WINDOW))
    fast = [_client(port) for _ in range(2)]
    for number, client in enumerate(fast, 1):
        client.subscribe(HOARD, f"fast{number}", consumer_flow_limit=str(FAST_WINDOW))
    producer, recorder = connect(port)  # stomp.py, a third-party client, as the producer
    for number in range(HOARD_MESSAGES):
        producer.send(HOARD, f"order {number}")
    sync(producer, recorder)
    received = [0, 0]
    deadline = time.monotonic() + 10
    while sum(received) < HOARD_MESSAGES - SLOW_WINDOW and time.monotonic() < deadline:
        for index, client in enumerate(fast):
            client.sync()
            for message in client.drain():
                client.ack(message)
                received[index] += 1
    for message in slow.receive(SLOW_WINDOW):
        slow.ack(message)
        time.sleep(SLOW_ACK_EVERY_S)  # the slow consumer's processing time
    slow.sync()
    producer.disconnect()
    for client in (slow, *fast):
        client.close()
    return received[0], received[1]


def pauses(port: int) -> float:
    """Phase 2; returns how long the consumer's window was used up, as the client saw it."""
    producer = _client(port)
    consumer = _client(port)
    # Threshold 0: the window refills once all 10 are acknowledged, with all 10 at once. At the
    # default of 50 % the refill comes as soon as the ACKs the broker has read bring the
    # unconsumed count to 5 or below, with 10 minus that count; the broker acknowledges the ACKs
    # of one read together, so ACKs read 7 and 3 bring 7 more, then nothing while 7 are held.
    consumer.subscribe(
        PAUSED, "p", consumer_flow_limit=str(PAUSE_WINDOW), consumer_flow_threshold="0"
    )
    for number in range(2 * PAUSE_WINDOW):
        producer.send("SEND", {"destination": PAUSED}, f"task {number}".encode())
    producer.sync()
    first = consumer.receive(PAUSE_WINDOW)
    window_full = time.monotonic()
    time.sleep(PAUSE_S)  # holds its whole window for a while: paused by flow control, measured
    for message in first:
        consumer.ack(message)
    second = consumer.receive(PAUSE_WINDOW)  # refilled at once: paused again
    time.sleep(PAUSE_S)  # as long again: the pause's length is what the analysis must measure
    for message in second:
        consumer.ack(message)
    consumer.sync()
    released = time.monotonic()
    producer.close()
    consumer.close()
    return released - window_full


def holding(port: int) -> float:
    """Phase 3; returns how long SENDs were held."""
    producer = _client(port)
    for number in range(FULL_SENT):
        producer.send("SEND", {"destination": FULL, "receipt": f"r{number}"}, b"x")
    for number in range(FULL_LIMIT):
        assert producer.expect("RECEIPT").headers["receipt-id"] == f"r{number}"
    held = time.monotonic()
    time.sleep(HOLD_S)  # nobody consumes for a while: the last SENDs wait, held, and measured
    consumer = _client(port)
    consumer.subscribe(FULL, "drain", ack="auto")
    for number in range(FULL_LIMIT, FULL_SENT):
        assert producer.expect("RECEIPT").headers["receipt-id"] == f"r{number}"
    released = time.monotonic()
    producer.close()
    consumer.close()
    return released - held


def refusing(port: int) -> float:
    """Phase 4; returns how long the SEND was held before the broker refused it."""
    producer = _client(port)
    producer.send("SEND", {"destination": REFUSE, "receipt": "r0"}, b"x")
    assert producer.expect("RECEIPT").headers["receipt-id"] == "r0"
    producer.send("SEND", {"destination": REFUSE, "receipt": "r1"}, b"y")
    held = time.monotonic()
    # Nobody consumes. The broker checks deadlines every second: the refusal comes up to a
    # second after the hold timeout, as an ERROR (no failed receipts asked for).
    error = producer.expect("ERROR", timeout=HOLD_TIMEOUT_S + 5)
    refused = time.monotonic()
    assert error.headers["message"] == "send held too long", error
    producer.close()
    return refused - held


def pipeline_readers(port: int) -> None:
    """Phase 5: a cursor group and a lease group, each READER_TAKEN messages in."""
    with PipelineConnection(PipelineSettings(port=port, timeout=10)) as pipeline:
        start = pipeline.open_cursor(CLICKS, "spark", "latest").cursor_sequence
        assert start is not None
        for destination in (CLICKS, ETL):
            pipeline.send_many(
                OutgoingMessage(destination, b"event %d" % i) for i in range(READER_SENT)
            )
        pipeline.commit_cursor(CLICKS, "spark", start + READER_TAKEN)
        taken = list(pipeline.read_lease(ETL, "etl/1", max_messages=READER_TAKEN))
        assert len(taken) == READER_TAKEN
        pipeline.ack_lease(ETL, "etl/1")


def _consumer_of(broker: BrokerThread, destination: str) -> model.ConsumerSnapshot:
    def find() -> model.ConsumerSnapshot:
        assert broker.broker is not None
        return next(c for c in model.consumers(broker.broker) if c.destination == destination)

    return broker.call(find)


def _totals(broker: BrokerThread, destination: str) -> model.Totals:
    def read() -> model.Totals:
        assert broker.broker is not None
        found = broker.broker.destination(parse_destination(destination))
        return model.destination_detail(broker.broker, found).totals

    return broker.call(read)


def adaptive_windows(broker: BrokerThread, metrics: Path) -> None:
    """Phase 6: a consumer of an auto destination, sampled once its pace is measured."""
    producer = _client(broker.port)
    for number in range(ADAPTIVE_MESSAGES):
        producer.send("SEND", {"destination": ADAPTIVE}, f"job {number}".encode())
    producer.sync()
    consumer = _client(broker.port)
    consumer.subscribe(ADAPTIVE, "tuned")  # no number: the destination's auto, capped at 1000
    for _ in range(ADAPTIVE_MESSAGES):
        (message,) = consumer.receive(1)
        time.sleep(ADAPTIVE_WORK_S)  # the consumer's work on it: its pace
        consumer.ack(message)
    consumer.sync()
    wait_until(lambda: _consumer_of(broker, ADAPTIVE).pace_ms is not None, WAIT_S)
    wait_for_samples_after(metrics, round(time.time() * 1000))
    producer.close()
    consumer.close()


def deadline_misses(broker: BrokerThread) -> None:
    """Phase 7: messages that expire unconsumed, and one acknowledged after its deadline."""
    consumer = _client(broker.port)
    consumer.subscribe(QUOTES, "quotes")
    producer = _client(broker.port)
    now_ms = round(time.time() * 1000)
    for number in range(QUOTES_EXPIRED):
        headers = {"destination": QUOTES, "expires": str(now_ms - 1000)}
        producer.send("SEND", headers, f"stale {number}".encode())
    due_ms = now_ms + round(QUOTES_TTL_S * 1000)
    producer.send("SEND", {"destination": QUOTES, "expires": str(due_ms)}, b"fresh")
    producer.sync()
    (message,) = consumer.receive(1)  # the stale ones expire instead of being delivered
    assert message.body == b"fresh", message
    # Past its deadline before acknowledging it: a wait for the wall clock, not for the broker.
    time.sleep(max(0.0, (due_ms + 200) / 1000 - time.time()))
    consumer.ack(message)
    consumer.sync()
    wait_until(lambda: _totals(broker, QUOTES).deadline_misses == QUOTES_EXPIRED + 1, WAIT_S)
    producer.close()
    consumer.close()


def wait_for_samples_after(directory: Path, wall_ms: int, timeout: float = 10.0) -> None:
    """Until the history has a sample written after `wall_ms` (ms since the epoch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in directory.glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.endswith("}") and json.loads(line)["ts"] > wall_ms:
                    return
        time.sleep(0.2)  # the broker writes once a second: poll, bounded by the deadline
    raise AssertionError(f"no metrics sample after {wall_ms} within {timeout} s")


def run(data_dir: Path) -> Measured:
    with BrokerThread(properties(data_dir)) as broker:
        fast = hoard(broker.port)
        paused = pauses(broker.port)
        held = holding(broker.port)
        refused = refusing(broker.port)
        pipeline_readers(broker.port)
        adaptive_windows(broker, data_dir / "metrics")
        deadline_misses(broker)
        # Two more samples, so the last pause and hold are seen to have ended.
        wait_for_samples_after(data_dir / "metrics", round(time.time() * 1000) + 1500)
    return Measured(
        data_dir=data_dir, fast_received=fast, paused_s=paused, held_s=held, refused_s=refused
    )
