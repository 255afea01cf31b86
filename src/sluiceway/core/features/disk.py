"""The disk under the journal, as the broker knows it: ok, low, full or failed.

- LOW: the free space of the journal's file system fell below `imq.persist.file.disk.free.limit`
  (RabbitMQ's disk free limit): an alarm raised before the disk is actually full. The free space
  is measured on the broker's once-a-second tick (statvfs), and between two ticks estimated by
  taking off what the journal wrote since, so a fast producer cannot write through the floor in
  the second between two measurements. It clears once the free space is back above the floor
  plus a tenth of it, so it does not flap at the boundary.
- FULL: a journal write failed (ENOSPC, EDQUOT, EFBIG, EIO...). The journal cut off what of it
  reached the file and keeps its records in memory, in order (persist.journal); the tick retries
  the write. It clears when a retried write succeeds.
- FAILED: the journal stopped for good (a failed fsync: the page cache may have dropped the data,
  so a retry proves nothing). It clears only with a restart.

While LOW or FULL (`holding`) every new message that would be written to the journal (a
persistent SEND, a staged one) is held, as memory RED holds producers: with a reason that names
the disk and its free space, refused after `imq.producer.hold.timeout`, accepted when the state
clears; a COMMIT that would publish persistent messages is refused (holding it would hold its
acknowledgements too). While FAILED (`refusing`) they are refused at once. Non-persistent
messages and consumers go on.

What keeps being written meanwhile (acknowledgements, delivery marks, state of leases and
cursors) waits in memory while FULL: at most `imq.persist.file.disk.backlog.max_size` bytes of
records, beyond which no client is read (`reading_stopped`) until the disk takes them; frames
wait in the clients' sockets, not in the broker.

The guard is told what the journal found (`observe`); it decides the state and logs each change
once: WARNING for LOW, ERROR for FULL and FAILED, INFO when the disk is fine again.
"""

from __future__ import annotations

import enum
import errno
import logging
from dataclasses import dataclass
from typing import Final

from sluiceway.core.values.clock import Clock
from sluiceway.errors import BrokerError, InternalError, ResourceFull

log = logging.getLogger(__name__)

FLOOR_PROPERTY: Final = "imq.persist.file.disk.free.limit"
BACKLOG_PROPERTY: Final = "imq.persist.file.disk.backlog.max_size"
NEVER: Final = 1 << 62  # a low mark no journal reaches (no floor, or the alarm is raised already)


# What to do about a failed write, by its errno.
_REMEDY: Final = "check the disk and the system log"
_REMEDIES: Final = {
    "ENOSPC": "free space there",
    "EDQUOT": "raise the disk quota of the broker's user, or free space there",
    "EFBIG": "raise the file size limit (ulimit -f) of the broker's process",
}


class DiskPressure(ResourceFull):
    """Why a message the journal would keep waits for the disk (LOW or FULL). It waits for the
    disk, not for room in its destination: messages that need no disk do not queue behind it."""


class DiskLevel(enum.IntEnum):
    OK = 0
    LOW = 1  # below the free-space floor: persistent producers held
    FULL = 2  # a journal write failed: its records wait in memory, persistent producers held
    FAILED = 3  # the journal stopped for good: persistent messages refused until a restart


@dataclass(frozen=True, slots=True)
class DiskStatus:
    """The disk state at one moment, for operators."""

    level: DiskLevel
    reason: str  # why it is not OK; "" when it is
    since_ms: int  # wall-clock time the level was entered
    path: str  # the journal's directory ("" before a journal is watched)
    free: int  # bytes free on its file system (-1: not measured)
    total: int  # bytes of that file system (-1: not measured)
    floor: int  # imq.persist.file.disk.free.limit (0: no floor)
    backlog: int  # bytes of journal records waiting for the disk
    backlog_limit: int  # imq.persist.file.disk.backlog.max_size
    reading_stopped: bool  # the backlog is at its limit: no client is read


