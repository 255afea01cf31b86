"""Start the processes of one scenario, watch their counters, stop them, gather their results.

Consumers are started and subscribed before the producers are let go (for `topic`, so every
subscriber exists before the first message; for the others, so that start-up is not measured).
In `backlog` the consumers start only once every producer has finished. The run ends when every
producer has finished and the consumers hold every message the broker accepted, or when neither
sent nor received counts have moved for `timeout` seconds (then what has not arrived is missing).
"""

from __future__ import annotations

import asyncio
import enum
import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess

from sluiceway.bench.accounting import MAX_SECONDS
from sluiceway.bench.cpu import BUSY_SHARE, ProcessClock, ProcessCpu
from sluiceway.bench.stream import RssSampler
from sluiceway.bench.workers import (
    ConsumerResult,
    ConsumerSpec,
    ProducerResult,
    ProducerSpec,
    Shared,
    Target,
    consumer_main,
    producer_main,
)

WATCH_SECONDS = 0.05  # how often the parent reads the counters
READY_TIMEOUT = 30.0  # seconds for every process to start, connect and subscribe
EXIT_GRACE = 10.0  # seconds for the processes to report once told to stop


class Scenario(enum.Enum):
    QUEUE = "queue"
    TOPIC = "topic"
    FAIRNESS = "fairness"
    BACKLOG = "backlog"
    LATENCY = "latency"


@dataclass(frozen=True)
class Settings:
    scenario: Scenario
    target: Target
    destination: str
    messages: int
    size: int = 1024
    producers: int = 1
    consumers: int = 1
    persistent: bool = False
    ack: str = "auto"
    prefetch: int = 0  # 0: the broker's default; PREFETCH_AUTO: an adaptive window
    ack_every: int = 0  # ack:client: a cumulative ACK every this many messages; 0: half prefetch
    receipts: bool = False
    window: int = 500
    rate: float = 0.0  # messages per second, all producers together; 0: unpaced
    delays_ms: tuple[float, ...] = ()  # per consumer (fairness)
    timeout: float = 10.0
    broker_pid: int = 0  # 0: not known; its RSS and CPU are then not reported
    busy_share: float = BUSY_SHARE  # warn when a load process used more of a core than this

    def counts(self) -> tuple[int, ...]:
        """Messages per producer: `messages` shared out, the first ones taking the remainder."""
        share, extra = divmod(self.messages, self.producers)
        return tuple(share + (index < extra) for index in range(self.producers))


@dataclass
class Outcome:
    settings: Settings
    producers: list[ProducerResult] = field(default_factory=list)
    consumers: list[ConsumerResult] = field(default_factory=list)
    start_ns: int = 0
    drain_start_ns: int = 0  # backlog: when the consumers were started
    end_ns: int = 0
    parent_cpu: float = 0.0
    broker_peak_rss: int = 0
    broker_cpu: ProcessCpu | None = None  # from the producers' start to the run's end
    timed_out: bool = False
    failures: list[str] = field(default_factory=list)  # processes that did not report
    # The origin of the per-second series (the consumers' and `sent_totals`).
    origin_ns: int = 0
    # Messages sent so far at the end of each second since `origin_ns` (at most MAX_SECONDS).
    sent_totals: list[int] = field(default_factory=list)


Progress = Callable[[int, int, int], None]  # (sent, received, expected received)


