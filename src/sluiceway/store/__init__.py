"""Storage: the write-ahead journal and the swap area. Records are opaque bytes here."""

from sluiceway.store.journal import Journal, SyncPolicy
from sluiceway.store.segments import (
    CorruptJournal,
    JournalError,
    Position,
    Record,
    RecoveryReport,
    SegmentInfo,
)
from sluiceway.store.swap import SwapArea, SwapError, SwapRef

__all__ = [
    "CorruptJournal",
    "Journal",
    "JournalError",
    "Position",
    "Record",
    "RecoveryReport",
    "SegmentInfo",
    "SwapArea",
    "SwapError",
    "SwapRef",
    "SyncPolicy",
]
