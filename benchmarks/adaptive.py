"""How fast an adaptive consumer window (consumer-flow-limit:auto) follows a consumer that slows
down.

Each run starts `sluiceway broker` afresh (a free STOMP port on 127.0.0.1, the admin HTTP API on
another free port, a temporary data directory) and, in one asyncio loop:

- a producer keeps about --backlog messages waiting on /queue/adaptive (256-byte bodies);
- one consumer subscribes with `consumer-flow-limit:auto` and `ack:client-individual`, reads
  what arrives into a local queue (as a client library does, up to its window) and works it off
  one message at a time: --fast-ms per message (a timer standing for the work) for
  --fast-seconds from its first message, then --slow-ms per message for --slow-seconds,
  acknowledging each message when its work is done;
- `GET /api/v1/consumers` every --poll-ms: the consumer's window as the broker sizes it now
  (`window_limit`), its pace, round trip, and the messages it holds (`outstanding`).

Figures of a run (a window is `window_limit`, in messages):

- window before: the median of the last second before the slowdown (of its last half, when
  the fast phase is shorter than two seconds);
- window after: the median of the run's last second (likewise): the new steady size;
- shrink seconds: from the slowdown (the start of the first message worked at the slow pace) to
  the first poll answered with a window at most twice the window after. Target: under 1 s;
- drained seconds: from the slowdown to the first poll with `outstanding` at most twice the
  window after. A smaller window takes effect at the next top-up: messages already given stay
  with the consumer, which works them off at its new pace.

A poll's time is when its answer arrived, so each time errs high by at most one poll (20 ms by
default). `--runs N` reports the median of each figure over N runs (a run whose window never
came down counts as the slowest). Prints a table and writes benchmarks/results/adaptive.json.

    .venv/bin/python benchmarks/adaptive.py [--runs 3] [--fast-seconds 3] [--slow-seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluiceway.bench.stream import StompStream
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "adaptive.json"
QUEUE = "/queue/adaptive"
SUBSCRIPTION = "adaptive"
BODY = b"x" * 256
CONSUMERS_PATH = "/api/v1/consumers"
TOP_UP_SECONDS = 0.01  # how often the producer tops the backlog up
STEADY_SECONDS = 1.0  # the span a steady window is the median of (at most half a phase)
SHRINK_TARGET_SECONDS = 1.0
SETUP_TIMEOUT = 30.0  # seconds to connect, subscribe and fill the backlog
RUN_GRACE = 30.0  # seconds allowed beyond the phases before a run is abandoned


@dataclass(frozen=True)
class Settings:
    fast_ms: float = 1.0
    slow_ms: float = 20.0
    fast_seconds: float = 3.0
    slow_seconds: float = 3.0
    poll_ms: float = 20.0
    backlog: int = 2000


@dataclass(frozen=True, slots=True)
class Sample:
    """One answer of GET /consumers about the consumer."""

    at: float  # seconds since the consumer's first message
    window: int  # window_limit
    outstanding: int
    pace_ms: float | None
    round_trip_ms: float | None


@dataclass
class RunFigures:
    broker_pid: int
    window_before: float
    window_after: float
    window_max: int
    shrink_seconds: float | None  # None: the window never came down to twice its new size
    drained_seconds: float | None
    pace_ms_before: float | None
    pace_ms_after: float | None
    round_trip_ms_before: float | None
    round_trip_ms_after: float | None
    messages_consumed: int
    slowdown_at: float  # seconds since the consumer's first message
    samples: list[tuple[float, int, int, float | None, float | None]] = field(repr=False)


class Consumer:
    """Reads eagerly into `inbox`; works one message at a time, each for a timer's delay."""

    def __init__(self, stream: StompStream, settings: Settings) -> None:
        self.stream, self.settings = stream, settings
        self._loop = asyncio.get_running_loop()
        self.inbox: deque[Frame] = deque()
        self.working = False
        self.first = 0.0  # monotonic time of the first message's start
        self.slowdown = 0.0  # monotonic time of the first slow message's start; 0 before
        self.consumed = 0
        self.error = ""
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.stream.on_data = self.take

    def stop(self) -> None:
        self.stream.on_data = None
        if self.timer is not None:
            self.timer.cancel()

    def take(self) -> None:
        while (event := self.stream.decoder.next_event()) is not None:
            if not isinstance(event, Frame):
                continue
            if event.command == "MESSAGE":
                self.inbox.append(event)
            elif event.command == "ERROR":
                self.error = self.error or event.headers.get("message", "ERROR from the broker")
        if self.stream.lost is not None:
            self.error = self.error or "the broker closed the connection"
            return
        # Frames that arrived before `start` paused the reading (nothing took them): read on.
        self.stream.resume_reading()
        if not self.working and self.inbox:
            self.work()

    def work(self) -> None:
        frame = self.inbox.popleft()
        now = time.monotonic()
        self.first = self.first or now
        slow = now - self.first >= self.settings.fast_seconds
        if slow and not self.slowdown:
            self.slowdown = now
        delay_ms = self.settings.slow_ms if slow else self.settings.fast_ms
        self.working = True
        self.timer = self._loop.call_later(delay_ms / 1000, self.done, frame)

    def done(self, frame: Frame) -> None:
        self.working = False
        self.consumed += 1
        self.stream.send(Frame("ACK", {"id": frame.headers.get("ack", "")}))
        if self.inbox:
            self.work()


