"""The producer and consumer processes: each runs one asyncio loop over one STOMP connection.

They share with the parent only what `multiprocessing` gives a spawned process: a few counters
(`Shared`, read by the parent for progress and to know when everything has arrived), two
events (`go`: producers start; `stop`: consumers finish) and a queue on which each process
puts its one result. A message body starts with `PRODUCER SEQUENCE SEND_NS ` (decimal), then
padding to the requested size. SEND_NS is `time.monotonic_ns()`: on Linux and macOS that clock
is CLOCK_MONOTONIC, one per machine and shared by every process, and it never steps backwards
when NTP corrects the wall clock, so a consumer subtracts it from its own reading to get the
latency (both ends must run on the same machine, which this tool does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from sluiceway.bench.accounting import LatencyHistogram, SequenceBitmap, Series
from sluiceway.bench.stream import READ_CHUNK, Refused, StompStream
from sluiceway.collector import tune_collector
from sluiceway.protocol.frames import Frame

# Prefetch (how many unacknowledged messages the broker may send one subscription), under each
# broker's spelling: ActiveMQ Classic, RabbitMQ, Sluiceway (Open MQ's imqConsumerFlowLimit).
PREFETCH_HEADERS = ("activemq.prefetchSize", "prefetch-count", "consumer-flow-limit")
POLL_SECONDS = 0.1  # how often a waiting consumer or producer looks at the stop event
STOP_GRACE_SECONDS = 1.0  # at most this long reading on after the stop event
PUBLISH_EVERY = 64  # messages between updates of the shared counters (they cost a lock-free write)
WRITE_BUFFER_HIGH = 1 << 20  # bytes queued in the socket before a producer waits for it to drain


@dataclass(frozen=True, slots=True)
class Target:
    address: str
    port: int
    login: str = ""
    passcode: str = ""
    virtual_host: str = "/"

    async def connect(self, **headers: str) -> StompStream:
        if self.login:
            headers = {"login": self.login, "passcode": self.passcode, **headers}
        return await StompStream.open(self.port, self.address, self.virtual_host, **headers)


@dataclass(frozen=True, slots=True)
class ProducerSpec:
    target: Target
    producer_id: int
    destination: str
    count: int
    size: int
    persistent: bool
    receipts: bool
    window: int
    rate: float  # messages per second for this producer; 0: as fast as it can


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    target: Target
    consumer_id: int
    destination: str
    counts: tuple[int, ...]  # messages each producer sends: the size of its sequence bitmap
    ack: str
    prefetch: int  # 0: the broker's default
    delay_ms: float  # simulated processing time per message
    start_ns: int  # the run's origin, for the per-second series


@dataclass
class Shared:
    """Counters the parent reads while the run goes on (one slot per process)."""

    # Shared memory without locks: each slot has a single writer, and a reader that sees an
    # older value only reports progress a moment late.
    sent: MutableSequence[int]
    received: MutableSequence[int]
    ready: MutableSequence[int]  # consumers first, then producers: 1 once connected
    go: Event
    stop: Event
    results: Queue[ProducerResult | ConsumerResult]


@dataclass
class ProducerResult:
    producer_id: int
    sent: int = 0
    accepted: int = 0  # answered by a plain RECEIPT (only with receipts)
    refused: int = 0  # answered by a RECEIPT with a status (Sluiceway's failed-receipts)
    first_refusal: str = ""
    started_ns: int = 0
    finished_ns: int = 0
    cpu_seconds: float = 0.0
    error: str = ""


@dataclass
class ConsumerResult:
    consumer_id: int
    received: int = 0
    body_bytes: int = 0
    duplicates: int = 0
    unexpected: int = 0  # bodies that do not parse or name an unknown producer or sequence
    bitmaps: list[bytes] = field(default_factory=list)
    out_of_order: int = 0
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    series: Series = field(default_factory=Series)
    first_ns: int = 0
    last_ns: int = 0
    idle_seconds: float = 0.0
    cpu_seconds: float = 0.0
    error: str = ""


PREFIX_BYTES = 64  # room for a body's prefix: producer id, sequence number, send time (ns)


def body_for(producer_id: int, seq: int, size: int, padding: bytes) -> bytes:
    prefix = b"%d %d %d " % (producer_id, seq, time.monotonic_ns())
    return prefix + padding[len(prefix) : size]


def producer_main(spec: ProducerSpec, shared: Shared, slot: int) -> None:
    result = ProducerResult(spec.producer_id)
    tune_collector()
    try:
        asyncio.run(_produce(spec, shared, slot, result))
    except (OSError, Refused, RuntimeError) as exc:
        result.error = str(exc) or type(exc).__name__
    result.sent = max(result.sent, shared.sent[spec.producer_id])
    result.cpu_seconds = time.process_time()
    shared.results.put(result)


async def _produce(spec: ProducerSpec, shared: Shared, slot: int, result: ProducerResult) -> None:
    stream = await spec.target.connect(**{"failed-receipts": "true"} if spec.receipts else {})
    credit = asyncio.Semaphore(spec.window)
    finished = asyncio.Event()

    async def read_answers() -> None:
        try:
            while True:
                frame = await stream.next_frame()
                if frame.command == "ERROR":
                    result.error = frame.headers.get("message", "ERROR from the broker")
                    break
                if frame.command != "RECEIPT":
                    continue
                if frame.headers.get("receipt-id", "") == "bye":
                    break
                if "status" in frame.headers:
                    result.refused += 1
                    result.first_refusal = result.first_refusal or frame.headers.get("detail", "")
                else:
                    result.accepted += 1
                credit.release()
        except ConnectionError as exc:
            result.error = str(exc)
        finally:
            finished.set()
            for _ in range(spec.window):
                credit.release()  # nothing more will be answered: let the sender see `finished`

    reader = asyncio.create_task(read_answers())
    shared.ready[slot] = 1
    await asyncio.get_running_loop().run_in_executor(None, shared.go.wait)

    async def send_and_leave() -> None:
        await _send_all(
            spec, stream=stream, shared=shared, credit=credit, finished=finished, result=result
        )
        if not finished.is_set():
            # DISCONNECT with a receipt: the broker answers once it has handled every frame
            # before it, so the run ends when the broker has the last message, not when it left.
            stream.send(Frame("DISCONNECT", {"receipt": "bye"}))
        await reader

    work = asyncio.create_task(send_and_leave())
    stopped = asyncio.create_task(_stopped(shared))
    await asyncio.wait((work, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not work.done():
        # The run ended without this producer: the broker stopped taking its messages (a
        # producer held by flow control), or stopped answering. Say so rather than vanish.
        work.cancel()
        reader.cancel()
        result.error = result.error or (
            f"stopped after {result.sent:,} sends: the broker took no more messages or "
            "receipts from this producer for --timeout seconds (held by flow control?)"
        )
        stream.writer.transport.abort()
        return
    result.finished_ns = time.monotonic_ns()
    await stream.close()


async def _stopped(shared: Shared) -> None:
    """Returns once the parent ends the run (a polled multiprocessing Event: no thread)."""
    while not shared.stop.is_set():
        await asyncio.sleep(POLL_SECONDS)


async def _send_all(
    spec: ProducerSpec,
    *,
    stream: StompStream,
    shared: Shared,
    credit: asyncio.Semaphore,
    finished: asyncio.Event,
    result: ProducerResult,
) -> None:
    # `persistent` only when true (false is every broker's default): RabbitMQ reads
    # `persistent:false` on a SEND to /queue/NAME as a request for a non-durable queue, and drops
    # the connection when the queue exists as a durable one.
    headers = {"destination": spec.destination}
    if spec.persistent:
        headers["persistent"] = "true"
    padding = b"x" * spec.size
    interval_ns = round(1e9 / spec.rate) if spec.rate else 0
    result.started_ns = time.monotonic_ns()
    for seq in range(spec.count):
        if interval_ns:
            # Paced by the schedule, not by the previous send, so a late send does not push
            # every later one back.
            delay = result.started_ns + seq * interval_ns - time.monotonic_ns()
            if delay > 0:
                stream.flush()
                await asyncio.sleep(delay / 1e9)
        if spec.receipts:
            if credit.locked():
                stream.flush()  # what the broker is to answer goes out before waiting for it
            await credit.acquire()
        if finished.is_set():
            break
        frame_headers = {**headers, "receipt": str(seq)} if spec.receipts else headers
        body = body_for(spec.producer_id, seq, spec.size, padding)
        stream.queue(Frame("SEND", frame_headers, body))
        result.sent = seq + 1
        if seq % PUBLISH_EVERY == 0:
            shared.sent[spec.producer_id] = result.sent
        if stream.writer.transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            await stream.writer.drain()
    stream.flush()
    shared.sent[spec.producer_id] = result.sent
    if spec.receipts:
        # Every credit back means every send was answered.
        for _ in range(spec.window):
            await credit.acquire()


def consumer_main(spec: ConsumerSpec, shared: Shared) -> None:
    result = ConsumerResult(spec.consumer_id)
    tally = Tally(spec, result)
    tune_collector()
    try:
        asyncio.run(_consume(spec, shared, tally))
    except (OSError, Refused, RuntimeError) as exc:
        result.error = str(exc) or type(exc).__name__
    result.bitmaps = [bytes(bitmap.bits) for bitmap in tally.bitmaps]
    result.out_of_order = sum(bitmap.out_of_order for bitmap in tally.bitmaps)
    result.cpu_seconds = time.process_time()
    shared.results.put(result)


class Tally:
    """A consumer's accounting of what it received."""

    def __init__(self, spec: ConsumerSpec, result: ConsumerResult) -> None:
        self.result = result
        self.start_ns = spec.start_ns
        self.bitmaps = [SequenceBitmap(count) for count in spec.counts]

    def count(self, body: bytes) -> None:
        now = time.monotonic_ns()
        result = self.result
        result.received += 1
        result.body_bytes += len(body)
        result.first_ns = result.first_ns or now
        result.last_ns = now
        try:
            producer, seq, sent_ns = map(int, body[:PREFIX_BYTES].split(b" ", 3)[:3])
            bitmap = self.bitmaps[producer]
            fresh = bitmap.add(seq) if 0 <= seq < bitmap.count else None
        except (ValueError, IndexError):
            fresh = None
        if fresh is None:
            result.unexpected += 1
            return
        if not fresh:
            result.duplicates += 1
        micros = (now - sent_ns) // 1000
        result.histogram.record(micros)
        result.series.record((now - self.start_ns) // 1_000_000_000, micros)


async def _consume(spec: ConsumerSpec, shared: Shared, tally: Tally) -> None:
    stream = await spec.target.connect()
    subscribe = {"destination": spec.destination, "id": "bench", "ack": spec.ack, "receipt": "sub"}
    if spec.prefetch:
        subscribe.update(dict.fromkeys(PREFETCH_HEADERS, str(spec.prefetch)))
    stream.send(Frame("SUBSCRIBE", subscribe))
    frame = await stream.next_frame()
    if frame.command != "RECEIPT":
        raise RuntimeError(f"SUBSCRIBE refused: {frame.headers.get('message', frame.command)}")
    shared.ready[spec.consumer_id] = 1
    loop = ConsumerLoop(spec, shared, stream, tally)
    await loop.run()
    tally.result.idle_seconds = loop.idle
    stream.send(Frame("DISCONNECT", {}))
    await stream.writer.drain()
    await stream.close()


class ConsumerLoop:
    """Handles frames as they are decoded; reads more only when the decoder has none left."""

    def __init__(
        self, spec: ConsumerSpec, shared: Shared, stream: StompStream, tally: Tally
    ) -> None:
        self.spec, self.shared, self.stream, self.tally = spec, shared, stream, tally
        # client (cumulative) acknowledgement: ack half a prefetch window at a time, so that
        # the broker never waits on us; without a known window, every message.
        self.ack_every = max(1, spec.prefetch // 2) if spec.ack == "client" else 1
        self.unacked = ""
        self.pending = 0
        self.stopping = 0.0  # monotonic deadline once the parent has said stop
        self.idle = 0.0  # seconds spent waiting for the broker once the producers started

    async def run(self) -> None:
        while True:
            event = self.stream.decoder.next_event()
            if isinstance(event, Frame):
                if self.handle(event) and self.spec.delay_ms:
                    self.stream.flush()  # the previous message's ACK goes before this wait
                    await asyncio.sleep(self.spec.delay_ms / 1000)
                    self.acknowledge()
            elif event is None:
                self.stream.flush()  # the ACKs of everything read so far, in one write
                if not await self.read_more():
                    break
        if self.pending:
            self.stream.send(Frame("ACK", {"id": self.unacked}))

    def handle(self, frame: Frame) -> bool:
        """Count a MESSAGE (True) and, without a delay, acknowledge it; other frames: False."""
        if frame.command == "ERROR":
            raise RuntimeError(frame.headers.get("message", "ERROR from the broker"))
        if frame.command != "MESSAGE":
            return False
        self.tally.count(frame.body)
        if self.spec.ack != "auto":
            self.unacked = frame.headers.get("ack", "")
            self.pending += 1
            if not self.spec.delay_ms:
                self.acknowledge()
        return True

    def acknowledge(self) -> None:
        """The message handled last is done: acknowledge it (or every `ack_every`-th)."""
        if self.pending >= self.ack_every:
            self.stream.queue(Frame("ACK", {"id": self.unacked}))
            self.pending = 0

    async def read_more(self) -> bool:
        """Feed the decoder; False when the consumer should finish."""
        self.shared.received[self.spec.consumer_id] = self.tally.result.received
        waiting_since = time.monotonic()
        if not self.stopping and self.shared.stop.is_set():
            # Read on until the line is quiet (or for a second at most), so that duplicates
            # arriving after the last expected message are still counted.
            self.stopping = waiting_since + STOP_GRACE_SECONDS
        if self.stopping and waiting_since > self.stopping:
            return False
        try:
            data = await asyncio.wait_for(self.stream.reader.read(READ_CHUNK), POLL_SECONDS)
        except TimeoutError:
            data = None
        if not self.stopping and self.shared.go.is_set():
            self.idle += time.monotonic() - waiting_since
        if data is None:
            return not self.stopping
        if not data:
            raise ConnectionError("the broker closed the connection")
        self.stream.decoder.receive_data(data)
        return True
