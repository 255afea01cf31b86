"""Stages: messages sent for a batch, kept out of sight until one COMMIT publishes them.

The wire protocol is docs/pipelines-protocol.md ("Stages: publishing a batch exactly once"). A
stage is named SINK/BATCH/TASK. A SEND with a `stage` header goes through the same admission as
any SEND (core.features.producers: limits, FLOW_CONTROL holding, throttling, memory levels); once
admitted its message lands here instead of in its destination. From then on it counts toward that
destination's limits (`staged_count`, `staged_bytes`), the system limits and the memory ledger,
so producer flow control sees it, but no consumer, browser or range read does.

A COMMIT of SINK/BATCH publishes the listed tasks' stages in task order, each in send order, and
discards the batch's other stages and any stage left of the sink's earlier batches (none of them
can ever be committed). Sequence numbers are assigned at publish. The sink's highest committed
batch is remembered: a COMMIT (or ABORT) of a batch at or below it changes nothing and answers
`committed-before`, and a SEND staged into such a batch is accepted and dropped, so a replayed
batch never publishes twice. ABORT and the stage's time to live (checked on the broker's tick)
discard; discarding frees the room at once, which lets held producers go as consuming would.

Every staged message is in the journal (persist.stage_extension) whatever its `persistent` header,
so stages survive a restart; once published, a message keeps its header's persistence. A large
stage does not stay in memory: like a pending list (core.containers.pending), it keeps its oldest
messages in memory and, once the ledger is over `imq.swap.threshold`, writes newer ones to the swap
area in chunks, reading them back a chunk at a time when they are published.
"""

from __future__ import annotations

import enum
import logging
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from sluiceway.core.containers.spilling import SpillingRun
from sluiceway.core.features.producers import Publish, PublishAll
from sluiceway.core.model.context import Context
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.message import Message
from sluiceway.core.values.positions import PositionHomes
from sluiceway.core.values.staging import (
    MAX_EXPIRES,
    OpenStage,
    PublishedStage,
    StagedHead,
    StageName,
)
from sluiceway.errors import Conflict, Forbidden
from sluiceway.naming import DestinationName

log = logging.getLogger(__name__)


class StageState(enum.Enum):
    """What a COMMIT or ABORT of a stage did (the RECEIPT's `stage-state` header)."""

    COMMITTED = "committed"
    COMMITTED_BEFORE = "committed-before"  # this batch, or a later one, was committed before
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class StageOutcome:
    state: StageState
    count: int  # messages published (COMMIT) or discarded (ABORT)
    # The journal position the answer depends on: for committed-before, the COMMIT that set the
    # sink's highest batch, which may not be synced yet when a retry asks (0: nothing to wait for).
    lsn: int = 0


@dataclass(frozen=True, slots=True)
class StagedSend:
    """What a SEND's `stage` and `stage-ttl` headers ask for."""

    name: StageName
    ttl_ms: int  # the stage is discarded this long after its latest SEND, unless committed


class StagedMessages(SpillingRun):
    """One stage's messages in send order, in memory up to the swap point and then in chunks
    in the swap area. Appending is O(1); they leave all together (published or discarded)."""

    __slots__ = ()


class _Totals:
    """A stage's messages for one destination: how many, and their body bytes."""

    __slots__ = ("bytes", "count")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0


class Stage:
    """The messages one writer task staged for one batch."""

    __slots__ = ("expires_ms", "last_lsn", "lsns", "messages", "name", "stage_id", "totals")

    def __init__(self, stage_id: int, name: StageName, messages: StagedMessages) -> None:
        self.stage_id = stage_id
        self.name = name
        self.messages = messages
        self.totals: dict[Destination, _Totals] = {}  # in the order first sent to
        self.expires_ms = 0  # ms since the epoch; moved on by every SEND
        # Journal bookkeeping (persist.stage_extension): the LSNs of its STAGE_ADD records, so a
        # discard can let them die without reading spilled messages back, and the last one.
        self.lsns = array("Q")
        self.last_lsn = 0

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def open_record(self) -> OpenStage:
        return OpenStage(self.stage_id, self.name)


