"""A message as the client application receives it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol


class Acknowledger(Protocol):
    """What a message asks of the session it came from: to acknowledge what it handed over."""

    def acknowledge(self) -> Awaitable[None]: ...


class MessageView:
    """What both client APIs show of a received message: body, headers and delivery details."""

    body: bytes
    headers: Mapping[str, str]

    @property
    def text(self) -> str:
        """The body decoded as UTF-8 (the charset named in content-type, if any)."""
        content_type = self.headers.get("content-type", "")
        charset = "utf-8"
        for part in content_type.split(";")[1:]:
            name, _, value = part.strip().partition("=")
            if name.lower() == "charset" and value:
                charset = value.strip('"')
        return self.body.decode(charset)

    @property
    def message_id(self) -> str:
        return self.headers.get("message-id", "")

    @property
    def destination(self) -> str:
        return self.headers.get("destination", "")

    @property
    def redelivered(self) -> bool:
        return self.headers.get("redelivered") == "true"

    @property
    def delivery_count(self) -> int:
        return int(self.headers.get("delivery-count", "1"))

    @property
    def priority(self) -> int:
        return int(self.headers.get("priority", "4"))

    @property
    def persistent(self) -> bool:
        return self.headers.get("persistent") == "true"

    @property
    def timestamp(self) -> int:
        """When the broker accepted the message, in milliseconds since the epoch."""
        return int(self.headers.get("timestamp", "0"))

    @property
    def expires(self) -> int:
        """Milliseconds since the epoch after which it would not have been delivered; 0: never."""
        return int(self.headers.get("expires", "0"))


@dataclass(eq=False)
class Message(MessageView):
    """A received message (asyncio API)."""

    body: bytes
    headers: Mapping[str, str]
    subscription: str
    ack_id: str
    _session: Acknowledger | None = field(default=None, repr=False)

    def acknowledge(self) -> Awaitable[None]:
        """CLIENT_ACKNOWLEDGE: acknowledge every message the session has delivered so far."""
        if self._session is None:
            raise RuntimeError("this message was not received from a session")
        return self._session.acknowledge()


MessageHandler = Callable[[Message], Awaitable[object] | object]
