"""How full a destination is, measured for one more message against its limits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, init=False)
class Fullness:
    """How full a destination is for a new message: its count and bytes against its limits.

    Not frozen (one is made per message; a frozen one takes three times as long to make), and
    never changed once made. Its __init__ is written out: a generated one stays interpreted
    Python in the compiled build."""

    count: int
    bytes: int

    def __init__(self, count: int, bytes: int) -> None:
        self.count = count
        self.bytes = bytes
