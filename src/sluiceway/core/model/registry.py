"""The broker's destinations, created by configuration or on first use."""

from __future__ import annotations

from collections.abc import Iterator

from sluiceway.config import DestinationSettings
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.errors import Forbidden, NotFound
from sluiceway.naming import DURABLE_QUEUE_PREFIX, DestinationKind, DestinationName


class DestinationRegistry:
    """Looks destinations up by name, creating them on first use when `imq.autocreate.*` allows."""

    def __init__(self, config: LiveConfig, context: Context) -> None:
        self._config = config
        self._context = context
        # Keyed by path (`/queue/NAME`): a string keeps its hash, where DestinationName's
        # __hash__ is Python code run at every lookup, and a lookup comes with every SEND.
        self._destinations: dict[str, Destination] = {}
        for definition in config.current.destinations:
            self.create(DestinationName(definition.kind, definition.name), definition.settings)

    def __iter__(self) -> Iterator[Destination]:
        return iter(list(self._destinations.values()))

    def __len__(self) -> int:
        return len(self._destinations)

    def get(self, name: DestinationName) -> Destination | None:
        return self._destinations.get(name.path)

    def create(self, name: DestinationName, settings: DestinationSettings) -> Destination:
        """Create destination `name` with `settings` (it must not exist yet)."""
        assert name.path not in self._destinations
        cls = Queue if name.kind is DestinationKind.QUEUE else Topic
        return self.add(cls(name, settings, self._context))

    def add(self, destination: Destination) -> Destination:
        """Register `destination`, made elsewhere (the dead message queue, core.dead_letters)."""
        assert destination.name.path not in self._destinations
        self._destinations[destination.name.path] = destination
        return destination

    def remove(self, name: DestinationName) -> None:
        del self._destinations[name.path]

    def recovered(self, name: DestinationName) -> Destination:
        """The destination a recovered message or durable subscription belongs to, created
        (with the auto-create settings) if the configuration does not define it."""
        destination = self._destinations.get(name.path)
        if destination is None:
            destination = self.create(name, self._config.current.autocreate_settings(name.kind))
        return destination

    def resolve(self, name: DestinationName) -> Destination:
        """The destination called `name`, created now if it is new and auto-creation is on."""
        destination = self._destinations.get(name.path)
        if destination is not None:
            return destination
        if name.is_system:
            raise Forbidden(
                "reserved destination name",
                f"destination {name} cannot be created: names beginning with 'mq.' are reserved "
                "for the broker",
            )
        if name.name.startswith(DURABLE_QUEUE_PREFIX):
            raise NotFound(
                "no such destination",
                f"destination {name} does not exist here: such a queue exists only on a member "
                "of a cluster where a subscriber of a durable subscription living elsewhere "
                "attached",
            )
        if not self._config.current.autocreate_enabled(name.kind):
            raise NotFound(
                "no such destination",
                f"destination {name} does not exist and imq.autocreate.{name.kind.value} is false; "
                "an administrator must create it first",
            )
        return self.create(name, self._config.current.autocreate_settings(name.kind))
