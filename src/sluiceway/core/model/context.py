"""What every destination needs from the broker: time, the store, memory and message accounting,
swap, and the broker's own reactions (dead messages, freed room)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluiceway.core.containers.pending import PendingList, Spill
from sluiceway.core.model.store import MemoryStore, MessageStore
from sluiceway.core.values.clock import Clock, SystemClock
from sluiceway.core.values.memory import MemoryLedger, SystemCounts
from sluiceway.core.values.message import Message

if TYPE_CHECKING:
    from sluiceway.core.model.destination import Destination


class Hooks:
    """What destinations ask the broker to do; the broker sets these when it starts."""

    def __init__(self) -> None:
        # A message became dead (expired, evicted, delivered too often): reason, comment.
        self.dead: Callable[[Destination, Message, str, str], None] = lambda d, m, r, c: None
        # A destination may have room again: held producers may go on.
        self.room: Callable[[Destination], None] = lambda d: None


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
    hooks: Hooks = field(default_factory=Hooks)
    batch: Batch = field(default_factory=Batch)

    def pending_list(self) -> PendingList:
        return PendingList(self.ledger, self.spill)
