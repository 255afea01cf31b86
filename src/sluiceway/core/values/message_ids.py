"""Message ids: unique across restarts, a random prefix per broker run and then a counter."""

from __future__ import annotations

import secrets


class MessageIds:
    """Hands out the `message-id` of every message a broker makes (sent or dead copies)."""

    __slots__ = ("_next", "_prefix", "instance_id")

    def __init__(self, instance_id: str | None = None) -> None:
        # Names this broker run in message ids and in the dead message queue's headers.
        self.instance_id = instance_id if instance_id is not None else secrets.token_hex(4)
        self._prefix = f"sw-{self.instance_id}-"
        self._next = 0

    def new(self) -> str:
        self._next += 1
        return f"{self._prefix}{self._next}"
