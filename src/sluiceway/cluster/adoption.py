"""Taking over a failed member's store: its journal read back with the recovery a restart runs,
and what it held adopted into this broker (core.features.adoption), in bounded batches.

The failed member's journal is recovered into a broker of its own (`scratch`), with no listener
and a swap area in a temporary directory, so a backlog larger than memory spills as it would on
a restart; the scratch broker never runs a client and is thrown away afterwards. Reading it (the
database, the disk) happens on the caller's thread, which must not be the event loop's; each
batch is adopted on the event loop (`on_loop`), which runs nothing else meanwhile, so the live
broker is only ever touched from its own thread. A batch holds at most BATCH_MESSAGES messages,
and the reading thread waits for each batch to be adopted before it reads the next.

Consumers wait (`gate`): each destination adopted into has its consumers paused from its first
adopted message until `open_gate`, which the caller runs once this broker's store holds what was
adopted. So nothing adopted is delivered, nor acknowledged, before then: a taker that dies in
between leaves the failed member's store whole, and no acknowledgement of a message it still
holds. With `redelivered`, every adopted message is flagged redelivered (a takeover tried again:
some of them may have reached a consumer through the taker that died).

What is adopted: every queue's messages, in order (the dead message queue's too), its lease
groups with their open leases (same numbers, same messages) ahead of them, every durable
subscription with the messages it had not acknowledged, and the open stages. What is not:
non-persistent messages (a journal never holds them), transactions still open (never written:
rolled back), and topic cursors (positions in the failed member's topics). Which batch each
sink committed last is adopted only when a replay would read the same messages here
(`_adopt_stages`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.features.adoption import DurableAdoption, adopt_queue_message
from sluiceway.core.features.leases import Lease
from sluiceway.core.features.stages import Stage
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.topic import DurableState, Topic
from sluiceway.core.values.leasing import LeaseState
from sluiceway.core.values.message import Message
from sluiceway.naming import DestinationName
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.restoring import restore_broker
from sluiceway.persist.swap import SwapArea

log = logging.getLogger(__name__)

BATCH_MESSAGES: Final = 500  # messages adopted per turn of the event loop

T = TypeVar("T")


ON_LOOP_TIMEOUT: Final = 60.0  # seconds a cluster thread waits for the event loop to run its call


class OnLoop(Protocol):
    """Runs a function on the live broker's event loop and returns what it returned."""

    def __call__(self, fn: Callable[[], T]) -> T: ...


def loop_caller(loop: asyncio.AbstractEventLoop) -> OnLoop:
    """An OnLoop for threads other than `loop`'s: a loop that does not run the call within
    ON_LOOP_TIMEOUT (it is stopping) makes it raise TimeoutError."""

    def call(fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(ON_LOOP_TIMEOUT)

    return call


@dataclass
class AdoptionReport:
    """What a takeover adopted."""

    messages: int = 0
    redelivered: int = 0  # of them, delivered by the failed member and not acknowledged
    durables: int = 0
    durable_messages: int = 0
    dropped_durables: list[str] = field(default_factory=list)  # replaced here by their client
    here_already: int = 0  # queue messages a link had brought here already: not adopted again
    leases: int = 0  # open queue leases adopted under their numbers
    stages: int = 0  # open stages adopted
    committed_kept: bool = True  # each sink's last committed batch taken over too
    by_destination: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"{self.messages} queue messages ({self.redelivered} to be redelivered, "
            f"{self.here_already} here already over a link), {self.durables} durable "
            f"subscriptions with {self.durable_messages} messages, {self.leases} queue leases, "
            f"{self.stages} stages"
        )


