"""Stages (publishing a batch exactly once): their names and the state a store keeps of them.

The protocol is in docs/pipelines-protocol.md; core.features.stages keeps the state and hands
these values to its recorder; how a store encodes them is its own affair (the journal's layout
is in persist.format).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluiceway.naming import DestinationName

MAX_BATCH: Final = 2**63 - 1  # batch numbers are decimal integers from 0 to 2^63-1
MAX_EXPIRES: Final = 2**63 - 1  # an expiry that does not fit an i64 is "never"


@dataclass(frozen=True, slots=True)
class StageName:
    """`SINK/BATCH/TASK`: a sink, a batch number, and a writer task."""

    sink: str
    batch: int
    task: str

    def __str__(self) -> str:
        return f"{self.sink}/{self.batch}/{self.task}"


@dataclass(frozen=True, slots=True)
class OpenStage:
    """A stage's identity (STAGE_OPEN, and the open stages of a STAGE_SNAPSHOT)."""

    stage_id: int
    name: StageName


@dataclass(frozen=True, slots=True)
class StagedHead:
    """The fixed part of a STAGE_ADD, read without decoding the message."""

    stage_id: int
    index: int
    expires: int


@dataclass(frozen=True, slots=True)
class PublishedStage:
    """A stage a COMMIT published: where its messages' sequence numbers start, per destination.

    `commit_lsn` (the STAGE_COMMIT's LSN) and `last_lsn` (its last STAGE_ADD's) are known once
    written; a STAGE_COMMIT leaves them out, a STAGE_SNAPSHOT carries them.
    """

    stage_id: int
    firsts: tuple[tuple[DestinationName, int], ...]
    commit_lsn: int = 0
    last_lsn: int = 0

    def first_seq(self, destination: DestinationName) -> int | None:
        for name, seq in self.firsts:
            if name == destination:
                return seq
        return None


@dataclass(frozen=True, slots=True)
class CommitRecord:
    sink: str
    batch: int
    published: tuple[PublishedStage, ...]
    discarded: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StageSnapshot:
    next_id: int
    sinks: tuple[tuple[str, int], ...]
    open: tuple[OpenStage, ...]
    published: tuple[PublishedStage, ...]
