"""What every destination needs from the broker: time, the store, memory accounting, swap."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluiceway.core.clock import Clock, SystemClock
from sluiceway.core.memory import MemoryLedger
from sluiceway.core.pending import PendingList, Spill
from sluiceway.core.store import MemoryStore, MessageStore


@dataclass(frozen=True, slots=True)
class Context:
    clock: Clock = field(default_factory=SystemClock)
    store: MessageStore = field(default_factory=MemoryStore)
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    spill: Spill | None = None  # None: pending messages always stay in memory

    def pending_list(self) -> PendingList:
        return PendingList(self.ledger, self.spill)
