"""The seam between the broker's state and where persistent messages are kept.

Destinations tell the store when a persistent message arrives and when it is consumed (or
otherwise leaves the broker). `MemoryStore` keeps them in memory only: nothing survives a restart.
A journal-backed store plugs in here without the core changing.
"""

from __future__ import annotations

from typing import Protocol

from sluiceway.core.message import Message


class MessageStore(Protocol):
    """Where persistent messages are recorded."""

    def message_added(self, message: Message) -> None:
        """A persistent message was accepted by a destination."""
        ...

    def message_removed(self, message: Message) -> None:
        """A persistent message left the broker (consumed, expired or discarded)."""
        ...

    def close(self) -> None:
        """Release resources; called once at shutdown."""
        ...


class MemoryStore:
    """Holds persistent messages in memory, for a broker that needs no durability."""

    def __init__(self) -> None:
        self._messages: dict[str, Message] = {}

    def message_added(self, message: Message) -> None:
        self._messages[message.id] = message

    def message_removed(self, message: Message) -> None:
        self._messages.pop(message.id, None)

    def close(self) -> None:
        self._messages.clear()

    def __len__(self) -> int:
        """Persistent messages held."""
        return len(self._messages)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._messages