class Admin:
    """GET requests over one kept-alive HTTP/1.1 connection to the admin endpoint."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> Any:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        host = f"127.0.0.1:{self.port}"
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n\r\n"
        self.writer.write(request.encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status_line, *lines = head.split("\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines if line)
        }
        if "content-length" not in headers:
            raise RuntimeError(f"GET {path}: an answer without Content-Length ({status_line})")
        body = await self.reader.readexactly(int(headers["content-length"]))
        if " 200 " not in f"{status_line} ":
            raise RuntimeError(f"GET {path}: {status_line}: {body[:200]!r}")
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return json.loads(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()
        self.reader = self.writer = None


async def produce(stream: StompStream, consumer: Consumer, backlog: int, sent: int) -> None:
    """Keep about `backlog` messages waiting (`sent` so far): every 10 ms, top up what the
    consumer took."""
    headers = {"destination": QUEUE}
    while True:
        for _ in range(consumer.consumed + backlog - sent):
            stream.queue(Frame("SEND", headers, BODY))
            sent += 1
        await stream.drain()
        await asyncio.sleep(TOP_UP_SECONDS)


async def poll(admin: Admin, consumer: Consumer, samples: list[Sample], every: float) -> None:
    """Every `every` seconds once the consumer has started: its window, as the broker says."""
    due = time.monotonic()
    while True:
        listed = await admin.get(CONSUMERS_PATH)
        at = time.monotonic()
        mine = [c for c in listed if c.get("id") == SUBSCRIPTION]
        if mine and consumer.first:
            c = mine[0]
            samples.append(
                Sample(
                    at - consumer.first,
                    int(c["window_limit"]),
                    int(c["outstanding"]),
                    c.get("pace_ms"),
                    c.get("round_trip_ms"),
                )
            )
        due += every
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def fill(stream: StompStream, count: int) -> None:
    """Send `count` messages, the last with a receipt, and wait for it: the queue holds them."""
    for index in range(count):
        headers = {"destination": QUEUE}
        if index == count - 1:
            headers["receipt"] = "filled"
        stream.queue(Frame("SEND", headers, BODY))
    await stream.drain()
    frame = await stream.next_frame()
    if frame.command != "RECEIPT":
        raise RuntimeError(f"filling the backlog: {frame.headers.get('message', frame.command)}")


async def subscribe(stream: StompStream) -> None:
    headers = {
        "destination": QUEUE,
        "id": SUBSCRIPTION,
        "ack": "client-individual",
        "consumer-flow-limit": "auto",
        "receipt": "subscribed",
    }
    stream.send(Frame("SUBSCRIBE", headers))
    frame = await stream.next_frame()
    if frame.command != "RECEIPT":
        raise RuntimeError(f"SUBSCRIBE refused: {frame.headers.get('message', frame.command)}")


async def one_run(stomp: int, admin_port: int, settings: Settings) -> tuple[Consumer, list[Sample]]:
    """Fill the backlog, subscribe, and poll until the slow phase has lasted its time."""
    streams: list[StompStream] = []
    tasks: list[asyncio.Task[None]] = []
    admin = Admin(admin_port)
    consumer: Consumer | None = None
    try:
        for _ in range(2):
            streams.append(await asyncio.wait_for(StompStream.open(stomp), SETUP_TIMEOUT))
        producer_stream, stream = streams
        await asyncio.wait_for(fill(producer_stream, settings.backlog), SETUP_TIMEOUT)
        await asyncio.wait_for(subscribe(stream), SETUP_TIMEOUT)
        consumer = Consumer(stream, settings)
        consumer.start()
        consumer.take()  # anything read with the receipt
        samples: list[Sample] = []
        tasks = [
            asyncio.create_task(
                produce(producer_stream, consumer, settings.backlog, settings.backlog)
            ),
            asyncio.create_task(poll(admin, consumer, samples, settings.poll_ms / 1000)),
        ]
        await watch(consumer, tasks, settings)
        return consumer, samples
    finally:
        if consumer is not None:
            consumer.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.close()
        for s in streams:
            s.transport.abort()


async def watch(consumer: Consumer, tasks: list[asyncio.Task[None]], settings: Settings) -> None:
    """Until the slow phase has lasted its time; raise what went wrong, if anything did."""
    deadline = time.monotonic() + settings.fast_seconds + settings.slow_seconds + RUN_GRACE
    while not consumer.slowdown or time.monotonic() < consumer.slowdown + settings.slow_seconds:
        if consumer.error:
            raise RuntimeError(f"the consumer: {consumer.error}")
        for task in tasks:
            if task.done():
                task.result()  # raises what ended it
                raise RuntimeError("a task of the run ended early")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the run did not finish within {RUN_GRACE:.0f} s beyond its phases "
                f"({consumer.consumed} messages consumed)"
            )
        await asyncio.sleep(0.05)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def figures(consumer: Consumer, samples: list[Sample], settings: Settings, pid: int) -> RunFigures:
    """A run's figures from its samples (the module's docstring says how each is read)."""
    slowdown = consumer.slowdown - consumer.first
    end = samples[-1].at if samples else slowdown
    before_span = min(STEADY_SECONDS, settings.fast_seconds / 2)
    after_span = min(STEADY_SECONDS, settings.slow_seconds / 2)
    before = [s for s in samples if slowdown - before_span <= s.at < slowdown]
    after = [s for s in samples if s.at >= end - after_span]
    if not before or not after:
        raise RuntimeError(
            f"too few polls to size the windows ({len(before)} before the slowdown, "
            f"{len(after)} at the end): poll more often or lengthen the phases"
        )
    window_after = statistics.median(s.window for s in after)
    later = [s for s in samples if s.at >= slowdown]
    shrunk = next((s.at for s in later if s.window <= 2 * window_after), None)
    drained = next((s.at for s in later if s.outstanding <= 2 * window_after), None)
    return RunFigures(
        broker_pid=pid,
        window_before=statistics.median(s.window for s in before),
        window_after=window_after,
        window_max=max(s.window for s in samples),
        shrink_seconds=None if shrunk is None else round(shrunk - slowdown, 3),
        drained_seconds=None if drained is None else round(drained - slowdown, 3),
        pace_ms_before=_median([s.pace_ms for s in before if s.pace_ms is not None]),
        pace_ms_after=_median([s.pace_ms for s in after if s.pace_ms is not None]),
        round_trip_ms_before=_median(
            [s.round_trip_ms for s in before if s.round_trip_ms is not None]
        ),
        round_trip_ms_after=_median(
            [s.round_trip_ms for s in after if s.round_trip_ms is not None]
        ),
        messages_consumed=consumer.consumed,
        slowdown_at=round(slowdown, 3),
        samples=[
            (round(s.at, 3), s.window, s.outstanding, s.pace_ms, s.round_trip_ms) for s in samples
        ],
    )


def run(settings: Settings) -> RunFigures:
    """One run against a broker of its own, stopped however the run ends."""
    with BrokerProcess() as broker:
        if not broker.admin_port:
            raise RuntimeError(f"the broker started without its admin endpoint: {broker.ready}")
        consumer, samples = asyncio.run(one_run(broker.port, broker.admin_port, settings))
        broker.stop()
    return figures(consumer, samples, settings, broker.process.pid)


def median_of(runs: list[RunFigures], name: str) -> float | None:
    """The median of a figure over the runs; a run without it (a window that never came down)
    counts as the slowest; None when the median itself is such a run."""
    values = [getattr(r, name) for r in runs]
    shown = statistics.median(math.inf if v is None else v for v in values)
    return None if math.isinf(shown) else shown


def summary(runs: list[RunFigures]) -> dict[str, float | None]:
    names = (
        "window_before", "window_after", "shrink_seconds", "drained_seconds",
        "pace_ms_before", "pace_ms_after", "round_trip_ms_before", "round_trip_ms_after",
    )  # fmt: skip
    return {name: median_of(runs, name) for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fast-ms", type=float, default=Settings.fast_ms)
    parser.add_argument("--slow-ms", type=float, default=Settings.slow_ms)
    parser.add_argument("--fast-seconds", type=float, default=Settings.fast_seconds)
    parser.add_argument("--slow-seconds", type=float, default=Settings.slow_seconds)
    parser.add_argument("--poll-ms", type=float, default=Settings.poll_ms)
    parser.add_argument("--backlog", type=int, default=Settings.backlog)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)
    settings = Settings(
        args.fast_ms, args.slow_ms, args.fast_seconds, args.slow_seconds, args.poll_ms,
        args.backlog,
    )  # fmt: skip
    problem = check(settings, args.runs)
    if problem:
        print(f"adaptive.py: {problem}", file=sys.stderr)
        return 2
    runs = []
    for index in range(1, args.runs + 1):
        found = run(settings)
        runs.append(found)
        print(
            f"run {index}: window {found.window_before:g} -> {found.window_after:g}, "
            f"down in {shown(found.shrink_seconds)}, drained in {shown(found.drained_seconds)}",
            flush=True,
        )
    medians = summary(runs)
    shrink = medians["shrink_seconds"]
    document = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "settings": asdict(settings),
        "target": f"shrink_seconds < {SHRINK_TARGET_SECONDS:g}",
        "met": shrink is not None and shrink < SHRINK_TARGET_SECONDS,
        "median": medians,
        "runs": [asdict(r) for r in runs],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(document, indent=1) + "\n")
    print(table(medians, len(runs), settings))
    return 0


def check(settings: Settings, runs: int) -> str:
    """What is wrong with the options, or ""."""
    if runs < 1:
        return "--runs must be at least 1"
    if min(settings.fast_ms, settings.slow_ms, settings.poll_ms) <= 0:
        return "--fast-ms, --slow-ms and --poll-ms must be positive"
    if settings.slow_ms <= settings.fast_ms:
        return "--slow-ms must be more than --fast-ms: the consumer is to slow down"
    if min(settings.fast_seconds, settings.slow_seconds) * 1000 < 4 * settings.poll_ms:
        return "each phase must last at least four polls (--fast-seconds, --slow-seconds)"
    if settings.backlog < 1:
        return "--backlog must be at least 1"
    return ""


def shown(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.3f} s"


def table(medians: dict[str, float | None], runs: int, settings: Settings) -> str:
    def cell(name: str) -> str:
        value = medians[name]
        return "-" if value is None else f"{value:.3g}"

    return "\n".join([
        f"Medians of {runs} run(s): {settings.fast_ms:g} ms per message for "
        f"{settings.fast_seconds:g} s, then {settings.slow_ms:g} ms for "
        f"{settings.slow_seconds:g} s",
        "",
        "| window before | window after | shrink (s) | drained (s) | pace before / after (ms) "
        "| round trip before / after (ms) |",
        "|---|---|---|---|---|---|",
        f"| {cell('window_before')} | {cell('window_after')} | {cell('shrink_seconds')} "
        f"| {cell('drained_seconds')} | {cell('pace_ms_before')} / {cell('pace_ms_after')} "
        f"| {cell('round_trip_ms_before')} / {cell('round_trip_ms_after')} |",
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