class StageRecorder(Protocol):
    """Where stages are made durable (persist.stage_extension), or not (Unrecorded)."""

    def opened(self, stage: Stage) -> None:
        """A stage was created (before its first message is added)."""
        ...

    def added(self, stage: Stage, message: Message, index: int) -> None:
        """`message` was staged; `index` counts the stage's earlier ones for its destination."""
        ...

    def committed(
        self, sink: str, batch: int, published: Sequence[PublishedStage], discarded: Sequence[Stage]
    ) -> int:
        """The decision of a COMMIT; returns its journal position (0: none)."""
        ...

    def publish(self, message: Message, destination: Destination) -> bool:
        """Publish one message of a committed stage into `destination`; True when the store
        keeps it from its staged record (persistent, retained by the destination)."""
        ...

    def published(self, stage: PublishedStage) -> None:
        """A stage's messages were published and some are kept from their staged records."""
        ...

    def discarded(self, stages: Sequence[Stage]) -> None:
        """Stages were dropped (ABORT, time to live)."""
        ...


class Unrecorded:
    """A broker without a journal (imq.persist.store=memory): stages live in memory only."""

    def opened(self, stage: Stage) -> None:
        pass

    def added(self, stage: Stage, message: Message, index: int) -> None:
        pass

    def committed(
        self, sink: str, batch: int, published: Sequence[PublishedStage], discarded: Sequence[Stage]
    ) -> int:
        return 0

    def publish(self, message: Message, destination: Destination) -> bool:
        destination.publish(message)
        return False

    def published(self, stage: PublishedStage) -> None:
        pass

    def discarded(self, stages: Sequence[Stage]) -> None:
        pass


