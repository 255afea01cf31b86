"""Topic cursors: named, durable positions on a topic that only a commit moves.

A cursor (docs/pipelines-protocol.md, "Topic cursors") makes its topic retain, in the topic's
log, every message at or after its position, counted against the topic's limits like what
durable subscriptions retain. Reading by range does not move it; a commit moves it forward,
never back, and the log then drops what no cursor or durable subscription needs any more. A
cursor is a durable subscription without a subscriber whose position the reader sets: the log,
its trimming and its journal records (ADD, REMOVE) are the durable subscriptions' own; cursors
add only their positions (CURSOR, CURSOR_END records, persist.lease_payloads).

Cursors are named by group within their topic: `cursor:GROUP` on /topic/a and on /topic/b are
two cursors. A topic has at most imq.cursor.max_groups of them: opening a new one beyond it is
refused (status 414) before anything is written; cursors recovered from the journal are kept
even beyond it (core.values.counts).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sluiceway.core.model.destination import Destination
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.counts import CountLimit, CountRefusals
from sluiceway.core.values.leasing import CursorRecord, LeaseRecorder, Unrecorded
from sluiceway.errors import BadRequest, NotFound
from sluiceway.naming import DestinationKind, DestinationName

log = logging.getLogger(__name__)


class CursorStart(enum.Enum):
    """Where a new cursor starts (`cursor-start`), unless given as a sequence number."""

    EARLIEST = "earliest"  # the oldest message the topic retains
    LATEST = "latest"  # after the last message the topic handed a sequence number


@dataclass(frozen=True, slots=True)
class CursorRead:
    """The cursor headers of a browser SUBSCRIBE: open the cursor (creating it when missing)
    and read `from_seq` (None: from the cursor's position) up to `to_seq` (None: the end)."""

    group: str
    start: CursorStart | int = CursorStart.LATEST  # used only when creating
    from_seq: int | None = None
    to_seq: int | None = None


class Cursor:
    """One cursor: its topic, its group name and the first sequence number it still needs."""

    __slots__ = ("group", "position", "topic")

    def __init__(self, topic: Topic, group: str, position: int) -> None:
        self.topic = topic
        self.group = group
        self.position = position

    @property
    def record(self) -> CursorRecord:
        return CursorRecord(self.topic.name.name, self.group, self.position)

    def end_headers(self) -> list[tuple[str, str]]:
        """What a read through this cursor adds to its end marker."""
        return [("cursor-sequence", str(self.position))]


class Cursors:
    """Every cursor of the broker, by topic and group."""

    def __init__(self, registry: DestinationRegistry, refusals: CountRefusals) -> None:
        self._registry = registry
        # Told of every change, to keep the cursors across restarts (persist.lease_extension).
        self.recorder: LeaseRecorder = Unrecorded()
        self._refusals = refusals
        self._cursors: dict[tuple[DestinationName, str], Cursor] = {}

    def __iter__(self) -> Iterator[Cursor]:
        return iter(list(self._cursors.values()))

    def __len__(self) -> int:
        return len(self._cursors)

    def open(self, destination: Destination, read: CursorRead, limit: int) -> Cursor:
        """The cursor `read.group` of `destination`, created at `read.start` when missing and
        the topic has fewer than `limit` (imq.cursor.max_groups) cursors."""
        if not isinstance(destination, Topic):
            raise BadRequest(
                "cursor on a queue",
                f"the cursor header is for topics and {destination.name} is a queue; a queue is "
                "read in numbered batches with the lease header instead",
            )
        cursor = self._cursors.get((destination.name, read.group))
        if cursor is not None:
            return cursor
        if len(destination.cursors) >= limit:
            raise self._refusals.refuse(
                CountLimit.CURSORS,
                limit,
                "too many cursors",
                f"{destination.name} already has {len(destination.cursors)} cursors, the limit "
                f"set by imq.cursor.max_groups ({limit}); cursor {read.group!r} was not created. "
                "Delete cursors no reader needs (UNSUBSCRIBE with the cursor header), or raise "
                "imq.cursor.max_groups",
                destination=destination.name.path,
            )
        cursor = Cursor(destination, read.group, self._start(destination, read.start))
        self._add(cursor)
        self.recorder.cursor_saved(cursor.record)
        log.debug("cursor %s of %s created at %d", read.group, destination.name, cursor.position)
        return cursor

    @staticmethod
    def _start(topic: Topic, start: CursorStart | int) -> int:
        latest = topic.last_seq + 1
        if start is CursorStart.LATEST:
            return latest
        if start is CursorStart.EARLIEST:
            first = topic.log.first_seq
            return first if first is not None else latest
        return start

    def _add(self, cursor: Cursor) -> None:
        self._cursors[cursor.topic.name, cursor.group] = cursor
        cursor.topic.cursors[cursor.group] = cursor

    def get(self, name: DestinationName, group: str) -> Cursor:
        cursor = self._cursors.get((name, group))
        if cursor is None:
            raise NotFound(
                "no such cursor",
                f"{name} has no cursor {group!r}; open it with a browser SUBSCRIBE that carries "
                f"cursor:{group} first",
                destination=name.path,
            )
        return cursor

    def commit(self, name: DestinationName, group: str, seq: int) -> Cursor:
        """Move the cursor to `seq` if that is forward; the topic drops what nobody needs."""
        cursor = self.get(name, group)
        if seq > cursor.position:
            cursor.position = seq
            self.recorder.cursor_saved(cursor.record)
            cursor.topic.trim()
        return cursor

    def delete(self, name: DestinationName, group: str) -> None:
        cursor = self.get(name, group)
        self._remove(cursor)
        cursor.topic.trim()
        log.debug("cursor %s of %s deleted", group, name)

    def _remove(self, cursor: Cursor) -> None:
        del self._cursors[cursor.topic.name, cursor.group]
        del cursor.topic.cursors[cursor.group]
        self.recorder.cursor_deleted(cursor.topic.name.name, cursor.group)

    def topic_destroyed(self, topic: Topic) -> None:
        """An administrator destroyed `topic`: its cursors go with it."""
        for group in list(topic.cursors):
            self._remove(self._cursors[topic.name, group])

    def restore(self, positions: dict[tuple[str, str], int], limit: int) -> None:
        """After a restart: the cursors the journal held (their topics' logs are recovered
        already), then each topic drops what a commit released before the crash. A topic with
        more than `limit` (imq.cursor.max_groups) keeps them all, with a warning."""
        topics: set[Topic] = set()
        for (topic_name, group), position in positions.items():
            topic = self._registry.recovered(DestinationName(DestinationKind.TOPIC, topic_name))
            assert isinstance(topic, Topic)
            self._add(Cursor(topic, group, position))
            topics.add(topic)
        for topic in topics:
            topic.trim()
            if len(topic.cursors) > limit:
                log.warning(
                    "%s has %d cursors in the journal, more than imq.cursor.max_groups (%d): "
                    "all are kept, and new cursors on it are refused until fewer remain",
                    topic.name,
                    len(topic.cursors),
                    limit,
                )

    def records(self) -> list[CursorRecord]:
        return [cursor.record for cursor in self._cursors.values()]
