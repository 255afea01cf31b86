"""JMS IQ Manager producer throttling (spec-docs 003, "Throttling Producers").

Three properties govern it: the server throttling threshold (`imq.throttling.server.threshold`,
default 100,000 messages held by the whole broker; 0: off), the per-destination threshold
(`imq.throttling.destination.threshold`, default 1000 undelivered messages; 0: off) and the lag
(`imq.throttling.lag`, default 100). A destination's producers are throttled (held) when the
broker holds more than the server threshold AND the destination has more undelivered messages
than its threshold (for a topic, its slowest subscriber's backlog). A throttled destination is
released when its undelivered messages fall below the threshold minus the lag (900 by default),
or when the broker falls below the server threshold. Between the two marks it stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Throttle:
    server_threshold: int = 100_000
    destination_threshold: int = 1000
    lag: int = 100

    @property
    def enabled(self) -> bool:
        return self.server_threshold > 0 and self.destination_threshold > 0

    def decide(self, throttled: bool, server_total: int, undelivered: int) -> bool:
        """Whether the destination is throttled now, given whether it was."""
        if not self.enabled:
            return False
        server_over = server_total > self.server_threshold
        if throttled:
            released = undelivered < self.destination_threshold - self.lag or not server_over
            return not released
        return server_over and undelivered > self.destination_threshold
