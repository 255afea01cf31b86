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
import os
import time
from collections import deque
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from sluiceway.bench.accounting import LatencyHistogram, SequenceBitmap, Series, Spells
from sluiceway.bench.cpu import BusyWindow
from sluiceway.bench.occupancy import Occupancy
from sluiceway.bench.stream import Refused, StompStream
from sluiceway.collector import tune_collector
from sluiceway.errors import RemoteProtocolError
from sluiceway.protocol.frames import Frame

# Prefetch (how many unacknowledged messages the broker may send one subscription), under each
# broker's spelling: ActiveMQ Classic, RabbitMQ, Sluiceway (Open MQ's imqConsumerFlowLimit).
PREFETCH_HEADERS = ("activemq.prefetchSize", "prefetch-count", "consumer-flow-limit")
# --prefetch auto: an adaptive window, `consumer-flow-limit:auto` (Sluiceway sizes each consumer's
# window from its pace and round trip, up to AUTO_PREFETCH_CAP messages). The other spellings
# take numbers only, so they are not sent: other brokers then use their default prefetch.
PREFETCH_AUTO = -1
AUTO_PREFETCH_CAP = 1000  # the most an adaptive window grows to when nothing else caps it
POLL_SECONDS = 0.1  # how often a waiting consumer or producer looks at the stop event
STOP_GRACE_SECONDS = 1.0  # at most this long reading on after the stop event
PUBLISH_EVERY = 64  # messages between updates of the shared counters (they cost a lock-free write)


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
    prefetch: int  # 0: the broker's default; PREFETCH_AUTO: an adaptive window
    delay_ms: float  # simulated processing time per message
    start_ns: int  # the run's origin, for the per-second series
    ack_every: int = 0  # ack:client: messages per cumulative ACK; 0: half the prefetch
    spells: bool = False  # keep the idle spells and those with messages waiting (fairness)


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
    busy: BusyWindow = field(default_factory=BusyWindow)  # from the first send to the last answer
    pid: int = field(default_factory=os.getpid)
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
    held_peak: int = 0  # the most messages held at once: received, not acknowledged (occupancy)
    window_auto: bool = False  # the broker sizes this consumer's window (its RECEIPT said so)
    idle_spells: Spells | None = None  # with ConsumerSpec.spells
    waiting_spells: Spells | None = None  # spells with received messages not yet started
    cpu_seconds: float = 0.0
    busy: BusyWindow = field(default_factory=BusyWindow)  # from the first message to the last
    pid: int = field(default_factory=os.getpid)
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
    sender = Sender(spec, stream, shared, result)
    shared.ready[slot] = 1
    await asyncio.get_running_loop().run_in_executor(None, shared.go.wait)
    sender.start()
    stopped = asyncio.create_task(_stopped(shared))
    await asyncio.wait((sender.done, stopped), return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not sender.done.done():
        # The run ended without this producer: the broker stopped taking its messages (a
        # producer held by flow control), or stopped answering. Say so rather than vanish.
        sender.stop()
        result.busy.mark()
        result.error = result.error or (
            f"stopped after {result.sent:,} sends: the broker took no more messages or "
            "receipts from this producer for --timeout seconds (held by flow control?)"
        )
        stream.transport.abort()
        return
    result.finished_ns = time.monotonic_ns()
    await stream.close()


async def _stopped(shared: Shared) -> None:
    """Returns once the parent ends the run (a polled multiprocessing Event: no thread)."""
    while not shared.stop.is_set():
        await asyncio.sleep(POLL_SECONDS)


class Sender:
    """A producer's sends, made from the event loop's callbacks: when a paced message is due (a
    timer), when receipts give credit back (a read) and when the transport takes more (writing
    resumed). No task is woken and no future made per message.

    The producer is done (`done`) once the broker has answered its DISCONNECT, which it does
    after handling every frame before it, so the run ends when the broker has the last message;
    or once the broker sent an ERROR or closed the connection.
    """

    def __init__(
        self, spec: ProducerSpec, stream: StompStream, shared: Shared, result: ProducerResult
    ) -> None:
        self.spec, self.stream, self.shared, self.result = spec, stream, shared, result
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        # `persistent` only when true (false is every broker's default): RabbitMQ reads
        # `persistent:false` on a SEND to /queue/NAME as a request for a non-durable queue, and
        # drops the connection when the queue exists as a durable one.
        self.headers = {"destination": spec.destination}
        if spec.persistent:
            self.headers["persistent"] = "true"
        self.padding = b"x" * spec.size
        self.interval_ns = round(1e9 / spec.rate) if spec.rate else 0
        self.unanswered = 0  # sends whose receipt has not come (only with receipts)
        self.leaving = False  # DISCONNECT sent
        self.timer: asyncio.TimerHandle | None = None  # the next paced send

    def start(self) -> None:
        self.stream.on_data = self.take_answers
        self.stream.on_writable = self.send_due
        self.result.started_ns = time.monotonic_ns()
        self.result.busy.begin(self.result.started_ns)
        self.send_due()

    def stop(self) -> None:
        self.stream.on_data = self.stream.on_writable = None
        if self.timer is not None:
            self.timer.cancel()

    def send_due(self) -> None:
        """Send what may go now; a timer, a receipt or writing resumed calls again."""
        if self.timer is not None:
            self.timer.cancel()  # called early (writing resumed): the loop below sets it again
            self.timer = None
        spec, stream, result = self.spec, self.stream, self.result
        seq = result.sent
        while seq < spec.count and not self.done.done():
            if self.interval_ns:
                # Paced by the schedule, not by the previous send, so a late send does not push
                # every later one back.
                wait_ns = result.started_ns + seq * self.interval_ns - time.monotonic_ns()
                if wait_ns > 0:
                    self.timer = self._loop.call_later(wait_ns / 1e9, self.send_due)
                    break
            if spec.receipts and self.unanswered >= spec.window:
                break  # the receipts' arrival calls again
            if not stream.writable:
                break  # resume_writing calls again
            headers = {**self.headers, "receipt": str(seq)} if spec.receipts else self.headers
            body = body_for(spec.producer_id, seq, spec.size, self.padding)
            stream.queue(Frame("SEND", headers, body))
            if spec.receipts:
                self.unanswered += 1
            seq = result.sent = seq + 1
            if seq % PUBLISH_EVERY == 0:
                self.shared.sent[spec.producer_id] = seq
        stream.flush()  # what the broker is to answer goes out before any wait for it
        self.shared.sent[spec.producer_id] = seq
        if seq == spec.count and not self.unanswered and not self.leaving:
            # Every send answered (or none asked for): leave, with a receipt that the broker
            # gives once it has handled every frame before it.
            self.leaving = True
            stream.send(Frame("DISCONNECT", {"receipt": "bye"}))

    def take_answers(self) -> None:
        """The frames read: receipts give credit back; an ERROR or a lost connection ends."""
        result = self.result
        try:
            while (event := self.stream.decoder.next_event()) is not None:
                if not isinstance(event, Frame) or self.done.done():
                    continue
                if event.command == "ERROR":
                    self._finish(event.headers.get("message", "ERROR from the broker"))
                elif event.command != "RECEIPT":
                    continue
                elif event.headers.get("receipt-id", "") == "bye":
                    self._finish("")
                elif "status" in event.headers:
                    result.refused += 1
                    result.first_refusal = result.first_refusal or event.headers.get("detail", "")
                    self.unanswered -= 1
                else:
                    result.accepted += 1
                    self.unanswered -= 1
        except RemoteProtocolError as exc:
            self._finish(f"the broker sent what is not STOMP: {exc}")
        if self.stream.lost is not None:
            self._finish(str(self.stream.lost))
        elif not self.done.done() and self.timer is None:
            self.send_due()

    def _finish(self, error: str) -> None:
        if not self.done.done():
            self.result.error = self.result.error or error
            self.result.busy.mark()
            self.stop()
            self.done.set_result(None)


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


def subscribe_headers(spec: ConsumerSpec) -> dict[str, str]:
    """The SUBSCRIBE's headers: the prefetch under every broker's spelling, or auto under
    Sluiceway's alone."""
    headers = {"destination": spec.destination, "id": "bench", "ack": spec.ack, "receipt": "sub"}
    if spec.prefetch == PREFETCH_AUTO:
        headers["consumer-flow-limit"] = "auto"
    elif spec.prefetch:
        headers.update(dict.fromkeys(PREFETCH_HEADERS, str(spec.prefetch)))
    return headers


async def _consume(spec: ConsumerSpec, shared: Shared, tally: Tally) -> None:
    stream = await spec.target.connect()
    stream.send(Frame("SUBSCRIBE", subscribe_headers(spec)))
    frame = await stream.next_frame()
    if frame.command != "RECEIPT":
        raise RuntimeError(f"SUBSCRIBE refused: {frame.headers.get('message', frame.command)}")
    # Sluiceway says on the RECEIPT when it sizes the window (consumerFlowLimit=auto).
    tally.result.window_auto = frame.headers.get("consumer-flow-auto") == "true"
    shared.ready[spec.consumer_id] = 1
    loop = ConsumerLoop(spec, shared, stream, tally)
    try:
        await loop.run()
    finally:
        loop.stop()
    result, occupancy = tally.result, loop.occupancy
    result.idle_seconds = occupancy.idle_ns / 1e9
    result.held_peak = occupancy.peak
    result.idle_spells, result.waiting_spells = occupancy.idle_spells, occupancy.waiting_spells
    stream.send(Frame("DISCONNECT", {}))
    await stream.close()


class ConsumerLoop:
    """Handles frames in the read's callback, as they are decoded: no task woken and no timer
    set per read.

    A consumer with a per-message delay reads eagerly, as a client library does up to its
    window: what arrives goes to a local queue (`inbox`), worked off one message at a time with
    a timer per delay (the work it stands for). A message is counted as received when its work
    starts, so that received/s, the finish time and the latency keep to the pace of the work.
    `occupancy` keeps what the consumer holds and when it has nothing to do."""

    def __init__(
        self, spec: ConsumerSpec, shared: Shared, stream: StompStream, tally: Tally
    ) -> None:
        self.spec, self.shared, self.stream, self.tally = spec, shared, stream, tally
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        # client (cumulative) acknowledgement: every `ack_every` messages as asked, else half a
        # prefetch window at a time, so that the broker never waits on us; without a known
        # window (none asked for, or an adaptive one, which may be a few messages), every one.
        self.ack_every = 1
        if spec.ack == "client":
            half = spec.prefetch // 2 if spec.prefetch != PREFETCH_AUTO else 1
            self.ack_every = spec.ack_every or max(1, half)
        self.unacked = ""
        self.pending = 0  # handled, not yet covered by an ACK (ack:client, ack:client-individual)
        self.acked = 0  # covered by ACKs queued and not yet written (ack:auto: handled)
        self.delay = spec.delay_ms / 1000  # seconds of work per message
        self.inbox: deque[Frame] = deque()  # MESSAGE frames received and not yet started
        self.working = False  # a message is being worked on (its delay has not passed)
        self.started = False  # the producers have been let go
        self.stopping = 0.0  # monotonic deadline once the parent has said stop
        self.heard = False  # something was read since the last poll
        self.arrived = 0  # MESSAGE frames read
        self.before = (0, 0)  # monotonic and CPU clocks (ns) before the first message's read
        self.occupancy = Occupancy(time.monotonic_ns(), self._counting, spells=spec.spells)
        self.poll_timer: asyncio.TimerHandle | None = None
        self.work_timer: asyncio.TimerHandle | None = None  # the delay under way

    async def run(self) -> None:
        self.stream.on_data = self.take_frames
        self.poll_timer = self._loop.call_later(POLL_SECONDS, self.poll)
        self.take_frames()  # any read with the SUBSCRIBE's receipt
        await self.done
        if self.pending:
            self.stream.send(Frame("ACK", {"id": self.unacked}))

    def stop(self) -> None:
        self.stream.on_data = None
        for timer in (self.poll_timer, self.work_timer):
            if timer is not None:
                timer.cancel()

    def take_frames(self) -> None:
        """Handle the frames decoded (with a delay: queue the messages, and start one if none is
        under way); what the handling wrote goes in one write."""
        if self.done.done():
            return
        now = time.monotonic_ns()
        self.heard = True
        delayed = self.delay > 0
        if not delayed:
            self.occupancy.busy(now)  # a read ends the wait for the broker
        if not self.arrived:  # the clocks before the first message's read, to begin its span
            self.before = (now, time.process_time_ns())
        received = self.tally.result.received
        try:
            arrived = self._read(delayed)
        except RuntimeError as exc:
            self._finish(exc)
            return
        except RemoteProtocolError as exc:
            self._finish(RuntimeError(f"the broker sent what is not STOMP: {exc}"))
            return
        self.arrived += arrived
        self.occupancy.arrived(arrived)
        if delayed:
            if not self.working and self.inbox:
                self._start_next(now)
            self.occupancy.waiting(now, len(self.inbox))
        else:
            self._note_busy(received)
            self.shared.received[self.spec.consumer_id] = self.tally.result.received
        self._flush()  # the ACKs of everything handled so far, in one write
        if self.stream.lost is not None:
            self._finish(ConnectionError("the broker closed the connection"))
            return
        if not delayed:
            self.occupancy.idle(time.monotonic_ns())
        # The stream stops reading when frames arrive that nothing takes (before this loop was
        # set to take them, say): everything decoded is taken now, so read on.
        self.stream.resume_reading()

    def _read(self, delayed: bool) -> int:
        """The MESSAGE frames decoded: handled now, or queued when each takes a delay."""
        arrived = 0
        decoder, inbox = self.stream.decoder, self.inbox
        while (event := decoder.next_event()) is not None:
            if not isinstance(event, Frame):
                continue
            if not delayed:
                arrived += self.handle(event)
            elif event.command == "MESSAGE":
                inbox.append(event)
                arrived += 1
            elif event.command == "ERROR":
                self.handle(event)  # raises
        return arrived

    def _start_next(self, now: int) -> None:
        """Begin the work on the oldest message waiting: count it, and set its delay's timer."""
        frame = self.inbox.popleft()
        self.occupancy.busy(now)
        received = self.tally.result.received
        self.handle(frame)
        self._note_busy(received)
        self.shared.received[self.spec.consumer_id] = self.tally.result.received
        self.working = True
        self.work_timer = self._loop.call_later(self.delay, self.worked)

    def worked(self) -> None:
        """A message's delay has passed: acknowledge it and start the next, if one waits."""
        self.working = False
        if self.done.done():
            return
        self.acknowledge()
        now = time.monotonic_ns()
        if self.inbox:
            self._start_next(now)
        else:
            self.occupancy.idle(now)
        self.occupancy.waiting(now, len(self.inbox))
        self._flush()  # this message's ACK goes before the next one's wait

    def _flush(self) -> None:
        """Write what was queued; the messages its ACKs cover are no longer held."""
        self.stream.flush()
        if self.acked:
            self.occupancy.released(self.acked)
            self.acked = 0

    def _note_busy(self, received_before: int) -> None:
        """Messages were handled in this call: extend the span in which this consumer worked
        (two clock readings per read, not per message)."""
        result = self.tally.result
        if result.received > received_before:
            result.busy.begin(*self.before)
            result.busy.mark()

    def poll(self) -> None:
        """Every POLL_SECONDS: once the parent has said stop, read on until the line is quiet
        (or for a second at most), so that duplicates arriving after the last expected message
        are still counted."""
        now = time.monotonic()
        self.occupancy.count_idle(time.monotonic_ns())  # a consumer left idle hears nothing more
        if not self.stopping and self.shared.stop.is_set():
            self.stopping = now + STOP_GRACE_SECONDS
        elif self.stopping and (now > self.stopping or not (self.working or self.heard)):
            self._finish(None)
            return
        self.heard = False
        self.poll_timer = self._loop.call_later(POLL_SECONDS, self.poll)

    def _counting(self) -> bool:
        """Whether idle time counts now: once the producers were let go, until the stop."""
        self.started = self.started or self.shared.go.is_set()
        return self.started and not self.stopping

    def _finish(self, error: BaseException | None) -> None:
        if self.done.done():
            return
        for frame in self.inbox:  # messages left unstarted (the run ended): still received
            self.tally.count(frame.body)
        self.inbox.clear()
        self.occupancy.close(time.monotonic_ns())
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)

    def handle(self, frame: Frame) -> bool:
        """Count a MESSAGE (True) and, without a delay, acknowledge it; other frames: False."""
        if frame.command == "ERROR":
            raise RuntimeError(frame.headers.get("message", "ERROR from the broker"))
        if frame.command != "MESSAGE":
            return False
        self.tally.count(frame.body)
        if self.spec.ack == "auto":
            if not self.delay:
                self.acked += 1  # nothing to acknowledge: handled is done
        else:
            self.unacked = frame.headers.get("ack", "")
            self.pending += 1
            if not self.delay:
                self.acknowledge()
        return True

    def acknowledge(self) -> None:
        """The message handled last is done: acknowledge it (or every `ack_every`-th)."""
        if self.spec.ack == "auto":
            self.acked += 1
        elif self.pending >= self.ack_every:
            self.stream.queue(Frame("ACK", {"id": self.unacked}))
            self.acked += self.pending
            self.pending = 0
