"""The broker's own accounting of memory and messages (a ledger, not a guess), and its levels.

Every message waiting in memory (in a pending list, a topic log, being delivered, held for a
producer) is counted at its body size plus a fixed estimate of the Python objects around it;
the I/O layer adds the bytes waiting in write buffers, and the bytes of frames still being
received (`input`: a large SEND's body counts as it arrives, and is given back when the frame is
complete, then counted as a message, or when its connection closes). Against
`imq.memory.budget` that gives Open MQ's memory levels (`imq.<level>.threshold`, percent of the
budget):

- GREEN: all is well;
- YELLOW (80 %): newly queued messages go to the swap area (unless `imq.swap.threshold` sets
  another point);
- ORANGE (90 %): as YELLOW, with a smaller producer credit per connection;
- RED (98 %): new producers are refused and existing ones are held until memory is freed.

A level is entered `imq.memory.hysteresis` bytes before its threshold, so it does not flap.

The bytes of frames being received, on all connections together, are bounded by
`imq.stomp.input.total.max_bytes` (`LevelPolicy.input_max`): by default a quarter of the budget.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.core.values.message import Message

log = logging.getLogger(__name__)

# Python object overhead of one queued message besides its body: the Message object, its id and
# headers, the deque slot (measured with sys.getsizeof on typical messages, rounded up).
MESSAGE_OVERHEAD: Final = 400
# imq.stomp.input.total.max_bytes = -1: this percentage of imq.memory.budget. A quarter leaves
# the rest to what the budget is for (queued messages, write buffers) while a few large SENDs
# arrive at once; a stalled sender holds no more than its share of memory.
INPUT_SHARE: Final = 25


def message_cost(body_size: int) -> int:
    """Bytes one message in memory is counted for."""
    return body_size + MESSAGE_OVERHEAD


class MemoryLevel(enum.IntEnum):
    GREEN = 0
    YELLOW = 1
    ORANGE = 2
    RED = 3


@dataclass(frozen=True, slots=True)
class LevelPolicy:
    """Thresholds (percent of the budget) and producer credits per level, and the bytes of
    frames being received the budget leaves room for."""

    budget: int = 0  # 0: no budget, always GREEN
    thresholds: tuple[int, int, int, int] = (0, 80, 90, 98)
    counts: tuple[int, int, int, int] = (5000, 500, 50, 0)
    hysteresis: int = 1024
    input_max: int = 0  # bytes of frames being received on all connections; 0: no limit


def level_policy(config: BrokerConfig) -> LevelPolicy:
    return LevelPolicy(
        budget=config.memory_budget,
        thresholds=(0, config.yellow_threshold, config.orange_threshold, config.red_threshold),
        counts=(config.green_count, config.yellow_count, config.orange_count, config.red_count),
        hysteresis=config.memory_hysteresis,
        input_max=input_limit(config.input_total_max, config.memory_budget),
    )


def input_limit(configured: int, budget: int) -> int:
    """imq.stomp.input.total.max_bytes in bytes: -1 takes INPUT_SHARE percent of the budget (no
    limit without a budget); 0: no limit."""
    if configured >= 0:
        return configured
    return budget * INPUT_SHARE // 100


def swap_point(config: BrokerConfig, policy: LevelPolicy) -> int:
    """Bytes of queued messages beyond which new ones go to the swap area; 0: never."""
    if config.swap_threshold >= 0:
        return config.swap_threshold
    return policy.budget * policy.thresholds[MemoryLevel.YELLOW] // 100


class MemoryLedger:
    """Bytes of messages held in memory, and the memory level they put the broker at."""

    __slots__ = ("external", "input", "level", "peak", "policy", "threshold", "used")

    def __init__(self, threshold: int = 0, policy: LevelPolicy | None = None) -> None:
        self.policy = policy if policy is not None else LevelPolicy()
        self.used = 0  # counted by the core
        self.external = 0  # reported by the I/O layer (write buffers)
        self.input = 0  # charged by the I/O layer: frames being received, all connections
        self.peak = 0
        self.level = MemoryLevel.GREEN
        self.threshold = threshold  # swap point in bytes; 0: never swap

    def hold(self, message: Message) -> None:
        """`message` is now held in memory: count its cost."""
        self.used += message_cost(len(message.body))
        self.peak = max(self.peak, self.used)

    def let_go(self, message: Message) -> None:
        """`message` is no longer held in memory."""
        self.used -= message_cost(len(message.body))

    @property
    def over(self) -> bool:
        """True when new messages should go to the swap area rather than memory."""
        return 0 < self.threshold <= self.used

    @property
    def total(self) -> int:
        return self.used + self.external + self.input

    @property
    def credit(self) -> int:
        """Producer credit per connection at the current level."""
        return self.policy.counts[self.level]

    @property
    def room_below_red(self) -> int:
        """Bytes that may still be added before the level turns RED (no budget: unlimited)."""
        budget = self.policy.budget
        if budget <= 0:
            return 2**62
        red = budget * self.policy.thresholds[MemoryLevel.RED] // 100
        return max(0, red - self.policy.hysteresis - self.total)

    def check(self) -> MemoryLevel:
        """Recompute the level from what is counted; log a change."""
        budget = self.policy.budget
        if budget <= 0:
            return self.level
        used = self.total + self.policy.hysteresis
        level = MemoryLevel.GREEN
        for candidate in (MemoryLevel.YELLOW, MemoryLevel.ORANGE, MemoryLevel.RED):
            if used >= budget * self.policy.thresholds[candidate] // 100:
                level = candidate
        if level != self.level:
            log.log(
                logging.WARNING if level > self.level else logging.INFO,
                "memory level %s -> %s: %d of %d bytes (imq.memory.budget) in use",
                self.level.name,
                level.name,
                self.total,
                budget,
            )
            self.level = level
        return level


@dataclass
class SystemCounts:
    """Messages and body bytes held in all destinations (imq.system.max_count / max_size).

    A queue message counts once; a topic message once per subscription or log holding it.
    """

    count: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def add_all(self, count: int, size: int) -> None:
        """`count` messages of `size` bytes in all."""
        self.count += count
        self.bytes += size

    def remove(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
