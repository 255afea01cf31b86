"""What every destination shares with the rest of the broker: time, the store, memory and message
accounting, swap, and where its effects on others go (dead messages, freed room).

Destinations sit below the features that react to them (producer control, the dead message
queue), so they do not call those features: a dead message goes to a `DeadEnd` given when the
context is made, and freed room raises a `RoomSignal` that producer control reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sluiceway.core.containers.deadlines import DeadlineList
from sluiceway.core.containers.pending import PendingList, Spill
from sluiceway.core.model.store import MemoryStore, MessageStore
from sluiceway.core.values.clock import Clock, SystemClock
from sluiceway.core.values.memory import MemoryLedger, SystemCounts
from sluiceway.core.values.message import Message
from sluiceway.naming import DestinationName


class DeadEnd(Protocol):
    """Where a message that will never be delivered goes (core.dead_letters)."""

    def dead(self, source: DestinationName, message: Message, reason: str, comment: str) -> None:
        """`message` of `source` became dead (expired, evicted, delivered too often)."""
        ...


class NoDeadEnd:
    """Dead messages are counted and go nowhere: the dead message queue's own, whose messages
    never make dead copies, and a context made without a dead message queue."""

    def dead(self, source: DestinationName, message: Message, reason: str, comment: str) -> None:
        pass


class RoomSignal:
    """Raised when held SENDs may go on: a destination may have room again, or a setting that
    holds them changed. Producer control lowers it when it has looked (core.features.producers).

    A flag, not a callback: a message leaving a destination raises it, which happens for every
    message consumed, and setting a field costs less than calling out."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False


class Batch:
    """Frames handled as one unit (those of one read): while a batch is open, a destination
    that was sent messages hands them to its consumers once, when the batch closes, rather
    than after each message. What consumers are given, and in what order, is the same."""

    __slots__ = ("_due", "_open")

    def __init__(self) -> None:
        self._open = 0
        # Hand-overs to run at the close, each once: at most one per destination or topic
        # subscriber the batch's messages went to.
        self._due: dict[Callable[[], None], None] = {}

    def defer(self, hand_over: Callable[[], None]) -> bool:
        """Run `hand_over` when the batch closes (True), or False when no batch is open."""
        if not self._open:
            return False
        self._due[hand_over] = None
        return True

    def __enter__(self) -> None:
        self._open += 1

    def __exit__(self, *exc: object) -> None:
        self._open -= 1
        if self._open:
            return
        while self._due:
            hand_over = next(iter(self._due))
            del self._due[hand_over]
            hand_over()


@dataclass(frozen=True, slots=True)
class Context:
    clock: Clock = field(default_factory=SystemClock)
    store: MessageStore = field(default_factory=MemoryStore)
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    spill: Spill | None = None  # None: pending messages always stay in memory
    system: SystemCounts = field(default_factory=SystemCounts)
    batch: Batch = field(default_factory=Batch)
    room: RoomSignal = field(default_factory=RoomSignal)
    dead_end: DeadEnd = field(default_factory=NoDeadEnd)

    def with_dead_end(self, dead_end: DeadEnd) -> Context:
        """This context, sharing everything, but with dead messages going to `dead_end`."""
        return Context(
            self.clock,
            self.store,
            self.ledger,
            self.spill,
            self.system,
            self.batch,
            self.room,
            dead_end,
        )

    def pending_list(self, *, deadlines: bool = False) -> PendingList:
        """A pending list; `deadlines`: earliest deadline first (core.containers.deadlines)."""
        if deadlines:
            return DeadlineList(self.ledger, self.spill)
        return PendingList(self.ledger, self.spill)
