"""What one consumer holds and when it has nothing to do, from clock readings its loop passes in
(monotonic nanoseconds), so that the rules can be checked without a broker or an event loop.

- Held: messages received and not yet acknowledged (with ack:auto, not yet handled): the
  messages a client library keeps in memory for its consumer. A message counts from the read
  that brought it to the write of the ACK that covers it; `peak` is the most held at once. A
  consumer that handles what it reads at once holds at most one read's messages (and, with
  cumulative ACKs, those its next ACK is to cover).
- Idle: time with nothing to do (nothing received waits to be started, nothing is being worked
  on). `idle_ns` counts only while `counting()` says so: from the producers' start to the
  parent's stop.
- Spells, when asked for: the idle spells, and the spells in which messages received waited to
  be started (`waiting`), so that a report can tell how long a consumer idled while another held
  messages it had not started (`accounting.overlap`).
"""

from __future__ import annotations

from collections.abc import Callable

from sluiceway.bench.accounting import Spells


class Occupancy:
    """One consumer's held messages and idle time (module docstring)."""

    __slots__ = (
        "counting",
        "held",
        "idle_mark",
        "idle_ns",
        "idle_since",
        "idle_spells",
        "peak",
        "waiting_since",
        "waiting_spells",
    )

    def __init__(self, now: int, counting: Callable[[], bool], *, spells: bool) -> None:
        self.counting = counting
        self.held = 0  # messages received and not acknowledged
        self.peak = 0  # the most held at once
        self.idle_since = now  # the current idle spell's start; 0 while there is work
        self.idle_mark = now  # how far the current idle spell has been added to `idle_ns`
        self.idle_ns = 0
        self.waiting_since = 0  # since when received messages wait to be started; 0: none wait
        self.idle_spells = Spells() if spells else None
        self.waiting_spells = Spells() if spells else None

    def arrived(self, count: int) -> None:
        """`count` messages were read."""
        if count:
            self.held += count
            self.peak = max(self.peak, self.held)

    def released(self, count: int) -> None:
        """ACKs covering `count` messages were written (ack:auto: `count` were handled)."""
        self.held -= count

    def busy(self, now: int) -> None:
        """The consumer has work from `now`: the idle spell, if any, ends."""
        since = self.idle_since
        if since:
            self.count_idle(now)
            if self.idle_spells is not None:
                self.idle_spells.add(since, now)
            self.idle_since = self.idle_mark = 0

    def idle(self, now: int) -> None:
        """The consumer has nothing to do from `now` (unless it was idle already)."""
        if not self.idle_since:
            self.idle_since = self.idle_mark = now

    def count_idle(self, now: int) -> None:
        """Add the idle time up to `now` to `idle_ns`, if it is to be counted."""
        if self.idle_mark:
            if self.counting():
                self.idle_ns += now - self.idle_mark
            self.idle_mark = now

    def waiting(self, now: int, messages: int) -> None:
        """`messages` received messages wait to be started, as of `now`."""
        if messages and not self.waiting_since:
            self.waiting_since = now
        elif not messages and self.waiting_since:
            if self.waiting_spells is not None:
                self.waiting_spells.add(self.waiting_since, now)
            self.waiting_since = 0

    def close(self, now: int) -> None:
        """The run is over for this consumer: the open spells end at `now`."""
        if self.idle_since and self.idle_spells is not None:
            self.idle_spells.add(self.idle_since, now)
        self.waiting(now, 0)