class DiskGuard:
    """The disk state and what it means for producers (see the module docstring)."""

    def __init__(self, clock: Clock, *, floor: int = 0, backlog_limit: int = 16 << 20) -> None:
        self._clock = clock
        self.floor = floor  # bytes; 0: no floor
        self.backlog_limit = backlog_limit  # bytes
        self.level = DiskLevel.OK
        # Read per message (producers) and per frame (sessions): plain attributes.
        self.holding = False  # LOW or FULL: new persistent messages wait
        self.refusing = False  # FAILED: new persistent messages are refused
        self.reading_stopped = False  # the backlog reached its limit: read no client
        self.low_mark = NEVER  # bytes written by the journal at which the floor is reached
        self.since_ms = clock.time_ms()
        self.path = ""
        self.free = self.total = -1
        self.backlog = 0
        self.reason = ""
        self._measured_free = -1  # at the last measurement...
        self._written_then = 0  # ...when the journal had written this many bytes
        self._write_error: OSError | None = None
        self._failure: str | None = None

    def configure(self, floor: int, backlog_limit: int) -> None:
        """New limits (at start, `update bkr`); they apply from the next observation."""
        self.floor, self.backlog_limit = floor, backlog_limit
        self.low_mark = 0  # the next flush observes the disk again, against the new floor

    def observe(
        self,
        written: int,
        *,
        write_error: OSError | None = None,
        backlog: int = 0,
        failure: str | None = None,
        space: tuple[int, int] | None = None,
    ) -> None:
        """What the journal found: the bytes it has written so far, the error its records wait
        on (None: none wait), how many bytes wait, why it stopped for good (None: it works),
        and, when just measured, the (free, total) bytes of its file system."""
        if space is not None:
            self._measured_free, self.total = space
            self._written_then = written
        self._write_error, self._failure = write_error, failure
        self.backlog = backlog if write_error is not None else 0
        self._stop_reading(self.backlog > 0 and self.backlog >= self.backlog_limit)
        # Between measurements the journal's writes are taken off (its deletions are not: the
        # estimate errs towards the alarm, and the next measurement corrects it).
        measured = self._measured_free
        self.free = max(0, measured - (written - self._written_then)) if measured >= 0 else -1
        self._settle(self._level())
        floor = self.floor
        self.low_mark = NEVER
        if self.level is DiskLevel.OK and floor > 0 and self.free >= 0:
            self.low_mark = written + self.free - floor

    def _stop_reading(self, stop: bool) -> None:
        if stop == self.reading_stopped:
            return
        self.reading_stopped = stop
        if stop:
            log.error(
                "disk full: %s of journal records wait for the disk, the most %s (%s) lets "
                "wait: no client is read until the disk takes them",
                _size(self.backlog),
                BACKLOG_PROPERTY,
                _size(self.backlog_limit),
            )
        else:
            log.info("the disk took the journal's waiting records: clients are read again")

    def _level(self) -> DiskLevel:
        if self._failure is not None:
            return DiskLevel.FAILED
        if self._write_error is not None:
            return DiskLevel.FULL
        floor, free = self.floor, self.free
        if floor <= 0 or free < 0:
            return DiskLevel.OK
        # Once raised, the alarm stays until a tenth of the floor more is free.
        alarm = floor + floor // 10 if self.level is not DiskLevel.OK else floor
        return DiskLevel.LOW if free < alarm else DiskLevel.OK

    def _settle(self, level: DiskLevel) -> None:
        self.reason = self._reason(level)
        if level is self.level:
            return
        before, was_for = self.level, (self._clock.time_ms() - self.since_ms) / 1000
        self.level, self.since_ms = level, self._clock.time_ms()
        self.holding = level in (DiskLevel.LOW, DiskLevel.FULL)
        self.refusing = level is DiskLevel.FAILED
        if level is DiskLevel.OK:
            log.info(
                "disk ok again after %.1f s %s: %s free on the disk holding %s; persistent "
                "producers go on",
                was_for,
                before.name.lower(),
                _size(self.free),
                self.path,
            )
        elif level is DiskLevel.LOW:
            log.warning("disk low: %s", self.reason)
        else:
            log.error("disk %s: %s", level.name.lower(), self.reason)

    def _reason(self, level: DiskLevel) -> str:
        path = self.path or "the journal's directory"
        if level is DiskLevel.FAILED:
            return f"{self._failure}; persistent messages are refused until then"
        if level is DiskLevel.FULL:
            error = self._write_error
            assert error is not None
            name = errno.errorcode.get(error.errno or 0, "?")
            free = f"; {_size(self.free)} free" if self.free >= 0 else ""
            return (
                f"the journal cannot write to the disk holding {path} ({error.strerror or error},"
                f" {name}{free}): persistent messages are held until it takes writes again;"
                f" {_REMEDIES.get(name, _REMEDY)} (the broker retries every second; nothing"
                " confirmed is lost)"
            )
        if level is DiskLevel.LOW:
            return (
                f"the disk holding {path} has {_size(self.free)} free, below the"
                f" {_size(self.floor)} of {FLOOR_PROPERTY}: persistent messages are held until"
                " more is free (non-persistent ones go on)"
            )
        return ""

    # -- for producers ---------------------------------------------------------------------------

    def hold_error(self, destination: str, *, held: bool = True) -> BrokerError:
        """Why a persistent message for `destination` waits (LOW, FULL) or is refused (FAILED);
        `held=False`: why it is refused now (a COMMIT, which is never held)."""
        if self.level is DiskLevel.FAILED:
            return InternalError(
                "journal failed",
                f"a persistent message for {destination} cannot be kept: {self.reason}",
                destination=destination,
            )
        what = "waits" if held else "cannot be taken now"
        return DiskPressure(
            f"disk {self.level.name.lower()}",
            f"a persistent message for {destination} {what}: {self.reason}",
            destination=destination,
            limit=FLOOR_PROPERTY if self.level is DiskLevel.LOW else None,
            limit_value=str(self.floor) if self.level is DiskLevel.LOW else None,
        )

    def status(self) -> DiskStatus:
        return DiskStatus(
            level=self.level,
            reason=self.reason,
            since_ms=self.since_ms,
            path=self.path,
            free=self.free,
            total=self.total,
            floor=self.floor,
            backlog=self.backlog,
            backlog_limit=self.backlog_limit,
            reading_stopped=self.reading_stopped,
        )


def _size(count: int) -> str:
    """Bytes for a human, and exactly: 512 bytes, 12.3 MiB (12897484 bytes)."""
    if count < 0:
        return "an unknown amount"
    if count < 1024:
        return f"{count} bytes"
    value, unit = count / 1024, "KiB"
    for larger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit} ({count} bytes)"
