"""The broker's own accounting of the memory its queued messages take (a ledger, not a guess).

Every message waiting in memory in a pending list is counted at its body size plus a fixed
estimate of the Python objects around it. Above `imq.swap.threshold`, pending lists write newly
queued messages to the swap area instead of keeping them (see `core.pending`).
"""

from __future__ import annotations

from typing import Final

# Python object overhead of one queued message besides its body: the Message object, its id and
# headers, the deque slot (measured with sys.getsizeof on typical messages, rounded up).
MESSAGE_OVERHEAD: Final = 400


def message_cost(body_size: int) -> int:
    """Bytes one queued message is counted for."""
    return body_size + MESSAGE_OVERHEAD


class MemoryLedger:
    """Bytes of queued messages held in memory, against a threshold (0: no threshold)."""

    __slots__ = ("peak", "threshold", "used")

    def __init__(self, threshold: int = 0) -> None:
        self.threshold = threshold
        self.used = 0
        self.peak = 0

    def add(self, cost: int) -> None:
        self.used += cost
        self.peak = max(self.peak, self.used)

    def remove(self, cost: int) -> None:
        self.used -= cost

    @property
    def over(self) -> bool:
        """True when new messages should go to the swap area rather than memory."""
        return 0 < self.threshold <= self.used
