"""How one batch is shared among the destinations of a source: its message cap, its byte cap,
and its input partitions. Pure functions of numbers and names, so that a plan is the same
whoever computes it.

- Messages: max-min fair (`fair_shares`). A destination that has less than an equal share takes
  all it has; the rest is split evenly among the others. Units that do not divide evenly go one
  each to destinations in an order that turns with every batch (`rotated`), so that none is
  always the one left out when the cap is smaller than the number of destinations.
- Bytes: the batch's byte cap is spent destination after destination, in the turning order, each
  taking at most an equal share of what the ones before left (a destination with small messages
  leaves the rest to the next). Only the first destination of a batch may take a single message
  over its share, so that a message larger than the cap is still read (once in a while, when its
  destination comes first).
- Partitions: `minPartitions` spread over the destinations with messages in the batch, in
  proportion to their messages, at least one each (`spread`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """`items` starting at position `turn` (modulo their number), wrapping round."""
    if not items:
        return []
    cut = turn % len(items)
    return [*items[cut:], *items[:cut]]


def fair_shares(demands: Mapping[str, int], total: int | None, turn: int = 0) -> dict[str, int]:
    """What each destination takes of a batch capped at `total` messages (None: no cap), given
    what each has (`demands`): max-min fair, the odd units to destinations in the order of
    `turn`. The shares add up to `total` at most, and to every demand when they fit."""
    if total is None or sum(demands.values()) <= total:
        return dict(demands)
    left, level, odd = total, 0, 0
    ordered = sorted(demands.values())
    for index, demand in enumerate(ordered):
        sharing = len(ordered) - index
        if demand * sharing <= left:
            left -= demand  # it has less than an equal share: it takes all of it
            continue
        level, odd = divmod(left, sharing)
        break
    shares = {name: min(demand, level) for name, demand in demands.items()}
    above = [name for name in rotated(sorted(demands), turn) if demands[name] > level]
    for name in above[:odd]:
        shares[name] += 1
    return shares


def spread(parts: int, weights: Mapping[str, int]) -> dict[str, int]:
    """`parts` input partitions spread over the destinations of positive weight (messages), in
    proportion to it: at least one each (so there may be more than `parts`) and at most its
    weight. Destinations of weight 0 get none."""
    active = {name: weight for name, weight in weights.items() if weight > 0}
    if not active:
        return {}
    whole = sum(active.values())
    counts = {name: max(1, min(weight, parts * weight // whole)) for name, weight in active.items()}
    left = parts - sum(counts.values())
    # The partitions rounding left over, to the largest remainders (then by name).
    by_remainder = sorted(active, key=lambda name: (-(parts * active[name] % whole), name))
    for name in by_remainder:
        if left <= 0:
            break
        if counts[name] < active[name]:
            counts[name] += 1
            left -= 1
    return counts