class StoreAdopter:
    """Adopts a failed member's journal store into `live`, whose loop `on_loop` runs on."""

    def __init__(
        self,
        live: Broker,
        config: BrokerConfig,
        on_loop: OnLoop,
        *,
        gate: bool = False,
        redelivered: bool = False,
        here_already: Callable[[str], bool] = lambda message_id: False,
    ) -> None:
        """`here_already(message_id)`: whether a queue message of the failed member reached
        this broker over a link already (its home's acknowledgement lost with the home): it is
        not adopted again. Asked on the loop's thread."""
        self._live = live
        self._here_already = here_already
        self._config = config
        self._on_loop = on_loop
        self._gate = gate
        self._redelivered = redelivered
        # Destinations whose consumers the gate paused (on the loop's thread only).
        self._gated: list[Queue | Topic] = []
        self.skipped = 0  # queue messages not adopted: they came over a link already
        # A replay could not read here what it read on the failed member (_adopt_stages).
        self._positions_split = False

    def _pass(self, destination: Queue | Topic) -> None:
        """Before adopting into `destination`: pause its consumers, if the gate is on and
        nobody paused them already."""
        if self._gate and not destination.paused_consumers and destination not in self._gated:
            destination.paused_consumers = True
            self._gated.append(destination)

    def open_gate(self) -> None:
        """Let the consumers the gate paused go on (call on the loop)."""
        gated, self._gated = self._gated, []
        for destination in gated:
            destination.paused_consumers = False
            destination.resume_consumers()

    def adopt(self, store: JournalStore) -> AdoptionReport:
        """Read `store` back and adopt all it holds; call on a thread of its own. `store` is
        left open: the caller closes it, and deletes it once this broker's journal holds what
        was adopted."""
        started = time.monotonic()
        report = AdoptionReport()
        swap_directory = Path(tempfile.mkdtemp(prefix="sluiceway-takeover-"))
        swap = SwapArea(swap_directory)
        try:
            swap.open()
            scratch = Broker(self._config, store=store, spill=swap)
            restore_broker(store, scratch)
            for destination in list(scratch.registry):
                if isinstance(destination, Queue):
                    self._adopt_leased(scratch, destination, report)
                    self._adopt_queue(destination, report)
                elif isinstance(destination, Topic) and destination.durables:
                    self._adopt_topic(destination, report)
            self._adopt_stages(scratch, report)
        finally:
            swap.close()
            shutil.rmtree(swap_directory, ignore_errors=True)
        report.seconds = time.monotonic() - started
        report.here_already = self.skipped
        return report

    def _adopt_leased(self, scratch: Broker, queue: Queue, report: AdoptionReport) -> None:
        """The failed member's queue leases, before the queue's pending messages (they left
        its head first): each open one under its number with its messages, so that a reader
        that comes here reads the same lease again; then each group's numbers and finished
        leases. A lease whose number is used here already gives its messages to the queue,
        flagged redelivered, as an expired lease does. (The failed member's leases are read,
        not taken: nothing is written to its store, which a takeover tried again reads whole.)"""
        name = queue.name
        groups = [group.name for group in scratch.leases.groups_of(name)]
        if self._on_loop(functools.partial(self._groups_here, name, groups)):
            self._positions_split = True
        for lease in scratch.leases.open_leases(name):
            made = self._on_loop(
                functools.partial(
                    self._new_lease, name, lease.group.name, lease.number, lease.expires
                )
            )
            start = 0
            while batch := lease.messages.read_at(start, BATCH_MESSAGES):
                start += len(batch)
                if made is None:
                    self._adopt_batch(name, batch, report)
                else:
                    self._on_loop(functools.partial(self._into_lease, made, batch))
                    report.messages += len(batch)
                    report.redelivered += len(batch)
            if made is not None:
                self._on_loop(functools.partial(self._live.leases.adopted, made))
                report.leases += 1
        for kept in scratch.leases.groups_of(name):
            finished = {number: state for number, (_, state) in kept.finished.items()}
            self._on_loop(functools.partial(self._group, name, kept.name, kept.high, finished))

    def _groups_here(self, name: DestinationName, groups: list[str]) -> bool:
        """Whether any of `groups` of queue `name` exists here already."""
        here = {group.name for group in self._live.leases.groups_of(name)}
        return not here.isdisjoint(groups)

    def _new_lease(
        self, name: DestinationName, group: str, number: int, expires: int
    ) -> Lease | None:
        queue = self._live.registry.recovered(name)
        assert isinstance(queue, Queue)
        self._pass(queue)
        return self._live.leases.adopt_lease(queue, group, number, expires)

    def _into_lease(self, lease: Lease, batch: list[Message]) -> None:
        for message in batch:
            if self._redelivered:
                message.delivery_count = max(message.delivery_count, 2)
            self._live.leases.adopt_message(lease, message)

    def _group(
        self, name: DestinationName, group: str, high: int, finished: dict[int, LeaseState]
    ) -> None:
        queue = self._live.registry.recovered(name)
        assert isinstance(queue, Queue)
        self._live.leases.adopt_group(queue, group, high, finished)

    def _adopt_stages(self, scratch: Broker, report: AdoptionReport) -> None:
        """The failed member's open stages with their messages, in send order (a COMMIT here
        publishes them), and which batch each sink committed last (a replayed COMMIT here
        answers `committed-before`) -- the latter only while every position a replay reads
        from moved here whole. A replay must read what the first run read; otherwise the
        messages it read here instead would be acknowledged without being written. That is not
        so when the failed member had topic cursors (they do not move), or when one of its
        lease groups existed here already (a reader read leases here before the takeover,
        maybe of the same numbers with other messages): then a replay publishes again (at
        least once for that batch)."""
        if len(scratch.cursors):
            self._positions_split = True
        if self._positions_split:
            report.committed_kept = False
            log.warning(
                "takeover: the failed member's topic cursors do not move, or a lease group of "
                "its was read here already: which batch each of its sinks committed last is not "
                "taken over, so a replayed batch is published again (at least once)"
            )
        else:
            for sink, batch in list(scratch.stages.committed.items()):
                self._on_loop(functools.partial(self._live.stages.adopt_committed, sink, batch))
        for stage in scratch.stages:
            made = self._on_loop(functools.partial(self._live.stages.adopt_stage, stage.name))
            if made is None:
                continue  # committed here, or staged here again meanwhile: dropped
            start = 0
            while staged := stage.messages.read_at(start, BATCH_MESSAGES):
                start += len(staged)
                adopt = functools.partial(self._into_stage, made, staged, stage.expires_ms)
                self._on_loop(adopt)
            report.stages += 1

    def _into_stage(self, stage: Stage, batch: list[Message], expires_ms: int) -> None:
        for message in batch:
            self._live.stages.adopt_staged(stage, message, expires_ms)

    def _adopt_queue(self, queue: Queue, report: AdoptionReport) -> None:
        while True:
            batch: list[Message] = []
            while len(batch) < BATCH_MESSAGES and (message := queue.pending.pop()) is not None:
                batch.append(message)
            if not batch:
                return
            self._adopt_batch(queue.name, batch, report)

    def _adopt_batch(
        self, name: DestinationName, batch: list[Message], report: AdoptionReport
    ) -> None:
        adopted, flagged = self._on_loop(functools.partial(self._into_queue, name, batch))
        report.messages += adopted
        report.redelivered += flagged
        path = name.path
        report.by_destination[path] = report.by_destination.get(path, 0) + adopted

    def _into_queue(self, name: DestinationName, batch: list[Message]) -> tuple[int, int]:
        """Adopt `batch` into queue `name`: how many were adopted (not here already), and how
        many of those go out flagged redelivered."""
        queue = self._live.registry.recovered(name)
        assert isinstance(queue, Queue)
        self._pass(queue)
        adopted = flagged = 0
        for message in batch:
            if self._here_already(message.id):
                self.skipped += 1
                continue
            if self._redelivered:
                message.delivery_count = max(message.delivery_count, 1)
            flagged += message.delivery_count > 0
            adopt_queue_message(queue, message)
            adopted += 1
        return adopted, flagged

    def _adopt_topic(self, topic: Topic, report: AdoptionReport) -> None:
        name = topic.name
        states = list(topic.durables.values())
        # The subscriptions here that take each failed member's subscription over.
        takers = self._on_loop(lambda: self._takers(states, report))
        next_seq = topic.log.first_seq
        while next_seq is not None:
            messages = topic.log.read(next_seq, BATCH_MESSAGES)
            if not messages:
                break
            next_seq = messages[-1].seq + 1
            batch = [(message, _wanted(message, states, takers)) for message in messages]
            batch = [(message, wanted) for message, wanted in batch if wanted]
            if batch:
                self._on_loop(functools.partial(self._into_topic, name, batch))
                report.durable_messages += len(batch)
        report.durables += len(takers)

    def _takers(
        self, states: list[DurableState], report: AdoptionReport
    ) -> dict[int, DurableState]:
        takers: dict[int, DurableState] = {}
        for state in states:
            taker = self._live.adopt_durable(state.record)
            if taker is None:
                record = state.record
                report.dropped_durables.append(f"{record.client_id}/{record.name}")
                log.warning(
                    "takeover: durable subscription %r of client %r is on another topic or "
                    "selector here (its subscriber replaced it); its %s messages are dropped",
                    record.name,
                    record.client_id,
                    record.topic,
                )
            else:
                takers[id(state)] = taker
        return takers

    def _into_topic(
        self, name: DestinationName, batch: list[tuple[Message, list[tuple[DurableState, int]]]]
    ) -> None:
        topic = self._live.registry.recovered(name)
        assert isinstance(topic, Topic)
        self._pass(topic)
        adoption = DurableAdoption(topic, self._live.store)
        for message, wanted in batch:
            if self._redelivered:
                adoption.adopt(message, [(state, max(count, 1)) for state, count in wanted])
            else:
                adoption.adopt(message, wanted)
        adoption.wake()


def _wanted(
    message: Message, states: list[DurableState], takers: dict[int, DurableState]
) -> list[tuple[DurableState, int]]:
    """The subscriptions here that take `message` over, each with the deliveries the failed
    member had made of it: those of its subscriptions that had not acknowledged it."""
    wanted: list[tuple[DurableState, int]] = []
    for state in states:
        taker = takers.get(id(state))
        if (
            taker is not None
            and message.seq >= state.cursor
            and message.seq not in state.acked_ahead
            and state.accepts(message)
        ):
            wanted.append((taker, state.deliveries.get(message.seq, 0)))
    return wanted