class StageArea:
    """Every open stage of the broker, and each sink's highest committed batch."""

    def __init__(self, config: LiveConfig, context: Context, registry: DestinationRegistry) -> None:
        self._config = config
        self._context = context
        self._registry = registry
        self._clock = context.clock
        self.recorder: StageRecorder = Unrecorded()
        self._by_id: dict[int, Stage] = {}
        self._batches: dict[tuple[str, int], dict[str, Stage]] = {}  # (sink, batch) -> task
        self.committed: dict[str, int] = {}  # sink -> highest batch committed
        self._commit_lsn: dict[str, int] = {}  # sink -> where that commit is in the journal
        self.next_id = 1  # stage ids are never reused (the journal tells stages apart by them)
        self.late = 0  # SENDs staged into a batch already committed, dropped
        self.homes: PositionHomes | None = None  # in a cluster: where sinks not here live

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Stage]:
        return iter(list(self._by_id.values()))

    def get(self, name: StageName) -> Stage | None:
        return self._batches.get((name.sink, name.batch), {}).get(name.task)

    def is_committed(self, sink: str, batch: int) -> bool:
        return batch <= self.committed.get(sink, -1)

    def sinks(self) -> set[str]:
        """The sinks this broker has: a committed batch remembered, or an open stage."""
        return {*self.committed, *(sink for sink, _ in self._batches)}

    def _check_elsewhere(self, sink: str) -> None:
        """Refuse a sink this broker does not have when it lives on another cluster member."""
        refusal = None if self.homes is None else self.homes.sink(sink)
        if refusal is not None and sink not in self.sinks():
            raise refusal

    # -- staging -------------------------------------------------------------------------------

    def target(self, name: StageName, destination: Destination, ttl_ms: int) -> Publish | None:
        """Where an admitted SEND to `destination` staged as `name` goes; None when its batch
        was committed already (the SEND is accepted and its message dropped)."""
        if not self._may_stage(name, destination):
            return None
        return partial(self._take, name, destination, ttl_ms)

    def target_pack(
        self, name: StageName, destination: Destination, ttl_ms: int
    ) -> PublishAll | None:
        """`target` for the messages of a packed SEND, taken all at once."""
        if not self._may_stage(name, destination):
            return None
        return partial(self._take_all, name, destination, ttl_ms)

    def _may_stage(self, name: StageName, destination: Destination) -> bool:
        if destination.is_dmq:
            # A COMMIT plans the sequence numbers its messages get; dead copies that publishing
            # may make go to the dead message queue and would take them first.
            raise Forbidden(
                "stage to the dead message queue",
                f"{destination.name} cannot receive staged messages: the broker alone adds to "
                "it while publishing; stage to another destination",
                destination=destination.name.path,
            )
        self._check_elsewhere(name.sink)
        if self.is_committed(name.sink, name.batch):
            self._dropped_late(name)
            return False
        return True

    def _take(
        self, name: StageName, destination: Destination, ttl_ms: int, message: Message
    ) -> None:
        # Checked again: a SEND held for room may be admitted after its batch was committed.
        if self.is_committed(name.sink, name.batch):
            self._dropped_late(name)
            return
        stage = self.get(name) or self._create(name)
        expires = min(self._clock.time_ms() + ttl_ms, MAX_EXPIRES)
        self._add(stage, destination, message, expires)

    def _take_all(
        self, name: StageName, destination: Destination, ttl_ms: int, messages: list[Message]
    ) -> None:
        if self.is_committed(name.sink, name.batch):
            self._dropped_late(name)
            return
        stage = self.get(name) or self._create(name)
        expires = min(self._clock.time_ms() + ttl_ms, MAX_EXPIRES)
        for message in messages:
            self._add(stage, destination, message, expires)

    def _add(self, stage: Stage, destination: Destination, message: Message, expires: int) -> None:
        totals = stage.totals.get(destination)
        if totals is None:
            totals = stage.totals[destination] = _Totals()
        index = totals.count
        totals.count += 1
        totals.bytes += message.size
        stage.expires_ms = max(stage.expires_ms, expires)
        # Its place in the stage (orders spilled chunks) until publishing numbers it for real.
        message.seq = len(stage) + 1
        self.recorder.added(stage, message, index)
        stage.messages.append(message)
        self._counted(destination, 1, message.size)

    # -- adoption (a failed cluster member's stages, cluster.adoption) ---------------------------

    def adopt_stage(self, name: StageName) -> Stage | None:
        """An open stage of a failed member's store, made here (its messages follow with
        `adopt_staged`); None when its batch was committed here, or a stage of that name is
        here already (its task staged here meanwhile)."""
        if self.is_committed(name.sink, name.batch) or self.get(name) is not None:
            return None
        return self._create(name)

    def adopt_committed(self, sink: str, batch: int) -> None:
        """A failed member's record that it committed SINK/BATCH: a replayed COMMIT here
        answers `committed-before`, and this sink's stages of that batch or before are
        discarded (as a COMMIT here would)."""
        if self.is_committed(sink, batch):
            return
        discarded = [
            stage
            for (stage_sink, stage_batch), stages in self._batches.items()
            if stage_sink == sink and stage_batch <= batch
            for stage in stages.values()
        ]
        lsn = self.recorder.committed(sink, batch, [], discarded)
        self._remember(sink, batch, lsn)
        for stage in discarded:
            self._unregister(stage)
        self._drop(discarded)

    def adopt_staged(self, stage: Stage, message: Message, expires_ms: int) -> None:
        """One message of an adopted stage, in send order, with the stage's deadline there."""
        message.location, message.marks, message.wire = 0, None, None
        destination = self._registry.recovered(message.destination)
        self._add(stage, destination, message, min(expires_ms, MAX_EXPIRES))

    def _create(self, name: StageName) -> Stage:
        stage = self._register(self.next_id, name)
        self.recorder.opened(stage)
        return stage

    def _register(self, stage_id: int, name: StageName) -> Stage:
        stage = Stage(stage_id, name, StagedMessages(self._context.ledger, self._context.spill))
        self.next_id = max(self.next_id, stage_id + 1)
        self._by_id[stage_id] = stage
        self._batches.setdefault((name.sink, name.batch), {})[name.task] = stage
        return stage

    def _dropped_late(self, name: StageName) -> None:
        self.late += 1
        log.debug("a SEND staged as %s came after its batch was committed: dropped", name)

    def _counted(self, destination: Destination, count: int, size: int) -> None:
        """`count` staged messages of `size` body bytes now count toward `destination`'s limits
        and the system limits (negative: they stop counting)."""
        destination.staged_count += count
        destination.staged_bytes += size
        system = self._context.system
        system.count += count
        system.bytes += size

    # -- committing ----------------------------------------------------------------------------

    def commit(
        self, sink: str, batch: int, tasks: Sequence[str], counts: Sequence[int] | None = None
    ) -> StageOutcome:
        """Publish the stages of `tasks` (in that order) of SINK/BATCH, all or nothing. With
        `counts` (what each task staged, as its writer counted), a stage that holds another
        number of messages here refuses the whole COMMIT (409), which then changes nothing: it
        expired, or was staged on another broker."""
        self._check_elsewhere(sink)
        if self.is_committed(sink, batch):
            return StageOutcome(StageState.COMMITTED_BEFORE, 0, self._commit_lsn.get(sink, 0))
        listed = self._batches.get((sink, batch), {})
        if counts is not None:
            _check_counts(sink, batch, tasks, counts, listed)
        chosen = [listed[task] for task in tasks if task in listed]
        keep = {stage.stage_id for stage in chosen}
        discarded = [
            stage
            for (stage_sink, stage_batch), stages in self._batches.items()
            if stage_sink == sink and stage_batch <= batch
            for stage in stages.values()
            if stage.stage_id not in keep
        ]
        plan = self._plan(chosen)
        lsn = self.recorder.committed(sink, batch, plan, discarded)
        self._remember(sink, batch, lsn)
        for stage in (*chosen, *discarded):
            self._unregister(stage)
        self._drop(discarded)
        count = sum(
            self._publish(stage, planned, lsn) for stage, planned in zip(chosen, plan, strict=True)
        )
        log.debug(
            "stage %s/%d committed: %d messages of %d tasks published, %d stages discarded",
            sink,
            batch,
            count,
            len(chosen),
            len(discarded),
        )
        return StageOutcome(StageState.COMMITTED, count, lsn)

    def _plan(self, chosen: list[Stage]) -> list[PublishedStage]:
        """The sequence numbers publishing will assign: per stage and destination, the first.

        Publishing runs to the end without anything else reaching these destinations, so each
        one's messages take its next numbers in turn, which is what lets the journal's COMMIT
        record say where every message's number starts before any is published."""
        following: dict[Destination, int] = {}
        plan = []
        for stage in chosen:
            firsts = []
            for destination, totals in stage.totals.items():
                first = following.get(destination, destination.last_seq + 1)
                firsts.append((destination.name, first))
                following[destination] = first + totals.count
            plan.append(PublishedStage(stage.stage_id, tuple(firsts)))
        return plan

    def _publish(self, stage: Stage, planned: PublishedStage, commit_lsn: int) -> int:
        destinations = {destination.name: destination for destination in stage.totals}
        indexes: dict[DestinationName, int] = {}
        kept = published = 0
        for run in stage.messages.drain():
            for message in run:
                destination = destinations[message.destination]
                index = indexes.get(message.destination, 0)
                indexes[message.destination] = index + 1
                # Its room moves with it from the stage to the destination: nothing is freed.
                self._counted(destination, -1, -message.size)
                kept += self.recorder.publish(message, destination)
                first = planned.first_seq(message.destination)
                assert first is not None
                assert message.seq == first + index, (message.seq, first, index)
                published += 1
        if kept:
            self.recorder.published(
                PublishedStage(stage.stage_id, planned.firsts, commit_lsn, stage.last_lsn)
            )
        return published

    # -- discarding ----------------------------------------------------------------------------

    def abort(self, sink: str, batch: int, tasks: Sequence[str] | None) -> StageOutcome:
        """Discard the stages of SINK/BATCH (only those of `tasks`, when given)."""
        self._check_elsewhere(sink)
        if self.is_committed(sink, batch):
            return StageOutcome(StageState.COMMITTED_BEFORE, 0, self._commit_lsn.get(sink, 0))
        stages = self._batches.get((sink, batch), {})
        chosen = (
            list(stages.values()) if tasks is None else [stages[t] for t in tasks if t in stages]
        )
        count = sum(len(stage) for stage in chosen)
        self._discard(chosen)
        return StageOutcome(StageState.ABORTED, count)

    def expire(self) -> int:
        """Discard the stages whose time to live passed (the broker's tick); return how many."""
        now = self._clock.time_ms()
        expired = [stage for stage in self._by_id.values() if stage.expires_ms <= now]
        for stage in expired:
            log.info(
                "stage %s expired with %d messages: discarded (stage-ttl, imq.stage.ttl)",
                stage.name,
                len(stage),
            )
        self._discard(expired)
        return len(expired)

    def _discard(self, stages: list[Stage]) -> None:
        if not stages:
            return
        self.recorder.discarded(stages)
        for stage in stages:
            self._unregister(stage)
        self._drop(stages)

    def _unregister(self, stage: Stage) -> None:
        del self._by_id[stage.stage_id]
        key = (stage.name.sink, stage.name.batch)
        tasks = self._batches[key]
        del tasks[stage.name.task]
        if not tasks:
            del self._batches[key]

    def _drop(self, stages: list[Stage]) -> None:
        """The messages of `stages` are gone: their room is free, held producers may go on."""
        for stage in stages:
            stage.messages.discard()
            for destination, totals in stage.totals.items():
                self._counted(destination, -totals.count, -totals.bytes)
                self._context.room.raised = True

    # -- recovery (persist.stage_extension) -------------------------------------------------

    def restore(self, stage: OpenStage, head: StagedHead, message: Message) -> None:
        """A message of an open stage, read back from the journal at start-up, in send order."""
        restored = self._by_id.get(stage.stage_id) or self._register(stage.stage_id, stage.name)
        destination = self._registry.recovered(message.destination)
        totals = restored.totals.get(destination)
        if totals is None:
            totals = restored.totals[destination] = _Totals()
        totals.count += 1
        totals.bytes += message.size
        restored.expires_ms = max(restored.expires_ms, head.expires)
        message.seq = len(restored) + 1
        restored.lsns.append(message.location)
        restored.last_lsn = message.location
        restored.messages.append(message)
        self._counted(destination, 1, message.size)

    def restore_sinks(self, committed: dict[str, int], next_id: int) -> None:
        """The sinks' highest committed batches and the next stage id, read back at start-up."""
        for sink, batch in committed.items():
            self._remember(sink, max(self.committed.get(sink, -1), batch), 0)
        self.next_id = max(self.next_id, next_id)

    def _remember(self, sink: str, batch: int, lsn: int) -> None:
        """Record `sink`'s highest committed batch. Only the imq.stage.max_sinks sinks that
        committed last are remembered (every batch DataFrame write is a sink of its own, so the
        number of sinks grows without end); a sink forgotten that long ago would publish a
        replayed commit again."""
        self.committed.pop(sink, None)  # to the end: the most recent
        self.committed[sink] = batch
        if lsn:
            self._commit_lsn[sink] = lsn
        while len(self.committed) > self._config.current.stage_max_sinks:
            oldest = next(iter(self.committed))
            del self.committed[oldest]
            self._commit_lsn.pop(oldest, None)


def _check_counts(
    sink: str, batch: int, tasks: Sequence[str], counts: Sequence[int], listed: dict[str, Stage]
) -> None:
    for task, expected in zip(tasks, counts, strict=True):
        stage = listed.get(task)
        held = len(stage) if stage is not None else 0
        if held != expected:
            raise Conflict(
                "stage incomplete",
                f"stage {sink}/{batch}/{task} holds {held} messages here and the COMMIT says "
                f"its task staged {expected}: the stage expired (its stage-ttl passed), or was "
                "staged on another broker (one that failed, in a cluster). Nothing was "
                "published; run the batch again",
            )
