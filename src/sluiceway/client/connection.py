"""Connection factory and connection: the entry points of the asyncio client.

`ConnectionFactory` holds the connection-factory attributes (see `settings`) and opens
connections; a `Connection` is a `link.Link` (opening, reconnecting, routing: see there for what
happens when the connection is lost) that also makes the sessions producers and consumers come
from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from sluiceway.client.link import Link
from sluiceway.client.session import Session
from sluiceway.client.session_state import AckMode
from sluiceway.client.settings import ClientSettings, build_settings


class ConnectionFactory:
    """Makes connections with Open MQ connection-factory attributes.

    `ConnectionFactory("stomp://127.0.0.1:61613", consumer_flow_limit=100)`, or with Open MQ
    names: `ConnectionFactory(properties={"imqConsumerFlowLimit": "100"})` or
    `ConnectionFactory(properties="client.properties")`. Keywords win over properties.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        properties: Mapping[str, str] | str | Path | None = None,
        **keywords: Any,
    ) -> None:
        self.settings: ClientSettings = build_settings(address, properties, **keywords)

    async def connect(self) -> Connection:
        connection = Connection(self.settings)
        await connection.open()
        return connection


class Connection(Link):
    """One client connection; sessions, producers and consumers are made from it."""

    def session(self, ack_mode: AckMode | None = None, *, transacted: bool = False) -> Session:
        """A session; AUTO acknowledgement unless told otherwise, or transacted."""
        session = Session(self, ack_mode or AckMode.AUTO, transacted=transacted)
        self.adopt(session)
        return session

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
