"""Time, injected so the core runs deterministically in tests (`sluiceway.testing.FakeClock`)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """The two clocks the broker reads."""

    def time_ms(self) -> int:
        """Wall-clock time in milliseconds since the epoch: message timestamps and `expires`."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: durations and deadlines."""
        ...


class SystemClock:
    """The real clocks."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()