class Run:
    def __init__(self, settings: Settings, progress: Progress | None = None) -> None:
        self.settings = settings
        self.progress = progress
        self.context = multiprocessing.get_context("spawn")
        consumers = settings.consumers
        self.shared = Shared(
            sent=self.context.Array("q", settings.producers, lock=False),
            received=self.context.Array("q", consumers, lock=False),
            ready=self.context.Array("b", consumers + settings.producers, lock=False),
            go=self.context.Event(),
            stop=self.context.Event(),
            results=self.context.Queue(),
        )
        self.outcome = Outcome(settings)
        self.processes: list[SpawnProcess] = []
        self.broker_clock = ProcessClock(settings.broker_pid) if settings.broker_pid else None

    def execute(self) -> Outcome:
        cpu = time.process_time()
        sampler = RssSampler(self.settings.broker_pid) if self.settings.broker_pid else None
        if sampler is not None:
            sampler.start()
        try:
            self._run()
        finally:
            for process in self.processes:
                if process.is_alive():
                    process.terminate()
                process.join(5)
            if sampler is not None:
                self.outcome.broker_peak_rss = sampler.stop()
        self.outcome.parent_cpu = time.process_time() - cpu
        return self.outcome

    def _run(self) -> None:
        s, outcome = self.settings, self.outcome
        outcome.start_ns = outcome.origin_ns = time.monotonic_ns()
        backlog = s.scenario is Scenario.BACKLOG
        if not backlog:
            self._start_consumers()
        for index in range(s.producers):
            spec = ProducerSpec(
                s.target, index, s.destination, s.counts()[index], s.size, s.persistent,
                s.receipts, s.window, s.rate / s.producers,
            )  # fmt: skip
            self._spawn(producer_main, spec, self.shared, s.consumers + index)
        self._wait_ready(range(0 if not backlog else s.consumers, s.consumers + s.producers))
        if self.broker_clock is not None:
            self.broker_clock.start()
        outcome.start_ns = time.monotonic_ns()
        self.shared.go.set()
        self._watch(backlog)
        if self.broker_clock is not None:
            outcome.broker_cpu = self.broker_clock.stop()
        self.shared.stop.set()
        self._collect(deadline=time.monotonic() + EXIT_GRACE)

    def _start_consumers(self) -> None:
        s = self.settings
        for index in range(s.consumers):
            delay = s.delays_ms[index] if index < len(s.delays_ms) else 0.0
            # With delays (fairness), the spells say who idled while another held messages.
            spec = ConsumerSpec(
                s.target, index, s.destination, s.counts(), s.ack, s.prefetch, delay,
                self.outcome.origin_ns, s.ack_every, spells=bool(s.delays_ms),
            )  # fmt: skip
            self._spawn(consumer_main, spec, self.shared)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self.processes.append(process)

    def _wait_ready(self, slots: range) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(self.shared.ready[slot] for slot in slots):
            self._collect(deadline=time.monotonic() + WATCH_SECONDS)
            failed = [r.error for r in self._results() if r.error]
            if failed:
                raise StartError(failed[0])
            if time.monotonic() > deadline:
                raise StartError(f"the load processes were not connected after {READY_TIMEOUT} s")

    def _watch(self, backlog: bool) -> None:
        s = self.settings
        last_change, last_counts = time.monotonic(), (-1, -1)
        drained = False
        while True:
            self._collect(deadline=time.monotonic() + WATCH_SECONDS)
            sent = sum(self.shared.sent)
            received = sum(self.shared.received)
            self._note_sent(sent)
            producers_done = len(self.outcome.producers) == s.producers
            if backlog and producers_done and not drained:
                drained = True
                self.outcome.drain_start_ns = time.monotonic_ns()
                self._start_consumers()
                last_change = time.monotonic()
            expected = self._expected_received()
            if self.progress is not None:
                self.progress(sent, received, expected)
            if producers_done and (not backlog or drained) and received >= expected:
                break
            now = time.monotonic()
            if (sent, received) != last_counts:
                last_change, last_counts = now, (sent, received)
            elif now - last_change > s.timeout:
                self.outcome.timed_out = True
                break
        self.outcome.end_ns = time.monotonic_ns()

    def _note_sent(self, sent: int) -> None:
        """Keep `sent` as the total at the end of the current second (for the plot)."""
        totals = self.outcome.sent_totals
        second = (time.monotonic_ns() - self.outcome.origin_ns) // 1_000_000_000
        second = min(second, MAX_SECONDS - 1)
        while len(totals) <= second:
            totals.append(totals[-1] if totals else 0)
        totals[second] = sent

    def _expected_received(self) -> int:
        """What the consumers should hold in all, from what the producers have sent so far."""
        s = self.settings
        done = {result.producer_id: result for result in self.outcome.producers}
        sent = sum(
            done[index].sent - done[index].refused if index in done else self.shared.sent[index]
            for index in range(s.producers)
        )
        return sent * s.consumers if s.scenario is Scenario.TOPIC else sent

    def _results(self) -> list[ProducerResult | ConsumerResult]:
        return [*self.outcome.producers, *self.outcome.consumers]

    def _collect(self, deadline: float) -> None:
        """Take the results that have arrived, waiting until `deadline` for all of them."""
        outcome = self.outcome
        while len(outcome.producers) + len(outcome.consumers) < len(self.processes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                result = self.shared.results.get(timeout=remaining)
            except queue.Empty:
                break
            if isinstance(result, ProducerResult):
                outcome.producers.append(result)
            else:
                outcome.consumers.append(result)
        if self.shared.stop.is_set():
            for process in self.processes:
                if process.exitcode not in (None, 0):
                    outcome.failures.append(f"{process.name} exited with {process.exitcode}")


class StartError(Exception):
    """A load process could not connect or subscribe."""


async def probe(target: Target) -> None:
    """Connect once, so that a wrong address or login is one clear error before any process."""
    stream = await asyncio.wait_for(target.connect(), READY_TIMEOUT)
    await stream.close()
