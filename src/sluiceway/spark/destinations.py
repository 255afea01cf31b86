"""The destinations a source reads: the `destination` option, and what it names on the broker.

The option is a comma-separated list of destinations and patterns, all queues or all topics:
`/queue/a,/queue/b`, `/topic/orders.*` (`*` one segment of a name, `>` the rest). Names are
read as they are given; patterns are resolved on the broker (pipelines-protocol.md, "Listing
destinations") each time the driver asks (`resolve`): at the start of a query and at every
trigger, so a destination that appears is read from then on and one that is gone is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluiceway.client.pipeline import PipelineConnection
from sluiceway.client.pipeline_listing import DEFAULT_LIST_MAX, ListRight
from sluiceway.errors import BadRequest, ConfigError, RemoteProtocolError
from sluiceway.naming import DestinationKind, DestinationPattern, parse_pattern
from sluiceway.spark.errors import UnsupportedBroker

# The most destinations one source reads: every trigger asks the broker about each of them.
MAX_DESTINATIONS: Final = DEFAULT_LIST_MAX
OPTION: Final = "destination"


@dataclass(frozen=True, slots=True)
class SourceDestinations:
    """What the `destination` option names: destinations (`names`, their paths) and patterns,
    all of one `kind`; `text` is the option as given."""

    kind: DestinationKind
    names: tuple[str, ...]
    patterns: tuple[DestinationPattern, ...]
    text: str

    @property
    def several(self) -> bool:
        """More than one destination, or a pattern (which may match several)."""
        return len(self.names) + len(self.patterns) > 1 or bool(self.patterns)


def parse_destinations(text: str) -> SourceDestinations:
    """The `destination` option; ConfigError says what is wrong with it."""
    names: list[str] = []
    patterns: list[DestinationPattern] = []
    kinds: set[DestinationKind] = set()
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            raise ConfigError(
                OPTION,
                f"option destination={text!r} has an empty entry: give destinations separated "
                "by commas, such as /queue/a,/queue/b",
            )
        try:
            pattern = parse_pattern(entry)
        except ValueError as exc:
            raise ConfigError(OPTION, f"option destination={text!r} is not valid: {exc}") from None
        kinds.add(pattern.kind)
        if pattern.is_wildcard:
            if pattern not in patterns:
                patterns.append(pattern)
        elif pattern.path not in names:
            names.append(pattern.path)
    if len(kinds) > 1:
        raise ConfigError(
            OPTION,
            f"option destination={text!r} names queues and topics: a source reads queues (by "
            "leases) or topics (by cursors), not both; read each kind with a source of its own "
            "and union the two DataFrames",
        )
    if len(names) > MAX_DESTINATIONS:
        raise ConfigError(OPTION, _too_many(text))
    return SourceDestinations(kinds.pop(), tuple(names), tuple(patterns), text)


def resolve(
    connection: PipelineConnection, destinations: SourceDestinations, right: ListRight
) -> list[str]:
    """The paths of the destinations the source reads now, sorted: those it names, and those
    its patterns match among the broker's that its user may `right` (consume for streams,
    browse for batch reads)."""
    found = set(destinations.names)
    for pattern in destinations.patterns:
        try:
            listing = connection.list_destinations(
                pattern.path, right=right, limit=MAX_DESTINATIONS
            )
        except (BadRequest, RemoteProtocolError) as exc:
            settings = connection.settings
            raise UnsupportedBroker(
                f"the broker at {settings.host}:{settings.port} did not list the destinations "
                f"matching {pattern.path} ({exc}): a broker that predates listing destinations "
                "(pipelines-protocol.md) takes no wildcards; name the destinations instead"
            ) from None
        found.update(listing.paths)
        if listing.truncated or len(found) > MAX_DESTINATIONS:
            raise ConfigError(OPTION, _too_many(destinations.text))
    return sorted(found)


def _too_many(text: str) -> str:
    return (
        f"option destination={text!r} names more than {MAX_DESTINATIONS} destinations, the most "
        "one source reads: narrow its patterns, or split it into several sources"
    )
